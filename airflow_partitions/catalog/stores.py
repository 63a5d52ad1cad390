"""Where catalog objects live: a local directory or an S3 prefix, behind one small protocol.

The commit protocol needs exactly one primitive beyond get/put/list/delete: `put_if_absent`, which creates
an object only if no object of that key exists, atomically, and says whether it did. Locally that is a
fully written and fsynced temporary hard-linked to the final name (`os.link` fails if the name exists);
on S3 it is `PutObject` with `If-None-Match: *` (HTTP 412 when the key exists). Readers therefore never
see a partial object, and of two writers racing for the same key exactly one wins, on both stores.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from airflow_partitions.exceptions import CatalogError
from airflow_partitions.storage.base import ensure_directory

TEMP_PREFIX = ".tmp-"


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One listed object: its key (relative to the store), size and last modification time (UTC)."""

    key: str
    size: int
    modified: dt.datetime


@runtime_checkable
class ObjectStore(Protocol):
    """The storage a catalog needs. Keys are `/`-separated relative paths."""

    def get(self, key: str, max_bytes: int | None = None) -> bytes | None:
        """The object's bytes (at most the first `max_bytes`), or `None` when it does not exist."""
        ...

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create `key` with `data` atomically unless it exists; `True` if this call created it."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Create or replace `key` atomically (readers see the old or the new bytes, never a mix)."""
        ...

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Objects whose key starts with `prefix` and sorts after `start_after`, in key order."""
        ...

    def delete(self, key: str) -> None:
        """Delete `key`; deleting a missing key is not an error."""
        ...

    def local_path(self, key: str) -> Path | None:
        """A filesystem path holding `key`'s bytes (lets readers memory-map), or `None` if remote."""
        ...

    def describe(self) -> str:
        """Where the store is, for messages (`/path/to/dir`, `s3://bucket/prefix`)."""
        ...


# --- local directory ------------------------------------------------------------------------------


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
            raise CatalogError(f"invalid object key {key!r}: use a relative path without '.' or '..'")
        return self.root.joinpath(*parts)

    def local_path(self, key: str) -> Path | None:
        return self._path(key)

    def get(self, key: str, max_bytes: int | None = None) -> bytes | None:
        try:
            with self._path(key).open("rb") as handle:
                return handle.read() if max_bytes is None else handle.read(max_bytes)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise CatalogError(f"cannot read {self._path(key)}: {err}") from err

    def put_if_absent(self, key: str, data: bytes) -> bool:
        final = self._path(key)
        temporary = self._write_temporary(final, data)
        try:
            os.link(temporary, final)
        except FileExistsError:
            return False
        except OSError as err:
            raise CatalogError(f"cannot create {final}: {err}") from err
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
        _fsync_directory(final.parent)
        return True

    def put(self, key: str, data: bytes) -> None:
        final = self._path(key)
        temporary = self._write_temporary(final, data)
        try:
            os.replace(temporary, final)
        except OSError as err:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
            raise CatalogError(f"cannot write {final}: {err}") from err
        _fsync_directory(final.parent)

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
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        except OSError as err:
            raise CatalogError(f"cannot write under {final.parent}: {err}") from err
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

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as err:
            raise CatalogError(f"cannot delete {path}: {err}") from err

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


def _key_order(entry: os.DirEntry[str]) -> str:
    return entry.name + "/" if entry.is_dir(follow_symlinks=False) else entry.name


def _fsync_directory(path: Path) -> None:
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # not every filesystem syncs directories; the object itself was synced
    finally:
        os.close(descriptor)


# --- S3 -------------------------------------------------------------------------------------------


class S3Store:
    """Objects under `s3://bucket/prefix/`; `put_if_absent` is `PutObject` with `If-None-Match: *`."""

    _CONFLICT_RETRIES = 20

    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")

    def __repr__(self) -> str:
        return f"S3Store({self.describe()!r})"

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def local_path(self, key: str) -> Path | None:
        return None

    def get(self, key: str, max_bytes: int | None = None) -> bytes | None:
        arguments: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key)}
        if max_bytes is not None:
            arguments["Range"] = f"bytes=0-{max_bytes - 1}"
        try:
            response = self.client.get_object(**arguments)
        except Exception as err:
            if _error_code(err) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise CatalogError(f"cannot read s3://{self.bucket}/{self._key(key)}: {err}") from err
        body: bytes = response["Body"].read()
        return body

    def put_if_absent(self, key: str, data: bytes) -> bool:
        for attempt in range(self._CONFLICT_RETRIES):
            try:
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*")
                return True
            except Exception as err:
                code = _error_code(err)
                if code in ("PreconditionFailed", "412"):
                    return False
                if code in ("ConditionalRequestConflict", "409"):
                    # S3 answers 409 while another conditional write of the same key is in flight.
                    time.sleep(0.02 * (attempt + 1))
                    continue
                raise CatalogError(
                    f"cannot create s3://{self.bucket}/{self._key(key)}: {err}; the bucket must support "
                    "conditional writes (If-None-Match)"
                ) from err
        raise CatalogError(f"s3://{self.bucket}/{self._key(key)} stayed in conflict after retries")

    def put(self, key: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        except Exception as err:
            raise CatalogError(f"cannot write s3://{self.bucket}/{self._key(key)}: {err}") from err

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        strip = len(self.prefix) + 1 if self.prefix else 0
        arguments: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._key(prefix)}
        if start_after is not None:
            arguments["StartAfter"] = self._key(start_after)
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(**arguments):
                for item in page.get("Contents", []):
                    modified = item["LastModified"]
                    if modified.tzinfo is None:
                        modified = modified.replace(tzinfo=dt.UTC)
                    yield ObjectInfo(item["Key"][strip:], int(item["Size"]), modified)
        except CatalogError:
            raise
        except Exception as err:
            raise CatalogError(f"cannot list s3://{self.bucket}/{self._key(prefix)}: {err}") from err

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as err:
            if _error_code(err) in ("NoSuchKey", "404"):
                return
            raise CatalogError(f"cannot delete s3://{self.bucket}/{self._key(key)}: {err}") from err


def _error_code(err: Exception) -> str | None:
    response = getattr(err, "response", None)
    if not isinstance(response, dict):
        return None
    code = response.get("Error", {}).get("Code")
    if code is None:
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return None if status is None else str(status)
    return str(code)


def store_from_url(url: str, *, client: Any = None, **client_settings: Any) -> ObjectStore:
    """A store for `s3://bucket/prefix` (boto3 client from `client_settings` unless given) or a local path."""
    if url.startswith("s3://"):
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not bucket:
            raise CatalogError(f"catalog location {url!r} has no bucket; use s3://bucket/prefix")
        if client is None:
            import boto3

            client = boto3.client("s3", **client_settings)
        return S3Store(client, bucket, prefix)
    if "://" in url and not url.startswith("file://"):
        raise CatalogError(f"unsupported catalog location {url!r}; use a local path or s3://bucket/prefix")
    return LocalStore(Path(url.removeprefix("file://")))
