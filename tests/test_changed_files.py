"""Flat file sources refresh only the partitions changed files can feed (per-file facts), never fewer.

Each source file holds the rows of one month (plus, in one file, rows whose `ts` is NULL), so a file
added, changed or removed maps to known partitions. After each refresh the acceleration must equal the
source (row hashes of a full read, filtered reads against DuckDB over the source), and the plan must name
exactly the partitions the change touched.
"""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from matrix_support import SCHEMA, MatrixSource, _row, key_path, rows_by_key
from test_conservation_matrix import DATASET, check_equals_source, write_spec

from airflow_partitions.refresh import plan_refresh, refresh_dataset
from airflow_partitions.sources import file_facts, keep_file_facts, open_dataset_source
from airflow_partitions.spec import load_spec
from airflow_partitions.transforms import parse_transform

pytestmark = pytest.mark.spark

FIELDS = [("month", "date_trunc('month', ts)")]
UTC = dt.UTC


def month_rows(seed: int, month: int, count: int, *, with_nulls: bool = False) -> pa.Table:
    """`count` hostile rows whose `ts` falls in month `month` of 2026 (NULL in some when `with_nulls`);
    the first row has no NULL anywhere (CSV type inference needs one)."""
    rng = random.Random(seed * 100 + month)
    rows = []
    for i in range(count):
        row = _row(rng, seed * 10_000 + month * 100 + i, complete=i == 0)
        day = rng.randrange(0, 28)
        # Month edges on purpose: the first and last microsecond of the month.
        edge = [dt.timedelta(0), dt.timedelta(days=28 - day, microseconds=-1)][i % 2] if i < 3 else None
        start = dt.datetime(2026, month, 1, tzinfo=UTC)
        row["ts"] = start + (
            edge if edge is not None else dt.timedelta(days=day, seconds=rng.randrange(86_400))
        )
        if i >= 3 and with_nulls and i % 4 == 0:
            row["ts"] = None
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def planned(spec: Path) -> tuple[set[str], set[str], tuple[str, ...]]:
    plan = plan_refresh(spec, DATASET)
    return {item.key_path for item in plan.items}, set(plan.removed), plan.notes


def months(*values: int | None) -> set[str]:
    return {key_path((None if m is None else dt.datetime(2026, m, 1, tzinfo=UTC),), FIELDS) for m in values}


@pytest.mark.parametrize("kind", ["parquet", "csv", "json"])
def test_added_changed_and_removed_files_refresh_only_their_partitions(
    kind: str, tmp_path: Path, spark: Any
) -> None:
    source = MatrixSource(kind, tmp_path)
    source.write([month_rows(1, 1, 20, with_nulls=True), month_rows(1, 2, 20), month_rows(1, 3, 20)])
    spec = write_spec(tmp_path, source, "parquet", FIELDS)
    refresh_dataset(spec, DATASET, spark=spark)
    assert planned(spec)[:2] == (set(), set()), "nothing changed: nothing to refresh"

    # A new file of March rows: only March refreshes (January, February and NULL stay).
    source._write_chunk(3, month_rows(2, 3, 15))
    items, removed, notes = planned(spec)
    assert items == months(3), f"a new March file must refresh March only, planned {sorted(items)}"
    assert any("per-file facts" in note for note in notes), notes
    refresh_dataset(spec, DATASET, spark=spark)
    check_equals_source(spec, source.expected(), FIELDS, filters=6, seed=2)
    if kind != "parquet":
        return  # the formats differ in how facts are learnt, not in how files map: parquet goes on

    # A file rewritten with April rows instead of February ones: February (emptied) goes, April is new.
    source._delete_chunk(1)
    source._write_chunk(1, month_rows(3, 4, 20))
    items, removed, _ = planned(spec)
    assert items == months(4), f"planned {sorted(items)}"
    assert removed == months(2)
    refresh_dataset(spec, DATASET, spark=spark)

    # The January file (with the NULL rows) removed: January and NULL partitions go; March stays.
    source._delete_chunk(0)
    items, removed, _ = planned(spec)
    assert items == set()
    assert removed == months(1, None)
    summary = refresh_dataset(spec, DATASET, spark=spark)
    assert summary.removed == 2
    check_equals_source(spec, source.expected(), FIELDS, filters=12, seed=4)


def test_a_file_spanning_months_refreshes_every_month_it_holds(tmp_path: Path, spark: Any) -> None:
    source = MatrixSource("parquet", tmp_path)
    source.write([month_rows(1, 1, 10), month_rows(1, 2, 10), month_rows(1, 3, 10), month_rows(1, 4, 10)])
    spec = write_spec(tmp_path, source, "parquet", FIELDS)
    refresh_dataset(spec, DATASET, spark=spark)
    # One new file with January and March rows: exactly those two months, not February.
    source._write_chunk(9, pa.concat_tables([month_rows(5, 1, 4), month_rows(5, 3, 4)]))
    items, _, _ = planned(spec)
    assert items == months(1, 3)
    refresh_dataset(spec, DATASET, spark=spark)
    check_equals_source(spec, source.expected(), FIELDS, filters=8, seed=5)


def test_file_ranges_map_files_when_their_keys_are_too_many_to_keep(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With no keys kept, the min..max range of `ts` maps each file (date_trunc projects ranges exactly).
    monkeypatch.setattr(file_facts, "MAX_KEYS_PER_FILE", 0)
    source = MatrixSource("parquet", tmp_path)
    source.write([month_rows(1, 1, 10, with_nulls=True), month_rows(1, 3, 10), month_rows(1, 5, 10)])
    spec = write_spec(tmp_path, source, "parquet", FIELDS)
    refresh_dataset(spec, DATASET, spark=spark)
    source._write_chunk(7, pa.concat_tables([month_rows(6, 3, 4), month_rows(6, 4, 4)]))
    items, _, notes = planned(spec)
    # March..April: March and the new April; May's file and January's are outside the range.
    assert items == months(3, 4), f"planned {sorted(items)}"
    assert any("column ranges" in note for note in notes), notes
    refresh_dataset(spec, DATASET, spark=spark)
    check_equals_source(spec, source.expected(), FIELDS, filters=8, seed=6)
    # A changed file whose NULLs are new: the range maps it to its month and to the NULL partition.
    source._delete_chunk(2)
    source._write_chunk(2, month_rows(7, 5, 12, with_nulls=True))
    items, _, _ = planned(spec)
    assert items == months(5, None), f"planned {sorted(items)}"
    refresh_dataset(spec, DATASET, spark=spark)
    check_equals_source(spec, source.expected(), FIELDS, filters=8, seed=7)


def test_bucket_fields_map_by_enumeration_and_wide_ranges_refresh_all(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_facts, "MAX_KEYS_PER_FILE", 0)
    fields = [("b", "bucket(8, n_int)")]
    source = MatrixSource("parquet", tmp_path)
    narrow = [month_rows(1, 1, 6), month_rows(1, 2, 6)]
    for index, table in enumerate(narrow):
        # n_int 10..12 and 20..22: small integer ranges, enumerated through the bucket hash.
        values = [10 * (index + 1) + i % 3 for i in range(table.num_rows)]
        narrow[index] = table.set_column(1, "n_int", pa.array(values, pa.int64()))
    source.write(narrow)
    spec = write_spec(tmp_path, source, "parquet", fields)
    refresh_dataset(spec, DATASET, spark=spark)
    added = month_rows(2, 3, 6).set_column(1, "n_int", pa.array([10, 11, 12, 10, 11, 12], pa.int64()))
    source._write_chunk(5, added)
    items, _, _ = planned(spec)
    bucket_of = set(rows_by_key(added, fields))
    assert items == bucket_of, f"the new file's buckets only: planned {sorted(items)}, expected {bucket_of}"
    refresh_dataset(spec, DATASET, spark=spark)
    # A file over a huge range cannot be enumerated: every partition it could hit (all) refreshes.
    wide = month_rows(3, 4, 2).set_column(1, "n_int", pa.array([-(2**62), 2**62], pa.int64()))
    source._write_chunk(6, wide)
    items, _, _ = planned(spec)
    # It has no NULL n_int, so the NULL partition stays: its NULL count is exact.
    assert items == {f"b={i}" for i in range(8)}, "doubt never prunes: every bucket"
    refresh_dataset(spec, DATASET, spark=spark)
    check_equals_source(spec, source.expected(), fields, filters=8, seed=8)


def test_csv_facts_are_learnt_once(tmp_path: Path, spark: Any) -> None:
    source = MatrixSource("csv", tmp_path)
    source.write([month_rows(1, 1, 10), month_rows(1, 2, 10), month_rows(1, 3, 10)])
    spec = write_spec(tmp_path, source, "parquet", FIELDS)
    project = load_spec(spec)
    dataset = project.dataset(DATASET)
    first = keep_file_facts(open_dataset_source(dataset), Path(project.accelerator_dir) / DATASET)
    plan_refresh(project, dataset, source=first)
    assert len(first.facts_reads) == 3  # type: ignore[attr-defined]
    source._write_chunk(4, month_rows(2, 2, 5))
    second = keep_file_facts(open_dataset_source(dataset), Path(project.accelerator_dir) / DATASET)
    plan = plan_refresh(project, dataset, source=second)
    assert second.facts_reads == ["chunk4-v0.csv"], "a later plan reads only the new file"  # type: ignore[attr-defined]
    assert {item.key_path for item in plan.items} == months(1, 2, 3), "nothing refreshed yet: all new"
    refresh_dataset(spec, DATASET, spark=spark)
    third = keep_file_facts(open_dataset_source(dataset), Path(project.accelerator_dir) / DATASET)
    assert plan_refresh(project, dataset, source=third).items == ()
    assert third.facts_reads == []  # type: ignore[attr-defined]


def test_schema_drift_between_files_refreshes_everything_once(tmp_path: Path, spark: Any) -> None:
    source = MatrixSource("parquet", tmp_path)
    source.write([month_rows(1, 1, 10), month_rows(1, 2, 10)])
    spec = write_spec(tmp_path, source, "parquet", FIELDS)
    refresh_dataset(spec, DATASET, spark=spark)
    # A new file whose n_int is int32: the unified source schema is unchanged (int64) -> only its month.
    narrow = month_rows(4, 2, 5)
    narrow = narrow.set_column(1, "n_int", narrow.column("n_int").cast(pa.int32()))
    pq.write_table(narrow, tmp_path / "src" / "drift-int32.parquet")
    items, _, _ = planned(spec)
    assert items == months(2)
    refresh_dataset(spec, DATASET, spark=spark)
    # The oracle reads every file itself (the helper source knows only the files it wrote).
    every_file = [pq.read_table(p).cast(SCHEMA) for p in sorted((tmp_path / "src").glob("*.parquet"))]
    check_equals_source(spec, pa.concat_tables(every_file), FIELDS, filters=6, seed=9)
    # A new file with an extra column changes the source schema: every partition is rewritten.
    extra = month_rows(5, 1, 5).append_column("note", pa.array(["x"] * 5))
    pq.write_table(extra, tmp_path / "src" / "drift-extra.parquet")
    items, _, _ = planned(spec)
    assert items == months(1, 2), "a schema change refreshes every partition"
    assert refresh_dataset(spec, DATASET, spark=spark).rows == 30


def test_stage_reads_only_the_files_that_can_feed_the_planned_partitions(tmp_path: Path) -> None:
    source = MatrixSource("parquet", tmp_path)
    source.write([month_rows(1, m, 5, with_nulls=m == 2) for m in (1, 2, 3, 4)])
    spec = write_spec(tmp_path, source, "parquet", FIELDS)
    project = load_spec(spec)
    dataset = project.dataset(DATASET)
    files = keep_file_facts(open_dataset_source(dataset), Path(project.accelerator_dir) / DATASET)
    plan_refresh(project, dataset, source=files)  # learns the facts
    transform = parse_transform(FIELDS[0][1]).bind(SCHEMA.field("ts").type)
    march = (dt.datetime(2026, 3, 1, tzinfo=UTC),)
    read = files.files_for_keys([transform], [march])  # type: ignore[attr-defined]
    assert [f.relative for f in read] == ["chunk2-v0.parquet"], "only March's file feeds March"
    nulls = files.files_for_keys([transform], [(None,)])  # type: ignore[attr-defined]
    assert [f.relative for f in nulls] == ["chunk1-v0.parquet"], "only February's file has NULL ts"
    # A file listed after the facts were learnt has none: it is read for every partition (doubt).
    source._write_chunk(8, month_rows(9, 6, 3))
    files.list_files(refresh=True)  # type: ignore[attr-defined]
    read = files.files_for_keys([transform], [march])  # type: ignore[attr-defined]
    assert [f.relative for f in read] == ["chunk2-v0.parquet", "chunk8-v0.parquet"]
