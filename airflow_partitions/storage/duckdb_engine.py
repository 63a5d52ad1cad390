"""The `duckdb` engine: a DuckDB file per partition (`files` mode) or one table per partition (`tables` mode).

Every DuckDB file written here holds the partition rows in table `data` and the exact Arrow schema they
were written with in that table's comment (files written before kept it in a table `_ap_arrow_schema`,
one more block on disk; both are read), so a read restores what DuckDB maps to a nearby type
(`large_string` comes back as VARCHAR, a timezone name as UTC, `timestamp[s]` with a timezone as
microseconds) and the round trip is exact.

`tables` mode keeps one shared file, `<dataset>/_tables.duckdb`. DuckDB allows a single writer per file,
so partition writers never touch it: `write` stages each partition as its own immutable file (exactly as
in `files` mode, under the partition's Hive directory), and `publish`, called once by the committing
process, copies the staged partitions into uniquely named tables (`p_<file id>`) of the shared file.
Tables are never modified after creation, so every catalog version keeps reading the tables it names;
vacuum drops tables no retained version references. Under concurrency: writers run fully in parallel;
publishers and readers of the shared file take DuckDB's file lock (one writer, or any number of readers)
and wait for it, retrying for up to `lock_timeout` seconds before raising `StorageError`.

Once a staged file's table is in the shared file, the staged copy is only needed by snapshot uploads
(the object uploaded is the staged file, whose checksum the catalog records). So `publish` deletes it
at once unless `keep_staged` (set for datasets whose snapshots upload; the manifest publish releases
them with `release_staged` once they are in object storage), and vacuum removes staged copies left over
by an interrupted publish.

Disk use: every DuckDB file holds three 4 KiB headers plus at least one block per table, and DuckDB's
default block is 256 KiB, so a one-row partition file would take 0.5 MB. Files are therefore created with
a block size fitted to the data (`block_size_for`): 16 KiB (DuckDB's minimum) for small partitions, which
puts the floor of a partition file at about 44 KiB and of a table in the shared file at about 16 KiB.
Files are written through `ATTACH ... (BLOCK_SIZE n)` and detached, which checkpoints: no WAL remains.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import itertools
import os
import time
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from airflow_partitions.exceptions import StorageError
from airflow_partitions.storage.base import (
    PartitionStorage,
    SharedFileCompaction,
    VacuumedFile,
    conform,
    data_file_path,
)
from airflow_partitions.storage.datafile import DataFile
from airflow_partitions.storage.integrity import REPAIR_PREFIX, surface_duckdb_error, verify_file
from airflow_partitions.storage.side_index import IndexConfig
from airflow_partitions.storage.sql import quote_identifier, quote_literal

DATA_TABLE = "data"
SCHEMA_TABLE = "_ap_arrow_schema"  # where files written before schema comments keep the schema
SCHEMA_COMMENT_PREFIX = "ap-arrow-schema:"
SHARED_FILE = "_tables.duckdb"
TABLES_REGISTRY = "_ap_tables"
_COMPACT_PREFIX = f".{SHARED_FILE}.compact-"  # a compaction's new file before it takes the shared name
# Vacuum rewrites the shared file once free blocks are this share of it (a rewrite copies every live table).
COMPACT_FREE_SHARE = 0.25
_LOCK_MESSAGES = ("Could not set lock", "Conflicting lock", "database is locked")
KiB = 1024
MiB = 1024 * KiB
# Immutable per-partition DuckDB files stay attached between reads, up to this many open at once.
MAX_ATTACHED_FILES = 256
MIN_BLOCK_SIZE = 16 * KiB  # the smallest block DuckDB accepts
DEFAULT_BLOCK_SIZE = 256 * KiB  # DuckDB's default


def block_size_for(data_bytes: int) -> int:
    """The DuckDB block size for a file holding about `data_bytes` bytes of (Arrow) data.

    Every table takes at least one block, so small partitions want small blocks; but blocks under 64 KiB
    compress large columns worse (measured with DuckDB 2.0 on order-like rows: 200,000 rows take 3.6 MB
    in 16 KiB blocks, 1.4 MB in 64 KiB and 1.5 MB in 256 KiB blocks; 1,000 rows 60 KiB, 140 KiB, 524 KiB).
    """
    if data_bytes < 128 * KiB:
        return MIN_BLOCK_SIZE
    if data_bytes < 8 * MiB:
        return 64 * KiB
    return DEFAULT_BLOCK_SIZE


class DuckDBFilesStorage(PartitionStorage):
    """One DuckDB file per partition, in the partition's Hive directory."""

    engine = "duckdb"
    format = "duckdb"
    extension = "duckdb"
    partition_mode = "files"
    duckdb_attaches_files = True

    def _write_file(self, table: pa.Table, path: Path) -> None:
        if table.num_columns == 0:
            raise StorageError("a DuckDB partition needs at least one column")
        connection = duckdb.connect(":memory:")
        try:
            connection.execute(
                f"ATTACH {quote_literal(str(path))} AS ap_out (BLOCK_SIZE {block_size_for(table.nbytes)})"
            )
            connection.register("ap_source", table)
            connection.execute(f"CREATE TABLE ap_out.{DATA_TABLE} AS SELECT * FROM ap_source")
            connection.unregister("ap_source")
            # In the table's comment, not a table of its own: a table costs a whole block.
            connection.execute(
                f"COMMENT ON TABLE ap_out.{DATA_TABLE} IS {quote_literal(_schema_comment(table))}"
            )
            connection.execute("DETACH ap_out")  # checkpoints: the file is complete, no WAL is left
        except duckdb.Error as err:
            raise StorageError(f"DuckDB could not store the partition table: {err}") from err
        finally:
            connection.close()

    def _read_file(self, dataset_root: Path, file: DataFile) -> pa.Table:
        path = _checked_path(Path(dataset_root), file)
        with _surfacing(path, Path(dataset_root).name, [file]):
            connection = duckdb.connect(str(path), read_only=True)
            try:
                return _read_table(connection)
            finally:
                connection.close()

    def _count_file_rows(self, dataset_root: Path, file: DataFile) -> int:
        # The partition's own file (in tables mode: the staged file, which `publish` copies whole).
        path = _checked_path(Path(dataset_root), file)
        with _surfacing(path, Path(dataset_root).name, [file]):
            connection = duckdb.connect(str(path), read_only=True)
            try:
                row = connection.execute(f"SELECT count(*) FROM {DATA_TABLE}").fetchone()
            finally:
                connection.close()
        return int(row[0]) if row is not None else 0

    def register_duckdb(
        self,
        connection: Any,
        dataset_root: Path,
        files: Sequence[DataFile],
        view_name: str,
        *,
        schema: pa.Schema | None = None,
    ) -> None:
        if not files:
            self._register_empty(connection, view_name, schema)
            return
        selects = []
        for file in files:
            alias = _attach(connection, _checked_path(Path(dataset_root), file))
            selects.append(f"SELECT * FROM {alias}.{DATA_TABLE}")
        _create_union_view(connection, view_name, selects)

    def release_duckdb(self, connection: Any) -> None:
        """Detach the shared DuckDB file of `tables` mode, and everything once too much is attached.

        Per-partition DuckDB files are immutable and never written again, so they stay attached for the
        next read (attaching costs more than a small scan). The shared file is detached at once: a
        lingering read lock on it would block the next publish.
        """
        rows = connection.execute(
            "SELECT database_name, path FROM duckdb_databases() WHERE NOT internal"
        ).fetchall()
        attached = [(name, path or "") for name, path in rows if name != "memory"]
        release_all = len(attached) > MAX_ATTACHED_FILES
        for name, path in attached:
            if release_all or Path(path).name == SHARED_FILE:
                with contextlib.suppress(Exception):
                    connection.execute(f"DETACH {quote_identifier(name)}")


class DuckDBTablesStorage(DuckDBFilesStorage):
    """One shared DuckDB file with a table per partition; writes are staged and published at commit."""

    partition_mode = "tables"

    def __init__(
        self,
        *,
        max_rows_per_file: int | None = None,
        lock_timeout: float = 60.0,
        keep_staged: bool = True,
        index: IndexConfig | None = None,
    ) -> None:
        super().__init__(max_rows_per_file=max_rows_per_file, index=index)
        self.lock_timeout = lock_timeout
        # True while something may still upload the staged files (snapshots); `get_storage(spec)` sets
        # it from the dataset's snapshot mode.
        self.keep_staged = keep_staged

    def publish(self, dataset_root: Path, files: Sequence[DataFile]) -> list[DataFile]:
        """Copy staged partitions into the shared file; idempotent (a re-run reuses tables already made).

        Without `keep_staged`, each staged file is deleted once its table is committed in the shared file.
        """
        root = Path(dataset_root)
        pending = [f for f in files if f.table is None]
        if not pending:
            return list(files)
        published: dict[str, str] = {}
        sizes = sorted(f.bytes for f in pending)
        with self._shared(
            root, read_only=False, block_size=block_size_for(sizes[len(sizes) // 2])
        ) as connection:
            _ensure_registry(connection)
            for file in pending:
                table_name = _table_name(file)
                exists = connection.execute(
                    f"SELECT count(*) FROM {TABLES_REGISTRY} WHERE table_name = ?", [table_name]
                ).fetchall()
                if exists[0][0] == 0:
                    self._copy_staged(connection, root, file, table_name)
                published[file.path] = table_name
        # Each copy's COMMIT is durable (in the WAL until closing checkpoints it), so the staged copies
        # may go now.
        result = [replace(f, table=published[f.path]) if f.table is None else f for f in files]
        if not self.keep_staged:
            _remove_files(root, pending)
        return result

    def release_staged(self, dataset_root: Path, files: Collection[DataFile]) -> list[VacuumedFile]:
        """Delete the staged copies of `files` whose tables are in the shared file (they are not needed
        once uploaded to a snapshot); the removed files with their sizes."""
        root = Path(dataset_root)
        candidates = [f for f in files if f.table is not None and data_file_path(root, f).exists()]
        if not candidates or not (root / SHARED_FILE).exists():
            return []
        with self._shared(root, read_only=True) as connection:
            registered = {
                row[0]
                for row in connection.execute(
                    f"SELECT table_name FROM {TABLES_REGISTRY} WHERE table_name IN "
                    f"({', '.join('?' for _ in candidates)})",
                    [f.table for f in candidates],
                ).fetchall()
            }
        return _remove_files(root, [f for f in candidates if f.table in registered])

    def _copy_staged(self, connection: Any, root: Path, file: DataFile, table_name: str) -> None:
        staged = data_file_path(root, file)
        if not staged.exists():
            raise StorageError(f"staged partition file {file.path} is missing under {root}; refresh it again")
        verify_file(staged, file, dataset=root.name)  # never copy damaged bytes into the shared file
        alias = _attach(connection, staged)
        try:
            schema = _stored_schema(connection, _database_of(connection, staged))
            if schema is None:
                raise StorageError(
                    f"staged partition file {file.path} holds no Arrow schema; it was not written by this "
                    "storage engine: refresh the partition again"
                )
            connection.execute("BEGIN TRANSACTION")
            connection.execute(
                f"CREATE TABLE {quote_identifier(table_name)} AS SELECT * FROM {alias}.{DATA_TABLE}"
            )
            connection.execute(
                f"INSERT INTO {TABLES_REGISTRY} VALUES (?, ?, ?, now())", [table_name, file.path, schema]
            )
            connection.execute("COMMIT")
        except duckdb.Error as err:
            with contextlib.suppress(duckdb.Error):
                connection.execute("ROLLBACK")
            raise StorageError(f"could not publish {file.path} into {SHARED_FILE}: {err}") from err
        finally:
            connection.execute(f"DETACH {alias}")

    def _read_file(self, dataset_root: Path, file: DataFile) -> pa.Table:
        if file.table is None:
            return super()._read_file(dataset_root, file)
        root = Path(dataset_root)
        with (
            _surfacing(root / SHARED_FILE, root.name, [file]),
            self._shared(root, read_only=True) as connection,
        ):
            return self._read_shared_table(connection, file)

    def _read_many(
        self, dataset_root: Path, files: Sequence[DataFile], columns: Sequence[str] | None
    ) -> list[pa.Table]:
        if all(f.table is None for f in files):
            return super()._read_many(dataset_root, files, columns)
        # One open of the shared file for every published table, not one per partition.
        tables: list[pa.Table] = []
        root = Path(dataset_root)
        published = [f for f in files if f.table is not None]
        with (
            _surfacing(root / SHARED_FILE, root.name, published),
            self._shared(root, read_only=True) as connection,
        ):
            for file in files:
                if file.table is None:
                    table = super()._read_file(root, file)
                else:
                    with _surfacing(root / SHARED_FILE, root.name, [file]):
                        table = self._read_shared_table(connection, file)
                if columns is not None:
                    table = table.select([c for c in columns if c in table.column_names])
                tables.append(table)
        return tables

    def _read_shared_table(self, connection: Any, file: DataFile) -> pa.Table:
        assert file.table is not None
        row = connection.execute(
            f"SELECT arrow_schema FROM {TABLES_REGISTRY} WHERE table_name = ?", [file.table]
        ).fetchall()
        if not row:
            raise StorageError(
                f"table {file.table} of partition file {file.path} is not in {SHARED_FILE}; "
                "it was vacuumed or the file was replaced: read a retained version or refresh"
            )
        data = connection.sql(f"SELECT * FROM {quote_identifier(file.table)}").to_arrow_table()
        return conform(data, pa.ipc.read_schema(pa.py_buffer(row[0][0])))

    def register_duckdb(
        self,
        connection: Any,
        dataset_root: Path,
        files: Sequence[DataFile],
        view_name: str,
        *,
        schema: pa.Schema | None = None,
    ) -> None:
        if not files:
            self._register_empty(connection, view_name, schema)
            return
        root = Path(dataset_root)
        shared_alias: str | None = None
        selects = []
        for file in files:
            if file.table is None:
                alias = _attach(connection, _checked_path(root, file))
                selects.append(f"SELECT * FROM {alias}.{DATA_TABLE}")
            else:
                if shared_alias is None:
                    shared_alias = self._attach_shared(connection, root, files)
                selects.append(f"SELECT * FROM {shared_alias}.{quote_identifier(file.table)}")
        _create_union_view(connection, view_name, selects)

    def shared_objects(self, files: Sequence[DataFile]) -> list[str]:
        """The shared file, when any of `files` is published into it."""
        return [SHARED_FILE] if any(f.table for f in files) else []

    def _attach_shared(self, connection: Any, root: Path, files: Sequence[DataFile]) -> str:
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                return _attach(connection, root / SHARED_FILE)
            except duckdb.Error as err:
                if _is_lock_error(err) and time.monotonic() > deadline:
                    raise StorageError(f"could not open {root / SHARED_FILE} for reading: {err}") from err
                if not _is_lock_error(err):
                    published = [f for f in files if f.table is not None]
                    raise surface_duckdb_error(err, root.name, published, str(root / SHARED_FILE)) from err
                time.sleep(0.05)

    def check_tables(self, dataset_root: Path, files: Sequence[DataFile], *, dataset: str) -> None:
        """Read every row of each published table of `files` through DuckDB, which verifies the checksum
        of every block it loads: a damaged block raises a `StorageError` naming the shared file."""
        root = Path(dataset_root)
        for file in files:
            with (
                _surfacing(root / SHARED_FILE, dataset, [file]),
                self._shared(root, read_only=True) as connection,
            ):
                for _batch in connection.sql(
                    f"SELECT * FROM {quote_identifier(str(file.table))}"
                ).fetch_record_batch():
                    pass

    def remove_unreferenced(
        self,
        dataset_root: Path,
        referenced: Collection[DataFile],
        *,
        cutoff: dt.datetime,
        dry_run: bool,
    ) -> list[VacuumedFile]:
        """Drop shared-file tables that no referenced file names and that were created before `cutoff`."""
        root = Path(dataset_root)
        if not (root / SHARED_FILE).exists():
            return []
        keep = {f.table for f in referenced if f.table is not None}
        if cutoff.tzinfo is None:
            cutoff = cutoff.replace(tzinfo=dt.UTC)
        removed: list[VacuumedFile] = []
        with self._shared(root, read_only=dry_run) as connection:
            registry = connection.execute(
                "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
                "AND table_name = ?",
                [TABLES_REGISTRY],
            ).fetchall()
            if registry[0][0] == 0:
                return []
            # Epoch microseconds: fetching TIMESTAMPTZ values into Python would need pytz.
            rows = connection.execute(
                f"SELECT table_name, staged_path, epoch_us(created_at) FROM {TABLES_REGISTRY} "
                "ORDER BY table_name"
            ).fetchall()
            cutoff_us = int(cutoff.timestamp() * 1_000_000)
            staged_leftovers = [
                DataFile(path=str(staged_path), format=self.format, rows=0, bytes=0, checksum="", table=name)
                for name, staged_path, created_us in rows
                if staged_path and created_us < cutoff_us
            ]
            for table_name, _staged_path, created_us in rows:
                if table_name in keep or created_us >= cutoff_us:
                    continue
                if not dry_run:
                    connection.execute("BEGIN TRANSACTION")
                    connection.execute(f"DROP TABLE IF EXISTS {quote_identifier(table_name)}")
                    connection.execute(f"DELETE FROM {TABLES_REGISTRY} WHERE table_name = ?", [table_name])
                    connection.execute("COMMIT")
                removed.append(VacuumedFile(f"{SHARED_FILE}#{table_name}", 0))
            if removed and not dry_run:
                connection.execute("CHECKPOINT")
        if not self.keep_staged:
            # Staged copies whose table was published before the cutoff: left by a publish that was
            # interrupted before it deleted them (the data lives in the table).
            for leftover in staged_leftovers:
                path = data_file_path(root, leftover)
                if not path.exists():
                    continue
                if dry_run:
                    removed.append(VacuumedFile(leftover.path, path.stat().st_size))
                else:
                    removed.extend(_remove_files(root, [leftover]))
        return removed

    def shared_file_sizes(self, dataset_root: Path) -> dict[str, int]:
        path = Path(dataset_root) / SHARED_FILE
        return {SHARED_FILE: path.stat().st_size} if path.exists() else {}

    def compact_shared(
        self, dataset_root: Path, *, dry_run: bool, sizes_before: Mapping[str, int]
    ) -> list[SharedFileCompaction]:
        """Rewrite the shared file without its free blocks when they are `COMPACT_FREE_SHARE` of it or more.

        DuckDB reuses the blocks of dropped tables but never gives them back to the filesystem (only
        trailing ones), so a file that saw many versions keeps the size of its largest past. Under the
        writer lock, the live tables are copied (`COPY FROM DATABASE`: same tables, same rows, same
        registry) into a new file of the same block size; the new file is locked by a second connection
        before it takes the shared file's name (`os.replace`), so waiting publishers and readers open the
        new file once both locks go, and a writer that opened the old file meanwhile notices the swap and
        opens again (`_shared`). A crash leaves at most a `.compact-*` file, removed by the next vacuum.
        """
        root = Path(dataset_root)
        path = root / SHARED_FILE
        if not path.exists():
            return []
        before = sizes_before.get(SHARED_FILE, path.stat().st_size)
        if dry_run:
            return [SharedFileCompaction(SHARED_FILE, before, before, compacted=False)]
        successor: Any = None
        with self._shared(root, read_only=False) as connection:
            # Under the writer lock no compaction is in flight: a new file found now is a killed one's.
            for leftover in root.glob(f"{_COMPACT_PREFIX}*"):
                leftover.unlink(missing_ok=True)
            database, block_size, total_blocks, free_blocks = connection.execute(
                "SELECT database_name, block_size, total_blocks, free_blocks FROM pragma_database_size() "
                "WHERE database_name = current_database()"
            ).fetchall()[0]
            if total_blocks == 0 or free_blocks < COMPACT_FREE_SHARE * total_blocks:
                return [SharedFileCompaction(SHARED_FILE, before, path.stat().st_size, compacted=False)]
            compacted = root / f"{_COMPACT_PREFIX}{uuid.uuid4().hex}"
            try:
                connection.execute(
                    f"ATTACH {quote_literal(str(compacted))} AS ap_compact (BLOCK_SIZE {int(block_size)})"
                )
                connection.execute(f"COPY FROM DATABASE {quote_identifier(database)} TO ap_compact")
                connection.execute("DETACH ap_compact")  # checkpointed: complete, no WAL
                successor = duckdb.connect(str(compacted))  # holds the new file's lock across the swap
                os.replace(compacted, path)
            except (duckdb.Error, OSError) as err:
                if successor is not None:
                    successor.close()
                for partial in (compacted, compacted.with_name(compacted.name + ".wal")):
                    partial.unlink(missing_ok=True)
                raise StorageError(f"could not compact {path}: {err}") from err
        # The old file is closed (unlinked, nothing left to write); now waiting processes may have the new.
        successor.close()
        return [SharedFileCompaction(SHARED_FILE, before, path.stat().st_size, compacted=True)]

    @contextmanager
    def _shared(self, root: Path, *, read_only: bool, block_size: int = MIN_BLOCK_SIZE) -> Iterator[Any]:
        """A connection to the shared file; a writer creates it with `block_size` when it is missing."""
        path = root / SHARED_FILE
        if read_only and not path.exists():
            raise StorageError(f"{path} does not exist: no partition of this dataset was published yet")
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                if not read_only and not path.exists():
                    _create_database(path, block_size)
                opened = _file_identity(path)
                connection = duckdb.connect(str(path), read_only=read_only)
                if _file_identity(path) != opened:
                    # A compaction swapped the file in while this opened it: the lock held may be the
                    # old file's, whose writes would be lost. Open the file now under the name.
                    connection.close()
                    continue
                break
            except duckdb.Error as err:
                if not _is_lock_error(err):
                    raise StorageError(
                        f"could not open {path} ({'read' if read_only else 'write'}): {err}"
                    ) from err
                if time.monotonic() > deadline:
                    raise StorageError(
                        f"could not open {path} ({'read' if read_only else 'write'}): {err}; another "
                        f"process held it for more than {self.lock_timeout:.0f} s"
                    ) from err
                time.sleep(0.05)
        try:
            yield connection
        finally:
            connection.close()


# --- helpers --------------------------------------------------------------------------------------


@contextmanager
def _surfacing(location: Path, dataset: str, files: Sequence[DataFile]) -> Iterator[None]:
    """DuckDB failures on the file at `location` (a block checksum, a header) as `StorageError`s naming
    it, the partitions and the repair (`storage.integrity.surface_duckdb_error`); lock waits stay as
    they are."""
    try:
        yield
    except duckdb.Error as err:
        raise surface_duckdb_error(err, dataset, files, str(location)) from err
    except StorageError as err:
        # `_shared`'s own error for a file DuckDB refused; one that already names its repair (an inner
        # `_surfacing`, a failed digest) stays as it is.
        cause = err.__cause__
        if isinstance(cause, duckdb.Error) and not _is_lock_error(cause) and REPAIR_PREFIX not in str(err):
            raise surface_duckdb_error(cause, dataset, files, str(location)) from cause
        raise


def _checked_path(dataset_root: Path, file: DataFile) -> Path:
    """The path of a per-partition DuckDB file once its bytes match the catalog's SHA-256."""
    path = data_file_path(dataset_root, file)
    verify_file(path, file, dataset=dataset_root.name)
    return path


def _file_identity(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except FileNotFoundError:
        return None
    return (status.st_dev, status.st_ino)


def _read_table(connection: Any) -> pa.Table:
    """The `data` table of the connection's own database, with the Arrow schema it was written with."""
    data = connection.sql(f"SELECT * FROM {DATA_TABLE}").to_arrow_table()
    database = connection.execute("SELECT current_database()").fetchall()[0][0]
    schema = _stored_schema(connection, database)
    if schema is None:
        return data
    return conform(data, pa.ipc.read_schema(pa.py_buffer(schema)))


def _schema_comment(table: pa.Table) -> str:
    return SCHEMA_COMMENT_PREFIX + base64.b64encode(table.schema.serialize().to_pybytes()).decode("ascii")


def _stored_schema(connection: Any, database: str) -> bytes | None:
    """The serialized Arrow schema of a partition file attached as `database`: from the `data` table's
    comment, or from the `_ap_arrow_schema` table of files written before comments were used."""
    found = connection.execute(
        "SELECT table_name, comment FROM duckdb_tables() WHERE database_name = ? AND table_name IN (?, ?)",
        [database, DATA_TABLE, SCHEMA_TABLE],
    ).fetchall()
    comments = dict(found)
    comment = comments.get(DATA_TABLE) or ""
    if comment.startswith(SCHEMA_COMMENT_PREFIX):
        return base64.b64decode(comment[len(SCHEMA_COMMENT_PREFIX) :])
    if SCHEMA_TABLE in comments:
        row = connection.execute(
            f"SELECT arrow_schema FROM {quote_identifier(database)}.{SCHEMA_TABLE}"
        ).fetchall()
        if row:
            return bytes(row[0][0])
    return None


def _database_of(connection: Any, path: Path) -> str:
    row = connection.execute(
        "SELECT database_name FROM duckdb_databases() WHERE path = ?", [str(path)]
    ).fetchall()
    return str(row[0][0])


def _table_name(file: DataFile) -> str:
    # Unique because file names are: `part-<uuid>-<index>.duckdb` -> `p_<uuid>_<index>`.
    stem = file.path.rsplit("/", 1)[-1].removesuffix(".duckdb").removeprefix("part-")
    return "p_" + stem.replace("-", "_")


def _create_database(path: Path, block_size: int) -> None:
    """Create an empty DuckDB file with `block_size` blocks (the size is fixed when a file is created)."""
    connection = duckdb.connect(":memory:")
    try:
        connection.execute(f"ATTACH {quote_literal(str(path))} AS ap_new (BLOCK_SIZE {block_size})")
        connection.execute("DETACH ap_new")
    finally:
        connection.close()


def _remove_files(root: Path, files: Sequence[DataFile]) -> list[VacuumedFile]:
    removed: list[VacuumedFile] = []
    for file in files:
        path = data_file_path(root, file)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(VacuumedFile(file.path, size))
    return removed


def _ensure_registry(connection: Any) -> None:
    connection.execute(
        f"CREATE TABLE IF NOT EXISTS {TABLES_REGISTRY} ("
        "table_name VARCHAR PRIMARY KEY, staged_path VARCHAR, arrow_schema BLOB, created_at TIMESTAMPTZ)"
    )


_attach_ids = itertools.count(1)


def _attach(connection: Any, path: Path) -> str:
    """Attach `path` read-only (or reuse the alias it is already attached under) and return the alias."""
    location = str(path)
    row = connection.execute(
        "SELECT database_name FROM duckdb_databases() WHERE path = ?", [location]
    ).fetchall()
    if row:
        return quote_identifier(row[0][0])
    alias = f"ap_part_{next(_attach_ids)}"
    connection.execute(f"ATTACH {quote_literal(location)} AS {alias} (READ_ONLY)")
    return alias


def _create_union_view(connection: Any, view_name: str, selects: Sequence[str]) -> None:
    body = " UNION ALL BY NAME ".join(selects)
    connection.execute(f"CREATE OR REPLACE TEMP VIEW {quote_identifier(view_name)} AS {body}")


def _is_lock_error(err: Exception) -> bool:
    text = str(err)
    return any(marker in text for marker in _LOCK_MESSAGES)
