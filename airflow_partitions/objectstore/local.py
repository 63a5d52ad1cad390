"""Objects as files under a directory, with the durable-write helpers partition files use as well.

`put_if_absent` writes a temporary (`O_EXCL`), fsyncs it and hard-links it to the final name: `os.link`
fails if the name exists, so of two writers exactly one creates the object, and a reader never sees a
partial one.

`AP_UNSAFE_NO_FSYNC=1` skips every fsync here (a test suite's throwaway directories). Writes stay atomic
(temporary + rename or link) and a killed process still loses nothing; a power loss or an operating system
crash may lose or tear the latest commits. Never set it where the data matters.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from airflow_partitions.exceptions import ObjectStoreError
from airflow_partitions.objectstore.base import TEMP_PREFIX, ObjectInfo, as_key_list


class LocalStore:
    """Objects as files under `root`; `put_if_absent` is write-temporary + fsync + `os.link`."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def describe(self) -> str:
        return str(self.root)

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ObjectStoreError(f"invalid object key {key!r}: use a relative path without '.' or '..'")
        return self.root.joinpath(*parts)

    def local_path(self, key: str) -> Path | None:
        return self._path(key)

    def arrow_filesystem(self) -> Any:
        """A pyarrow filesystem over `root` (paths are store keys); pyarrow is imported here."""
        from pyarrow import fs

        return fs.SubTreeFileSystem(str(self.root.resolve()), fs.LocalFileSystem())

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise ObjectStoreError(f"cannot read {self._path(key)}: {err}") from err

    def get_range(self, key: str, start: int, length: int) -> bytes | None:
        try:
            with self._path(key).open("rb") as handle:
                handle.seek(start)
                return handle.read(length)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise ObjectStoreError(f"cannot read {self._path(key)}: {err}") from err

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def put_if_absent(self, key: str, data: bytes) -> bool:
        final = self._path(key)
        temporary = self._write_temporary(final, data)
        try:
            os.link(temporary, final)
        except FileExistsError:
            return False
        except OSError as err:
            raise ObjectStoreError(f"cannot create {final}: {err}") from err
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
        fsync_directory(final.parent)
        return True

    def put(self, key: str, data: bytes) -> None:
        final = self._path(key)
        temporary = self._write_temporary(final, data)
        try:
            os.replace(temporary, final)
        except OSError as err:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
            raise ObjectStoreError(f"cannot write {final}: {err}") from err
        fsync_directory(final.parent)

    def _write_temporary(self, final: Path, data: bytes) -> Path:
        try:
            # New directories (a log shard) are made durable too, or a crash could lose the entry of a
            # directory holding a committed record.
            ensure_directory(final.parent, stop_at=self.root)
            temporary = final.with_name(f"{TEMP_PREFIX}{uuid.uuid4().hex}-{final.name}")
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                while view:
                    written = os.write(descriptor, view)
                    view = view[written:]
                _fsync(descriptor)
            finally:
                os.close(descriptor)
        except OSError as err:
            raise ObjectStoreError(f"cannot write under {final.parent}: {err}") from err
        return temporary

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        # Walk in key order, skipping whole directories that sort before `start_after`: the catalog
        # shards its log into directories so finding the newest commits stays cheap at any history length.
        directory_key, _, _ = prefix.rpartition("/")
        base = self.root.joinpath(*directory_key.split("/")) if directory_key else self.root
        yield from self._walk(base, directory_key, prefix, start_after)

    def _walk(self, directory: Path, key: str, prefix: str, start_after: str | None) -> Iterator[ObjectInfo]:
        try:
            # Sort as the keys sort: a directory's keys continue with "/".
            entries = sorted(
                os.scandir(directory),
                key=lambda e: e.name + "/" if e.is_dir(follow_symlinks=False) else e.name,
            )
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if entry.name.startswith(TEMP_PREFIX):
                continue
            child = f"{key}/{entry.name}" if key else entry.name
            if entry.is_dir(follow_symlinks=False):
                folder = child + "/"
                if not (folder.startswith(prefix) or prefix.startswith(folder)):
                    continue
                if start_after is not None and folder < start_after and not start_after.startswith(folder):
                    continue
                yield from self._walk(Path(entry.path), child, prefix, start_after)
            elif child.startswith(prefix) and (start_after is None or child > start_after):
                try:
                    info = entry.stat()
                except FileNotFoundError:
                    continue
                yield ObjectInfo(child, info.st_size, dt.datetime.fromtimestamp(info.st_mtime, dt.UTC))

    def delete(self, keys: str | Iterable[str]) -> None:
        for key in as_key_list(keys):
            path = self._path(key)
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as err:
                raise ObjectStoreError(f"cannot delete {path}: {err}") from err

    def temporaries(self, prefix: str) -> Iterator[ObjectInfo]:
        """Leftover temporaries of writers killed mid-write (vacuum removes the old ones)."""
        directory_key = prefix.rstrip("/")
        base = self.root.joinpath(*directory_key.split("/")) if directory_key else self.root
        for directory, _subdirs, names in os.walk(base):
            for name in names:
                if name.startswith(TEMP_PREFIX):
                    path = Path(directory) / name
                    try:
                        info = path.stat()
                    except FileNotFoundError:
                        continue
                    key = path.relative_to(self.root).as_posix()
                    yield ObjectInfo(key, info.st_size, dt.datetime.fromtimestamp(info.st_mtime, dt.UTC))


def ensure_directory(directory: Path, *, stop_at: Path) -> None:
    """Create `directory` and make each newly created level durable (fsync of its parent)."""
    if directory.is_dir():
        return
    if not stop_at.exists():
        stop_at.mkdir(parents=True, exist_ok=True)
        fsync_directory(stop_at.parent)
    missing: list[Path] = []
    current = directory
    while not current.exists():
        missing.append(current)
        if current == stop_at or current.parent == current:
            break
        current = current.parent
    for level in reversed(missing):
        with contextlib.suppress(FileExistsError):
            level.mkdir()
        fsync_directory(level.parent)


NO_FSYNC_ENV = "AP_UNSAFE_NO_FSYNC"


def _fsync_skipped() -> bool:
    return os.environ.get(NO_FSYNC_ENV, "") not in ("", "0")


def _fsync(descriptor: int) -> None:
    if not _fsync_skipped():
        os.fsync(descriptor)


def fsync_file(path: Path) -> None:
    # Opened even when the fsync is skipped: a file that is not there is an error either way.
    descriptor = os.open(path, os.O_RDONLY)
    try:
        _fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_directory(path: Path) -> None:
    if _fsync_skipped():
        return
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the object itself was synced
    finally:
        os.close(descriptor)
