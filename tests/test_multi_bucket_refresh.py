"""A dataset partitioned by `multi_bucket(8, s, n_int)` (with a calendar field beside it), end to end.

Hostile Parquet sources (NULLs in one field, the other, both; unicode, empty strings, negative and
extreme integers) are refreshed through the in-process Arrow strategy and through the Spark stage; the
full read equals the source row for row (row digests), every partition holds exactly the rows the
independent-of-engine Arrow kernel routes there, and 30+ random filters (plus filters pinning every
column of the multi_bucket) equal DuckDB over the source. Plans prune a pinned filter to its one bucket
and say when a filter cannot prune the multi_bucket field.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from matrix_support import DuckDBOracle, FilterGenerator, hostile_chunks, rows_by_key, sql_literal
from test_arrow_refresh import DATASET, assert_same_rows, conformed, read_back, write_source, write_spec

from airflow_partitions.refresh import refresh_dataset
from airflow_partitions.refresh.verify import verify_dataset

MULTI = (("mb", "multi_bucket(8, s, n_int)"), ("cy", "date_part('year', d)"))
WIDE = (("wb", "multi_bucket(5, s, ts, ts_naive, d, x)"),)


def _pinned_filters(table: pa.Table, rng: random.Random, count: int) -> list[str]:
    """`s = .. AND n_int = ..` / `s IN (..) AND n_int IN (..)` with values from the data (NULLs too)."""
    rows = table.select(["s", "n_int"]).to_pylist()
    out = []
    for number in range(count):
        picks = [rng.choice(rows) for _ in range(1 + number % 3)]
        strings = [sql_literal(r["s"], pa.string(), rng) for r in picks if r["s"] is not None] or ["''"]
        ints = [str(r["n_int"]) for r in picks if r["n_int"] is not None] or ["0"]
        if number % 2:
            out.append(f"s IN ({', '.join(strings)}) AND n_int IN ({', '.join(ints)})")
        else:
            extra = " AND d IS NOT NULL" if number % 4 == 0 else ""
            out.append(f"n_int = {ints[0]} AND s = {strings[0]}{extra}")
    return out


def _check_dataset(spec: Path, expected: pa.Table, fields: tuple[tuple[str, str], ...], what: str) -> None:
    got = conformed(read_back(spec), expected)
    assert_same_rows(got, expected, f"{what}: full read")
    keys = rows_by_key(expected, fields)
    got_groups = rows_by_key(got, fields)
    assert set(got_groups) == set(keys), what
    for key, rows in keys.items():
        assert_same_rows(got_groups[key], rows, f"{what}: partition {key}")


def _check_filters(spec: Path, expected: pa.Table, fields: tuple[tuple[str, str], ...], seed: int) -> int:
    """Random filters and pinned filters: each pruned read equals DuckDB over the source; returns how
    many filters ran."""
    rng = random.Random(seed)
    generator = FilterGenerator(expected, [expression for _, expression in fields], seed=seed)
    oracle = DuckDBOracle(generator.oracle_table())
    filters = [(f.reader_sql, f.oracle_sql) for f in generator.filters(30)]
    filters += [(text, text) for text in _pinned_filters(expected, rng, 12)]
    try:
        for reader_sql, oracle_sql in filters:
            want = expected.take(pa.array(oracle.rows(oracle_sql), pa.int64()))
            assert_same_rows(read_back(spec, reader_sql), want, reader_sql)
    finally:
        oracle.close()
    return len(filters)


def _bucket_of(text: str, number: int) -> int:
    import struct

    import mmh3

    return abs(mmh3.hash(text.encode("utf-8") + struct.pack("<q", number), 0, signed=True)) % 8


def _plan(spec: Path, where: str) -> Any:
    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

    hook = PartitionedDatasetHook(dataset=DATASET, spec_path=str(spec))
    try:
        return hook.plan(where)
    finally:
        hook.reader.close()


def test_multi_bucket_refreshed_in_process_reads_back_every_row(tmp_path: Path) -> None:
    chunks = hostile_chunks(29, rows=240)
    write_source(tmp_path, chunks)
    spec = write_spec(tmp_path, "parquet", MULTI)
    expected = pa.concat_tables(chunks)
    summary = refresh_dataset(spec, DATASET, strategy="arrow")
    assert summary.stage_mode == "arrow"
    assert summary.rows == expected.num_rows
    _check_dataset(spec, expected, MULTI, "arrow")
    # Rows with one field NULL still have a bucket; only rows NULL in both are in the NULL bucket.
    both_null = [
        r for r in expected.select(["s", "n_int"]).to_pylist() if r["s"] is None and r["n_int"] is None
    ]
    one_null = [
        r for r in expected.select(["s", "n_int"]).to_pylist() if (r["s"] is None) != (r["n_int"] is None)
    ]
    assert both_null, "the data must hold rows NULL in both fields"
    assert one_null, "the data must hold rows NULL in one field"
    assert any(key.startswith("mb=%NULL") for key in rows_by_key(expected, MULTI))
    assert _check_filters(spec, expected, MULTI, seed=41) >= 30
    # verify tallies the source in DuckDB grouped by both raw columns, then hashes each combination:
    # the same partitions and row hashes as the commit computed.
    report = verify_dataset(spec, DATASET)
    assert report.ok, [c.to_json() for c in report.differing]
    assert sum(c.source_rows for c in report.partitions) == expected.num_rows
    deep = verify_dataset(spec, DATASET, deep=True, record=False)
    assert deep.ok

    # A filter pinning both columns reads one bucket: exactly the partitions of that bucket.
    row = next(r for r in expected.to_pylist() if r["s"] and r["n_int"] is not None)
    where = f"s = {sql_literal(row['s'], pa.string(), random.Random(0))} AND n_int = {row['n_int']}"
    plan = _plan(spec, where)
    buckets = {p.key_path.split("/")[0] for p in plan.selected}
    assert len(buckets) == 1, plan.explain()
    assert plan.total > len(plan.selected)
    assert not plan.notes
    # One column alone, a range, or an OR with a branch leaving a column free cannot prune the
    # multi_bucket field: the plan says so. Every branch pinned prunes to their buckets.
    for partial in (
        f"n_int = {row['n_int']}",
        f"s = 'x' AND n_int > {row['n_int']}",
        f"({where}) OR n_int = 1",
    ):
        notes = _plan(spec, partial).notes
        assert any("reads all of its buckets" in note for note in notes), (partial, notes)
    both = _plan(spec, f"({where}) OR (s = 'zz' AND n_int = 1)")
    assert not both.notes
    assert {p.key_path.split("/")[0] for p in both.selected} <= {
        f"mb={b}" for b in (_bucket_of(row["s"], row["n_int"]), _bucket_of("zz", 1))
    }


def test_multi_bucket_refreshed_by_spark_reads_back_every_row(spark: Any, tmp_path: Path) -> None:
    chunks = hostile_chunks(31, rows=240)
    write_source(tmp_path, chunks)
    spec = write_spec(tmp_path, "parquet", MULTI)
    expected = pa.concat_tables(chunks)
    summary = refresh_dataset(spec, DATASET, strategy="spark", spark=spark)
    assert summary.stage_mode != "arrow"
    assert summary.rows == expected.num_rows
    _check_dataset(spec, expected, MULTI, "spark")
    assert _check_filters(spec, expected, MULTI, seed=43) >= 30


@pytest.mark.parametrize("strategy", ["arrow", "spark"])
def test_multi_bucket_over_timestamps_dates_and_doubles(spark: Any, tmp_path: Path, strategy: str) -> None:
    """Tz-aware and naive timestamps, dates and doubles (NaN, -0.0) hashed alike by both strategies."""
    chunks = hostile_chunks(37, rows=150)
    write_source(tmp_path, chunks)
    spec = write_spec(tmp_path, "parquet", WIDE)
    expected = pa.concat_tables(chunks)
    refresh_dataset(spec, DATASET, strategy=strategy, **({"spark": spark} if strategy == "spark" else {}))
    _check_dataset(spec, expected, WIDE, strategy)
