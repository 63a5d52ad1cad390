"""A bounded local cache of immutable partition files fetched from object storage, keyed by checksum.

A file enters the cache once: fetched whole, its bytes checked against the SHA-256 the catalog recorded
(`DataFile.checksum`), written to a temporary and renamed into place. Its path is then stable, so DuckDB's
Parquet metadata cache keeps working across calls. On reuse the cache compares the file's size and
modification time with those recorded when it was verified; when they differ (the file was changed on
disk) it checks the bytes again and fetches the file anew when they do not match.

The cache holds at most `max_bytes`; past that it evicts the least recently used files, never one a call
in progress holds (`acquire` pins, the release it returns unpins). One `FileCache` per directory per
process: readers sharing a directory share its pins and its bound. Concurrent calls fetch a file once.
"""

from __future__ import annotations

import atexit
import collections
import hashlib
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from airflow_partitions.exceptions import SnapshotIntegrityError
from airflow_partitions.objectstore.base import TEMP_PREFIX
from airflow_partitions.storage.datafile import file_checksum

# The default bound: 2 GiB, or a tenth of the free space of the cache's file system when that is less.
DEFAULT_MAX_BYTES = 2 * 1024**3
_FREE_FRACTION = 0.1
# The subdirectory of a reader's `cache_dir` holding the files keyed by checksum.
CHECKSUM_DIRECTORY = "by-checksum"

# A fetch: the file's bytes (exactly the catalog's size, or a `StorageError`).
Fetch = Callable[[], bytes]


@dataclass
class _Entry:
    path: Path
    size: int
    mtime_ns: int
    verified: bool  # its bytes matched the checksum at (size, mtime_ns)
    pins: int = 0


@dataclass(frozen=True)
class CachedFile:
    """One file a call wants: its checksum (the key), its size, its suffix and how to fetch it."""

    checksum: str
    size: int
    suffix: str
    name: str  # what error messages call it (its object-storage path)
    fetch: Fetch


class FileCache:
    """Checksum-keyed files under `directory`, at most `max_bytes` of them (see the module docstring)."""

    def __init__(self, directory: Path, max_bytes: int | None = None) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes if max_bytes is not None else default_max_bytes(directory)
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[str, _Entry] = collections.OrderedDict()  # LRU first
        self._fetching: dict[str, threading.Lock] = {}
        self.fetches = 0  # files fetched into the cache by this process
        self._adopt_existing()

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(entry.size for entry in self._entries.values())

    def holds(self, checksum: str) -> bool:
        """Whether a copy of the file with this checksum is in the cache (not verified here)."""
        with self._lock:
            return checksum in self._entries

    def acquire(self, files: Sequence[CachedFile]) -> tuple[list[str], Callable[[], None]]:
        """Local paths of `files`, in order, pinned until the returned release is called."""
        keys: list[str] = []
        try:
            paths = []
            for file in files:
                paths.append(str(self._acquire_one(file)))
                keys.append(file.checksum)
        except BaseException:
            self._unpin(keys)
            raise
        self._evict()
        return paths, lambda: self._unpin(keys)

    # --- one file ---------------------------------------------------------------------------------

    def _acquire_one(self, file: CachedFile) -> Path:
        key = file.checksum
        with self._lock:
            fetching = self._fetching.setdefault(key, threading.Lock())
        with fetching:  # one thread fetches a key; the others wait and reuse its copy
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None:
                    entry.pins += 1
                    self._entries.move_to_end(key)
            if entry is not None and self._still_good(entry, file):
                return entry.path
            if entry is not None:  # changed on disk: unpinned again below, once fetched anew
                with self._lock:
                    entry.pins -= 1
            return self._fetch(file)

    def _still_good(self, entry: _Entry, file: CachedFile) -> bool:
        """Whether the cached copy still holds the file's bytes: size and mtime as verified, or (when
        they changed, or the copy was found from an earlier process) the checksum of its bytes."""
        try:
            stat = entry.path.stat()
        except FileNotFoundError:
            return False
        if entry.verified and stat.st_size == entry.size and stat.st_mtime_ns == entry.mtime_ns:
            return True
        if stat.st_size == file.size and file_checksum(entry.path) == file.checksum:
            with self._lock:
                entry.size, entry.mtime_ns, entry.verified = stat.st_size, stat.st_mtime_ns, True
            return True
        return False

    def _fetch(self, file: CachedFile) -> Path:
        data = file.fetch()
        actual = hashlib.sha256(data).hexdigest()
        if actual != file.checksum:
            raise SnapshotIntegrityError(
                f"{file.name} does not hold the bytes this version recorded (SHA-256 {actual}, recorded "
                f"{file.checksum}): the object was changed after it was published; read another version "
                "or refresh the partition",
                uri=file.name,
                expected=file.checksum,
                actual=actual,
            )
        final = self.directory / f"{file.checksum}{file.suffix}"
        temporary = self.directory / f"{TEMP_PREFIX}{uuid.uuid4().hex}{file.suffix}"
        try:
            with open(temporary, "wb") as handle:
                handle.write(data)
            os.replace(temporary, final)
        finally:
            temporary.unlink(missing_ok=True)
        stat = final.stat()
        with self._lock:
            self.fetches += 1
            previous = self._entries.get(file.checksum)
            pins = 1 + (previous.pins if previous is not None else 0)
            self._entries[file.checksum] = _Entry(final, stat.st_size, stat.st_mtime_ns, True, pins=pins)
            self._entries.move_to_end(file.checksum)
        return final

    # --- bookkeeping ------------------------------------------------------------------------------

    def _unpin(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is not None and entry.pins > 0:
                    entry.pins -= 1
        self._evict()

    def _evict(self) -> None:
        """Remove least recently used, unpinned files until the cache fits its bound."""
        with self._lock:
            total = sum(entry.size for entry in self._entries.values())
            for key in list(self._entries):
                if total <= self.max_bytes:
                    break
                entry = self._entries[key]
                if entry.pins:
                    continue
                entry.path.unlink(missing_ok=True)
                del self._entries[key]
                total -= entry.size

    def _adopt_existing(self) -> None:
        """Files an earlier process left, oldest use first; each is verified on its first reuse."""
        found = []
        for path in self.directory.iterdir():
            if path.name.startswith(TEMP_PREFIX):
                path.unlink(missing_ok=True)  # a fetch cut short
                continue
            key = path.name.split(".", 1)[0]
            if len(key) != 64 or not path.is_file():
                continue
            stat = path.stat()
            found.append((stat.st_atime_ns, key, _Entry(path, stat.st_size, stat.st_mtime_ns, False)))
        for _, key, entry in sorted(found):
            self._entries[key] = entry
        self._evict()


def default_max_bytes(directory: Path) -> int:
    """`DEFAULT_MAX_BYTES`, or a tenth of the free space under `directory` when that is less."""
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return DEFAULT_MAX_BYTES
    return max(1, min(DEFAULT_MAX_BYTES, int(free * _FREE_FRACTION)))


_caches: dict[Path, FileCache] = {}
_caches_lock = threading.Lock()
_process_directory: Path | None = None


def file_cache(directory: Path | None, max_bytes: int | None = None) -> FileCache:
    """The process's cache under `directory` (in its `by-checksum` subdirectory, beside the copies
    `RemoteFiles.local_root` keeps by path; None: a temporary directory removed when the process exits);
    `max_bytes`, when given, sets its bound."""
    global _process_directory
    with _caches_lock:
        if directory is None:
            if _process_directory is None:
                _process_directory = Path(tempfile.mkdtemp(prefix="ap-cache-", dir=_scratch_directory()))
                atexit.register(shutil.rmtree, _process_directory, True)
            directory = _process_directory
        directory = (directory / CHECKSUM_DIRECTORY).resolve()
        cache = _caches.get(directory)
        if cache is None:
            cache = _caches[directory] = FileCache(directory, max_bytes)
        elif max_bytes is not None:
            cache.max_bytes = max_bytes
        return cache


def _scratch_directory() -> str | None:
    """Memory-backed /dev/shm when the machine has it, else the default temporary directory."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
