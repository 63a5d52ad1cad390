"""The object store interface the catalog, snapshots and sources share, and what a listing returns.

Keys are `/`-separated and relative to the store (its directory, or its bucket and prefix).

Conditional writes, one rule for every store: `put_if_absent` creates a key only if no object of that
key exists, atomically, and returns whether this call created it. On S3 it is `PutObject` with
`If-None-Match: *`: HTTP 412 (`PreconditionFailed`) means the key exists, so the call returns False.
HTTP 409 (`ConditionalRequestConflict`) means another conditional write of the same key was in flight
and its outcome is not known yet: the write is retried after a short backoff until the server gives a
definite answer (201, or 412 once the other writer won), and only after `CONFLICT_RETRIES` attempts is it
an `ObjectStoreError`. A caller therefore never mistakes a race in progress for an existing object.
`S3Store.put_if_match` (compare-and-swap on an ETag) follows the same rule.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

CONFLICT_RETRIES = 20
TEMP_PREFIX = ".tmp-"


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One listed object: its key (relative to the store), size, modification time (UTC) and ETag (S3)."""

    key: str
    size: int
    modified: dt.datetime
    etag: str | None = None


@runtime_checkable
class ObjectStore(Protocol):
    """Objects under a local directory or an S3 prefix."""

    def get(self, key: str) -> bytes | None:
        """The object's bytes, or `None` when it does not exist."""
        ...

    def get_range(self, key: str, start: int, length: int) -> bytes | None:
        """At most `length` bytes from offset `start`, or `None` when the object does not exist."""
        ...

    def exists(self, key: str) -> bool: ...

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create `key` with `data` atomically unless it exists; `True` if this call created it."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Create or replace `key` atomically (readers see the old or the new bytes, never a mix)."""
        ...

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Objects whose key starts with `prefix` and sorts after `start_after`, in key order."""
        ...

    def delete(self, keys: str | Iterable[str]) -> None:
        """Delete one key or many; deleting a missing key is not an error."""
        ...

    def local_path(self, key: str) -> Path | None:
        """A filesystem path holding `key`'s bytes (lets readers memory-map), or `None` if remote."""
        ...

    def describe(self) -> str:
        """Where the store is, for messages (`/path/to/dir`, `s3://bucket/prefix`)."""
        ...

    def arrow_filesystem(self) -> Any:
        """A pyarrow filesystem whose paths are this store's keys (rooted at its directory or prefix),
        reaching S3 with the same settings as the store; pyarrow is imported here."""
        ...


def as_key_list(keys: str | Iterable[str]) -> list[str]:
    """One key or many, as a list (a string is one key, not its characters)."""
    return [keys] if isinstance(keys, str) else list(keys)
