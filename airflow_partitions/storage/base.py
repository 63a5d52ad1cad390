"""What every partition storage engine shares: the engine interface, safe paths, atomic file placement.

A write never exposes a partial file and never replaces an existing one: the engine writes a hidden
temporary (`.tmp-<name>`) in the partition directory, fsyncs it, hard-links it to its final unique name
(`os.link` fails instead of overwriting) and fsyncs the directory. A writer killed at any point leaves at
most a `.tmp-*` orphan, which `vacuum_files` removes once it is older than the retention period.

A caller writing many partitions at once may pass `sync=False` and make every file durable in one pass
afterwards (`sync_written`: the files, then each directory once), before anything references them: the
disk then flushes the files together instead of one partition at a time.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from airflow_partitions.exceptions import StorageError
from airflow_partitions.objectstore.base import TEMP_PREFIX
from airflow_partitions.objectstore.local import ensure_directory, fsync_directory, fsync_file
from airflow_partitions.storage.datafile import DataFile, FileLayout, compute_column_stats, file_checksum
from airflow_partitions.storage.side_index import IndexConfig, build_file_index
from airflow_partitions.storage.sql import quote_identifier

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc

FILE_PREFIX = "part-"
# A key path component is `escape_component(name)=encode_value(value)`: only these characters appear.
_KEY_COMPONENT = re.compile(r"[A-Za-z0-9_.%-]+=[A-Za-z0-9_.%-]*")
_PARALLEL_READ_THRESHOLD = 4


@dataclass(frozen=True, slots=True)
class VacuumedFile:
    """A file (or shared-file table) that vacuum deleted, or would delete in a dry run."""

    path: str
    bytes: int


@dataclass(frozen=True, slots=True)
class SharedFileCompaction:
    """A shared file (duckdb `tables` mode) that vacuum rewrote without its free space, or measured in a
    dry run or when there was nothing to gain (`compacted` False, sizes equal)."""

    path: str  # relative to the dataset root
    bytes_before: int
    bytes_after: int
    compacted: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "compacted": self.compacted,
        }


@dataclass(frozen=True, slots=True)
class FileVacuumResult:
    """Unreferenced files removed, and unreferenced files kept because they are younger than the cutoff."""

    removed: list[VacuumedFile]
    kept_young: list[str]


class ScanAccess(Protocol):
    """How one DuckDB read reaches the files it scans (the read path implements it, locally or remotely)."""

    def local_root(self, files: Sequence[DataFile], shared: Sequence[str] = ()) -> Path:
        """A local dataset root under which `files` and the `shared` objects (paths relative to the
        dataset root) sit whole: the dataset directory itself, or a cache of object-storage copies."""
        ...

    def local_paths(self, files: Sequence[DataFile]) -> list[str]:
        """One local path per file, readable until the read ends (object-storage files fetched whole)."""
        ...

    def local_parts(self, files: Sequence[DataFile]) -> list[str | pa.Table]:
        """As `local_paths`, but a Parquet file the read filters row by row may come as an Arrow table of
        only its row groups the filter may need (`read.ranged`: a first read on object storage)."""
        ...

    def arrow_relation(self, connection: Any, table: pa.Table) -> str:
        """A relation (SQL usable after FROM) over the rows of `table`, registered until the read ends."""
        ...

    def view_name(self) -> str:
        """A fresh name for a temporary DuckDB view, dropped when the read ends."""
        ...


class RemoteFileAccess(Protocol):
    """How the read path reaches partition files on object storage."""

    def local_root(self, files: Sequence[DataFile], shared: Sequence[str] = ()) -> Path:
        """A local cache root under which copies of `files` and the `shared` objects sit whole."""
        ...

    def open(self, file: DataFile) -> AbstractContextManager[Any]:
        """A random-access handle on `file`: each read is a ranged request."""
        ...


class PartitionStorage(ABC):
    """One storage engine: writes partition files, reads them back exactly, exposes them to DuckDB."""

    engine: str
    format: str
    extension: str
    # Whether `register_duckdb` ATTACHes database files: attachments belong to the whole DuckDB
    # database, so a reader runs such reads one at a time and calls `release_duckdb` after each.
    duckdb_attaches_files = False
    # Whether Spark reads this engine's files itself (`spark_frame`); else a reader hands Spark Arrow rows.
    spark_reads_files = False

    def __init__(self, *, max_rows_per_file: int | None = None, index: IndexConfig | None = None) -> None:
        if max_rows_per_file is not None and max_rows_per_file < 1:
            raise StorageError(f"max_rows_per_file must be a positive integer, got {max_rows_per_file}")
        self.max_rows_per_file = max_rows_per_file
        # Side indexes every written file gets (`storage/side_index.py`); None: no index columns.
        self.index = index if index is not None and index.columns else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(engine={self.engine!r})"

    # --- writing ----------------------------------------------------------------------------------

    def write(
        self, table: pa.Table, dataset_root: Path, key_path: str, *, sync: bool = True
    ) -> list[DataFile]:
        """Write `table` as new uniquely named file(s) under `dataset_root/key_path/`; nothing is replaced.

        `sync=False`: the files and new directories are not fsynced here; the caller must pass the files
        to `sync_written` before anything references them."""
        directory = partition_directory(dataset_root, key_path)
        _make_directory(directory, Path(dataset_root), sync=sync)
        written: list[DataFile] = []
        for index, chunk in enumerate(self._split(table)):
            name = f"{FILE_PREFIX}{uuid.uuid4().hex}-{index:04d}.{self.extension}"
            final = directory / name
            temporary = directory / f"{TEMP_PREFIX}{name}"
            try:
                try:
                    self._write_file(chunk, temporary)
                except FileNotFoundError:
                    # A concurrent vacuum may have removed the (then empty, old) directory: recreate once.
                    _make_directory(directory, Path(dataset_root), sync=sync)
                    self._write_file(chunk, temporary)
                if sync:
                    fsync_file(temporary)
                checksum = file_checksum(temporary)
                size = temporary.stat().st_size
                layout = self._file_layout(temporary, size)
                os.link(temporary, final)
            except StorageError:
                raise
            except Exception as err:
                raise StorageError(f"could not write partition file {final}: {err}") from err
            finally:
                _remove_temporaries(temporary)
            relative = f"{key_path}/{name}" if key_path else name
            written.append(
                DataFile(
                    path=relative,
                    format=self.format,
                    rows=chunk.num_rows,
                    bytes=size,
                    checksum=checksum,
                    stats=compute_column_stats(chunk),
                    index=build_file_index(chunk, self.index),
                    layout=layout,
                )
            )
        if sync:
            fsync_directory(directory)
        return written

    def _split(self, table: pa.Table) -> Iterator[pa.Table]:
        limit = self.max_rows_per_file
        if limit is None or table.num_rows <= limit:
            yield table
            return
        for offset in range(0, table.num_rows, limit):
            yield table.slice(offset, limit)

    @abstractmethod
    def _write_file(self, table: pa.Table, path: Path) -> None:
        """Write `table` to `path` (a fresh temporary name) in this engine's format."""

    def _file_layout(self, path: Path, size: int) -> FileLayout | None:
        """Where the footer and row groups of the file just written to `path` lie, for ranged first reads
        on object storage (`DataFile.layout`); engines whose files are not read by ranges record none."""
        del path, size
        return None

    def publish(self, dataset_root: Path, files: Sequence[DataFile]) -> list[DataFile]:
        """Make written files ready for a catalog commit; engines that stage writes finish them here."""
        del dataset_root
        return list(files)

    def release_staged(self, dataset_root: Path, files: Collection[DataFile]) -> list[VacuumedFile]:
        """Delete staged copies of published `files` that only snapshot uploads still needed (duckdb
        `tables` mode); the files removed. Other engines read the files themselves: nothing to release."""
        del dataset_root, files
        return []

    # --- reading ----------------------------------------------------------------------------------

    def read(
        self,
        dataset_root: Path,
        files: Sequence[DataFile],
        columns: Sequence[str] | None = None,
        filter: pc.Expression | None = None,
        *,
        schema: pa.Schema | None = None,
    ) -> pa.Table:
        """Read `files` back as one table with their exact Arrow types, then filter and project.

        Files written with different schemas (columns added later) are unified: a column missing from a
        file reads as NULL. With no files, the result is an empty table of `schema` (or of no columns).
        """
        import pyarrow as pa

        if not files:
            empty = pa.table({}) if schema is None else schema.empty_table()
            return _project(empty, columns)
        tables = self._read_many(Path(dataset_root), files, columns if filter is None else None)
        unified = schema or unify_schemas([t.schema for t in tables], files)
        combined = pa.concat_tables([conform(t, unified) for t in tables])
        if filter is not None:
            try:
                combined = combined.filter(filter)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as err:
                raise StorageError(f"cannot apply filter {filter} to {len(files)} file(s): {err}") from err
        return _project(combined, columns)

    def _read_many(
        self, dataset_root: Path, files: Sequence[DataFile], columns: Sequence[str] | None
    ) -> list[pa.Table]:
        if len(files) < _PARALLEL_READ_THRESHOLD:
            return [self._read_file_checked(dataset_root, f, columns) for f in files]
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 2)) as pool:
            return list(pool.map(lambda f: self._read_file_checked(dataset_root, f, columns), files))

    def _read_file_checked(
        self, dataset_root: Path, file: DataFile, columns: Sequence[str] | None
    ) -> pa.Table:
        try:
            table = self._read_file(dataset_root, file)
        except StorageError:
            raise
        except FileNotFoundError as err:
            raise StorageError(
                f"partition file {file.path} is missing under {dataset_root}; it was deleted outside "
                "the catalog or vacuumed: read a retained version or refresh the partition"
            ) from err
        except Exception as err:
            raise StorageError(
                f"could not read partition file {file.path} under {dataset_root}: {err}"
            ) from err
        if columns is not None:
            table = table.select([c for c in columns if c in table.column_names])
        return table

    @abstractmethod
    def _read_file(self, dataset_root: Path, file: DataFile) -> pa.Table:
        """Read one file completely, with the exact Arrow schema it was written with."""

    def file_schema(self, dataset_root: Path, file: DataFile) -> pa.Schema:
        """The Arrow schema `file` was written with."""
        return self._read_file(Path(dataset_root), file).schema

    def count_rows(self, dataset_root: Path, file: DataFile) -> int:
        """The rows `file` holds, counted from the file on disk (never taken from `file.rows`)."""
        try:
            return self._count_file_rows(Path(dataset_root), file)
        except StorageError:
            raise
        except FileNotFoundError as err:
            raise StorageError(f"partition file {file.path} is missing under {dataset_root}") from err
        except Exception as err:
            raise StorageError(
                f"could not count the rows of {file.path} under {dataset_root}: {err}"
            ) from err

    def _count_file_rows(self, dataset_root: Path, file: DataFile) -> int:
        # Engines override this with a metadata-only count; reading the file is the exact fallback.
        return self._read_file(dataset_root, file).num_rows

    def check_tables(self, dataset_root: Path, files: Sequence[DataFile], *, dataset: str) -> None:
        """Read every row of the shared-file tables `files` are published in (duckdb `tables` mode, whose
        shared file has no recorded digest); engines without shared files have none."""
        del dataset_root, files, dataset

    # --- DuckDB access ----------------------------------------------------------------------------

    @abstractmethod
    def register_duckdb(
        self,
        connection: Any,
        dataset_root: Path,
        files: Sequence[DataFile],
        view_name: str,
        *,
        schema: pa.Schema | None = None,
    ) -> None:
        """Create (or replace) the temporary view `view_name` in `connection` over exactly `files`.

        DuckDB then scans the selected files directly. With no files, `schema` gives the columns of an
        empty view.
        """

    def duckdb_relation(
        self,
        connection: Any,
        access: ScanAccess,
        files: Sequence[DataFile],
        schema: pa.Schema,
        *,
        union_by_name: bool,
    ) -> str:
        """A DuckDB relation (SQL usable after FROM) over exactly `files`, for the read `access` serves.

        Here a temporary view made by `register_duckdb`, which always combines files by column name;
        `union_by_name` tells an engine scanning inline that the files may lack or reorder columns.
        """
        del union_by_name
        view = access.view_name()
        root = access.local_root(files, self.shared_objects(files))
        self.register_duckdb(connection, root, files, view, schema=schema)
        return quote_identifier(view)

    def release_duckdb(self, connection: Any) -> None:
        """Undo what `register_duckdb` left on `connection` that must not outlive a read (here nothing)."""
        del connection

    def _register_empty(self, connection: Any, view_name: str, schema: pa.Schema | None) -> None:
        if schema is None:
            raise StorageError(
                f"cannot create view {view_name!r} over zero files without a schema; pass schema="
            )
        import pyarrow as pa  # noqa: F401 - schema.empty_table needs pyarrow loaded

        connection.register(view_name, schema.empty_table())

    # --- the read path ----------------------------------------------------------------------------

    def shared_objects(self, files: Sequence[DataFile]) -> list[str]:
        """Objects besides `files` that reading them needs, as paths relative to the dataset root."""
        del files
        return []

    def remote_file_schema(self, access: RemoteFileAccess, file: DataFile) -> pa.Schema:
        """The Arrow schema of `file` on object storage: here from a local copy of the whole file."""
        return self.file_schema(access.local_root([file], self.shared_objects([file])), file)

    def nan_outside_statistics(self, file: DataFile, float_columns: Sequence[str]) -> bool:
        """Whether `file`'s float columns may hold NaN that the engine's own statistics leave out.

        DuckDB prunes with those statistics, so a scan of such a file must keep filters above it.
        """
        del file, float_columns
        return False

    def spark_frame(self, spark: Any, dataset_root: Path, files: Sequence[DataFile]) -> Any:
        """A Spark DataFrame reading `files` in place (only where `spark_reads_files`)."""
        del spark, dataset_root, files
        raise StorageError(f"Spark cannot read {self.engine} partition files; read them to Arrow first")

    # --- vacuum -----------------------------------------------------------------------------------

    def remove_unreferenced(
        self,
        dataset_root: Path,
        referenced: Collection[DataFile],
        *,
        cutoff: dt.datetime,
        dry_run: bool,
    ) -> list[VacuumedFile]:
        """Engine-specific clean-up beyond plain files (the duckdb `tables` mode drops tables)."""
        del dataset_root, referenced, cutoff, dry_run
        return []

    def shared_file_sizes(self, dataset_root: Path) -> dict[str, int]:
        """Bytes of each shared file under `dataset_root` (duckdb `tables` mode: `_tables.duckdb`)."""
        del dataset_root
        return {}

    def compact_shared(
        self, dataset_root: Path, *, dry_run: bool, sizes_before: Mapping[str, int]
    ) -> list[SharedFileCompaction]:
        """Give back the space of what `remove_unreferenced` dropped from shared files (duckdb `tables`
        mode rewrites `_tables.duckdb`); `sizes_before`: `shared_file_sizes` when vacuum began, reported
        as each file's `bytes_before`. Engines without shared files have nothing to compact."""
        del dataset_root, dry_run, sizes_before
        return []


# --- paths ----------------------------------------------------------------------------------------


def partition_directory(dataset_root: Path, key_path: str) -> Path:
    """`dataset_root/key_path`, refusing any key path that `PartitionKey.path` could not have produced."""
    root = Path(dataset_root)
    if key_path == "":
        return root
    components = key_path.split("/")
    bad = [c for c in components if not _KEY_COMPONENT.fullmatch(c)]
    if bad:
        raise StorageError(
            f"key path {key_path!r} has component(s) {bad!r} that are not `name=value` as produced by "
            "keys.PartitionKey.path; build key paths with PartitionKey.path(names)"
        )
    directory = root.joinpath(*components)
    resolved_root = root.resolve()
    if not directory.resolve().is_relative_to(resolved_root):
        raise StorageError(f"key path {key_path!r} escapes the dataset directory {root}")
    return directory


def _make_directory(directory: Path, dataset_root: Path, *, sync: bool) -> None:
    if sync:
        ensure_directory(directory, stop_at=dataset_root)
    else:
        directory.mkdir(parents=True, exist_ok=True)  # made durable by `sync_written`


# Concurrent fsyncs in `sync_written`: the disk queues them; their waits overlap.
_SYNC_WORKERS = 8


def sync_written(dataset_root: Path, files: Sequence[DataFile]) -> None:
    """Make files written with `write(..., sync=False)` durable: each file, then each directory from its
    partition directory up to the dataset root's parent once (new entries and new directories), on a
    small pool. `StorageError` when a file is missing or the disk refuses."""
    with BackgroundSync(dataset_root) as syncs:
        syncs.finish(files)


class BackgroundSync:
    """`sync_written` begun while files are still being written: `start(files)` fsyncs them on a small
    pool at once (the disk flushes one partition while the next is encoded), `finish(files)` waits for
    those of `files`, fsyncs any not started and then every directory once. A context manager: leaving it
    waits for the fsyncs in flight (of files kept or not)."""

    def __init__(self, dataset_root: Path) -> None:
        self.root = Path(dataset_root)
        self._pool = ThreadPoolExecutor(max_workers=_SYNC_WORKERS, thread_name_prefix="fsync")
        self._started: dict[str, Future[None]] = {}
        self._lock = threading.Lock()  # writer threads start their partitions' files concurrently

    def __enter__(self) -> BackgroundSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True)

    def start(self, files: Sequence[DataFile]) -> None:
        with self._lock:
            for file in files:
                if file.path not in self._started:
                    self._started[file.path] = self._pool.submit(_sync_file, data_file_path(self.root, file))

    def finish(self, files: Sequence[DataFile]) -> None:
        """Every file of `files` and its directories durable, or `StorageError`."""
        self.start(files)
        with self._lock:
            started = [self._started[file.path] for file in files]
        for future in started:
            future.result()
        list(self._pool.map(fsync_directory, _directories(self.root, files)))


def _sync_file(path: Path) -> None:
    try:
        fsync_file(path)
    except OSError as err:
        raise StorageError(f"could not make partition file {path} durable: {err}") from err


def _directories(root: Path, files: Sequence[DataFile]) -> list[Path]:
    """Each directory from the files' partition directories up to `root`'s parent, once."""
    directories: dict[Path, None] = {}
    for file in files:
        level = data_file_path(root, file).parent
        while True:
            directories.setdefault(level, None)
            if level == root or level == level.parent:
                break
            level = level.parent
    if files:
        directories.setdefault(root.parent, None)
    return list(directories)


def data_file_path(dataset_root: Path, file: DataFile) -> Path:
    """Absolute location of `file`, refusing paths that would leave the dataset directory."""
    root = Path(dataset_root)
    relative = Path(file.path)
    if relative.is_absolute() or ".." in relative.parts:
        raise StorageError(f"data file path {file.path!r} must be relative and stay inside {root}")
    return root / relative


def _remove_temporaries(temporary: Path) -> None:
    # DuckDB leaves `<name>.wal` next to its file while open; both belong to this write.
    for leftover in (temporary, temporary.with_name(temporary.name + ".wal")):
        # Not there (never written, or its directory path is blocked): nothing to remove; the write's
        # own error is the one to report.
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            leftover.unlink()


# --- schemas --------------------------------------------------------------------------------------


def unify_schemas(schemas: Sequence[pa.Schema], files: Sequence[DataFile]) -> pa.Schema:
    """One schema covering every file (union of columns), or a `StorageError` naming the clash."""
    import pyarrow as pa

    first = schemas[0]
    if all(s.equals(first) for s in schemas[1:]):
        return first
    try:
        return pa.unify_schemas(list(schemas), promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        names = ", ".join(f.path for f in files[:5])
        raise StorageError(f"partition files have incompatible schemas ({names}, ...): {err}") from err


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with exactly `schema`'s columns: missing ones NULL, differing types cast."""
    import pyarrow as pa

    if table.schema.equals(schema):
        return table
    columns = []
    for field in schema:
        if field.name in table.column_names:
            column = table.column(field.name)
            columns.append(column if column.type.equals(field.type) else column.cast(field.type))
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _project(table: pa.Table, columns: Sequence[str] | None) -> pa.Table:
    if columns is None:
        return table
    unknown = [c for c in columns if c not in table.column_names]
    if unknown:
        raise StorageError(f"unknown column(s) {unknown}; the partition files have {table.column_names}")
    return table.select(list(columns))


# --- vacuum of plain files ------------------------------------------------------------------------


def vacuum_files(
    dataset_root: Path,
    referenced_paths: Collection[str],
    *,
    cutoff: dt.datetime,
    dry_run: bool,
) -> FileVacuumResult:
    """Delete partition files and temporaries not in `referenced_paths`, last modified before `cutoff`.

    Only partition directories (top-level `name=value` folders) and top-level `part-*` / `.tmp-*` files are
    considered; anything else under the dataset directory (the catalog, the shared DuckDB file) is left.
    """
    root = Path(dataset_root)
    if not root.is_dir():
        return FileVacuumResult([], [])
    referenced = set(referenced_paths)
    cutoff_epoch = cutoff.timestamp()
    removed: list[VacuumedFile] = []
    kept_young: list[str] = []
    # Directory ages before this run deletes anything (a deletion refreshes its directory's mtime).
    old_directories = _old_partition_directories(root, cutoff_epoch)
    for path in _candidate_files(root):
        relative = path.relative_to(root).as_posix()
        if relative in referenced:
            continue
        try:
            info = path.stat()
        except FileNotFoundError:
            continue
        if info.st_mtime >= cutoff_epoch:
            kept_young.append(relative)  # may belong to a write or commit still in flight
            continue
        if not dry_run:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        removed.append(VacuumedFile(relative, info.st_size))
    if not dry_run:
        for directory in sorted(old_directories, key=lambda d: len(d.parts), reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(directory)  # only succeeds when empty
    return FileVacuumResult(removed, kept_young)


def _candidate_files(root: Path) -> Iterator[Path]:
    for entry in sorted(root.iterdir()):
        if entry.is_dir() and not entry.is_symlink() and "=" in entry.name:
            for directory, _subdirs, names in os.walk(entry):
                for name in sorted(names):
                    yield Path(directory) / name
        elif entry.is_file() and entry.name.startswith((FILE_PREFIX, TEMP_PREFIX)):
            yield entry


def _old_partition_directories(root: Path, cutoff_epoch: float) -> list[Path]:
    """Partition directories last modified before the cutoff: a younger (possibly empty) one may be where a
    writer is about to place its next file."""
    found: list[Path] = []
    for entry in root.iterdir():
        if entry.is_dir() and not entry.is_symlink() and "=" in entry.name:
            for directory, _subdirs, _names in os.walk(entry):
                with contextlib.suppress(OSError):
                    if os.stat(directory).st_mtime < cutoff_epoch:
                        found.append(Path(directory))
    return found
