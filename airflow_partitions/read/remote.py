"""Partition files under an object-storage data root, reached through a pyarrow `FileSystem`.

DuckDB cannot open remote files here, so every read works on local copies of the (immutable) files:
either from the bounded checksum-keyed file cache (`paths_for_call`, `read.cache`), each file fetched
whole with one request, concurrently, and verified once, or copied once to a local tree keyed by path and
checksum (`local_root`, for formats that need the dataset's layout). The first filtered read of a large
Parquet file fetches only its footer and the row groups the filter may need (`read.ranged`), handed to
DuckDB as an Arrow table (`parts_for_call`); a file read again is fetched whole into the cache. Which of
the two an engine uses is the storage class's choice (`PartitionStorage.duckdb_relation`).
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from airflow_partitions.exceptions import ObjectStoreError, StorageError
from airflow_partitions.objectstore.arrow import repeating_filesystem
from airflow_partitions.objectstore.open import filesystem_path
from airflow_partitions.objectstore.ranges import RangedObject
from airflow_partitions.read.cache import CachedFile, file_cache
from airflow_partitions.read.ranged import (
    RANGED_READ_MIN_BYTES,
    RangedRead,
    duckdb_scannable,
    read_row_groups,
    read_row_groups_by_ranges,
    write_local,
)
from airflow_partitions.storage.base import data_file_path
from airflow_partitions.storage.integrity import remember_verified, repair_command, verify_file

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from airflow_partitions.objectstore import S3Store
    from airflow_partitions.read.locations import RowFilter
    from airflow_partitions.storage import DataFile


class RemoteFiles:
    """The partition files of one dataset under `root` (`s3://bucket/prefix` or a path of `filesystem`)."""

    def __init__(
        self,
        root: str,
        filesystem: pafs.FileSystem,
        *,
        dataset: str,
        cache_dir: Path | None = None,
        cache_max_bytes: int | None = None,
        ranged_read_min_bytes: int | None = RANGED_READ_MIN_BYTES,
        store: S3Store | None = None,
    ) -> None:
        self.root = root.rstrip("/")
        # The S3 store over `root`, when its settings are known: then files are read by ranged GETs of
        # known size (no HEAD; `objectstore.ranges`) instead of through `filesystem`.
        self.store = store
        # The filesystem path every object path starts with (for `s3://`: `bucket/prefix`), parsed once.
        self._base = filesystem_path(self.root, error=StorageError)
        # Reads repeated after transient faults, as the object store repeats its own requests.
        self.filesystem = repeating_filesystem(filesystem)
        self.dataset = dataset
        self.cache_dir = cache_dir
        self.cache_max_bytes = cache_max_bytes
        # Files at least this large are read by ranges on their first filtered read (None: never).
        self.ranged_read_min_bytes = ranged_read_min_bytes
        self._ranged_lock = threading.Lock()
        self._ranged_seen: set[str] = set()  # checksums read by ranges once
        self.ranged_reads: list[RangedRead] = []  # what ranged reads fetched, newest last

    def path(self, relative: str) -> str:
        """The filesystem path of an object given relative to the dataset root."""
        return f"{self._base}/{relative}"

    def file_path(self, file: DataFile) -> str:
        return self.path(self.relative_path(file))

    def relative_path(self, file: DataFile) -> str:
        return data_file_path(Path("."), file).as_posix()  # refuses absolute and `..` paths

    def ranged_object(self, file: DataFile) -> RangedObject:
        """`file` on the store, read by ranged GETs of its recorded size (needs `store`)."""
        assert self.store is not None
        return RangedObject(self.store, self.relative_path(file), file.bytes)

    @contextlib.contextmanager
    def open(self, file: DataFile) -> Iterator[Any]:
        if self.store is not None:
            # The size is the catalog's: no HEAD; a Parquet reader's footer read is one GET.
            with pa.PythonFile(self.ranged_object(file), mode="r") as handle:
                yield handle
            return
        with self.filesystem.open_input_file(self.file_path(file)) as handle:
            yield handle

    def paths_for_call(self, files: Sequence[DataFile], releases: list[Callable[[], None]]) -> list[str]:
        """Local paths of `files`, in order, from the checksum-keyed file cache (`read.cache`); what is
        not there yet is fetched whole, one GET each, concurrently, and verified against its checksum.
        The files stay pinned in the cache until the call runs what this appends to `releases`.
        """
        cache = file_cache(self.cache_dir, self.cache_max_bytes)
        wanted = [
            CachedFile(
                file.checksum, file.bytes, Path(file.path).suffix, self.file_path(file), self._fetcher(file)
            )
            for file in files
        ]
        if len(wanted) == 1:
            paths, release = cache.acquire(wanted)
            releases.append(release)
            return paths
        from concurrent.futures import ThreadPoolExecutor

        # Each file pinned on its own: concurrent fetches, one release per file.
        def acquire(file: CachedFile) -> tuple[list[str], Callable[[], None]]:
            return cache.acquire([file])

        with ThreadPoolExecutor(max_workers=min(16, len(wanted))) as pool:
            futures = [pool.submit(acquire, file) for file in wanted]
            paths = []
            failure: BaseException | None = None
            for future in futures:
                try:
                    acquired, release = future.result()
                except BaseException as err:  # the others still get released
                    failure = failure or err
                    continue
                releases.append(release)
                paths.extend(acquired)
        if failure is not None:
            raise failure
        return paths

    def parts_for_call(
        self, files: Sequence[DataFile], releases: list[Callable[[], None]], *, row_filter: RowFilter | None
    ) -> list[str | pa.Table]:
        """As `paths_for_call`; with a `row_filter`, a large Parquet file neither cached nor read before
        is read by ranges instead (`read.ranged`): its part is then an Arrow table of only the row
        groups the filter may need (or, for types DuckDB scans otherwise from Arrow, a local file of
        them, removed when the call ends)."""
        if row_filter is None or self.ranged_read_min_bytes is None:
            return list(self.paths_for_call(files, releases))
        cache = file_cache(self.cache_dir, self.cache_max_bytes)
        with self._ranged_lock:
            ranged = [
                file.format == "parquet"
                and file.bytes >= self.ranged_read_min_bytes
                and file.checksum not in self._ranged_seen
                and not cache.holds(file.checksum)
                for file in files
            ]
            self._ranged_seen.update(f.checksum for f, r in zip(files, ranged, strict=True) if r)
        if not any(ranged):
            return list(self.paths_for_call(files, releases))
        whole = [f for f, r in zip(files, ranged, strict=True) if not r]
        cached = iter(self.paths_for_call(whole, releases) if whole else [])
        partial = iter(
            self._ranged([f for f, r in zip(files, ranged, strict=True) if r], row_filter, releases)
        )
        return [next(partial) if r else next(cached) for r in ranged]

    def _ranged(
        self, files: Sequence[DataFile], row_filter: RowFilter, releases: list[Callable[[], None]]
    ) -> list[str | pa.Table]:
        """The row groups of `files` that `row_filter` may need, per file: an Arrow table DuckDB scans
        (`read.ranged.duckdb_scannable`), else a per-call local Parquet file of them."""
        from concurrent.futures import ThreadPoolExecutor

        def read(file: DataFile) -> tuple[RangedRead, pa.Table]:
            try:
                if self.store is not None:
                    return read_row_groups_by_ranges(
                        self.ranged_object(file),
                        file,
                        row_filter.predicate,
                        row_filter.schema,
                    )
                return read_row_groups(
                    self.filesystem, self.file_path(file), file, row_filter.predicate, row_filter.schema
                )
            except (StorageError, ObjectStoreError) as err:
                # A page whose CRC fails, a footer that does not parse: name the repair too.
                raise StorageError(
                    f"{err}; if its bytes are damaged, rebuild the partition from the source: "
                    f"{repair_command(self.dataset, [file])}"
                ) from err

        if len(files) == 1:
            done = [read(files[0])]
        else:
            with ThreadPoolExecutor(max_workers=min(16, len(files))) as pool:
                done = list(pool.map(read, files))
        with self._ranged_lock:
            self.ranged_reads.extend(result for result, _ in done)
        parts: list[str | pa.Table] = []
        scratch: Path | None = None
        for _, table in done:
            scanned = duckdb_scannable(table)
            if scanned is not None:
                parts.append(scanned)
                continue
            # A column DuckDB would bind otherwise from Arrow than from Parquet: DuckDB reads these
            # rows from a Parquet file, as it reads the whole file, so the types and the filter agree.
            if scratch is None:
                scratch = Path(tempfile.mkdtemp(prefix=f"ap-ranged-{self.dataset}-"))
                releases.append(functools.partial(shutil.rmtree, scratch, ignore_errors=True))
            parts.append(write_local(table, scratch))
        return parts

    def _fetcher(self, file: DataFile) -> Callable[[], bytes]:
        remote = self.file_path(file)
        if self.store is not None:

            def fetch_by_ranges() -> bytes:
                # One GET per 8 MiB part of the recorded size, concurrently; no HEAD.
                whole = self.ranged_object(file)
                try:
                    whole.prefetch([(0, file.bytes)])
                    return whole.read(file.bytes)
                except ObjectStoreError as err:
                    raise StorageError(str(err)) from err

            return fetch_by_ranges

        def fetch() -> bytes:
            try:
                # The catalog knows the size: asking for exactly that many bytes is a single GET.
                with self.filesystem.open_input_stream(remote) as stream:
                    data = stream.read(file.bytes)
            except (OSError, pa.ArrowException) as err:
                raise StorageError(f"cannot read {remote}: {err}") from err
            if len(data) != file.bytes:
                raise StorageError(
                    f"{remote} holds {len(data)} bytes, the catalog recorded {file.bytes}: it is not the "
                    "file this version references; read another version or refresh the partition"
                )
            return bytes(data)

        return fetch

    def local_root(self, files: Sequence[DataFile], shared: Sequence[str] = ()) -> Path:
        """Copy `files` (immutable, keyed by path and checksum) and the `shared` objects to the local
        cache; its root."""
        import pyarrow.fs as pafs

        if self.cache_dir is None:
            self.cache_dir = Path(tempfile.mkdtemp(prefix=f"ap-{self.dataset}-"))
        root = self.cache_dir
        wanted: list[tuple[str, Path, DataFile | None]] = []
        for file in files:
            local = root / file.path
            marker = local.with_name(local.name + f".{file.checksum[:16]}.ok")
            if not marker.exists():
                wanted.append((self.file_path(file), local, file))
        # The shared DuckDB file has no recorded digest: DuckDB verifies its blocks as it reads them.
        wanted.extend((self.path(relative), root / relative, None) for relative in shared)
        for remote, local, expected in wanted:
            local.parent.mkdir(parents=True, exist_ok=True)
            temporary = local.with_name(f".tmp-{uuid.uuid4().hex}-{local.name}")
            try:
                pafs.copy_files(remote, str(temporary), source_filesystem=self.filesystem)
                if expected is not None:
                    # Checked before it takes its name: a damaged download is never marked good.
                    verify_file(temporary, expected, dataset=self.dataset, full=True)
            except (OSError, pa.ArrowException) as err:
                temporary.unlink(missing_ok=True)
                raise StorageError(f"cannot download {remote}: {err}") from err
            except StorageError as err:
                temporary.unlink(missing_ok=True)
                raise StorageError(str(err).replace(str(temporary), remote)) from err
            temporary.replace(local)
            if expected is not None:
                remember_verified(local, expected)
        for file in files:
            local = root / file.path
            local.with_name(local.name + f".{file.checksum[:16]}.ok").touch()
        return root
