"""pyarrow filesystems under the object store's repeat rule: every S3 read is sent again after a
transient fault, as the store's own requests are (`objectstore.s3.repeat_transient`).

pyarrow's S3 client retries a failed request a few times by itself, then gives up with an `OSError`
(`AWS Error SLOW_DOWN`, `NETWORK_CONNECTION`, ...); under a burst of faults that reaches the reader as a
failed read although the object is there. `repeating_filesystem` wraps a filesystem so that metadata
calls, opening a file and each ranged read of an open file are repeated with the store's backoff while
they fail transiently (`objectstore.errors.is_transient`), and a read that returns fewer bytes than the
file holds from that offset is repeated too. Reads of an open file are positional (`read_at`): a repeat
asks for exactly the same bytes again. Writes and local filesystems pass through unchanged.
"""

from __future__ import annotations

from typing import Any

from pyarrow import PythonFile
from pyarrow import fs as pafs

from airflow_partitions.objectstore.errors import ShortReadError
from airflow_partitions.objectstore.positional import PositionalReader
from airflow_partitions.objectstore.repeat import repeat_transient


def repeating_filesystem(filesystem: Any) -> Any:
    """`filesystem` with its reads under the repeat rule; a local filesystem (or one already wrapped)
    is returned as it is."""
    if _is_local(filesystem) or _is_repeating(filesystem):
        return filesystem
    return pafs.PyFileSystem(_RepeatingHandler(filesystem))


def _is_local(filesystem: Any) -> bool:
    if isinstance(filesystem, pafs.LocalFileSystem):
        return True
    if isinstance(filesystem, pafs.SubTreeFileSystem):
        return _is_local(filesystem.base_fs)
    return False


def _is_repeating(filesystem: Any) -> bool:
    if isinstance(filesystem, pafs.SubTreeFileSystem):
        return _is_repeating(filesystem.base_fs)
    return isinstance(filesystem, pafs.PyFileSystem) and isinstance(filesystem.handler, _RepeatingHandler)


class _RepeatingHandler(pafs.FileSystemHandler):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _RepeatingHandler) and self.inner.equals(other.inner)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return id(self.inner)

    def get_type_name(self) -> str:
        return f"repeating-{self.inner.type_name}"

    def normalize_path(self, path: str) -> str:
        normalized: str = self.inner.normalize_path(path)
        return normalized

    def get_file_info(self, paths: list[str]) -> Any:
        return repeat_transient(lambda: self.inner.get_file_info(paths))

    def get_file_info_selector(self, selector: Any) -> Any:
        return repeat_transient(lambda: self.inner.get_file_info(selector))

    def create_dir(self, path: str, recursive: bool) -> None:
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.inner.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        self.inner.delete_dir_contents("/", accept_root_dir=True)

    def delete_file(self, path: str) -> None:
        self.inner.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.inner.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.inner.copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        return PythonFile(_RepeatingReader(self.inner, path), mode="r")

    def open_input_file(self, path: str) -> Any:
        return PythonFile(_RepeatingReader(self.inner, path), mode="r")

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return self.inner.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self.inner.open_append_stream(path, metadata=metadata)


class _RepeatingReader(PositionalReader):
    """A seekable reader of one object: each read is one positional read of the inner file, repeated
    while it fails transiently or comes back short."""

    def __init__(self, inner: Any, path: str) -> None:
        super().__init__()
        self._name = path
        self._file = repeat_transient(lambda: inner.open_input_file(path))
        self._size = int(self._file.size())

    def _read_at(self, position: int, length: int) -> bytes:
        def read_once() -> bytes:
            data = self._file.read_at(length, position)
            if len(data) != length:
                raise ShortReadError(f"{self._name}: read {len(data)} of {length} bytes at offset {position}")
            return bytes(data)

        return repeat_transient(read_once)

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()
