"""Exact side indexes (`acceleration.params.index_columns`): built by every write, never skip a match.

Reads with index columns are compared with DuckDB over the source rows for `=`, `IN`, `IS NULL` and
AND / OR of them, on hostile values (unicode, '', '/', '=', '%', quotes, NULLs, large integers, timestamps
with offsets) across the parquet, duckdb and arrow engines; the bloom filters' false-positive rate is
measured with probes of absent values and printed.
"""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from test_pruning_support import Acceleration, build_acceleration

from airflow_partitions.cli.main import main
from airflow_partitions.exceptions import SpecValidationError, StorageError
from airflow_partitions.spec import parse_spec
from airflow_partitions.storage import DataFile, IndexConfig, get_storage
from airflow_partitions.storage.side_index import (
    ProbeSet,
    bloom_blocks,
    build_column_index,
    expected_fpp,
    literal_hashes,
    value_hashes,
)
from airflow_partitions.table import open_handle

UTC = dt.UTC
COUNTRIES = ["DE", "US", "FR", "ES", "IT", "NL"]  # never "UK": the Seafowl probe
HOSTILE = ["", "/", "=", "%", "it's", 'say "hi"', "é", "🙂", "a/b=c%", "NULL", " "]
BIG = [2**62, -(2**62), 2**63 - 1, -(2**63), 0, -1]
INDEXED = ("s", "cat", "big", "ts", "naive", "d")


def hostile_table(rows: int = 600, seed: int = 3) -> pa.Table:
    rng = random.Random(seed)
    base = dt.datetime(2026, 1, 1, tzinfo=UTC)

    def maybe(value: object) -> object:
        return None if rng.random() < 0.08 else value

    return pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "s": pa.array(
                [
                    maybe(HOSTILE[i % len(HOSTILE)] if i % 3 == 0 else f"user-{i * 7919 % 1000}")
                    for i in range(rows)
                ],
                pa.string(),
            ),
            "cat": pa.array([maybe(COUNTRIES[i % len(COUNTRIES)]) for i in range(rows)], pa.string()),
            "big": pa.array(
                [maybe(BIG[i % len(BIG)] if i % 4 == 0 else i * 104729) for i in range(rows)], pa.int64()
            ),
            "ts": pa.array(
                [maybe(base + dt.timedelta(minutes=37 * i)) for i in range(rows)], pa.timestamp("us", "UTC")
            ),
            "naive": pa.array(
                [maybe(dt.datetime(2026, 2, 1) + dt.timedelta(hours=5 * i)) for i in range(rows)],
                pa.timestamp("us"),
            ),
            "d": pa.array(
                [maybe(dt.date(2026, 1, 1) + dt.timedelta(days=i % 90)) for i in range(rows)], pa.date32()
            ),
        }
    )


ENGINES = [("parquet", "files"), ("duckdb", "files"), ("duckdb", "tables"), ("arrow", "files")]
CONFIG = IndexConfig(INDEXED, fpp=0.01, max_values=8)
FILTERS = [
    "s = ''",
    "s = '/'",
    "s = '='",
    "s = '%'",
    "s = 'it''s'",
    "s = 'say \"hi\"'",
    "s = 'é'",
    "s = '🙂'",
    "s = 'NULL'",
    "s = ' '",
    "s = 'user-17'",
    "s = 'absent/value'",
    "s IN ('a/b=c%', 'nope', 'user-400')",
    "s IN ('nope', 'also nope')",
    "s IS NULL",
    "s = NULL",
    "s IN ('x') OR s IS NULL",
    "cat = 'UK'",
    "cat = 'DE'",
    "cat IN ('UK', 'NL')",
    "cat = 'UK' OR big = -1",
    "cat = 'UK' AND id > 3",
    "cat = 'FR' AND s = 'absent'",
    "NOT (cat = 'UK')",
    "cat IS NULL",
    f"big = {2**62}",
    f"big = {2**63 - 1}",
    f"big = {-(2**63)}",
    "big = -1",
    "big IN (0, 104729, 5)",
    "big = 123",
    # A long IN list is probed with numpy against each bloom filter (`ProbeSet`): 40 absent values and one
    # present (104729 * 5), then the same without it.
    "big IN (" + ", ".join(str(7 + 13 * i) for i in range(40)) + ", 523645)",
    "big IN (" + ", ".join(str(7 + 13 * i) for i in range(40)) + ")",
    "big IS NULL",
    "ts = '2026-01-01 02:28:00+00:00'",
    "ts = '2026-01-01 04:28:00+02:00'",
    "ts = '2026-01-01 04:28:00'",
    "ts IN ('2026-01-03 10:00:00+05:30', '2026-01-01 00:37:00Z')",
    "ts = '2027-01-01 00:00:00+00:00'",
    "ts = '2026-01-05 02:01:00+02:00'",
    "naive = '2026-02-01 05:00:00'",
    "naive = '2026-02-01 05:00:01'",
    "d = '2026-01-03'",
    "d IN ('2026-02-15', '2030-01-01')",
    "d IS NULL",
]


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return hostile_table()


@pytest.fixture(scope="module")
def accelerations(tmp_path_factory: pytest.TempPathFactory, table: pa.Table) -> dict[str, Acceleration]:
    built = {}
    for engine, mode in ENGINES:
        name = f"{engine}-{mode}"
        built[name] = build_acceleration(
            tmp_path_factory.mktemp(name),
            table,
            [("b", "bucket(3, id)")],
            engine=engine,
            partition_mode=mode,
            max_rows_per_file=25,
            storage_options={"index": CONFIG},
        )
    return built


def rows_of(result: pa.Table) -> list[int]:
    return sorted(result.column("id").to_pylist())


def test_every_written_file_carries_its_index(accelerations: dict[str, Acceleration]) -> None:
    for name, acc in accelerations.items():
        files = acc.plan().files
        assert len(files) > 20, name
        for file in files:
            assert set(file.index) == set(INDEXED), f"{name}: {file.path} lacks an index"
            assert not file.index["cat"].is_bloom, "six countries fit the value set"
            if file.rows >= 20:
                assert file.index["big"].is_bloom, "20+ distinct integers exceed max_values=8: a bloom filter"
            again = DataFile.from_json(file.to_json())
            assert again == file
            assert again.index == file.index


def test_reads_with_index_columns_equal_duckdb_over_the_source(
    accelerations: dict[str, Acceleration], table: pa.Table
) -> None:
    any_acc = next(iter(accelerations.values()))
    expected = {where: rows_of(any_acc.expected_rows(where, ["id"])) for where in FILTERS}
    skipped: dict[str, int] = {}
    for name, acc in accelerations.items():
        with acc.reader() as reader:
            for where in FILTERS:
                got = rows_of(reader.read(where, columns=["id"]))
                want = expected[where]
                assert got == want, f"{name}: WHERE {where}: {len(got)} rows, DuckDB says {len(want)}"
                if name == "parquet-files":
                    skipped[where] = acc.plan(where).files_skipped_by_index
    for where in (
        "cat = 'UK'",
        "s = 'absent/value'",
        f"big = {2**62}",
        "ts = '2026-01-05 02:01:00+02:00'",
        "d IN ('2026-02-15', '2030-01-01')",
    ):
        assert skipped[where] > 0, f"the index must skip files for WHERE {where}"
    assert skipped["NOT (cat = 'UK')"] == 0, "NOT rules nothing out"


def test_seafowl_case_min_max_cannot_exclude_but_the_index_does(
    accelerations: dict[str, Acceleration], capsys: pytest.CaptureFixture[str]
) -> None:
    acc = accelerations["parquet-files"]
    files = acc.plan().files
    # Every full file spans DE..US: min / max cannot rule out 'UK'.
    full = [f for f in files if f.rows >= 20]
    assert len(full) > len(files) // 2
    assert all(f.stats["cat"].min <= "UK" <= f.stats["cat"].max for f in full)
    plan = acc.plan("cat = 'UK'")
    assert plan.files == [], "Should not read: the index proves 'UK' absent from every file"
    spanning = [f for f in files if f.stats["cat"].min <= "UK" <= f.stats["cat"].max]
    assert plan.files_skipped_by_index == len(spanning), "the index rules out every file statistics keep"
    assert plan.partitions_skipped_by_index == plan.total
    assert "skipped by index" in plan.explain()
    assert all(d.cause == "side index" for d in plan.decisions)
    # Present values are still read, from every file that holds them.
    present = acc.plan("cat = 'DE'")
    de_files = {
        f.path for f in files if f.index["cat"].might_contain(*literal_hashes(["DE"], pa.string()) or [0])
    }
    assert {f.path for f in present.files} == de_files
    assert main(["plan", str(acc.spec_path), acc.dataset, "--where", "cat = 'UK'", "--json"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    assert data["skipped_by_index"] == {"files": len(spanning), "partitions": plan.total}
    assert main(["plan", str(acc.spec_path), acc.dataset, "--where", "cat = 'UK'"]) == 0
    assert "skipped by index" in capsys.readouterr().out


def test_without_an_index_nothing_is_skipped_by_index(tmp_path: Path, table: pa.Table) -> None:
    acc = build_acceleration(tmp_path, table, [("b", "bucket(3, id)")], max_rows_per_file=25)
    plan = acc.plan("cat = 'UK'")
    assert plan.files_skipped_by_index == 0
    spanning = [f for f in acc.plan().files if f.stats["cat"].min <= "UK" <= f.stats["cat"].max]
    assert len(plan.files) == len(spanning) > 20, "min / max alone cannot exclude 'UK' from DE..US"


@pytest.mark.parametrize("distinct", [9, 300, 5000])
def test_bloom_false_positive_rate_is_within_the_configured_bound(distinct: int) -> None:
    config = IndexConfig(("s",), fpp=0.01, max_values=8)
    present = [f"value-{i}/é" for i in range(distinct)]
    index = build_column_index(pa.array([*present, None]), config)
    assert index is not None
    assert index.is_bloom
    assert index.has_null
    assert all(index.might_contain(h) for h in literal_hashes(present, pa.string())), "no false negative"
    probes = literal_hashes([f"absent-{i}" for i in range(40_000)], pa.string())
    assert probes is not None
    rate = sum(index.might_contain(h) for h in probes) / len(probes)
    print(f"side index bloom: {distinct} values, {index.size_bytes} bytes base64, measured fpp {rate:.4%}")
    assert rate <= config.fpp, (
        f"measured false-positive rate {rate:.4%} above the configured {config.fpp:.2%}"
    )
    assert expected_fpp(distinct, bloom_blocks(distinct, config.fpp)) <= config.fpp


def test_long_in_lists_are_judged_like_single_values() -> None:
    config = IndexConfig(("big",), max_values=8)
    rng = random.Random(5)
    present = [rng.randrange(10**12) for _ in range(3000)]
    index = build_column_index(pa.array(present, pa.int64()), config)
    assert index is not None
    assert index.is_bloom
    absent = literal_hashes([rng.randrange(10**12) for _ in range(4000)], pa.int64())
    assert absent is not None
    for start in range(0, len(absent), 50):
        chunk = absent[start : start + 50]
        one_by_one = any(index.might_contain(h) for h in chunk)
        assert index.might_contain_any(ProbeSet(chunk)) == one_by_one
    hit = literal_hashes(present[:1], pa.int64())
    assert hit is not None
    assert index.might_contain_any(ProbeSet([*absent[:60], *hit])), "no false negative in a long list"


def test_hashes_do_not_depend_on_width_or_unit() -> None:
    for kind in (pa.int8(), pa.int32(), pa.uint16(), pa.int64()):
        assert value_hashes(pa.array([5, None, 7], kind)).tolist() == literal_hashes([5, 7], pa.int64())
    instant = dt.datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    hashes = {
        tuple(value_hashes(pa.array([instant], pa.timestamp(unit, "UTC"))).tolist())
        for unit in ("s", "ms", "us", "ns")
    }
    assert len(hashes) == 1
    offset = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert literal_hashes([offset], pa.timestamp("us", "UTC")) == list(hashes.pop())
    day = dt.date(2026, 3, 1)
    assert value_hashes(pa.array([day], pa.date64())).tolist() == literal_hashes([day], pa.date32())
    text = pa.array(["", "é", None, "a/b"])
    assert value_hashes(text).tolist() == value_hashes(text.cast(pa.large_string())).tolist()
    assert value_hashes(pc.dictionary_encode(text)).tolist() == value_hashes(text).tolist()
    assert value_hashes(text.slice(1)).tolist() == value_hashes(pa.array(["é", None, "a/b"])).tolist()


def test_a_column_beyond_max_bytes_gets_no_index_and_is_always_read() -> None:
    config = IndexConfig(("big",), max_values=8, max_bytes=64)
    assert build_column_index(pa.array(range(1000), pa.int64()), config) is None
    assert build_column_index(pa.array([1, 2, None], pa.int64()), config) is not None


def spec_with(params: str, schema: str = "{id: int64, country: string, amount: double}") -> str:
    return f"""
datasets:
  - name: events
    from: file:data/
    params: {{file_format: parquet}}
    schema: {schema}
    acceleration:
      partition_by: ["bucket(4, id)"]
      params: {params}
"""


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("{index_columns: [contry]}", "index_columns: unknown column 'contry'"),
        ("{index_columns: [amount]}", "index columns must be integer, boolean, date, timestamp, string"),
        ("{index_columns: country}", "must be a list of column names"),
        ("{index_columns: [id, id]}", "lists a column twice"),
        (
            "{index_columns: [id], index_fpp: 0.7}",
            "index_fpp must be a false-positive rate between 0 and 0.5",
        ),
        ("{index_fpp: 0.01}", "need params.index_columns"),
        ("{index_columns: [id], index_max_values: -1}", "index_max_values must be an integer"),
        ("{index_colums: [id]}", "index_columns"),
    ],
)
def test_index_settings_are_validated_at_load(tmp_path: Path, params: str, message: str) -> None:
    with pytest.raises(SpecValidationError) as caught:
        parse_spec(spec_with(params), base_dir=tmp_path)
    assert any(message in error for error in caught.value.errors), caught.value.errors


def test_a_valid_spec_gives_every_engine_its_index(tmp_path: Path) -> None:
    project = parse_spec(spec_with("{index_columns: [country, id], index_fpp: 0.02}"), base_dir=tmp_path)
    storage = get_storage(project.dataset("events").acceleration)
    assert storage.index == IndexConfig(("country", "id"), fpp=0.02)
    with pytest.raises(StorageError, match="index_fpp"):
        IndexConfig(("x",), fpp=0)


def latest_files(spec: Path) -> list[DataFile]:
    from airflow_partitions.refresh.pipeline import load_project
    from airflow_partitions.table import open_handle

    project = load_project(spec)
    snapshot = open_handle(project, project.dataset("events")).catalog.latest()
    assert snapshot is not None
    return [f for p in snapshot.partitions for f in snapshot.partitions[p].files]


def test_refresh_writes_and_compaction_build_the_index(tmp_path: Path, table: pa.Table) -> None:
    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook
    from airflow_partitions.refresh import refresh_dataset
    from airflow_partitions.refresh.compaction import compact_dataset
    from airflow_partitions.spec import load_spec
    from airflow_partitions.write.commit import append

    (tmp_path / "src").mkdir()
    pq.write_table(table, tmp_path / "src" / "part0.parquet")
    spec = tmp_path / "datasets.yaml"
    spec.write_text(
        f"""
accelerator_dir: {tmp_path / "acc"}
datasets:
  - name: events
    from: file:{tmp_path / "src"}
    params: {{file_format: parquet}}
    acceleration:
      engine: arrow
      partition_by: ["bucket(3, id)"]
      params: {{index_columns: [cat, s], max_rows_per_file: 40}}
""",
        encoding="utf-8",
    )

    def read(where: str) -> list[int]:
        hook = PartitionedDatasetHook(dataset="events", spec_path=str(spec))
        try:
            return rows_of(hook.read(where))
        finally:
            hook.reader.close()

    refresh_dataset(spec, "events", strategy="arrow")
    files = latest_files(spec)
    assert len(files) > 10
    assert all(set(f.index) == {"cat", "s"} for f in files), "the arrow refresh builds every file's index"
    assert read("cat = 'UK'") == []
    # A write adds rows with a value no file held: its new files carry an index that holds it.
    project = load_spec(spec)
    extra = hostile_table(30, seed=9).set_column(0, "id", pa.array(range(5000, 5030), pa.int64()))
    extra = extra.set_column(2, "cat", pa.array(["UK"] * 30))
    append(open_handle(project, project.dataset("events")), extra)
    files = latest_files(spec)
    assert all(set(f.index) == {"cat", "s"} for f in files), "a write builds the index of its files"
    assert read("cat = 'UK'") == list(range(5000, 5030))
    report = compact_dataset(project, project.dataset("events"))
    assert report.version is not None
    compacted = latest_files(spec)
    assert len(compacted) < len(files)
    assert all(set(f.index) == {"cat", "s"} for f in compacted), "compaction rebuilds merged files' index"
    assert read("cat = 'UK'") == list(range(5000, 5030))
    assert read("cat IN ('DE', 'UK')") == sorted(
        [i for i, c in zip(table.column("id").to_pylist(), table.column("cat").to_pylist()) if c == "DE"]
        + list(range(5000, 5030))
    )


@pytest.mark.spark
@pytest.mark.slow
def test_spark_executors_build_the_index_of_the_files_they_write(spark: Any, tmp_path: Path) -> None:
    from matrix_support import hostile_chunks

    from airflow_partitions.read import PartitionedDatasetReader
    from airflow_partitions.refresh import commit_refresh, finalize_partition, plan_refresh, stage_refresh
    from airflow_partitions.refresh.plan import StageMode
    from airflow_partitions.spec import load_spec

    chunks = hostile_chunks(seed=29, rows=240)
    (tmp_path / "src").mkdir()
    for position, chunk in enumerate(chunks):
        pq.write_table(chunk, tmp_path / "src" / f"chunk-{position}.parquet")
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: trips\n"
        "    from: file:src\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        "      engine: parquet\n"
        "      params: {index_columns: [s, n_int], max_rows_per_file: 20}\n"
        "      partition_by: ['bucket(3, id)']\n"
    )
    project = load_spec(spec)
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    stage = stage_refresh(open_handle(project, dataset), plan, spark=spark)
    assert stage.mode is StageMode.WRITTEN
    results = [finalize_partition(open_handle(project, dataset), stage, item) for item in plan.items]
    commit_refresh(open_handle(project, dataset), plan, results, stage=stage)
    files = [f for result in results for f in result.entry.files]
    assert len(files) > 6
    assert all(set(f.index) == {"s", "n_int"} for f in files), "executor-written files carry the index"
    source = pa.concat_tables(chunks)
    reader = PartitionedDatasetReader(spec, "trips")
    try:
        for where in ("s = 'absent/value'", "s = ''", "n_int IS NULL", "s IN ('é', 'NULL')"):
            got = sorted(reader.read(where, columns=["id"]).column("id").to_pylist())
            want = duckdb_ids(source, where)
            assert got == want, f"WHERE {where}"
        assert reader.plan("s = 'absent/value'").files_skipped_by_index > 0
    finally:
        reader.close()


def duckdb_ids(table: pa.Table, where: str) -> list[int]:
    import duckdb

    connection = duckdb.connect()
    try:
        connection.register("source_rows", table)
        rows = connection.sql(f"SELECT id FROM source_rows WHERE {where}").fetchall()
        return sorted(row[0] for row in rows)
    finally:
        connection.close()


def test_parquet_files_of_several_row_groups_carry_parquet_bloom_filters(tmp_path: Path) -> None:
    import duckdb

    storage = get_storage("parquet", row_group_rows=100, index=IndexConfig(("s",)))
    rows = pa.table({"id": pa.array(range(500), pa.int64()), "s": pa.array([f"v{i}" for i in range(500)])})
    (several,) = storage.write(rows, tmp_path, "b=0")
    (single,) = storage.write(rows.slice(0, 80), tmp_path, "b=1")
    connection = duckdb.connect()
    try:

        def excluded(file: DataFile, value: str) -> list[bool]:
            sql = "SELECT bloom_filter_excludes FROM parquet_bloom_probe(?, 's', ?) ORDER BY row_group_id"
            return [row[0] for row in connection.execute(sql, [str(tmp_path / file.path), value]).fetchall()]

        assert excluded(several, "absent") == [True] * 5, "DuckDB skips every row group by its bloom filter"
        assert excluded(several, "v150") == [True, False, True, True, True]
        assert excluded(single, "absent") == [False], "one row group: no Parquet bloom filter"
    finally:
        connection.close()
