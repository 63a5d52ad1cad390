"""Storage engines: exact round trips of every supported type, stats, file naming, DuckDB views, vacuum."""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import os
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from airflow_partitions.exceptions import StorageError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.storage import (
    ColumnStats,
    DataFile,
    PartitionStorage,
    get_storage,
    partition_directory,
    vacuum_files,
)
from airflow_partitions.storage.datafile import STATS_PREFIX_LENGTH, compute_column_stats
from airflow_partitions.storage.duckdb_engine import SHARED_FILE

ENGINES = [("parquet", "files"), ("arrow", "files"), ("duckdb", "files"), ("duckdb", "tables")]
ENGINE_IDS = ["parquet", "arrow", "duckdb-files", "duckdb-tables"]


def all_types_table() -> pa.Table:
    """Every supported type, with extremes and a NULL in each column."""
    big = decimal.Decimal("12345678901234567890.123456789012345678")
    return pa.table(
        {
            "i8": pa.array([-128, 127, None], pa.int8()),
            "i16": pa.array([-32768, 32767, None], pa.int16()),
            "i32": pa.array([-(2**31), 2**31 - 1, None], pa.int32()),
            "i64": pa.array([-(2**63), 2**63 - 1, None], pa.int64()),
            "u8": pa.array([0, 255, None], pa.uint8()),
            "u16": pa.array([0, 65535, None], pa.uint16()),
            "u32": pa.array([0, 2**32 - 1, None], pa.uint32()),
            "u64": pa.array([0, 2**64 - 1, None], pa.uint64()),
            "f32": pa.array([1.5, -3.25, None], pa.float32()),
            "f64": pa.array([1e300, float("-inf"), None], pa.float64()),
            "dec": pa.array([big, decimal.Decimal("-0.000000000000000001"), None], pa.decimal128(38, 18)),
            "dec_small": pa.array(
                [decimal.Decimal("123.45"), decimal.Decimal("-0.01"), None], pa.decimal128(5, 2)
            ),
            "s": pa.array(["plain", "é\n\"'\t日本🙂", None], pa.string()),
            "ls": pa.array(["x" * 10_000, "", None], pa.large_string()),
            "b": pa.array([b"\x00\xff\x10", b"", None], pa.binary()),
            "bo": pa.array([True, False, None], pa.bool_()),
            "d": pa.array([dt.date(1, 1, 1), dt.date(9999, 12, 31), None], pa.date32()),
            "ts_s": pa.array([-1, 1_700_000_000, None], pa.timestamp("s")),
            "ts_ms": pa.array([-1, 1_700_000_000_123, None], pa.timestamp("ms")),
            "ts_us": pa.array([-1, 1_700_000_000_123_456, None], pa.timestamp("us")),
            "ts_ns": pa.array([-1, 1_700_000_000_123_456_789, None], pa.timestamp("ns")),
            "tz_s": pa.array([-1, 1_700_000_000, None], pa.timestamp("s", "America/New_York")),
            "tz_ms": pa.array([-1, 1_700_000_000_123, None], pa.timestamp("ms", "Europe/Paris")),
            "tz_us": pa.array([-1, 1_700_000_000_123_456, None], pa.timestamp("us", "UTC")),
            "tz_ns": pa.array([-1, 1_700_000_000_123_456_789, None], pa.timestamp("ns", "Asia/Tokyo")),
        }
    )


def write_published(storage: PartitionStorage, table: pa.Table, root: Path, key_path: str) -> list[DataFile]:
    return storage.publish(root, storage.write(table, root, key_path))


@pytest.mark.parametrize(("engine", "mode"), ENGINES, ids=ENGINE_IDS)
def test_every_supported_type_round_trips_exactly(tmp_path: Path, engine: str, mode: str) -> None:
    storage = get_storage(engine, mode)
    table = all_types_table()
    files = write_published(storage, table, tmp_path, "k=1")
    back = storage.read(tmp_path, files)
    assert back.schema.equals(table.schema), f"{engine}/{mode} changed the schema:\n{back.schema}"
    mismatched = [name for name in table.column_names if not back.column(name).equals(table.column(name))]
    assert not mismatched, f"{engine}/{mode} changed values of {mismatched}"
    assert back.to_pylist() == table.to_pylist()


@pytest.mark.parametrize(("engine", "mode"), ENGINES, ids=ENGINE_IDS)
def test_descriptor_records_rows_bytes_checksum_and_stats(tmp_path: Path, engine: str, mode: str) -> None:
    storage = get_storage(engine, mode)
    table = all_types_table()
    (file,) = write_published(storage, table, tmp_path, "k=1")
    on_disk = tmp_path / file.path
    assert file.path.startswith("k=1/part-")
    assert file.format == engine
    assert file.rows == 3
    assert file.bytes == on_disk.stat().st_size
    assert file.checksum == hashlib.sha256(on_disk.read_bytes()).hexdigest()
    assert file.stats["i64"] == ColumnStats(-(2**63), 2**63 - 1, 1)
    assert file.stats["u64"] == ColumnStats(0, 2**64 - 1, 1)
    assert file.stats["d"] == ColumnStats(dt.date(1, 1, 1), dt.date(9999, 12, 31), 1)
    assert file.stats["bo"] == ColumnStats(False, True, 1)
    assert file.stats["dec_small"] == ColumnStats(decimal.Decimal("-0.01"), decimal.Decimal("123.45"), 1)
    if mode == "tables":
        assert file.table is not None
        assert file.table.startswith("p_")
    else:
        assert file.table is None
    assert DataFile.from_json(file.to_json()) == file


def test_stats_bounds_are_never_tighter_than_the_data() -> None:
    long_text = "m" * (STATS_PREFIX_LENGTH + 50)
    table = pa.table(
        {
            "text": pa.array(["a" + long_text, "z" + long_text, None]),
            "blob": pa.array([b"\x00" * 100, b"\xff" * 100, b"\x01"]),
            "ns": pa.array([1_500, 2_001, None], pa.timestamp("ns")),
            "tz": pa.array([1_500, 2_001, None], pa.timestamp("ns", "Europe/Paris")),
            "nan": pa.array([1.0, float("nan"), 3.0]),
            "only_nan": pa.array([float("nan")]).take(pa.array([0, 0, 0])),
            "all_null": pa.array([None, None, None], pa.int32()),
            "listy": pa.array([[1], [2], None], pa.list_(pa.int64())),
        }
    )
    stats = compute_column_stats(table)
    text = stats["text"]
    assert len(text.min) == STATS_PREFIX_LENGTH
    assert ("a" + long_text) >= text.min
    assert text.max > "z" + long_text, "a truncated max must be rounded up above every value"
    assert stats["blob"].max is None or stats["blob"].max > b"\xff" * 100
    assert stats["blob"].min == b"\x00" * STATS_PREFIX_LENGTH
    epoch = dt.datetime(1970, 1, 1)
    assert stats["ns"] == ColumnStats(
        epoch + dt.timedelta(microseconds=1), epoch + dt.timedelta(microseconds=3), 1
    )
    assert stats["tz"].min == dt.datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=dt.UTC)
    assert stats["nan"] == ColumnStats(1.0, None, 0), "NaN sorts above numbers in SQL: max must be unknown"
    assert stats["only_nan"] == ColumnStats(None, None, 0)
    assert stats["all_null"] == ColumnStats(None, None, 3)
    assert stats["listy"] == ColumnStats(None, None, 1)
    round_tripped = {k: ColumnStats.from_json(v.to_json()) for k, v in stats.items()}
    assert round_tripped == stats


def test_infinite_float_stats_survive_json() -> None:
    stats = compute_column_stats(pa.table({"f": [float("-inf"), 0.5, float("inf")]}))["f"]
    assert stats == ColumnStats(float("-inf"), float("inf"), 0)
    assert ColumnStats.from_json(stats.to_json()) == stats


@pytest.mark.parametrize(("engine", "mode"), ENGINES, ids=ENGINE_IDS)
def test_writes_never_overwrite_and_leave_no_temporaries(tmp_path: Path, engine: str, mode: str) -> None:
    storage = get_storage(engine, mode)
    first = storage.write(pa.table({"x": [1]}), tmp_path, "k=1")
    second = storage.write(pa.table({"x": [2]}), tmp_path, "k=1")
    assert first[0].path != second[0].path
    assert storage.read(tmp_path, first).column("x").to_pylist() == [1]
    assert storage.read(tmp_path, second).column("x").to_pylist() == [2]
    leftovers = [
        p.name for p in (tmp_path / "k=1").iterdir() if p.name.startswith(".tmp-") or ".wal" in p.name
    ]
    assert leftovers == []


@pytest.mark.parametrize("engine", ["parquet", "arrow"])
def test_large_partition_splits_by_row_count_and_reads_back_in_order(tmp_path: Path, engine: str) -> None:
    storage = get_storage(engine, max_rows_per_file=400)
    table = pa.table({"x": pa.array(range(1000), pa.int64())})
    files = storage.write(table, tmp_path, "k=1")
    assert [f.rows for f in files] == [400, 400, 200]
    assert [f.stats["x"].min for f in files] == [0, 400, 800]
    assert storage.read(tmp_path, files).equals(table)


@pytest.mark.parametrize(("engine", "mode"), ENGINES, ids=ENGINE_IDS)
def test_read_projects_filters_and_unifies_schemas(tmp_path: Path, engine: str, mode: str) -> None:
    storage = get_storage(engine, mode)
    old = write_published(storage, pa.table({"id": [1, 2], "v": ["a", "b"]}), tmp_path, "k=1")
    new = write_published(
        storage, pa.table({"id": [3, 4], "v": ["c", "d"], "extra": [1.5, None]}), tmp_path, "k=2"
    )
    both = storage.read(tmp_path, [*old, *new])
    assert both.column_names == ["id", "v", "extra"]
    assert both.column("extra").to_pylist() == [None, None, 1.5, None], (
        "a column missing from a file reads as NULL"
    )
    filtered = storage.read(tmp_path, [*old, *new], columns=["v"], filter=pc.field("id") >= 2)
    assert filtered.to_pylist() == [{"v": "b"}, {"v": "c"}, {"v": "d"}]
    empty = storage.read(tmp_path, [], schema=pa.schema([("id", pa.int64())]))
    assert empty.num_rows == 0
    assert empty.column_names == ["id"]
    with pytest.raises(StorageError, match="unknown column"):
        storage.read(tmp_path, old, columns=["nope"])


@pytest.mark.parametrize(("engine", "mode"), ENGINES, ids=ENGINE_IDS)
def test_duckdb_scans_exactly_the_selected_files(tmp_path: Path, engine: str, mode: str) -> None:
    storage = get_storage(engine, mode)
    selected = write_published(
        storage, pa.table({"id": [1, 2], "u": pa.array([2**64 - 1, 0], pa.uint64())}), tmp_path, "k=1"
    )
    skipped = write_published(
        storage, pa.table({"id": [99], "u": pa.array([7], pa.uint64())}), tmp_path, "k=2"
    )
    assert skipped
    connection = duckdb.connect()
    storage.register_duckdb(connection, tmp_path, selected, "part view")
    rows = connection.sql('SELECT id, u FROM "part view" ORDER BY id').fetchall()
    assert rows == [(1, 2**64 - 1), (2, 0)]
    # Registering again (another query on the same connection) reuses attachments.
    storage.register_duckdb(connection, tmp_path, [*selected, *skipped], "all_parts")
    assert connection.sql("SELECT count(*) FROM all_parts").fetchall() == [(3,)]
    storage.register_duckdb(connection, tmp_path, [], "nothing", schema=pa.schema([("id", pa.int64())]))
    assert connection.sql("SELECT count(*) FROM nothing").fetchall() == [(0,)]
    connection.close()


class InPlaceAccess:
    """Files read where they lie: what the read path's `storage.base.ScanAccess` gives a local root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.views: list[str] = []

    def local_root(self, files: list[DataFile], shared: list[str] | tuple[str, ...] = ()) -> Path:
        return self.root

    def local_paths(self, files: list[DataFile]) -> list[str]:
        return [str(self.root / f.path) for f in files]

    def local_parts(self, files: list[DataFile]) -> list[str | pa.Table]:
        return list(self.local_paths(files))  # local files are read whole, never handed over as Arrow

    def arrow_relation(self, connection: Any, table: pa.Table) -> str:
        raise AssertionError("no Arrow table is handed over for files read where they lie")

    def view_name(self) -> str:
        self.views.append(f"view_{len(self.views)}")
        return self.views[-1]


@pytest.mark.parametrize(("engine", "mode"), ENGINES, ids=ENGINE_IDS)
def test_duckdb_relation_is_what_a_read_scans(tmp_path: Path, engine: str, mode: str) -> None:
    storage = get_storage(engine, mode)
    schema = pa.schema([("id", pa.int64()), ("f", pa.float64())])
    with_nan = write_published(
        storage, pa.table({"id": [1, 2], "f": [0.5, float("nan")]}, schema=schema), tmp_path, "k=1"
    )
    plain = write_published(storage, pa.table({"id": [99], "f": [1.0]}, schema=schema), tmp_path, "k=2")
    connection = duckdb.connect()
    relation = storage.duckdb_relation(
        connection, InPlaceAccess(tmp_path), with_nan, schema, union_by_name=False
    )
    assert sorted(row[0] for row in connection.sql(f"SELECT id FROM {relation}").fetchall()) == [1, 2]
    storage.release_duckdb(connection)
    paths = connection.sql("SELECT path FROM duckdb_databases() WHERE NOT internal").fetchall()
    assert not any((path or "").endswith(SHARED_FILE) for (path,) in paths), (
        "the shared file stays attached after a read: its read lock would block the next publish"
    )
    connection.close()
    assert storage.shared_objects(with_nan) == ([SHARED_FILE] if mode == "tables" else [])
    # Only Parquet statistics leave NaN out of min / max where DuckDB prunes with them.
    assert storage.nan_outside_statistics(with_nan[0], ["f"]) == (engine == "parquet")
    assert not storage.nan_outside_statistics(plain[0], ["f"]), "no NaN: statistics are trustworthy"


def test_duckdb_tables_mode_publishes_idempotently_into_one_file(tmp_path: Path) -> None:
    storage = get_storage("duckdb", "tables")
    staged = storage.write(pa.table({"x": [1, 2]}), tmp_path, "k=1") + storage.write(
        pa.table({"x": [3]}), tmp_path, "k=2"
    )
    assert all(f.table is None for f in staged)
    assert storage.read(tmp_path, staged).column("x").to_pylist() == [1, 2, 3], "staged files are readable"
    published = storage.publish(tmp_path, staged)
    again = storage.publish(tmp_path, staged)
    assert [f.table for f in published] == [f.table for f in again]
    assert [f.checksum for f in published] == [f.checksum for f in staged]
    connection = duckdb.connect(str(tmp_path / SHARED_FILE), read_only=True)
    tables = {row[0] for row in connection.sql("SELECT table_name FROM duckdb_tables()").fetchall()}
    connection.close()
    assert {f.table for f in published} <= tables
    assert storage.read(tmp_path, published).column("x").to_pylist() == [1, 2, 3]


def test_duckdb_tables_vacuum_drops_only_unreferenced_old_tables(tmp_path: Path) -> None:
    storage = get_storage("duckdb", "tables")
    keep = storage.publish(tmp_path, storage.write(pa.table({"x": [1]}), tmp_path, "k=1"))
    drop = storage.publish(tmp_path, storage.write(pa.table({"x": [2]}), tmp_path, "k=1"))
    future = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    past = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    assert storage.remove_unreferenced(tmp_path, keep, cutoff=past, dry_run=False) == [], (
        "young tables are kept"
    )
    dry = storage.remove_unreferenced(tmp_path, keep, cutoff=future, dry_run=True)
    assert [v.path for v in dry] == [f"{SHARED_FILE}#{drop[0].table}"]
    assert storage.read(tmp_path, drop).num_rows == 1, "a dry run drops nothing"
    storage.remove_unreferenced(tmp_path, keep, cutoff=future, dry_run=False)
    assert storage.read(tmp_path, keep).column("x").to_pylist() == [1]
    with pytest.raises(StorageError, match="vacuumed"):
        storage.read(tmp_path, drop)


def test_vacuum_files_keeps_referenced_young_and_foreign_files(tmp_path: Path) -> None:
    storage = get_storage("parquet")
    referenced = storage.write(pa.table({"x": [1]}), tmp_path, "k=1")
    orphan_old = storage.write(pa.table({"x": [2]}), tmp_path, "k=2")
    orphan_young = storage.write(pa.table({"x": [3]}), tmp_path, "k=3")
    crashed = tmp_path / "k=1" / ".tmp-part-crashed.parquet"
    crashed.write_bytes(b"partial")
    foreign = tmp_path / "notes.txt"
    foreign.write_text("not ours")
    old = dt.datetime.now().timestamp() - 7200
    for path in (tmp_path / orphan_old[0].path, crashed, tmp_path / referenced[0].path, tmp_path / "k=2"):
        os.utime(path, (old, old))
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    result = vacuum_files(tmp_path, {referenced[0].path}, cutoff=cutoff, dry_run=False)
    assert sorted(v.path for v in result.removed) == sorted(
        [orphan_old[0].path, "k=1/.tmp-part-crashed.parquet"]
    )
    assert result.kept_young == [orphan_young[0].path]
    assert (tmp_path / referenced[0].path).exists()
    assert foreign.exists()
    assert not (tmp_path / "k=2").exists(), "an old partition directory left empty is removed"
    assert (tmp_path / "k=3").exists()


def test_key_paths_that_escaping_cannot_produce_are_refused(tmp_path: Path) -> None:
    for bad in ("../x=1", "k=1/../../x=2", "/etc=1", "k=a/b", "k", "k=1/", "k=é", "k=1\\..", "k=%2F/.."):
        with pytest.raises(StorageError):
            partition_directory(tmp_path, bad)
    with pytest.raises(StorageError, match="unknown storage engine"):
        get_storage("sqlite")
    with pytest.raises(StorageError, match="only for the duckdb engine"):
        get_storage("parquet", "tables")


HOSTILE_VALUES: list[str | None] = [
    "/",
    "=",
    "%",
    ":",
    "..",
    ".",
    "../../etc/passwd",
    "a/../../b",
    "a=b/c=d",
    "'single'",
    '"double"',
    "\\back\\slash",
    "line\nbreak\r\n",
    "tab\tand\x00nul\x01\x1f\x7f",
    "é 日本 🙂 \u202e",
    "",
    " ",
    "null",
    "none",
    "NULL",
    "%NULL",
    "%25NULL",
    "__HIVE_DEFAULT_PARTITION__",
    "%2F",
    None,
    "x" * 10_000,
    "/" * 5_000,
]


def check_hostile_values(storage: PartitionStorage, store: Any, root: Path) -> None:
    """Write, commit, reopen and read back one partition per hostile value; nothing may leave `root`."""
    from airflow_partitions.catalog import Catalog, PartitionEntry, PartitionSpecInfo

    spec = PartitionSpecInfo.from_fields([("region", "region", "string"), ("n", "n", "int")])
    dataset_root = root / "ds"
    catalog = Catalog(store, "ds", data_root=dataset_root, storage=storage)
    written: list[tuple[PartitionKey, DataFile]] = []
    directories = set()
    for index, value in enumerate(HOSTILE_VALUES):
        key = PartitionKey((value, index))
        key_path = key.path(spec.names)
        directory = partition_directory(dataset_root, key_path)
        assert directory.resolve().is_relative_to(dataset_root.resolve()), f"{value!r} escaped: {key_path}"
        directories.add(directory)
        (file,) = storage.write(pa.table({"v": pa.array([value], pa.string())}), dataset_root, key_path)
        assert (dataset_root / file.path).resolve().is_relative_to(dataset_root.resolve())
        written.append((key, file))
    assert len(directories) == len(HOSTILE_VALUES), "two different values must never share a directory"
    # One publish for the whole commit, as a refresh does it.
    published = storage.publish(dataset_root, [file for _key, file in written])
    entries = [PartitionEntry.from_files(key, spec, [file]) for (key, _), file in zip(written, published)]
    version = catalog.commit(base_version=None, upserts=entries, partition_spec=spec)
    reopened = Catalog(store, "ds", data_root=dataset_root).snapshot(version)
    for index, value in enumerate(HOSTILE_VALUES):
        entry = reopened.partitions[PartitionKey((value, index)).path(spec.names)]
        assert entry.key.values == (value, index), f"{value!r} did not round-trip through the catalog"
        assert storage.read(dataset_root, entry.files).column("v").to_pylist() == [value]
    every_file = [p for p in root.rglob("*") if p.is_file()]
    assert all(p.resolve().is_relative_to(root.resolve()) for p in every_file)


@pytest.mark.parametrize(("engine", "mode"), ENGINES, ids=ENGINE_IDS)
def test_hostile_partition_values_stay_inside_and_round_trip(tmp_path: Path, engine: str, mode: str) -> None:
    from airflow_partitions.catalog import LocalStore

    root = tmp_path / "accel"
    check_hostile_values(get_storage(engine, mode), LocalStore(root), root)


@pytest.mark.s3
def test_hostile_partition_values_round_trip_through_an_s3_catalog(
    tmp_path: Path, s3_server: dict[str, Any], s3_bucket: str
) -> None:
    import boto3

    from airflow_partitions.catalog import S3Store

    store = S3Store(boto3.client("s3", **s3_server), s3_bucket, "hostile")
    check_hostile_values(get_storage("parquet"), store, tmp_path / "accel")
    keys = [o["Key"] for o in boto3.client("s3", **s3_server).list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert all(k.startswith("hostile/ds/_catalog/") for k in keys), keys
