"""Disk use of the DuckDB engine: small partitions stay small, staged copies go once published."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from airflow_partitions.catalog import Catalog, LocalStore, PartitionEntry, PartitionSpecInfo, open_catalog
from airflow_partitions.keys import PartitionKey
from airflow_partitions.refresh.pipeline import refresh_dataset
from airflow_partitions.snapshots import (
    bootstrap_snapshot,
    upload_partition_snapshot,
    upload_snapshot_manifest,
)
from airflow_partitions.sources import open_source
from airflow_partitions.spec import load_spec
from airflow_partitions.storage import get_storage
from airflow_partitions.storage.duckdb_engine import SHARED_FILE, DuckDBTablesStorage
from airflow_partitions.table import open_handle

SPEC = PartitionSpecInfo.from_fields([("region", "region", "string")])
CITIES = ["Zürich", "a/b", "k=v", "100%", 'say "hi"', "it's", None]
PARTITIONS = 60
KiB = 1024


def _disk_use(directory: Path) -> int:
    """Allocated bytes under `directory`, as `du` counts them."""
    return sum(
        os.lstat(os.path.join(folder, name)).st_blocks * 512
        for folder, _dirs, names in os.walk(directory)
        for name in names
    )


def _files(directory: Path, suffix: str) -> list[Path]:
    return sorted(p for p in directory.rglob(f"*{suffix}") if p.is_file())


def _write_csv_source(directory: Path, rows: int) -> None:
    directory.mkdir(parents=True)
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "city": pa.array([CITIES[i % len(CITIES)] for i in range(rows)], pa.string()),
            "amount": pa.array([None if i % 11 == 3 else i * 0.25 for i in range(rows)], pa.float64()),
            "at": pa.array(
                [
                    None if i % 13 == 5 else dt.datetime(2026, 1, 1) + dt.timedelta(minutes=i)
                    for i in range(rows)
                ],
                pa.timestamp("us"),
            ),
        }
    )
    pacsv.write_csv(table, directory / "orders.csv")


def _spec(tmp_path: Path) -> Path:
    datasets = []
    for name, engine, mode in [
        ("pq", "parquet", None),
        ("files", "duckdb", "files"),
        ("tables", "duckdb", "tables"),
    ]:
        params = f"\n      params: {{partition_mode: {mode}}}" if mode else ""
        datasets.append(
            f"""  - name: {name}
    from: file:{tmp_path / "src"}
    params: {{file_format: csv}}
    acceleration:
      engine: {engine}{params}
      partition_by:
        - b: "bucket({PARTITIONS}, id)\""""
        )
    path = tmp_path / "spec.yaml"
    path.write_text(f"accelerator_dir: {tmp_path / 'acc'}\ndatasets:\n" + "\n".join(datasets) + "\n")
    return path


def _read_all(project: Any, dataset: Any) -> pa.Table:
    catalog = open_catalog(project, dataset)
    snapshot = catalog.latest()
    assert snapshot is not None
    assert catalog.data_root is not None
    files = [f for entry in snapshot.partitions.values() for f in entry.files]
    return get_storage(dataset.acceleration).read(catalog.data_root, files).sort_by("id")


def test_refreshed_duckdb_datasets_stay_near_parquet_size_and_keep_every_row(
    spark: Any, tmp_path: Path
) -> None:
    _write_csv_source(tmp_path / "src", 3000)
    project = load_spec(_spec(tmp_path))
    used: dict[str, int] = {}
    for dataset in project.datasets:
        summary = refresh_dataset(project, dataset, spark=spark)
        assert summary.failed == {}
        # Buckets 0..59 plus the NULL bucket, which is planned even though no id is NULL (and stays empty).
        assert summary.refreshed == PARTITIONS + 1
        used[dataset.name] = _disk_use(open_handle(project, dataset).local_root)
    # The DuckDB datasets hold exactly the rows the parquet one does (same stage, same source).
    expected = _read_all(project, project.dataset("pq"))
    assert expected.num_rows == open_source(project.dataset("pq").source).read_all().num_rows == 3000
    for name in ("files", "tables"):
        rows = _read_all(project, project.dataset(name))
        assert rows.select(expected.column_names).cast(expected.schema).equals(expected), name

    files_root = open_handle(project, project.dataset("files")).local_root
    partition_files = _files(files_root, ".duckdb")
    assert len(partition_files) == PARTITIONS
    biggest = max(p.stat().st_size for p in partition_files)
    assert biggest <= 64 * KiB, (
        f"a 50-row partition file takes {biggest // KiB} KiB (DuckDB default: 524 KiB)"
    )
    assert _files(files_root, ".wal") == [], "no write-ahead log is left next to a partition file"

    tables_root = open_handle(project, project.dataset("tables")).local_root
    assert [p.name for p in _files(tables_root, ".duckdb")] == [SHARED_FILE], (
        "staged per-partition files are deleted once their tables are in the shared file"
    )
    assert _files(tables_root, ".wal") == []
    # DuckDB's floor (12 KiB of headers plus a 16 KiB block per file or table) against parquet's 4 KiB
    # filesystem block per file: these bounds are what small blocks make possible, not the 2x goal.
    assert used["files"] <= 16 * used["pq"], used
    assert used["tables"] <= 6 * used["pq"], used


def _rows(region: str | None, first: int) -> pa.Table:
    return pa.table(
        {
            "region": pa.array([region] * 3, pa.string()),
            "trip_id": pa.array(range(first, first + 3), pa.int64()),
            "note": pa.array(["x'\"", None, ""], pa.string()),
        }
    )


def test_tables_mode_snapshot_round_trip_releases_staged_copies(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    # What get_storage(spec) gives a dataset whose snapshots are enabled: staged copies kept for upload.
    storage = DuckDBTablesStorage(keep_staged=True)
    (tmp_path / "source").mkdir()
    source = Catalog(LocalStore(tmp_path / "source"), "trips", storage=storage)
    assert source.data_root is not None
    root = Path(source.data_root)
    entries = []
    for offset, region in enumerate(["EU", "a/b", "k=v", "Überprüfung ✓", None]):
        key = PartitionKey((region,))
        files = storage.write(_rows(region, offset * 10), root, key.path(SPEC.names))
        # As the refresh DAG does: each partition is uploaded before the commit publishes it.
        upload_partition_snapshot(s3_server, location, root, files, dataset="trips")
        entries.append(PartitionEntry.from_files(key, SPEC, storage.publish(root, files)))
    source.commit(base_version=None, upserts=entries, partition_spec=SPEC)
    snapshot = source.latest()
    assert snapshot is not None
    assert len(_files(root, ".duckdb")) == 6, "staged copies stay until the snapshot has them"

    upload_snapshot_manifest(s3_server, location, "trips", snapshot, dataset_root=root, storage=storage)
    assert [p.name for p in _files(root, ".duckdb")] == [SHARED_FILE], "released once published"
    expected = storage.read(root, [f for e in snapshot.partitions.values() for f in e.files]).sort_by(
        "trip_id"
    )
    assert expected.num_rows == 15

    (tmp_path / "replica").mkdir()
    replica_storage = get_storage("duckdb", "tables", keep_staged=False)
    replica = Catalog(LocalStore(tmp_path / "replica"), "trips", storage=replica_storage)
    assert replica.data_root is not None
    replica_root = Path(replica.data_root)
    result = bootstrap_snapshot(s3_server, location, "trips", replica_root, catalog=replica)
    assert result.files_downloaded == 5
    local = replica.latest()
    assert local is not None
    assert dict(local.partitions) == dict(snapshot.partitions)
    files = [f for e in local.partitions.values() for f in e.files]
    assert replica_storage.read(replica_root, files).sort_by("trip_id").equals(expected)
    assert [p.name for p in _files(replica_root, ".duckdb")] == [SHARED_FILE]

    again = bootstrap_snapshot(s3_server, location, "trips", replica_root, catalog=replica)
    assert (again.files_downloaded, again.committed_version) == (0, None), "nothing fetched twice"


def test_vacuum_removes_staged_copies_left_behind_only_when_nothing_uploads_them(tmp_path: Path) -> None:
    keeping = DuckDBTablesStorage(keep_staged=True)
    catalog = Catalog(LocalStore(tmp_path), "trips", storage=keeping)
    assert catalog.data_root is not None
    root = Path(catalog.data_root)
    key = PartitionKey(("EU",))
    published = keeping.publish(root, keeping.write(_rows("EU", 0), root, key.path(SPEC.names)))
    catalog.commit(
        base_version=None, upserts=[PartitionEntry.from_files(key, SPEC, published)], partition_spec=SPEC
    )
    staged = root / published[0].path
    assert staged.exists()
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)

    catalog.vacuum(retain_versions=1, grace=dt.timedelta(0), now=later)
    assert staged.exists(), "a dataset whose snapshots upload keeps its staged copies for the upload"

    releasing = Catalog(LocalStore(tmp_path), "trips", storage=DuckDBTablesStorage(keep_staged=False))
    dry = releasing.vacuum(retain_versions=1, grace=dt.timedelta(0), now=later, dry_run=True)
    assert published[0].path in {f.path for f in dry.removed_files}
    assert staged.exists(), "a dry run deletes nothing"
    report = releasing.vacuum(retain_versions=1, grace=dt.timedelta(0), now=later)
    assert published[0].path in {f.path for f in report.removed_files}
    assert not staged.exists(), "vacuum removes the staged copy a publish left behind"
    assert keeping.read(root, published).equals(_rows("EU", 0)), "the rows live on in the shared file"


@pytest.mark.parametrize(
    ("mode", "keeps"), [("enabled", True), ("bootstrap_only", False), ("disabled", False)]
)
def test_spec_storage_keeps_staged_copies_only_when_snapshots_upload(
    tmp_path: Path, mode: str, keeps: bool
) -> None:
    location = "\n        location: s3://bucket/prefix" if mode != "disabled" else ""
    (tmp_path / "spec.yaml").write_text(
        f"""accelerator_dir: {tmp_path / "acc"}
datasets:
  - name: trips
    from: file:{tmp_path / "src"}
    acceleration:
      engine: duckdb
      params: {{partition_mode: tables}}
      partition_by:
        - region: region
      snapshots:
        mode: {mode}{location}
"""
    )
    storage = get_storage(load_spec(tmp_path / "spec.yaml").dataset("trips").acceleration)
    assert isinstance(storage, DuckDBTablesStorage)
    assert storage.keep_staged is keeps


@pytest.mark.parametrize("mode", ["files", "tables"])
def test_partition_files_of_the_earlier_layout_still_read_exactly(tmp_path: Path, mode: str) -> None:
    import duckdb

    from airflow_partitions.storage.datafile import DataFile, file_checksum

    table = pa.table(
        {
            "s": pa.array(["Zürich", None, "a/b"], pa.large_string()),
            "ts": pa.array([1, None, 3], pa.timestamp("s", tz="Europe/Oslo")),
        }
    )
    directory = tmp_path / "region=EU"
    directory.mkdir()
    path = directory / "part-0123456789abcdef0123456789abcdef-0000.duckdb"
    # The layout before schema comments: DuckDB's default blocks and a table holding the Arrow schema.
    connection = duckdb.connect(str(path))
    connection.register("t", table)
    connection.execute("CREATE TABLE data AS SELECT * FROM t")
    connection.execute(
        "CREATE TABLE _ap_arrow_schema AS SELECT ?::BLOB AS arrow_schema",
        [table.schema.serialize().to_pybytes()],
    )
    connection.close()
    old = DataFile(
        path=path.relative_to(tmp_path).as_posix(),
        format="duckdb",
        rows=3,
        bytes=path.stat().st_size,
        checksum=file_checksum(path),
    )
    storage = get_storage("duckdb", mode)
    assert storage.read(tmp_path, [old]).equals(table)
    published = storage.publish(tmp_path, [old])
    assert storage.read(tmp_path, published).equals(table), "exact types survive publishing too"

    new = storage.write(table, tmp_path, "region=US")
    assert storage.read(tmp_path, storage.publish(tmp_path, new)).equals(table)
    connection = duckdb.connect(str(tmp_path / new[0].path), read_only=True)
    names = [row[0] for row in connection.sql("SELECT table_name FROM duckdb_tables()").fetchall()]
    connection.close()
    assert names == ["data"], "new files keep the schema in the table comment, not in a second table"


def _version_rows(region: str | None, version: int, rows: int) -> pa.Table:
    first = version * 100_000
    return pa.table(
        {
            "region": pa.array([region] * rows, pa.string()),
            "trip_id": pa.array(range(first, first + rows), pa.int64()),
            "note": pa.array(
                [f"v{version} 'n°{i}' \"q\"" if i % 7 else None for i in range(rows)], pa.string()
            ),
        }
    )


def _publish_version(catalog: Catalog, storage: DuckDBTablesStorage, version: int, rows: int) -> None:
    assert catalog.data_root is not None
    root = Path(catalog.data_root)
    entries = []
    for region in ["EU", "a/b", "k=v", "Überprüfung ✓", None]:
        key = PartitionKey((region,))
        files = storage.write(_version_rows(region, version, rows), root, key.path(SPEC.names))
        entries.append(PartitionEntry.from_files(key, SPEC, storage.publish(root, files)))
    latest = catalog.latest()
    catalog.commit(base_version=latest.version if latest else None, upserts=entries, partition_spec=SPEC)


def _retained_tables(catalog: Catalog, storage: DuckDBTablesStorage) -> dict[str, pa.Table]:
    assert catalog.data_root is not None
    snapshot = catalog.latest()
    assert snapshot is not None
    return {
        str(f.table): storage.read(Path(catalog.data_root), [f])
        for entry in snapshot.partitions.values()
        for f in entry.files
    }


def test_vacuum_compacts_the_shared_tables_file_keeping_retained_tables_identical(tmp_path: Path) -> None:
    storage = DuckDBTablesStorage(keep_staged=False)
    catalog = Catalog(LocalStore(tmp_path / "grown"), "trips", storage=storage)
    assert catalog.data_root is not None
    shared = Path(catalog.data_root) / SHARED_FILE
    for version in range(11):
        _publish_version(catalog, storage, version, rows=2000 + version)
    expected = _retained_tables(catalog, storage)
    before = shared.stat().st_size
    # The same retained rows published once into a fresh file: what the file needs.
    fresh = Catalog(LocalStore(tmp_path / "fresh"), "trips", storage=storage)
    _publish_version(fresh, storage, 10, rows=2010)
    assert fresh.data_root is not None
    needed = (Path(fresh.data_root) / SHARED_FILE).stat().st_size

    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    dry = catalog.vacuum(retain_versions=1, grace=dt.timedelta(0), now=later, dry_run=True)
    assert [(c.path, c.bytes_before) for c in dry.shared_files] == [(SHARED_FILE, before)]
    assert shared.stat().st_size == before, "a dry run rewrites nothing"

    report = catalog.vacuum(retain_versions=1, grace=dt.timedelta(0), now=later)
    after = shared.stat().st_size
    (compaction,) = report.shared_files
    assert (compaction.path, compaction.bytes_before, compaction.bytes_after) == (SHARED_FILE, before, after)
    assert report.to_json()["shared_files"] == [
        {"path": SHARED_FILE, "bytes_before": before, "bytes_after": after, "compacted": True}
    ]
    assert after <= needed * 1.25, f"{before} -> {after} bytes; the retained tables need {needed}"
    assert _retained_tables(catalog, storage) == expected, "retained tables read back identical"
    assert sorted(p.name for p in shared.parent.iterdir() if p.is_file()) == [SHARED_FILE], (
        "no copy, temporary or WAL is left next to the shared file"
    )
    # Publishing and vacuuming go on over the compacted file.
    _publish_version(catalog, storage, 11, rows=5)
    assert all(t.num_rows == 5 for t in _retained_tables(catalog, storage).values())
    again = catalog.vacuum(retain_versions=1, grace=dt.timedelta(0), now=later + dt.timedelta(hours=1))
    assert len([f for f in again.removed_files if f.path.startswith(SHARED_FILE)]) == 5
