"""The rules of the one upsert / merge algorithm, as writes (`write.commit.upsert_changes`) and changes
refreshes (`refresh.finalize.merge_changes`, also run by the Spark executors) apply it.

What both share: a key compares NULL-safe; every changed key leaves the partition it was in (also when its
new row is routed elsewhere); the rows routed to the partition join it. Where they differ, by design:
- a write keeps a file that holds none of the keys as it is (not rewritten) and reads the key columns of
  a file first when the key does not decide the partition; a changes refresh rewrites the whole partition;
- a changes refresh takes keys to delete (change data capture's marked rows): they leave and go nowhere;
- a changes refresh refuses committed files that no longer hold the rows the catalog records.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from airflow_partitions.catalog.model import PartitionEntry
from airflow_partitions.exceptions import ConservationError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.refresh import finalize
from airflow_partitions.refresh.plan import PartitionWorkItem, Reason
from airflow_partitions.sources.pg_cdc import DELETED_COLUMN
from airflow_partitions.storage import get_storage
from airflow_partitions.transforms import parse_transform
from airflow_partitions.write import commit as writes

SCHEMA = pa.schema([("id", pa.int64()), ("region", pa.string()), ("note", pa.string())])
REGIONS = [None, "a/b", "it's", "🙂", "x=%"]


def rows(*values: tuple[Any, Any, Any]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, v, strict=True)) for v in values], schema=SCHEMA)


def region_transform() -> Any:
    return parse_transform("region").bind(pa.string())


def sorted_rows(table: pa.Table) -> list[tuple[Any, ...]]:
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=repr)


def write_partition(root: Path, region: str | None, *files: pa.Table) -> tuple[PartitionKey, list[Any]]:
    """`files` written as separate files of the partition of `region` (identity on `region`)."""
    storage = get_storage("parquet")
    key = PartitionKey((region,))
    written = [f for table in files for f in storage.write(table, root, key.path(["region"]))]
    return key, written


def change_item(key: PartitionKey, base: list[Any]) -> PartitionWorkItem:
    return PartitionWorkItem(
        key=tuple(key.to_json()),
        key_path=key.path(["region"]),
        reason=Reason.CHANGED,
        fingerprint="f",
        changes=True,
        base_files=tuple(base),
    )


def merge(root: Path, key: PartitionKey, base: list[Any], changed: pa.Table) -> tuple[pa.Table, int]:
    return finalize.merge_changes(
        "items",
        ("id",),
        get_storage("parquet"),
        root,
        changed,
        change_item(key, base),
        [region_transform()],
        key.values,
        SCHEMA,
    )


def write_target(root: Path, entries: list[PartitionEntry]) -> writes.WriteTarget:
    """A write target over `entries` (one spec, identity on `region`), without a catalog."""
    spec = SimpleNamespace(spec_id="s1", names=("region",))
    field = SimpleNamespace(transform=region_transform())
    acceleration = SimpleNamespace(partition_by=[field], partition_names=("region",))
    snapshot = SimpleNamespace(
        version=1,
        partitions={e.key_path: e for e in entries},
        other_layout=lambda spec_id=None: (0, 0),
    )
    return writes.WriteTarget(
        project=None,  # type: ignore[arg-type]
        dataset=SimpleNamespace(name="items", acceleration=acceleration),  # type: ignore[arg-type]
        catalog=None,  # type: ignore[arg-type]
        storage=get_storage("parquet"),
        root=root,
        schema=SCHEMA,
        snapshot=snapshot,  # type: ignore[arg-type]
        spec_info=spec,  # type: ignore[arg-type]
    )


def entry(key: PartitionKey, files: list[Any]) -> PartitionEntry:
    return PartitionEntry.from_files(key, SimpleNamespace(spec_id="s1", names=("region",)), files)  # type: ignore[arg-type]


def test_changes_merge_moves_a_key_out_and_routes_the_rest_here_null_keys_included(tmp_path: Path) -> None:
    key, base = write_partition(
        tmp_path, "a/b", rows((1, "a/b", "old"), (None, "a/b", "null key"), (3, "a/b", "x"))
    )
    changed = rows((1, "🙂", "moved"), (None, "a/b", "null key new"), (7, "a/b", "new"))
    merged, added = merge(tmp_path, key, base, changed)
    assert sorted_rows(merged) == sorted_rows(
        rows((None, "a/b", "null key new"), (3, "a/b", "x"), (7, "a/b", "new"))
    )
    assert added == 2, "only the changed rows routed here are added"


def test_changes_merge_deletes_marked_keys_and_routes_them_nowhere(tmp_path: Path) -> None:
    key, base = write_partition(tmp_path, "it's", rows((1, "it's", "a"), (2, "it's", "b")))
    changed = rows((2, None, None), (5, "it's", "c")).append_column(DELETED_COLUMN, pa.array([True, False]))
    merged, added = merge(tmp_path, key, base, changed)
    assert sorted_rows(merged) == sorted_rows(rows((1, "it's", "a"), (5, "it's", "c")))
    assert added == 1


def test_changes_merge_rewrites_the_whole_partition(tmp_path: Path) -> None:
    """Every committed row is in the merged table (written as the partition's new files), also the rows
    of a file that holds none of the changed keys."""
    key, base = write_partition(tmp_path, None, rows((1, None, "a")), rows((50, None, "b")))
    merged, _ = merge(tmp_path, key, base, rows((1, None, "new")))
    assert sorted_rows(merged) == sorted_rows(rows((1, None, "new"), (50, None, "b")))


def test_changes_merge_refuses_files_that_lost_rows(tmp_path: Path) -> None:
    key, base = write_partition(tmp_path, "x=%", rows((1, "x=%", "a"), (2, "x=%", "b")))
    recorded = [f.__class__.from_json({**f.to_json(), "rows": f.rows + 1}) for f in base]
    with pytest.raises(ConservationError, match="rows the catalog records"):
        merge(tmp_path, key, recorded, rows((9, "x=%", "n")))


def test_write_upsert_keeps_files_without_the_keys_and_moves_a_key_across_partitions(tmp_path: Path) -> None:
    key_a, files_a = write_partition(tmp_path, "a/b", rows((1, "a/b", "old")), rows((50, "a/b", "keep")))
    key_n, files_n = write_partition(tmp_path, None, rows((None, None, "null key")), rows((60, None, "z")))
    target = write_target(tmp_path, [entry(key_a, files_a), entry(key_n, files_n)])
    incoming = rows((1, None, "moved"), (None, "a/b", "null key moved"))
    changes = {c.key_path: c for c in writes.upsert_changes(target, incoming, ("id",))}
    a, n = changes["region=a%2Fb"], changes[key_n.path(["region"])]
    # The file holding key 1 is rewritten without it; the one holding only 50 is kept as it is.
    assert a.kept == [files_a[1]]
    assert a.removed == 1
    assert sorted_rows(pa.concat_tables(a.rewritten)) == []
    assert sorted_rows(a.added) == sorted_rows(rows((None, "a/b", "null key moved")))
    # The NULL key leaves the NULL partition (NULL-safe match); key 1 arrives there.
    assert n.kept == [files_n[1]]
    assert n.removed == 1
    assert sorted_rows(n.added) == sorted_rows(rows((1, None, "moved")))


def test_write_upsert_does_not_take_delete_markers() -> None:
    """A write's rows must be the dataset's columns: a delete marker column is refused, not applied."""
    from airflow_partitions.exceptions import WriteSchemaError
    from airflow_partitions.write.rows import conform_rows

    marked = rows((1, "a/b", "x")).append_column(DELETED_COLUMN, pa.array([True]))
    with pytest.raises(WriteSchemaError, match=DELETED_COLUMN):
        conform_rows(marked, SCHEMA, dataset="items")
