"""Renaming a source column (`renamed_columns: {old: new}`) keeps the field's identity: no spec change.

The acceleration keeps the stored (old) name in its files, catalog and partition spec; reads, filters,
writes and refreshes speak the current name. After the rename, every step is checked: a full read equals
the source row by row (NULLs and types included) and 30 random filters on the new names equal DuckDB over
the source, on the parquet, DuckDB and Arrow IPC engines.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from matrix_support import DuckDBOracle, FilterGenerator, hostile_chunks, multiset_difference

from airflow_partitions.catalog import open_catalog
from airflow_partitions.exceptions import PartitionSpecChangedError, SpecValidationError
from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.refresh.pipeline import refresh_dataset
from airflow_partitions.spec import load_spec
from airflow_partitions.table import open_handle
from airflow_partitions.write import append, delete, upsert

FILTERS_PER_CHECK = 30
RENAMES = {"ts": "event_ts", "x": "x_value"}  # a partition column and a plain one
OLD_FIELDS = ["p_day: date_trunc('day', ts)", "p_s: s"]
NEW_FIELDS = ["p_day: date_trunc('day', event_ts)", "p_s: s"]


def write_spec(
    path: Path,
    engine: str,
    partition_by: list[str],
    renamed: dict[str, str] | None,
    accelerator_dir: str = "acc",
) -> Path:
    fields = []
    for entry in partition_by:
        name, _, expression = entry.partition(": ")
        fields.append(f"        - {{{name}: {json.dumps(expression)}}}")
    lines = [
        f"accelerator_dir: {accelerator_dir}",
        *(["local_scratch_dir: scratch"] if accelerator_dir.startswith("s3://") else []),
        "datasets:",
        "  - name: events",
        "    from: file:src",
        "    params: {file_format: parquet}",
        *([f"    renamed_columns: {json.dumps(renamed)}"] if renamed else []),
        "    acceleration:",
        f"      engine: {engine}",
        "      refresh_mode: append",
        "      refresh: {watermark_column: id}",
        "      primary_key: [id]",
        "      partition_by:",
        *fields,
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


class RenameScenario:
    """A source directory (the truth, in current names), a spec, and the checks against both."""

    def __init__(
        self,
        root: Path,
        seed: int,
        engine: str,
        *,
        fields: tuple[list[str], list[str]] = (OLD_FIELDS, NEW_FIELDS),
        renames: dict[str, str] | None = None,
        accelerator_dir: str = "acc",
    ) -> None:
        self.root = root
        self.seed = seed
        self.engine = engine
        self.rng = random.Random(seed)
        self.old_fields, self.new_fields = fields
        self.renames = renames or RENAMES
        self.accelerator_dir = accelerator_dir
        self.fields = self.old_fields
        self.spec = write_spec(root / "spec.yaml", engine, self.old_fields, None, accelerator_dir)
        self.source = pa.concat_tables(hostile_chunks(seed, rows=90, chunks=2))
        self.next_id = 10**13
        self.checks = 0
        self.save_source()

    def save_source(self) -> None:
        directory = self.root / "src"
        directory.mkdir(exist_ok=True)
        for old in directory.glob("*.parquet"):
            old.unlink()
        pq.write_table(self.source, directory / f"part-{self.checks}.parquet")

    def rename(self, declare: bool = True) -> None:
        """The source renames its columns (`ts` and `x` unless told); the spec follows (declaring the
        rename when `declare`)."""
        names = [self.renames.get(n, n) for n in self.source.column_names]
        self.source = self.source.rename_columns(names)
        self.save_source()
        self.fields = self.new_fields
        renamed = self.renames if declare else None
        write_spec(self.spec, self.engine, self.new_fields, renamed, self.accelerator_dir)

    @property
    def project(self) -> Any:
        return load_spec(self.spec)

    def dataset(self) -> Any:
        return self.project.dataset("events")

    def snapshot(self) -> Any:
        project = self.project
        return open_catalog(project, project.dataset("events")).latest()

    def new_rows(self, count: int) -> pa.Table:
        rows = pa.concat_tables(hostile_chunks(self.rng.randrange(10**6), rows=count, chunks=1))
        rows = rows.rename_columns([self.renames.get(n, n) for n in rows.column_names])
        ids = pa.array(range(self.next_id, self.next_id + rows.num_rows), pa.int64())
        self.next_id += rows.num_rows
        return rows.set_column(0, "id", ids)

    def check(self, step: str, filters: int = 0) -> None:
        """Full read == source (names, types, rows); `filters` random filters on current names == DuckDB."""
        self.checks += 1
        names = self.source.column_names
        reader = PartitionedDatasetReader(self.spec, "events")
        try:
            assert reader.schema().names == names, f"{step}: the reader presents the current names"
            full = reader.read()
            assert full.schema.names == names, step
            assert full.schema == self.source.schema, f"{step}: types kept: {full.schema}"
            missing, extra = multiset_difference(full, self.source)
            assert not missing, f"{step}: full read lacks rows: {missing[:2]}"
            assert not extra, f"{step}: full read has extra rows: {extra[:2]}"
            projected = reader.read(columns=["id", "event_ts"] if "event_ts" in names else ["id", "ts"])
            assert projected.num_rows == self.source.num_rows
            if not filters:
                return
            expressions = [entry.partition(": ")[2] for entry in self.fields]
            generator = FilterGenerator(self.source, expressions, self.seed * 1000 + self.checks)
            oracle = DuckDBOracle(generator.oracle_table())
            try:
                for item in generator.filters(filters):
                    got = reader.read(item.reader_sql).select(names)
                    expected = self.source.take(pa.array(oracle.rows(item.oracle_sql), pa.int64()))
                    missing, extra = multiset_difference(got, expected)
                    assert not missing, f"{step}: filter {item.reader_sql}: {len(missing)} rows missing"
                    assert not extra, f"{step}: filter {item.reader_sql}: {len(extra)} extra rows"
            finally:
                oracle.close()
        finally:
            reader.close()

    def other_reads(self, spark: Any) -> None:
        """Point reads, pruned plans, query() and to_spark speak the current names; old ones are refused."""
        from airflow_partitions.exceptions import FilterError

        reader = PartitionedDatasetReader(self.spec, "events")
        try:
            row_id = self.rng.choice(self.source.column("id").to_pylist())
            point = reader.read(f"id = {row_id}")
            expected = self.source.filter(pc.equal(self.source.column("id"), row_id))
            assert multiset_difference(point, expected) == ([], [])
            stamps = self.source.column("event_ts").drop_null()
            low = pc.min(stamps).as_py()
            plan = reader.plan(f"event_ts < TIMESTAMPTZ '{low.isoformat()}' + INTERVAL 1 HOUR")
            assert 0 < len(plan.selected) < plan.index.size, "the renamed partition column prunes"
            sql = "SELECT * FROM events WHERE x_value > 0 OR event_ts IS NULL"
            got = reader.query(sql)
            assert got.schema == self.source.schema
            keep = pc.or_kleene(
                pc.greater(self.source.column("x_value"), 0), pc.is_null(self.source["event_ts"])
            )
            expected = self.source.filter(pc.fill_null(keep, False))
            assert multiset_difference(got, expected) == ([], [])
            counted = reader.query("SELECT count(event_ts) AS n, count(x_value) AS m FROM events").to_pylist()
            assert counted == [
                {"n": len(stamps), "m": self.source.num_rows - self.source.column("x_value").null_count}
            ]
            frame = reader.to_spark(spark, where="x_value IS NOT NULL", columns=["id", "x_value", "event_ts"])
            assert frame.columns == ["id", "x_value", "event_ts"]
            ids = sorted(row["id"] for row in frame.collect())
            assert ids == sorted(self.source.filter(pc.is_valid(self.source["x_value"]))["id"].to_pylist())
            for stale in ("ts IS NULL", "x > 0"):
                with pytest.raises(FilterError, match="unknown column"):
                    reader.read(stale)
        finally:
            reader.close()

    def stored_names(self) -> set[str]:
        """Column names of every partition file the newest version lists."""
        snapshot = self.snapshot()
        reader = PartitionedDatasetReader(self.spec, "events")
        try:
            names: set[str] = set()
            for path in snapshot.partitions:
                for file in snapshot.partitions[path].files:
                    names.update(reader._read_file_schema(file).names)
            return names
        finally:
            reader.close()


@pytest.mark.parametrize("engine", ["parquet", "duckdb", "arrow"])
def test_a_declared_rename_keeps_the_layout_and_every_row(tmp_path: Path, engine: str, spark: Any) -> None:
    scenario = RenameScenario(tmp_path, 3200 + len(engine), engine)
    refresh_dataset(str(scenario.spec), "events", strategy="arrow")
    scenario.check("before the rename")
    before = scenario.snapshot()

    scenario.rename()
    dataset = scenario.dataset()
    assert dataset.acceleration.partition_spec_id == before.partition_spec.spec_id, "not a spec change"
    assert dataset.renamed_columns == tuple(RENAMES.items())
    scenario.check("renamed, nothing rewritten", FILTERS_PER_CHECK)
    assert scenario.snapshot().version == before.version

    # New source rows (current names) past the watermark: an append refresh, where Spark reads the
    # renamed source (once, on the parquet engine: a Spark refresh costs more than the rest of the test;
    # the other engines take the rows through the Arrow strategy's full refresh of the new source).
    scenario.source = pa.concat_tables([scenario.source, scenario.new_rows(9)])
    scenario.save_source()
    if engine == "parquet":
        summary = refresh_dataset(str(scenario.spec), "events", strategy="spark", spark=spark)
        assert summary.refresh_mode == "append", summary
        # `appended_rows` counts the rows added to partitions already committed; the rest opened new ones.
        assert 0 < summary.appended_rows <= 9, summary
    else:
        refresh_dataset(str(scenario.spec), "events", full=True, strategy="arrow")
    assert scenario.snapshot().partition_spec.spec_id == before.partition_spec.spec_id
    scenario.check("append refresh")

    rows = scenario.new_rows(5)
    append(open_handle(scenario.project, scenario.dataset()), rows)
    scenario.source = pa.concat_tables([scenario.source, rows])
    scenario.save_source()
    scenario.check("append write")

    positions = sorted(scenario.rng.sample(range(scenario.source.num_rows), 4))
    replacement = scenario.new_rows(len(positions) + 1)
    old_ids = scenario.source.column("id").take(pa.array(positions)).to_pylist()
    ids = pa.array([*old_ids, replacement.column("id")[-1].as_py()], pa.int64())
    replacement = replacement.set_column(0, "id", ids)
    upsert(open_handle(scenario.project, scenario.dataset()), replacement, keys=["id"])
    keep = pc.invert(pc.is_in(scenario.source.column("id"), value_set=ids))
    scenario.source = pa.concat_tables([scenario.source.filter(keep), replacement])
    scenario.save_source()
    scenario.check("upsert")

    gone = scenario.source.filter(pc.is_null(scenario.source.column("x_value")))
    delete(open_handle(scenario.project, scenario.dataset()), "x_value IS NULL")
    assert gone.num_rows > 0
    scenario.source = scenario.source.filter(pc.is_valid(scenario.source.column("x_value")))
    scenario.save_source()
    scenario.check("delete on a renamed column")

    low = scenario.rng.choice(scenario.source.column("id").to_pylist())
    refresh_dataset(str(scenario.spec), "events", where=f"id >= {low}", full=True, strategy="arrow")
    scenario.check("partial refresh")

    from airflow_partitions.refresh.compaction import compact_dataset

    compact_dataset(scenario.project, scenario.dataset(), target_file_bytes=1 << 30)
    scenario.check("compaction", FILTERS_PER_CHECK)

    scenario.other_reads(spark)

    after = scenario.snapshot()
    assert after.spec_ids_in_use() == {before.partition_spec.spec_id}
    stored = scenario.stored_names()
    if engine == "parquet":
        assert {"ts", "x"} <= stored, "the files keep the stored names"
        assert not {"event_ts", "x_value"} & stored


EXPRESSION_RENAMES = {"s": "label", "n_int": "n", "ts": "event_ts"}
EXPRESSION_FIELDS = (
    ["p_low: lower(s)", "p_mb: multi_bucket(3, n_int, ts)"],
    ["p_low: lower(label)", "p_mb: multi_bucket(3, n, event_ts)"],
)


@pytest.mark.spark
@pytest.mark.parametrize(("engine", "on_s3"), [("duckdb", False), ("arrow", True)])
def test_expression_and_multi_bucket_fields_follow_a_rename_through_spark_and_verify(
    tmp_path: Path, engine: str, on_s3: bool, spark: Any, request: pytest.FixtureRequest
) -> None:
    """A custom expression and a `multi_bucket` field over renamed columns keep their spec id; a Spark
    append refresh reads the renamed source and routes its rows exactly as the stored fields do (a row
    in another partition would make a pruned filter miss it); `verify` finds every partition equal. On
    the Arrow IPC engine the acceleration lives on S3."""
    from airflow_partitions.refresh.verify import verify_dataset

    accelerator_dir = "acc"
    if on_s3:
        s3 = request.getfixturevalue("s3_server")
        accelerator_dir = f"s3://{request.getfixturevalue('s3_bucket')}/acc"
        monkeypatch = request.getfixturevalue("monkeypatch")
        monkeypatch.setenv("AWS_ENDPOINT_URL", s3["endpoint_url"])
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3["aws_access_key_id"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3["aws_secret_access_key"])
        monkeypatch.setenv("AWS_DEFAULT_REGION", s3["region_name"])
    scenario = RenameScenario(
        tmp_path,
        3300 + len(engine),
        engine,
        fields=EXPRESSION_FIELDS,
        renames=EXPRESSION_RENAMES,
        accelerator_dir=accelerator_dir,
    )
    # The Arrow strategy writes a local accelerator_dir only.
    refresh_dataset(str(scenario.spec), "events", strategy="spark" if on_s3 else "arrow", spark=spark)
    before = scenario.snapshot()

    scenario.rename()
    assert scenario.dataset().acceleration.partition_spec_id == before.partition_spec.spec_id
    scenario.check("renamed")  # the filters run once, after the Spark refresh below

    scenario.source = pa.concat_tables([scenario.source, scenario.new_rows(12)])
    scenario.save_source()
    summary = refresh_dataset(str(scenario.spec), "events", strategy="spark", spark=spark)
    assert summary.refresh_mode == "append", summary
    scenario.check("Spark append refresh of the renamed source", FILTERS_PER_CHECK)

    rows = scenario.new_rows(4)
    append(open_handle(scenario.project, scenario.dataset()), rows)
    scenario.source = pa.concat_tables([scenario.source, rows])
    scenario.save_source()
    report = verify_dataset(str(scenario.spec), "events")
    assert report.ok, report.to_json()
    assert report.counts()["equal"] == len(report.partitions) > 3, report.to_json()
    assert scenario.snapshot().spec_ids_in_use() == {before.partition_spec.spec_id}


def test_status_ap_files_and_multi_dataset_queries_show_the_current_names(tmp_path: Path) -> None:
    """What a user reads about a renamed dataset names its columns as the source does now: `status`
    (partition_by, the rename itself), `ap_files` statistics, and a query joining it to another dataset
    (its filter still prunes the renamed partition column; a join on it runs partition-wise against a
    dataset that stores the column under the new name)."""
    import duckdb

    from airflow_partitions.cli.status import dataset_status, render_status
    from airflow_partitions.read.reader import datasets_query

    scenario = RenameScenario(tmp_path, 3400, "arrow")
    refresh_dataset(str(scenario.spec), "events", strategy="arrow")
    scenario.rename()
    spec_text = scenario.spec.read_text(encoding="utf-8")
    scenario.spec.write_text(
        spec_text + "  - name: copy\n    from: file:src\n    params: {file_format: parquet}\n"
        "    acceleration:\n      engine: parquet\n"
        "      partition_by: [{p_day: \"date_trunc('day', event_ts)\"}]\n",
        encoding="utf-8",
    )
    refresh_dataset(str(scenario.spec), "copy", strategy="arrow")
    project = scenario.project

    report = dataset_status(project, project.dataset("events"))
    assert report["renamed_columns"] == RENAMES
    shown = dict(report["spec_partition_by"])
    assert "event_ts" in shown["p_day"], shown
    assert "(ts" not in shown["p_day"], "the stored name is not what the user sees"
    assert report["catalog_partition_by"] == report["spec_partition_by"]
    assert report["spec_matches_catalog"]
    assert "ts -> event_ts, x -> x_value" in render_status(report)

    source = scenario.source
    with PartitionedDatasetReader(scenario.spec, "events") as reader:
        files = reader.query("SELECT rows, min, max, null_count FROM ap_files('events')")
        stats = files.column("min").type
        names = {stats.field(i).name for i in range(stats.num_fields)}
        assert {"event_ts", "x_value"} <= names, names
        assert not {"ts", "x"} & names, names
        lows = [v["event_ts"] for v in files.column("min").to_pylist() if v["event_ts"] is not None]
        assert min(lows) == pc.min(source.column("event_ts")).as_py()
        nulls = sum(v["x_value"] for v in files.column("null_count").to_pylist())
        assert nulls == source.column("x_value").null_count

        stamps = source.column("event_ts").drop_null()
        middle = pc.min(stamps).as_py() + (pc.max(stamps).as_py() - pc.min(stamps).as_py()) / 2
        sql = (
            "SELECT e.id, e.event_ts, e.x_value, c.s AS copy_s FROM events e JOIN copy c ON e.id = c.id "
            f"WHERE e.event_ts < TIMESTAMPTZ '{middle.isoformat()}' OR e.x_value IS NULL"
        )
        got = reader.query(sql)
        plan = reader.plan_datasets_query(sql)
    on_day = (
        "SELECT e.id, c.id AS copy_id, e.x_value FROM events e JOIN copy c ON e.event_ts = c.event_ts "
        "WHERE e.x_value IS NOT NULL"
    )
    with datasets_query(scenario.spec, split_min_bytes=0) as query:
        joined = query.plan(on_day).joins
        assert [decision.split for decision in joined] == [True], [d.reason for d in joined]
        split = query.query(on_day)
    connection = duckdb.connect()
    try:
        connection.execute("SET TimeZone = 'UTC'")
        connection.register("events", source)
        connection.register("copy", source)
        expected = connection.sql(sql).to_arrow_table()
        expected_split = connection.sql(on_day).to_arrow_table()
    finally:
        connection.close()
    assert got.column_names == ["id", "event_ts", "x_value", "copy_s"]
    assert 0 < got.num_rows < source.num_rows
    assert multiset_difference(got, expected) == ([], [])
    events = plan.plans["events"]
    assert len(events.selected) < events.index.size, "the renamed partition column prunes"
    assert split.num_rows > 0
    assert multiset_difference(split, expected_split) == ([], [])


def test_an_undeclared_rename_is_a_spec_change_naming_renamed_columns(tmp_path: Path) -> None:
    scenario = RenameScenario(tmp_path, 3211, "parquet")
    refresh_dataset(str(scenario.spec), "events", strategy="arrow")
    before = scenario.snapshot()
    scenario.rename(declare=False)
    assert scenario.dataset().acceleration.partition_spec_id != before.partition_spec.spec_id
    with pytest.raises(PartitionSpecChangedError, match="renamed_columns"):
        refresh_dataset(str(scenario.spec), "events", where="id >= 0", strategy="arrow")
    assert scenario.snapshot().version == before.version, "refused: nothing committed"


@pytest.mark.parametrize(
    ("renamed", "partition_by", "message"),
    [
        ("{ts: ts}", "date_trunc('day', ts)", "renamed to itself"),
        ("{ts: a, x: a}", "date_trunc('day', a)", "two columns are renamed to 'a'"),
        ("{ts: a, a: b}", "date_trunc('day', b)", "both a stored and a current name"),
        ("[ts]", "date_trunc('day', ts)", "must be a mapping"),
    ],
)
def test_renamed_columns_is_checked_at_load(
    tmp_path: Path, renamed: str, partition_by: str, message: str
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "datasets:\n  - name: events\n    from: file:src\n    params: {file_format: parquet}\n"
        f"    renamed_columns: {renamed}\n    acceleration:\n"
        f"      partition_by: [{json.dumps(partition_by)}]\n",
        encoding="utf-8",
    )
    with pytest.raises(SpecValidationError, match=message):
        load_spec(spec)


def test_a_new_column_taking_a_renamed_columns_old_name_is_refused(tmp_path: Path) -> None:
    """After `ts` became `event_ts`, a new source column called `ts` would read as the stored `ts`."""
    scenario = RenameScenario(tmp_path, 3212, "parquet")
    refresh_dataset(str(scenario.spec), "events", strategy="arrow")
    scenario.rename()
    scenario.source = scenario.source.append_column("ts", scenario.source.column("event_ts"))
    scenario.save_source()
    with pytest.raises(SpecValidationError, match=r"\['ts'\] would appear twice"):
        refresh_dataset(str(scenario.spec), "events", strategy="arrow")


def test_a_snapshot_taken_before_a_rename_bootstraps_a_replica_that_reads_the_new_names(
    tmp_path: Path, s3_server: dict[str, str], s3_bucket: str
) -> None:
    """The manifest and the files keep the stored names; a replica whose spec declares the rename reads
    them under the current ones, and its spec id matches the snapshot's (no spec change at bootstrap)."""
    from airflow_partitions.snapshots import bootstrap_snapshot, upload_snapshot_manifest

    scenario = RenameScenario(tmp_path, 3213, "parquet")
    refresh_dataset(str(scenario.spec), "events", strategy="arrow")
    snapshot = scenario.snapshot()
    project = scenario.project
    root = open_catalog(project, project.dataset("events")).data_root
    location = f"s3://{s3_bucket}/rename-snapshots"
    upload_snapshot_manifest(s3_server, location, "events", snapshot, dataset_root=root)

    scenario.rename()
    replica_spec = tmp_path / "replica.yaml"
    replica_spec.write_text(
        scenario.spec.read_text(encoding="utf-8").replace("accelerator_dir: acc", "accelerator_dir: replica"),
        encoding="utf-8",
    )
    replica_project = load_spec(replica_spec)
    replica_catalog = open_catalog(replica_project, replica_project.dataset("events"))
    result = bootstrap_snapshot(
        s3_server, location, "events", replica_catalog.data_root, catalog=replica_catalog
    )
    assert result.version == snapshot.version
    scenario.spec = replica_spec
    scenario.check("bootstrapped, read under the new names", FILTERS_PER_CHECK)
    rows = scenario.new_rows(6)
    append(open_handle(scenario.project, scenario.dataset()), rows)
    scenario.source = pa.concat_tables([scenario.source, rows])
    scenario.check("written to the replica under the new names")


# --- Postgres: refresh_mode changes across an ALTER TABLE ... RENAME COLUMN --------------------------

PG_TEXTS = ["a/b", "K=v", "100%", "it's", 'say "hi"', "", None, "É中", "İplain"]


def pg_rows(ids: range, version: int = 0) -> list[tuple[Any, ...]]:
    stamp = dt.datetime(2026, 5, 1, 8, tzinfo=dt.UTC)
    return [
        (
            i,
            PG_TEXTS[(i + version) % len(PG_TEXTS)],
            None if i % 6 == 0 else f"{i * 2.5 + version:.2f}",
            PG_TEXTS[(i + 4) % len(PG_TEXTS)],
            None if i % 7 == 3 else stamp + dt.timedelta(minutes=i + 100 * version),
        )
        for i in ids
    ]


def pg_spec(path: Path, url: str, detection: str, renamed: bool) -> Any:
    region, stamp = ("area", "changed_at") if renamed else ("region", "updated_at")
    watermark = f", watermark_column: {stamp}" if detection == "watermark" else ""
    path.write_text(
        "accelerator_dir: acc\ndatasets:\n  - name: accounts\n    from: postgres:public.accounts\n"
        f"    params: {{url: '{url}', pushdown: always}}\n"
        + ("    renamed_columns: {region: area, updated_at: changed_at}\n" if renamed else "")
        + "    acceleration:\n      refresh_mode: changes\n      primary_key: [id]\n"
        f'      partition_by: [{{r: "lower({region})"}}]\n'
        f"      refresh: {{change_detection: {detection}{watermark}}}\n",
        encoding="utf-8",
    )
    return load_spec(path)


def assert_postgres_equals(project: Any, url: str, seed: int) -> None:
    """Full read == the table (current names, NULLs, types); random filters == DuckDB over the table."""
    import psycopg

    from airflow_partitions.sources import open_dataset_source

    dataset = project.dataset("accounts")
    source = open_dataset_source(dataset).inner.read_all()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM public.accounts").fetchone()[0] == source.num_rows
    reader = PartitionedDatasetReader(project, "accounts")
    try:
        full = reader.read()
        assert full.schema == source.schema, f"{full.schema} != {source.schema}"
        assert multiset_difference(full, source) == ([], [])
        expressions = [dataset.acceleration.partition_by[0].expression]
        generator = FilterGenerator(source, expressions, seed)
        oracle = DuckDBOracle(generator.oracle_table())
        try:
            for item in generator.filters(12):
                got = reader.read(item.reader_sql).select(source.column_names)
                expected = source.take(pa.array(oracle.rows(item.oracle_sql), pa.int64()))
                assert multiset_difference(got, expected) == ([], []), item.reader_sql
        finally:
            oracle.close()
    finally:
        reader.close()


@pytest.mark.postgres
@pytest.mark.parametrize("detection", ["watermark", "cdc"])
def test_a_postgres_rename_follows_changes_refreshes_and_verify(
    tmp_path: Path, detection: str, request: pytest.FixtureRequest
) -> None:
    """`ALTER TABLE ... RENAME COLUMN` of the partition column and the watermark; the spec declares it.
    Changes refreshes keep merging (watermark: read by the new names; cdc: changes written before the
    rename still arrive under the old names), the spec id stays, and `verify` finds every partition equal."""
    import psycopg

    from airflow_partitions.refresh.verify import verify_dataset

    url = request.getfixturevalue("pg_logical_database" if detection == "cdc" else "pg_database")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.accounts (id bigint PRIMARY KEY, region text, balance numeric(12, 2), "
            "note text, updated_at timestamptz)"
        )
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO public.accounts VALUES (%s, %s, %s, %s, %s)", pg_rows(range(40)))
    spec = tmp_path / "spec.yaml"
    project = pg_spec(spec, url, detection, renamed=False)
    assert refresh_dataset(project, "accounts", strategy="arrow").refresh_mode == "full"
    before = open_catalog(project, project.dataset("accounts")).latest()

    later = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
    with psycopg.connect(url, autocommit=True) as conn:
        if detection == "cdc":  # in the slot before the rename: decoded under the old column names
            conn.execute("UPDATE public.accounts SET region = 'moved/=', balance = 1 WHERE id IN (1, 2)")
            conn.execute("DELETE FROM public.accounts WHERE id = 5")
        conn.execute("ALTER TABLE public.accounts RENAME COLUMN region TO area")
        conn.execute("ALTER TABLE public.accounts RENAME COLUMN updated_at TO changed_at")
        conn.execute("UPDATE public.accounts SET area = NULL, changed_at = %s WHERE id = 3", (later,))
        conn.execute("UPDATE public.accounts SET area = 'ÉNEW', changed_at = %s WHERE id = 4", (later,))
        with conn.cursor() as cur:
            rows = [(*row[:4], later) for row in pg_rows(range(100, 106), version=1)]
            cur.executemany("INSERT INTO public.accounts VALUES (%s, %s, %s, %s, %s)", rows)
    project = pg_spec(spec, url, detection, renamed=True)
    dataset = project.dataset("accounts")
    assert dataset.acceleration.partition_spec_id == before.partition_spec.spec_id, "not a spec change"
    summary = refresh_dataset(project, "accounts")
    assert summary.refresh_mode == "changes", summary
    # watermark: 6 new rows, ids 3 and 4, and the newest row before (read again at the watermark);
    # cdc: also ids 1 and 2 updated and id 5 deleted before the rename
    expected_changes = {"watermark": 9, "cdc": 11}[detection]
    assert summary.changed_rows == expected_changes, summary
    after = open_catalog(project, dataset).latest()
    assert after.partition_spec.spec_id == before.partition_spec.spec_id
    assert_postgres_equals(project, url, 41)

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE public.accounts SET area = 'k=V', changed_at = %s WHERE id = 6", (later,))
    assert refresh_dataset(project, "accounts").refresh_mode == "changes"
    assert_postgres_equals(project, url, 42)
    report = verify_dataset(project, "accounts")
    assert report.ok, report.to_json()
    assert report.counts()["equal"] == len(report.partitions) > 3, report.to_json()


PLAN_RENAMES = {"ts": "event_ts", "amount": "price"}
PLAN_FIELDS = (
    ["p_day: date_trunc('day', ts)", "p_amt: truncate(1000, amount)", "p_mb: multi_bucket(2, s, ts)"],
    [
        "p_day: date_trunc('day', event_ts)",
        "p_amt: truncate(1000, price)",
        "p_mb: multi_bucket(2, s, event_ts)",
    ],
)


def test_plan_shows_the_current_names_and_prunes_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`airflow-partitions plan` (text and --json) names a renamed dataset's columns and partition fields
    as the source does now (filter, predicate, residual, per-partition reasons, hints, notes, truncate
    widths), and selects exactly the partitions the same filter selected under the old names."""
    import re

    from airflow_partitions.cli.main import main

    scenario = RenameScenario(tmp_path, 3500, "parquet", fields=PLAN_FIELDS, renames=PLAN_RENAMES)
    refresh_dataset(str(scenario.spec), "events", strategy="arrow")
    source = scenario.source
    stamp = next(v for v in source.column("ts").to_pylist() if v is not None)
    amounts = sorted(v for v in source.column("amount").to_pylist() if v is not None)
    middle = amounts[len(amounts) // 2]
    filters = [  # in the old names; the same with the new names after the rename
        f"ts = TIMESTAMPTZ '{stamp.isoformat()}'",
        f"(amount > {middle} AND amount < {middle + 5}) OR ts IS NULL",
        "s = 'é' AND amount = 1.5",
        "ts IS NOT NULL AND amount * 2 > 1",  # not prunable as written: a residual
    ]

    def plan(where: str) -> tuple[str, dict[str, Any]]:
        assert main(["plan", str(scenario.spec), "events", "--where", where]) == 0
        text = capsys.readouterr().out
        assert main(["plan", str(scenario.spec), "events", "--where", where, "--json"]) == 0
        return text, json.loads(capsys.readouterr().out)

    def choices(document: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [(d["key_path"], d["selected"], d["exact"], d["cause"]) for d in document["partitions"]]

    before = [plan(where) for where in filters]
    shown_before = "\n".join(text + json.dumps(document, ensure_ascii=False) for text, document in before)
    for piece in (  # each place a name is printed, under the old names before the rename
        "(date_trunc('day', ts): ",  # a skipped partition's hint
        "multi_bucket(2, s, ts) prunes only",  # a note
        "file statistics rule out s = 'é': s in [",  # statistics
        "truncate(1000, amount) on decimal(12,2)",  # a truncate field's width
    ):
        assert piece in shown_before, piece
    assert "amount * 2 > 1" in before[-1][1]["residual"], "the residual filter"
    scenario.rename()
    for where, (old_text, old_json) in zip(filters, before, strict=True):
        current = re.sub(r"\bts\b", "event_ts", re.sub(r"\bamount\b", "price", where))
        text, document = plan(current)
        shown = text + "\n" + json.dumps(document, ensure_ascii=False)
        for old, new in PLAN_RENAMES.items():
            found = re.search(rf"\b{old}\b", shown)
            assert not found, f"{where}: {old!r} shown: {shown[max(found.start() - 300, 0) :][:600]}"
            if re.search(rf"\b{old}\b", old_text + json.dumps(old_json, ensure_ascii=False)):
                assert new in shown, f"{where}: {new!r} missing:\n{shown}"
        assert document["selected_partitions"] == old_json["selected_partitions"], where
        assert choices(document) == choices(old_json), where
        assert 0 < document["selected"] < document["total"] or document["selected"] == 0, where
        # The same reasons, under the new names.
        renamed_reasons = [
            re.sub(r"\bts\b", "event_ts", re.sub(r"\bamount\b", "price", d["reason"]))
            for d in old_json["partitions"]
        ]
        assert [d["reason"] for d in document["partitions"]] == renamed_reasons, where
    assert re.search(r'"?price"? \* 2 > 1', document["residual"]), "the residual, under the new names"
    # `plan --query` names the dataset's filter, residual and notes the same way.
    sql = "SELECT id FROM events WHERE event_ts IS NOT NULL AND price * 2 > 1"
    assert main(["plan", str(scenario.spec), "--query", sql]) == 0
    text = capsys.readouterr().out
    assert "filter: event_ts IS NOT NULL" in text, text
    assert "multi_bucket(2, s, event_ts)" in text, text
    assert not re.search(r"\b(ts|amount)\b", text), text
