"""A seekable, read-only file over positional reads: the file interface the retrying pyarrow reader
(`objectstore.arrow`) and the ranged S3 reader (`objectstore.ranges`) share.

A subclass sets `_size` and `_name` (for messages) and implements `_read_at(position, length)`, which
returns exactly `length` bytes from `position` (`length` > 0, within the file).
"""

from __future__ import annotations

import io
from typing import Any


class PositionalReader(io.RawIOBase):
    _size: int
    _name: str

    def __init__(self) -> None:
        super().__init__()
        self._position = 0

    def _read_at(self, position: int, length: int) -> bytes:
        raise NotImplementedError

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise OSError(f"cannot seek {self._name} to {base + offset}")
        self._position = base + offset
        return self._position

    def read(self, size: int | None = -1) -> bytes:
        wanted = self._size - self._position if size is None or size < 0 else size
        wanted = max(0, min(wanted, self._size - self._position))
        if wanted == 0:
            return b""
        data = self._read_at(self._position, wanted)
        self._position += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
