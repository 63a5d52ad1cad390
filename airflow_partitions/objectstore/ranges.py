"""Byte ranges of one S3 object of known size by ranged GETs: no HEAD, nearby ranges coalesced, several
GETs at once, each repeated after a transient fault (`objectstore.repeat`).

The catalog records every partition file's size, so a reader never needs a HEAD to find an object's end:
the footer of a Parquet file is a GET of its last bytes, and the row groups a filter keeps are GETs of their
column chunks. Every response names the object's real size (`Content-Range: bytes a-b/size`); an object
whose size differs from the recorded one is not the file the catalog references, and says so at once
(`ObjectSizeError`, not repeated). A body cut short is a transient fault and is asked for again.

`RangedObject` is a seekable, read-only file (`io.RawIOBase`) over the bytes fetched so far: `prefetch`
fetches ranges ahead (coalesced, concurrently), and a read outside them is one ranged GET of its own. A
Parquet reader over it (pyarrow's `PythonFile`) then reads from memory: pyarrow's Python file wrapper
serialises reads, so concurrency lives here, not in the reads it issues.
"""

from __future__ import annotations

import bisect
import re
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from airflow_partitions.exceptions import ObjectStoreError, StorageError
from airflow_partitions.objectstore.errors import ShortReadError, error_code, is_not_found, store_error
from airflow_partitions.objectstore.positional import PositionalReader
from airflow_partitions.objectstore.repeat import repeat_transient

if TYPE_CHECKING:
    from airflow_partitions.objectstore.s3 import S3Store

# Ranges closer than this are fetched as one GET (pyarrow's pre-buffer hole size limit): a round trip
# costs more than reading a few KiB it did not need.
HOLE_BYTES = 8 * 1024
# A range larger than this is split into GETs of at most this size, fetched concurrently.
PART_BYTES = 8 * 1024 * 1024
# GETs in flight at once for one object.
CONCURRENCY = 8
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


# What a Parquet reader's first read of a footer asks for (Arrow's default footer read size).
FOOTER_READ_BYTES = 64 * 1024


class ObjectSizeError(ObjectStoreError, StorageError):
    """An object's size differs from the size recorded for it: it is not the expected partition file."""


class ObjectReplacedError(ObjectStoreError, StorageError):
    """An object's bytes are not the ones recorded for it, or it changed between two ranged GETs."""


def coalesce(
    ranges: Sequence[tuple[int, int]], hole: int = HOLE_BYTES, part: int = PART_BYTES
) -> list[tuple[int, int]]:
    """`(offset, length)` ranges merged where they overlap or lie less than `hole` bytes apart, then split
    into pieces of at most `part` bytes; sorted, empty ranges dropped."""
    merged: list[list[int]] = []
    for start, length in sorted(r for r in ranges if r[1] > 0):
        if merged and start <= merged[-1][1] + hole:
            merged[-1][1] = max(merged[-1][1], start + length)
        else:
            merged.append([start, start + length])
    pieces = []
    for start, end in merged:
        for offset in range(start, end, part):
            pieces.append((offset, min(part, end - offset)))
    return pieces


class RangedObject(PositionalReader):
    """One S3 object of `size` bytes read by ranges; `requests` counts the GETs sent (repeats included)."""

    def __init__(self, store: S3Store, key: str, size: int, *, concurrency: int = CONCURRENCY) -> None:
        super().__init__()
        self.store = store
        self.key = key
        self._size = size
        self._name = store.uri(key)
        self._concurrency = concurrency
        self._lock = threading.Lock()
        self._starts: list[int] = []  # fetched segments, sorted by offset, non-overlapping
        self._segments: dict[int, bytes] = {}
        self.requests = 0
        self.bytes_fetched = 0
        self._etag: str | None = None  # of the first response: every later one must name the same

    @property
    def uri(self) -> str:
        return self.store.uri(self.key)

    # --- fetching ---------------------------------------------------------------------------------

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Fetch `ranges` (`(offset, length)`, within the object) ahead of the reads that need them."""
        wanted = [r for r in coalesce(self._clip(ranges)) if not self._covered(*r)]
        if not wanted:
            return
        if len(wanted) == 1:
            self._fetch(*wanted[0])
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(self._concurrency, len(wanted))) as pool:
            for future in [pool.submit(self._fetch, start, length) for start, length in wanted]:
                future.result()

    def tail(self, length: int) -> bytes:
        """The object's last `length` bytes (all of it when smaller)."""
        length = min(length, self._size)
        self.prefetch([(self._size - length, length)])
        return self._slice(self._size - length, length)

    def _clip(self, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        clipped = []
        for start, length in ranges:
            end = min(self._size, start + length)
            if start < 0 or start > self._size:
                raise ObjectStoreError(
                    f"{self.uri}: range at offset {start} lies outside its {self._size} bytes"
                )
            if end > start:
                clipped.append((start, end - start))
        return clipped

    def _fetch(self, start: int, length: int) -> None:
        def get_once() -> bytes:
            with self._lock:
                self.requests += 1
            response = self.store.client.get_object(
                Bucket=self.store.bucket,
                Key=self.store.object_key(self.key),
                Range=f"bytes={start}-{start + length - 1}",
            )
            content_range = str(response.get("ContentRange") or "")
            self._check_size(content_range)
            self._check_etag(str(response.get("ETag") or ""))
            data: bytes = response["Body"].read()
            if not content_range and len(data) == self._size and len(data) != length:
                data = data[start : start + length]  # a server that ignores Range sends the whole object
            if len(data) != length:
                raise ShortReadError(f"{self.uri}: read {len(data)} of {length} bytes at offset {start}")
            return data

        try:
            data = repeat_transient(get_once)
        except (ObjectSizeError, ObjectReplacedError):
            raise
        except Exception as err:
            if error_code(err) in ("416", "InvalidRange"):
                raise ObjectSizeError(self._size_message(None)) from err
            if is_not_found(err):
                raise ObjectStoreError(
                    f"{self.uri} does not exist: the file this version references is gone (vacuumed, or "
                    "never uploaded); read a newer version or refresh the partition"
                ) from err
            raise store_error(err, "read", self.uri) from err
        with self._lock:
            self.bytes_fetched += len(data)
            self._store(start, data)

    def _check_size(self, content_range: str) -> None:
        match = _CONTENT_RANGE.fullmatch(content_range.strip())
        if match is None or match.group(3) == "*":
            return
        actual = int(match.group(3))
        if actual != self._size:
            raise ObjectSizeError(self._size_message(actual))

    def _check_etag(self, etag: str) -> None:
        """Ranges of one object read concurrently must come from one version of it: an object replaced
        between two GETs would mix the bytes of two files."""
        if not etag:
            return
        with self._lock:
            if self._etag is None:
                self._etag = etag
                return
            first = self._etag
        if etag != first:
            raise ObjectReplacedError(
                f"{self.uri} changed while it was read (ETag {first} then {etag}): it is not the file "
                "this version references; read another version or refresh the partition"
            )

    def _size_message(self, actual: int | None) -> str:
        holds = f"{actual} bytes," if actual is not None else "fewer bytes than the"
        return (
            f"{self.uri} holds {holds} {self._size} bytes recorded for it: it is not the file "
            "this version references (damaged, truncated or replaced); read another version or refresh "
            "the partition"
        )

    def _store(self, start: int, data: bytes) -> None:
        # Segments never overlap: a fetch only asks for ranges not covered when it was planned, and two
        # fetches of the same range keep the first.
        if self._covered_locked(start, len(data)):
            return
        if start in self._segments:  # a longer fetch from the same offset replaces the shorter one
            self._segments[start] = data
            return
        index = bisect.bisect_left(self._starts, start)
        self._starts.insert(index, start)
        self._segments[start] = data

    def _covered(self, start: int, length: int) -> bool:
        with self._lock:
            return self._covered_locked(start, length)

    def _covered_locked(self, start: int, length: int) -> bool:
        return self._find(start, length) is not None

    def _find(self, start: int, length: int) -> int | None:
        """The start of the fetched segment holding `[start, start + length)`, if one does."""
        index = bisect.bisect_right(self._starts, start) - 1
        if index < 0:
            return None
        begin = self._starts[index]
        return begin if start + length <= begin + len(self._segments[begin]) else None

    def _slice(self, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        with self._lock:
            begin = self._find(start, length)
            segment = self._segments[begin] if begin is not None else b""
        if begin is not None:
            return segment[start - begin : start - begin + length]
        return b"".join(self._pieces(start, length))

    def _pieces(self, start: int, length: int) -> list[bytes]:
        """`[start, start + length)` from the fetched segments, the gaps between them fetched first."""
        out: list[bytes] = []
        position, end = start, start + length
        while position < end:
            with self._lock:
                begin = self._find(position, 1)
                segment = self._segments[begin] if begin is not None else b""
                following = bisect.bisect_right(self._starts, position)
                gap_end = self._starts[following] if following < len(self._starts) else end
            if begin is None:
                self._fetch(position, min(end, gap_end) - position)
                continue
            piece = segment[position - begin : min(end, begin + len(segment)) - begin]
            out.append(piece)
            position += len(piece)
        return out

    # --- the file interface (PositionalReader) ---------------------------------------------------

    def _read_at(self, position: int, length: int) -> bytes:
        return self._slice(position, length)


def parquet_footer_length(tail: bytes, uri: str, size: int) -> int:
    """The footer's length from a Parquet file's last 8 bytes (`ObjectStoreError` when they are not a
    Parquet file's end)."""
    if len(tail) < 8 or tail[-4:] != b"PAR1":
        raise ObjectStoreError(
            f"{uri} does not end like a Parquet file (no PAR1 magic): its bytes are damaged or it is not the "
            "file this version references; read another version or refresh the partition"
        )
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 12 > size:
        raise ObjectStoreError(
            f"{uri} names a footer of {length} bytes in a file of {size}: its bytes are damaged; read "
            "another version or refresh the partition"
        )
    return length


def fetch_parquet_footer(obj: RangedObject, first: int = FOOTER_READ_BYTES) -> None:
    """Fetch the footer of a Parquet object: one GET of its last `first` bytes (a second for the rest of
    a larger footer), so that a Parquet reader over `obj` finds it in memory."""
    tail = obj.tail(first)
    length = parquet_footer_length(tail, obj.uri, obj.size())
    if length + 8 > len(tail):
        obj.prefetch([(obj.size() - length - 8, length + 8 - len(tail))])
