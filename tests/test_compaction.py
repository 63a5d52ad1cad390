"""Compaction: small files merged per partition in one commit, every row kept, conflicts lose nothing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from matrix_support import hostile_chunks, row_digests
from test_pruning_support import Acceleration, build_acceleration

from airflow_partitions.catalog import PartitionEntry
from airflow_partitions.cli.main import main
from airflow_partitions.exceptions import CommitConflictError, CompactionError, ConservationError
from airflow_partitions.refresh.compaction import (
    compact_dataset,
    parse_size,
    plan_compaction,
    run_compaction,
)
from airflow_partitions.spec import load_spec
from airflow_partitions.storage import get_storage

# A NULL partition and four buckets: few partitions keep the DuckDB engines quick.
PARTITION_BY = [("b", "bucket(4, n_int)")]
ENGINES = {
    "parquet": ("parquet", "files"),
    "duckdb_files": ("duckdb", "files"),
    "duckdb_tables": ("duckdb", "tables"),
    "arrow": ("arrow", "files"),
}
PIECES = 3


def hostile_table() -> pa.Table:
    return pa.concat_tables(hostile_chunks(seed=11, rows=240, chunks=2))


def fragmented(directory: Path, engine: str) -> Acceleration:
    """An acceleration whose every partition of 3+ rows holds 3 files: the first commit's rows, rewritten
    in slices by a second commit (the same rows, more files)."""
    name, mode = ENGINES[engine]
    acc = build_acceleration(directory, hostile_table(), PARTITION_BY, engine=name, partition_mode=mode)
    storage = get_storage(name, mode)
    root = acc.root / acc.dataset
    snapshot = acc.catalog.latest()
    assert snapshot is not None
    entries = []
    for key_path in snapshot.partitions:
        entry: PartitionEntry = snapshot.partitions[key_path]
        rows = storage.read(root, entry.files)
        step = max(1, -(-rows.num_rows // PIECES))
        files = []
        for offset in range(0, rows.num_rows, step):
            files += storage.publish(root, storage.write(rows.slice(offset, step), root, key_path))
        entries.append(entry.with_files(files))
    acc.catalog.commit(base_version=snapshot.version, upserts=entries, partition_spec=snapshot.partition_spec)
    return acc


def read_all(acc: Acceleration) -> pa.Table:
    with acc.reader() as reader:
        return reader.read()


def file_count(acc: Acceleration) -> int:
    snapshot = acc.catalog.latest()
    assert snapshot is not None
    return sum(len(snapshot.partitions[p].files) for p in snapshot.partitions)


def project_of(acc: Acceleration) -> tuple[object, object]:
    project = load_spec(acc.spec_path)
    return project, project.dataset(acc.dataset)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_compaction_keeps_every_row_and_merges_the_files(tmp_path: Path, engine: str) -> None:
    acc = fragmented(tmp_path, engine)
    before = read_all(acc)
    files_before = file_count(acc)
    project, dataset = project_of(acc)
    report = compact_dataset(project, dataset, catalog=acc.catalog)  # type: ignore[arg-type]
    assert report.version is not None, "fragmented partitions must be compacted"
    assert report.partitions
    head = acc.catalog.versions()[-1]
    assert head.operation == "compact"
    assert head.version == report.version
    after = read_all(acc)
    assert (
        Counter(row_digests(after)) == Counter(row_digests(before)) == Counter(row_digests(hostile_table()))
    ), f"{engine}: a full read after compaction must hold exactly the rows before it"
    assert after.schema == before.schema
    snapshot = acc.catalog.latest()
    assert snapshot is not None
    assert all(len(snapshot.partitions[p].files) <= 1 for p in snapshot.partitions), (
        "with the default 128MB target every partition fits in one file"
    )
    assert file_count(acc) < files_before
    assert report.files_before == sum(len(p.merged) + len(p.kept) for p in report.partitions)
    # Statistics are recomputed from the merged rows: NULL counts add up to the partition's NULLs.
    for key_path in snapshot.partitions:
        entry = snapshot.partitions[key_path]
        for f in entry.files:
            assert f.rows == entry.rows
            assert set(f.stats) >= {"id", "n_int", "s"}
    # A second compaction finds nothing left to merge.
    again = compact_dataset(project, dataset, catalog=acc.catalog)  # type: ignore[arg-type]
    assert again.version is None
    assert not again.partitions


def test_parquet_compaction_sorts_merged_rows_by_sort_by(tmp_path: Path) -> None:
    acc = fragmented(tmp_path, "parquet")
    project, dataset = project_of(acc)
    assert tuple(dataset.acceleration.sort_columns) == ("n_int",)  # type: ignore[attr-defined]
    compact_dataset(project, dataset, catalog=acc.catalog)  # type: ignore[arg-type]
    snapshot = acc.catalog.latest()
    assert snapshot is not None
    checked = 0
    for key_path in snapshot.partitions:
        for f in snapshot.partitions[key_path].files:
            values = pq.read_table(acc.root / acc.dataset / f.path).column("n_int").to_pylist()
            present = [v for v in values if v is not None]
            assert present == sorted(present), f"{f.path}: rows must be sorted by n_int"
            assert values[len(present) :] == [None] * (len(values) - len(present)), "NULLs sort last"
            checked += len(values)
    assert checked == hostile_table().num_rows


def test_target_rows_cuts_files_and_leaves_large_files_alone(tmp_path: Path) -> None:
    acc = fragmented(tmp_path, "arrow")
    project, dataset = project_of(acc)
    before = read_all(acc)
    report = compact_dataset(project, dataset, target_rows=50, catalog=acc.catalog)  # type: ignore[arg-type]
    snapshot = acc.catalog.latest()
    assert snapshot is not None
    assert report.version is not None
    assert all(f.rows <= 50 for p in snapshot.partitions for f in snapshot.partitions[p].files)
    assert Counter(row_digests(read_all(acc))) == Counter(row_digests(before))


def test_dry_run_and_selection_write_nothing_outside_them(tmp_path: Path) -> None:
    acc = fragmented(tmp_path, "parquet")
    project, dataset = project_of(acc)
    head = acc.catalog.head_version()
    dry = compact_dataset(project, dataset, dry_run=True, catalog=acc.catalog)  # type: ignore[arg-type]
    assert dry.dry_run
    assert dry.version is None
    assert dry.partitions
    assert acc.catalog.head_version() == head, "a dry run commits nothing"
    selected = compact_dataset(
        project,  # type: ignore[arg-type]
        dataset,  # type: ignore[arg-type]
        where="bucket(4, n_int) = 1 OR n_int IS NULL",
        catalog=acc.catalog,
    )
    assert {p.key_path for p in selected.partitions} == {"b=1", "b=%NULL"}
    assert acc.catalog.head_version() == selected.version
    with pytest.raises(CompactionError, match="has no partition"):
        compact_dataset(project, dataset, partitions=["b=9"], catalog=acc.catalog)  # type: ignore[arg-type]


def test_concurrent_refresh_of_a_partition_conflicts_and_loses_nothing(tmp_path: Path) -> None:
    acc = fragmented(tmp_path, "parquet")
    project, dataset = project_of(acc)
    plan = plan_compaction(project, dataset, catalog=acc.catalog)  # type: ignore[arg-type]
    target = plan.partitions[0].key_path
    # A refresh of that partition commits after the compaction was planned: one new file with one row less.
    snapshot = acc.catalog.latest()
    assert snapshot is not None
    entry = snapshot.partitions[target]
    storage = get_storage("parquet")
    root = acc.root / acc.dataset
    refreshed = storage.read(root, entry.files).slice(1)
    files = storage.write(refreshed, root, target)
    refresh_version = acc.catalog.commit(
        base_version=snapshot.version,
        upserts=[entry.with_files(files)],
        partition_spec=snapshot.partition_spec,
    )
    with pytest.raises(CommitConflictError):
        run_compaction(project, dataset, plan, catalog=acc.catalog)  # type: ignore[arg-type]
    assert acc.catalog.head_version() == refresh_version, "the compaction published nothing"
    head = acc.catalog.latest()
    assert head is not None
    assert head.partitions[target].files == tuple(files), "the refresh's files stay the partition's files"
    with acc.reader() as reader:
        rows = reader.read()
    assert rows.num_rows == hostile_table().num_rows - 1, "every row of the refreshed version is readable"
    # The compaction's new files are on disk but unreferenced: vacuum's to remove.
    referenced = {f.path for f in acc.catalog.referenced_files()}
    on_disk = {str(p.relative_to(root)) for p in root.rglob("part-*.parquet")}
    assert on_disk - referenced, "the conflicting compaction's files are left for vacuum"


def test_row_count_mismatch_publishes_nothing(tmp_path: Path) -> None:
    acc = fragmented(tmp_path, "arrow")
    project, dataset = project_of(acc)
    snapshot = acc.catalog.latest()
    assert snapshot is not None
    victim = next(p for p in snapshot.partitions if len(snapshot.partitions[p].files) > 1)
    entry = snapshot.partitions[victim]
    # The catalog records one row more than the first file holds: compaction must not paper over it.
    first = entry.files[0]
    lying = type(first)(first.path, first.format, first.rows + 1, first.bytes, first.checksum, first.stats)
    version = acc.catalog.commit(
        base_version=snapshot.version,
        upserts=[entry.with_files((lying, *entry.files[1:]))],
        partition_spec=snapshot.partition_spec,
    )
    with pytest.raises(ConservationError, match=victim.replace("%", "%")) as caught:
        compact_dataset(project, dataset, catalog=acc.catalog)  # type: ignore[arg-type]
    expected, actual = caught.value.partitions[victim]
    assert expected == entry.rows + 1
    assert actual == entry.rows
    assert acc.catalog.head_version() == version


def test_cli_compact_reports_progress_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    acc = fragmented(tmp_path, "duckdb_files")
    before = read_all(acc)
    assert main(["compact", str(acc.spec_path), acc.dataset, "--dry-run", "--target-file-size", "1MB"]) == 0
    out = capsys.readouterr().out
    assert "dry run" in out
    assert "would merge" in out
    assert main(["compact", str(acc.spec_path), acc.dataset, "--json"]) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["partitions_compacted"] > 0
    assert document["files_after"] < document["files_before"]
    assert "[1/" in captured.err, "progress lines go to stderr with --json"
    assert Counter(row_digests(read_all(acc))) == Counter(row_digests(before))
    assert main(["compact", str(acc.spec_path)]) == 0
    assert "nothing to compact" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["compact", str(acc.spec_path), acc.dataset, "--target-file-size", "lots"])
    assert "invalid size 'lots'" in capsys.readouterr().err


def test_parse_size() -> None:
    assert parse_size("128MB") == 128 << 20
    assert parse_size("1.5 GiB") == int(1.5 * (1 << 30))
    assert parse_size("4096") == 4096
    for bad in ("", "MB", "-1MB", "3 parsecs"):
        with pytest.raises(CompactionError, match="invalid size"):
            parse_size(bad)


def test_compact_operator_runs_the_core_and_returns_totals(tmp_path: Path) -> None:
    from airflow_partitions.exceptions import OrchestrationError
    from airflow_partitions.operators import CompactOperator

    acc = fragmented(tmp_path, "parquet")
    before = read_all(acc)
    with pytest.raises(OrchestrationError, match="target_file_bytes"):
        CompactOperator(task_id="bad", spec_path=acc.spec_path, dataset=acc.dataset, target_file_bytes=0)
    dry = CompactOperator(task_id="dry", spec_path=acc.spec_path, dataset=acc.dataset, report_only=True)
    assert dry.execute({})["version"] is None  # type: ignore[arg-type]
    operator = CompactOperator(task_id="compact", spec_path=acc.spec_path, dataset=acc.dataset)
    summary = operator.execute({})  # type: ignore[arg-type]
    assert summary["version"] == acc.catalog.head_version()
    assert summary["partitions"] > 0
    json.dumps(summary)  # XCom-safe
    assert Counter(row_digests(read_all(acc))) == Counter(row_digests(before))
