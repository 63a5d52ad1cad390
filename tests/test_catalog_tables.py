"""Catalog tables in `query` (ap_partitions, ap_files, ap_versions) over hostile partition keys, checked
against the source and the catalog, through the reader, the hook and the CLI."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from test_pruning_support import Acceleration, build_acceleration, partition_rows

from airflow_partitions.catalog import PartitionEntry
from airflow_partitions.cli.main import main
from airflow_partitions.exceptions import DatasetNotFoundError, UnsafeQueryError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.storage import get_storage
from airflow_partitions.transforms import parse_transform

HOSTILE = ["a/b", "k=v", "100%", "Zürich", "", None, 'it\'s "q"', "日本"]
ROWS = 400
PARTITION_BY = [("place", "place"), ("n_bucket", "bucket(4, n)")]


def hostile_table() -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(ROWS), pa.int64()),
            "place": pa.array([HOSTILE[i % len(HOSTILE)] for i in range(ROWS)], pa.string()),
            "n": pa.array([None if i % 7 == 0 else (i * 31) % 1000 for i in range(ROWS)], pa.int64()),
            "amount": pa.array(
                [None if i % 11 == 0 else Decimal(i * 37 % 5000).scaleb(-2) for i in range(ROWS)],
                pa.decimal128(10, 2),
            ),
            "ts": pa.array(
                [
                    None
                    if i % 13 == 0
                    else dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(hours=5 * i)
                    for i in range(ROWS)
                ],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Acceleration:
    return build_acceleration(
        tmp_path_factory.mktemp("catalog_tables"), hostile_table(), PARTITION_BY, max_rows_per_file=9
    )


def ground_truth(acc: Acceleration) -> dict[tuple[object, object], pa.Table]:
    """The source rows of every partition, by (place, n_bucket) as the transforms compute them."""
    _, groups = partition_rows(acc.table, PARTITION_BY)
    truth = {}
    for rows in groups.values():
        part = acc.table.take(pa.array(rows, pa.int64()))
        bucket = parse_transform("bucket(4, n)").bind(pa.int64()).apply_scalar(part["n"][0].as_py())
        truth[(part["place"][0].as_py(), bucket)] = part
    return truth


def test_ap_partitions_has_typed_keys_and_the_source_counts(hostile: Acceleration) -> None:
    truth = ground_truth(hostile)
    with hostile.reader() as reader:
        table = reader.query("SELECT * FROM ap_partitions('events')")
        big = reader.query("SELECT place, n_bucket, rows FROM ap_partitions('events') WHERE rows > 12")
        total = reader.query("SELECT sum(rows) AS r, sum(files) AS f FROM ap_partitions('events')")
    assert table.schema.field("place").type == pa.string(), "identity keys keep the column's type"
    assert table.schema.field("n_bucket").type == pa.int64(), "bucket keys are integers"
    assert table.schema.field("refreshed_at").type == pa.timestamp("us", tz="UTC")
    got = {(r["place"], r["n_bucket"]): r["rows"] for r in table.to_pylist()}
    assert got == {key: part.num_rows for key, part in truth.items()}, (
        "one row per partition, NULL / unicode / '/' / '=' / '%' / quoted keys as typed values, rows as in "
        "the source"
    )
    assert (None, None) in got, "the NULL partition of both fields is a row with NULL keys"
    assert {(r["place"], r["n_bucket"]) for r in big.to_pylist()} == {
        key for key, part in truth.items() if part.num_rows > 12
    }, "a WHERE on rows filters partitions"
    snapshot = hostile.snapshot()
    assert total.to_pylist() == [{"r": ROWS, "f": sum(len(e.files) for e in snapshot.partitions.values())}], (
        "rows add up to the source; files to the catalog's"
    )
    by_path = {r["key_path"]: r for r in table.to_pylist()}
    for entry in snapshot.partitions.values():
        row = by_path[entry.key_path]
        assert (row["bytes"], row["files"], row["version"]) == (
            entry.bytes,
            len(entry.files),
            snapshot.version,
        ), f"catalog figures of {entry.key_path}"


def test_ap_files_bounds_hold_the_partition_rows(hostile: Acceleration) -> None:
    truth = ground_truth(hostile)
    with hostile.reader() as reader:
        files = reader.query(
            "SELECT place, n_bucket, path, rows, min.amount AS lo, max.amount AS hi, min.ts AS first_ts, "
            "null_count.amount AS amount_nulls FROM ap_files('events')"
        ).to_pylist()
    assert sum(f["rows"] for f in files) == ROWS
    per_partition: dict[tuple[object, object], list[dict[str, object]]] = {}
    for f in files:
        per_partition.setdefault((f["place"], f["n_bucket"]), []).append(f)
        assert not str(f["path"]).startswith("/"), "paths are relative to the dataset"
    assert per_partition.keys() == truth.keys()
    for key, part in truth.items():
        amounts = [a for a in part["amount"].to_pylist() if a is not None]
        mins = [f["lo"] for f in per_partition[key] if f["lo"] is not None]
        maxes = [f["hi"] for f in per_partition[key] if f["hi"] is not None]
        assert (min(mins, default=None), max(maxes, default=None)) == (
            min(amounts, default=None),
            max(amounts, default=None),
        ), f"typed min/max of amount over the files of {key} equal the source's"
        assert sum(int(f["amount_nulls"]) for f in per_partition[key]) == part["amount"].null_count
        stamps = [t for t in part["ts"].to_pylist() if t is not None]
        firsts = [f["first_ts"] for f in per_partition[key] if f["first_ts"] is not None]
        assert min(firsts, default=None) == min(stamps, default=None), "timestamps keep their zone"


def test_ap_versions_and_version_pinning(tmp_path: Path) -> None:
    acc = build_acceleration(tmp_path, hostile_table(), PARTITION_BY)
    snapshot = acc.snapshot()
    spec = snapshot.partition_spec
    key = PartitionKey(("Zürich", 0))
    replacement = acc.table.slice(0, 3)
    files = get_storage("parquet").write(replacement, acc.root / acc.dataset, key.path(spec.names))
    version = acc.catalog.commit(
        base_version=snapshot.version,
        upserts=[PartitionEntry.from_files(key, spec, files)],
        partition_spec=spec,
        operation="upsert",
    )
    acc.catalog.tag("first", 1)
    sql = (
        "SELECT version, operation, partitions_changed, commit_id, tags FROM ap_versions('events') ORDER BY 1"
    )
    with acc.reader() as reader:
        newest = reader.query(sql).to_pylist()
        pinned = reader.query(sql, version=1).to_pylist()
        count_now = reader.query("SELECT sum(rows) AS c FROM ap_partitions('events')").to_pylist()
        count_then = reader.query(
            "SELECT sum(rows) AS c FROM ap_partitions('events')", tag="first"
        ).to_pylist()
        explicit = reader.query(
            "SELECT max(version) AS v FROM ap_partitions('events', version := 1)"
        ).to_pylist()
    ids = {info.version: info.commit_id for info in acc.catalog.versions()}
    assert [(r["version"], r["operation"], r["commit_id"]) for r in newest] == [
        (1, "refresh", ids[1]),
        (version, "upsert", ids[version]),
    ]
    assert [r["tags"] for r in newest] == [["first"], []]
    assert [r["version"] for r in pinned] == [1], "a query of version 1 sees the versions up to it"
    replaced = snapshot.partitions[key.path(spec.names)].rows
    assert count_now == [{"c": ROWS - replaced + 3}], "the upsert replaced a partition by 3 rows"
    assert count_then == [{"c": ROWS}], "the tag pins the catalog tables too"
    assert explicit == [{"v": 1}]


def test_catalog_tables_join_the_dataset_and_stay_sandboxed(hostile: Acceleration) -> None:
    with hostile.reader() as reader:
        joined = reader.query(
            "SELECT p.key_path, p.rows, count(e.id) AS counted FROM ap_partitions('events') p "
            "JOIN events e ON e.place IS NOT DISTINCT FROM p.place "
            "AND bucket(4, e.n) IS NOT DISTINCT FROM p.n_bucket GROUP BY ALL"
        ).to_pylist()
        assert len(joined) == hostile.snapshot().partition_count
        assert all(r["rows"] == r["counted"] for r in joined), "catalog rows == rows read"
        hidden = next(
            iter(
                reader._catalog_tables(
                    "SELECT * FROM ap_files('events')", hostile.snapshot(), reader.schema()
                )
            )
        )
        with pytest.raises(UnsafeQueryError, match="reads"):
            reader.query(f"SELECT * FROM {hidden}")
        with pytest.raises(UnsafeQueryError, match="string literal"):
            reader.query("SELECT * FROM ap_partitions(lower('EVENTS'))")
        with pytest.raises(UnsafeQueryError, match="version must be"):
            reader.query("SELECT * FROM ap_files('events', version := 0)")
        with pytest.raises(DatasetNotFoundError, match="known datasets"):
            reader.query("SELECT * FROM ap_partitions('nope')")
        with pytest.raises(UnsafeQueryError, match="not available"):
            reader.query("SELECT * FROM read_parquet('x')")


def test_cli_query_of_catalog_tables_prints_json(
    hostile: Acceleration, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        [
            "query",
            str(hostile.spec_path),
            "SELECT place, n_bucket, rows FROM ap_partitions('events') WHERE rows > 1e1 ORDER BY rows DESC",
            "--json",
        ]
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert status == 0
    truth = ground_truth(hostile)
    assert sorted(json.dumps([r["place"], r["n_bucket"], r["rows"]]) for r in lines) == sorted(
        json.dumps([k[0], k[1], p.num_rows]) for k, p in truth.items() if p.num_rows > 10
    ), "the CLI finds the dataset from ap_partitions('events') and prints typed JSON values"


def test_catalog_tables_in_a_per_query_database(tmp_path: Path) -> None:
    """DuckDB-file engines run each query in a fresh locked database: the catalog tables reach it too."""
    acc = build_acceleration(
        tmp_path, hostile_table(), PARTITION_BY, engine="duckdb", partition_mode="tables"
    )
    with acc.reader() as reader:
        partitions = reader.query("SELECT sum(rows) AS r, count(*) AS c FROM ap_partitions('events')")
        files = reader.query("SELECT sum(rows) AS r FROM ap_files('events')")
        mapped = reader.query("SELECT count(*) AS c FROM events WHERE 'map_files' <> ''")
    assert partitions.to_pylist() == [{"r": ROWS, "c": len(ground_truth(acc))}]
    assert files.to_pylist() == [{"r": ROWS}]
    assert mapped.to_pylist() == [{"c": ROWS}], "text that only resembles a catalog function is a query"


def test_ap_partitions_names_the_commit_that_last_wrote_each_partition(tmp_path: Path) -> None:
    import dataclasses
    import hashlib

    from airflow_partitions.catalog import Catalog, LocalStore
    from airflow_partitions.catalog.state import PartitionMap, encode_checkpoint

    acc = build_acceleration(tmp_path, hostile_table(), PARTITION_BY)
    spec = acc.snapshot().partition_spec
    key = PartitionKey(("Zürich", 0))
    files = get_storage("parquet").write(acc.table.slice(0, 3), acc.root / acc.dataset, key.path(spec.names))

    def upsert(partition: PartitionKey, files: object) -> int:
        return acc.catalog.commit(
            base_version=acc.snapshot().version,
            upserts=[PartitionEntry.from_files(partition, spec, files)],  # type: ignore[arg-type]
            partition_spec=spec,
            operation="upsert",
        )

    second = upsert(key, files)
    ids = {info.version: info.commit_id for info in acc.catalog.versions()}
    assert ids[1] is not None
    assert ids[second] is not None
    assert ids[1] != ids[second]
    sql = "SELECT key_path, commit_id FROM ap_partitions('events')"

    def commit_ids() -> dict[str, str | None]:
        with acc.reader() as reader:
            return {row["key_path"]: row["commit_id"] for row in reader.query(sql).to_pylist()}

    replaced = key.path(spec.names)
    expected = {path: (ids[second] if path == replaced else ids[1]) for path in acc.snapshot().partitions}
    assert commit_ids() == expected, "each partition names the commit that last upserted it"
    assert acc.snapshot().partitions[replaced].commit_id == ids[second], "the catalog entry carries it"
    with acc.reader() as reader:
        pinned = reader.query(sql, version=1).to_pylist()
    assert {row["commit_id"] for row in pinned} == {ids[1]}, "version 1 as it was"
    # Through a checkpoint too: a fresh catalog object reads the column back.
    acc.catalog.write_checkpoint(acc.snapshot())
    fresh = Catalog(LocalStore(acc.root), acc.dataset)
    assert {p: e.commit_id for p, e in fresh.snapshot().partitions.items()} == expected
    assert commit_ids() == expected

    # A checkpoint written before the column existed stays readable: its partitions have no commit id
    # (NULL) until a commit writes them again.
    snapshot = fresh.snapshot()
    old_table = snapshot.table.drop_columns(["commit_id"])
    old = dataclasses.replace(snapshot, partitions=PartitionMap(old_table))
    data = encode_checkpoint(old)
    checkpoint = acc.root / fresh._checkpoint_key(snapshot.version)
    checkpoint.write_bytes(data)
    (checkpoint.parent / f"{checkpoint.name}.sha256").write_bytes(hashlib.sha256(data).hexdigest().encode())
    older = Catalog(LocalStore(acc.root), acc.dataset)
    assert {e.commit_id for e in older.snapshot().partitions.values()} == {None}
    assert set(commit_ids().values()) == {None}
    other = PartitionKey(("a/b", 1))
    third = upsert(
        other,
        get_storage("parquet").write(acc.table.slice(3, 2), acc.root / acc.dataset, other.path(spec.names)),
    )
    newest = {info.version: info.commit_id for info in acc.catalog.versions()}[third]
    after = commit_ids()
    assert after[other.path(spec.names)] == newest
    assert {v for p, v in after.items() if p != other.path(spec.names)} == {None}
    with acc.reader() as reader:
        assert reader.read().num_rows == Catalog(LocalStore(acc.root), acc.dataset).snapshot().total_rows
