"""No row is read from bytes nobody checked: partition files against the SHA-256 the catalog records.

Every partition file's descriptor (`DataFile.checksum`) holds the SHA-256 of its bytes. Before a read
opens a local file (DuckDB scanning a Parquet file, ATTACHing a DuckDB file, pyarrow mapping an Arrow IPC
file), `verify_file` checks the file's size and digest once per process and remembers the file by
(path, size, mtime_ns, inode): a repeated read pays one `stat`. A damaged file is a `StorageError` naming
the dataset, the partition, the file and the repair (`damaged_file_error`), raised before the file is
parsed, so a damaged Arrow IPC file can never be memory-mapped into a crash.

DuckDB `tables` mode keeps published partitions in one shared, mutable file that has no recorded digest;
DuckDB checksums each of its blocks and verifies every block it loads, and `surface_duckdb_error` turns
its failures into the same `StorageError`. Parquet files are also written with page checksums, verified
by every pyarrow read (compaction, ranged reads of remote files).

`check_files` is the full check (no per-process cache, every byte read, shared-file tables scanned in
full) that compaction runs before rewriting anything and that a verification command can call.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_partitions.exceptions import StorageError
from airflow_partitions.storage.base import data_file_path
from airflow_partitions.storage.datafile import DataFile, file_checksum

if TYPE_CHECKING:
    from airflow_partitions.storage.base import PartitionStorage

# Whether reads check files before opening them. Off only to measure what the check costs
# (benchmarks/bench_verified_reads.py); compaction and `check_files` always check.
VERIFY_ON_READ = True

# How every repair named in an error starts (`repair_command`).
REPAIR_PREFIX = "airflow-partitions refresh SPEC"

_verified: set[tuple[str, int, int, int, str]] = set()
_verified_lock = threading.Lock()


def repair_command(dataset: str, files: Sequence[DataFile]) -> str:
    """The CLI command that rebuilds the partitions holding `files` from the source."""
    keys = sorted({partition_key_path(f) for f in files})
    return f"{REPAIR_PREFIX} {dataset} --partitions {' '.join(k or '<root>' for k in keys)}"


def partition_key_path(file: DataFile) -> str:
    """The key path of the partition holding `file` (its directory under the dataset root)."""
    return file.path.rsplit("/", 1)[0] if "/" in file.path else ""


def damaged_file_error(dataset: str, file: DataFile, location: str, detail: str) -> StorageError:
    """The error for a partition file whose bytes are not the ones the catalog recorded."""
    key = partition_key_path(file) or "(the unpartitioned root)"
    return StorageError(
        f"partition file {location} of dataset {dataset!r} (partition {key}) is damaged: {detail}. No row "
        f"was read from it; rebuild the partition from the source: {repair_command(dataset, [file])}"
    )


def verify_file(path: Path, file: DataFile, *, dataset: str, full: bool = False) -> None:
    """Check that `path` holds exactly the bytes `file` records (size and SHA-256), else raise
    `damaged_file_error`; once per process per (path, size, mtime, inode) unless `full`.

    A missing file raises `FileNotFoundError` (the callers report missing files themselves).
    """
    if not VERIFY_ON_READ and not full:
        return
    status = os.stat(path)
    identity = (str(path), status.st_size, status.st_mtime_ns, status.st_ino, file.checksum)
    if not full and identity in _verified:
        return
    if status.st_size != file.bytes:
        raise damaged_file_error(
            dataset, file, str(path), f"it holds {status.st_size} bytes, the catalog recorded {file.bytes}"
        )
    actual = file_checksum(path)
    if actual != file.checksum:
        raise damaged_file_error(
            dataset, file, str(path), f"its SHA-256 is {actual}, the catalog recorded {file.checksum}"
        )
    with _verified_lock:
        _verified.add(identity)


def remember_verified(path: Path, file: DataFile) -> None:
    """Record that `path` was just checked to hold `file`'s bytes (a download checked before it took its
    name), so its first open does not hash it again."""
    status = os.stat(path)
    with _verified_lock:
        _verified.add((str(path), status.st_size, status.st_mtime_ns, status.st_ino, file.checksum))


def verify_files(root: Path, files: Sequence[DataFile], *, dataset: str | None = None) -> None:
    """`verify_file` for each of `files` under the dataset root `root` (the dataset: the root's name)."""
    if not VERIFY_ON_READ:
        return

    name = dataset or Path(root).name
    for file in files:
        verify_file(data_file_path(Path(root), file), file, dataset=name)


def forget_verified() -> None:
    """Forget which files this process verified (the next read of each checks it again)."""
    with _verified_lock:
        _verified.clear()


def surface_duckdb_error(
    err: Exception, dataset: str, files: Sequence[DataFile], location: str
) -> StorageError:
    """A DuckDB failure reading `files` (at `location`) as a `StorageError` naming them and the repair:
    DuckDB verifies the checksum of every block it loads, so a damaged file fails here."""
    names = ", ".join(f.path for f in files[:5]) + (", ..." if len(files) > 5 else "")
    return StorageError(
        f"DuckDB could not read {location} (dataset {dataset!r}, partition file(s) {names}): "
        f"{str(err).strip()}. The file may be damaged; rebuild the partitions from the source: "
        f"{repair_command(dataset, files)}"
    )


def check_files(
    storage: PartitionStorage, dataset_root: Path, files: Sequence[DataFile], *, dataset: str | None = None
) -> None:
    """Check `files` fully, with no per-process cache: every file's size and SHA-256 against the catalog,
    and (duckdb `tables` mode) every row of each published table read through DuckDB, which verifies the
    checksum of each block. Raises a `StorageError` naming the first damaged file and the repair.

    This is the check compaction runs before rewriting anything, for a verification command to call.
    """
    root = Path(dataset_root)
    name = dataset or root.name
    for file in files:
        path = data_file_path(root, file)
        if file.table is not None and not path.exists():
            continue  # a published table whose staged copy is gone: checked below, in the shared file
        try:
            verify_file(path, file, dataset=name, full=True)
        except FileNotFoundError as err:
            raise StorageError(
                f"partition file {file.path} of dataset {name!r} is missing under {root}; rebuild the "
                f"partition from the source: {repair_command(name, [file])}"
            ) from err
    published = [f for f in files if f.table is not None]
    if published:
        storage.check_tables(root, published, dataset=name)


__all__ = [
    "check_files",
    "damaged_file_error",
    "forget_verified",
    "partition_key_path",
    "remember_verified",
    "repair_command",
    "surface_duckdb_error",
    "verify_file",
    "verify_files",
]
