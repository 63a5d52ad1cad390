"""Objects under `s3://bucket/prefix` through one boto3 client; conditional writes follow `base`'s rule.

Requests that fail transiently (a reset or truncated response, 5xx, `SlowDown`) are sent again by botocore
itself, but a body cut short while it is read is not: reads, listings, unconditional writes and deletes
are idempotent, so the store repeats those with a backoff (`REQUEST_ATTEMPTS` in all). A conditional write
is not repeated here: after an unknown outcome, only its caller can tell its own object from another
writer's (the catalog reads back its commit id). Whatever still fails is an `ObjectStoreError`.
"""

from __future__ import annotations

import datetime as dt
import functools
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from airflow_partitions.exceptions import ObjectStoreError
from airflow_partitions.objectstore.base import CONFLICT_RETRIES, ObjectInfo, as_key_list
from airflow_partitions.objectstore.errors import (
    is_not_found,
    is_precondition_failed,
    is_write_conflict,
    store_error,
)
from airflow_partitions.objectstore.location import S3Location
from airflow_partitions.objectstore.repeat import repeat_transient
from airflow_partitions.objectstore.settings import (
    S3Settings,
    SettingsLike,
    resolve_settings,
    shared_s3_client,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import DeleteTypeDef

# DeleteObjects takes at most 1000 keys per request.
_DELETE_BATCH = 1000


class S3Store:
    """Objects under `s3://bucket/prefix/`; `put_if_absent` is `PutObject` with `If-None-Match: *`."""

    def __init__(
        self, client: Any, bucket: str, prefix: str = "", *, settings: S3Settings | None = None
    ) -> None:
        self.client: S3Client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        # The resolved settings `client` was built from: readers build their pyarrow filesystem from them.
        self.settings = settings

    @classmethod
    def at(cls, location: S3Location, settings: SettingsLike | None = None) -> S3Store:
        """The store of `location`, reached with `settings` completed from the standard AWS environment
        (`resolve_settings`; none given: the environment alone)."""
        resolved = resolve_settings(settings)
        return cls(shared_s3_client(resolved), location.bucket, location.prefix, settings=resolved)

    def arrow_filesystem(self) -> Any:
        """A pyarrow filesystem over `s3://bucket/prefix/` (paths are store keys), reaching the same
        endpoint with the same credentials as this store."""
        from pyarrow import fs

        root = f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket
        return fs.SubTreeFileSystem(root, self.bucket_filesystem())

    def bucket_filesystem(self) -> Any:
        """A pyarrow filesystem reaching the same endpoint with the same credentials (paths `bucket/key`),
        its reads repeated after transient faults like the store's own (`objectstore.arrow`)."""
        from airflow_partitions.objectstore.arrow import repeating_filesystem  # lazy: loads pyarrow

        return repeating_filesystem((self.settings or resolve_settings(None)).arrow_filesystem())

    def __repr__(self) -> str:
        return f"S3Store({self.describe()!r})"

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def object_key(self, key: str) -> str:
        """The bucket's key of store key `key`."""
        return f"{self.prefix}/{key}" if self.prefix else key

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.object_key(key)}"

    def local_path(self, key: str) -> Path | None:
        return None

    # --- reads ------------------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        found = self.get_with_etag(key)
        return None if found is None else found[0]

    def get_with_etag(self, key: str) -> tuple[bytes, str] | None:
        """The body and ETag (the token `put_if_match` compares); `None` when the object does not exist."""
        return self._get(key, {})

    def get_range(self, key: str, start: int, length: int) -> bytes | None:
        if length <= 0:
            return b"" if self.exists(key) else None
        found = self._get(key, {"Range": f"bytes={start}-{start + length - 1}"})
        return None if found is None else found[0]

    def _get(self, key: str, extra: dict[str, Any]) -> tuple[bytes, str] | None:
        def read() -> tuple[bytes, str]:
            response = self.client.get_object(Bucket=self.bucket, Key=self.object_key(key), **extra)
            body: bytes = response["Body"].read()
            return body, str(response.get("ETag", ""))

        try:
            return repeat_transient(read)
        except Exception as err:
            if is_not_found(err):
                return None
            raise store_error(err, "read", self.uri(key)) from err

    def head(self, key: str) -> dict[str, Any] | None:
        """HEAD with checksums enabled (metadata, size, SHA-256); `None` when the object does not exist."""
        try:
            return dict(
                repeat_transient(
                    lambda: self.client.head_object(
                        Bucket=self.bucket, Key=self.object_key(key), ChecksumMode="ENABLED"
                    )
                )
            )
        except Exception as err:
            if is_not_found(err):
                return None
            raise store_error(err, "inspect", self.uri(key)) from err

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        strip = len(self.prefix) + 1 if self.prefix else 0
        arguments: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.object_key(prefix)}
        if start_after is not None:
            arguments["StartAfter"] = self.object_key(start_after)
        while True:
            # One page per request, so a page that fails is fetched again, not the whole listing.
            try:
                page = repeat_transient(lambda: self.client.list_objects_v2(**arguments))
            except Exception as err:
                raise store_error(err, "list", self.uri(prefix)) from err
            for item in page.get("Contents", []):
                modified = item["LastModified"]
                if modified.tzinfo is None:
                    modified = modified.replace(tzinfo=dt.UTC)
                etag = str(item["ETag"]).strip('"') if "ETag" in item else None
                yield ObjectInfo(item["Key"][strip:], int(item["Size"]), modified, etag)
            if not page.get("IsTruncated") or not page.get("NextContinuationToken"):
                return
            arguments["ContinuationToken"] = page["NextContinuationToken"]

    # --- writes -----------------------------------------------------------------------------------

    def put(self, key: str, data: bytes, *, content_type: str | None = None) -> None:
        arguments = _put_arguments(content_type, None, None)
        try:
            repeat_transient(
                lambda: self.client.put_object(
                    Bucket=self.bucket, Key=self.object_key(key), Body=data, **arguments
                )
            )
        except Exception as err:
            raise store_error(err, "write", self.uri(key)) from err

    def put_if_absent(
        self,
        key: str,
        data: bytes | IO[bytes],
        *,
        content_type: str | None = None,
        metadata: dict[str, str] | None = None,
        checksum_sha256: str | None = None,
    ) -> bool:
        """Create `key` unless it exists (412 -> False; 409 -> retried, see `objectstore.base`).

        `checksum_sha256` (base64) makes S3 refuse bytes that differ from those the caller hashed; a
        file body is rewound before each attempt.
        """
        arguments = _put_arguments(content_type, metadata, checksum_sha256)
        return self._conditional_put(key, data, {"IfNoneMatch": "*", **arguments}, "create")

    def put_if_match(self, key: str, data: bytes, etag: str, *, content_type: str | None = None) -> bool:
        """Replace `key` only while it still has `etag` (412 -> False; 409 -> retried)."""
        arguments = _put_arguments(content_type, None, None)
        return self._conditional_put(key, data, {"IfMatch": etag, **arguments}, "update")

    def _conditional_put(
        self, key: str, data: bytes | IO[bytes], arguments: dict[str, Any], action: str
    ) -> bool:
        for attempt in range(CONFLICT_RETRIES):
            if not isinstance(data, bytes):
                data.seek(0)
            try:
                self.client.put_object(Bucket=self.bucket, Key=self.object_key(key), Body=data, **arguments)
                return True
            except Exception as err:
                if is_precondition_failed(err):
                    return False
                if is_write_conflict(err):
                    time.sleep(0.02 * (attempt + 1))
                    continue
                raise store_error(err, action, self.uri(key)) from err
        raise ObjectStoreError(
            f"cannot {action} {self.uri(key)}: it stayed in conflict with concurrent writers after "
            f"{CONFLICT_RETRIES} attempts (HTTP 409); retry later"
        )

    def delete(self, keys: str | Iterable[str]) -> None:
        wanted = as_key_list(keys)
        if len(wanted) == 1:
            try:
                repeat_transient(
                    lambda: self.client.delete_object(Bucket=self.bucket, Key=self.object_key(wanted[0]))
                )
            except Exception as err:
                if not is_not_found(err):
                    raise store_error(err, "delete", self.uri(wanted[0])) from err
            return
        for start in range(0, len(wanted), _DELETE_BATCH):
            batch = wanted[start : start + _DELETE_BATCH]
            try:
                delete: DeleteTypeDef = {
                    "Objects": [{"Key": self.object_key(key)} for key in batch],
                    "Quiet": True,
                }
                response = repeat_transient(
                    functools.partial(self.client.delete_objects, Bucket=self.bucket, Delete=delete)
                )
            except Exception as err:
                raise store_error(err, "delete objects under", self.describe()) from err
            errors = response.get("Errors") or []
            if errors:
                first = errors[0]
                raise ObjectStoreError(
                    f"cannot delete {len(errors)} object(s), e.g. s3://{self.bucket}/{first.get('Key')}: "
                    f"{first.get('Code')} {first.get('Message')}"
                )


def _put_arguments(
    content_type: str | None, metadata: dict[str, str] | None, checksum_sha256: str | None
) -> dict[str, Any]:
    # Every write carries a SHA-256 the server checks: a body damaged in transit is refused, not stored.
    arguments: dict[str, Any] = {"ChecksumAlgorithm": "SHA256"}
    if content_type:
        arguments["ContentType"] = content_type
    if metadata:
        arguments["Metadata"] = metadata
    if checksum_sha256:
        arguments["ChecksumSHA256"] = checksum_sha256
    return arguments
