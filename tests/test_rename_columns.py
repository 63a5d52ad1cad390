"""Renaming a source column (`renamed_columns: {old: new}`) keeps the field's identity: no spec change.

The acceleration keeps the stored (old) name in its files, catalog and partition spec; reads, filters,
writes and refreshes speak the current name. After the rename, every step is checked: a full read equals
the source row by row (NULLs and types included) and 30 random filters on the new names equal DuckDB over
the source, on the parquet, DuckDB and Arrow IPC engines.
"""

from __future__ import annotations

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


def write_spec(path: Path, engine: str, partition_by: list[str], renamed: dict[str, str] | None) -> Path:
    fields = []
    for entry in partition_by:
        name, _, expression = entry.partition(": ")
        fields.append(f"        - {{{name}: {json.dumps(expression)}}}")
    lines = [
        "accelerator_dir: acc",
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

    def __init__(self, root: Path, seed: int, engine: str) -> None:
        self.root = root
        self.seed = seed
        self.engine = engine
        self.rng = random.Random(seed)
        self.fields = OLD_FIELDS
        self.spec = write_spec(root / "spec.yaml", engine, OLD_FIELDS, None)
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
        """The source renames `ts` and `x`; the spec follows (declaring the rename when `declare`)."""
        self.source = self.source.rename_columns([RENAMES.get(n, n) for n in self.source.column_names])
        self.save_source()
        self.fields = NEW_FIELDS
        write_spec(self.spec, self.engine, NEW_FIELDS, RENAMES if declare else None)

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
        rows = rows.rename_columns([RENAMES.get(n, n) for n in rows.column_names])
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
        ("{n_int: m}", "m * 2", "reads a renamed column"),
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


def test_a_rename_with_refresh_mode_changes_is_refused_at_load(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "datasets:\n  - name: events\n    from: file:src\n    params: {file_format: parquet}\n"
        "    renamed_columns: {ts: event_ts}\n    acceleration:\n      partition_by: [s]\n"
        "      refresh_mode: changes\n      refresh: {watermark_column: event_ts}\n      primary_key: [id]\n",
        encoding="utf-8",
    )
    with pytest.raises(SpecValidationError, match="refresh_mode changes does not follow a rename"):
        load_spec(spec)
