"""Download one snapshot object to a local file: verified SHA-256, then an atomic no-overwrite placement.

The bytes go to a hidden temporary in the destination directory (the storage layer's `.tmp-` prefix, so
its vacuum removes what a killed download leaves behind), are checked against the manifest's size and
SHA-256 and fsynced (`fetch_verified`); only then are they hard-linked to the final name
(`place_verified`). `os.link` fails rather than replace a file, so a partition file that exists locally
is never rewritten. Keeping the two steps apart lets a bootstrap verify every file before it places any.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_partitions.exceptions import SnapshotError, SnapshotIntegrityError
from airflow_partitions.objectstore.base import TEMP_PREFIX
from airflow_partitions.objectstore.errors import is_not_found, store_error
from airflow_partitions.objectstore.local import ensure_directory, fsync_directory, fsync_file
from airflow_partitions.objectstore.repeat import repeat_transient

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

_READ_BLOCK = 1024 * 1024


class DownloadAction(StrEnum):
    DOWNLOADED = "downloaded"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class FileDownload:
    """One object to fetch: where from, where to, and what its bytes must be."""

    bucket: str
    key: str
    local: Path
    sha256_hex: str
    size: int


def local_file_matches(path: Path, sha256_hex: str, size: int) -> bool | None:
    """None when `path` does not exist; else whether it holds exactly `size` bytes with that SHA-256."""
    try:
        if path.stat().st_size != size:
            return False
    except FileNotFoundError:
        return None
    return _digest(path)[1] == sha256_hex


def _digest(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while block := handle.read(_READ_BLOCK):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def _streamed_download(client: S3Client, item: FileDownload, temporary: Path) -> tuple[int, str]:
    """One GET, hashed while written: a single pass over the bytes."""
    digest = hashlib.sha256()
    received = 0
    body = client.get_object(Bucket=item.bucket, Key=item.key)["Body"]
    with temporary.open("xb") as handle:
        for block in body.iter_chunks(_READ_BLOCK):
            digest.update(block)
            received += len(block)
            handle.write(block)
    return received, digest.hexdigest()


def _ranged_download(
    client: S3Client, item: FileDownload, temporary: Path, chunksize: int, max_concurrency: int
) -> None:
    from boto3.s3.transfer import TransferConfig

    config = TransferConfig(
        multipart_threshold=1,
        multipart_chunksize=chunksize,
        max_concurrency=max_concurrency,
        use_threads=max_concurrency > 1,
    )
    client.download_file(item.bucket, item.key, str(temporary), Config=config)


def fetch_verified(
    client: S3Client,
    item: FileDownload,
    *,
    stop_at: Path,
    ranged_threshold: int,
    chunksize: int,
    max_concurrency: int,
) -> Path | None:
    """Download `item` to a verified, fsynced temporary beside its final name and return that temporary.

    None when an identical local file already exists. The caller places the temporary with
    `place_verified` or removes it. `stop_at` bounds the directories created; objects of
    `ranged_threshold` bytes or more are fetched as concurrent ranged GETs of `chunksize`.
    """
    from boto3.exceptions import S3TransferFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    uri = f"s3://{item.bucket}/{item.key}"
    existing = local_file_matches(item.local, item.sha256_hex, item.size)
    if existing is True:
        return None
    if existing is False:
        raise SnapshotError(
            f"local file {item.local} exists with content other than the snapshot's {uri} "
            f"(sha256 {item.sha256_hex}); partition files are immutable, so something else wrote it. "
            "Move it away and bootstrap again"
        )
    ensure_directory(item.local.parent, stop_at=stop_at)
    temporary = item.local.with_name(f"{TEMP_PREFIX}{uuid.uuid4().hex}-{item.local.name}")
    verified = False
    try:

        def download() -> tuple[int, str]:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()  # what an attempt cut short wrote
            if item.size >= ranged_threshold:
                _ranged_download(client, item, temporary, chunksize, max_concurrency)
                return _digest(temporary)
            return _streamed_download(client, item, temporary)

        try:
            # A body cut short or a reset connection fetches the object again from its start.
            received, sha256_hex = repeat_transient(download)
        except (ClientError, S3TransferFailedError) as err:
            if is_not_found(err):
                raise SnapshotError(
                    f"{uri} is listed in the snapshot manifest but missing from object storage; the "
                    "snapshot location was modified by hand. Upload the dataset again or pick another version"
                ) from err
            raise store_error(err, "download", uri) from err
        except BotoCoreError as err:
            raise store_error(err, "download", uri) from err
        if received != item.size or sha256_hex != item.sha256_hex:
            raise SnapshotIntegrityError(
                f"{uri} does not match the snapshot manifest: got {received} bytes with sha256 "
                f"{sha256_hex}, expected {item.size} bytes with sha256 {item.sha256_hex}. "
                "The object was changed after it was published; nothing was written locally. Upload the "
                "partition again from the catalog that wrote it, or bootstrap another version",
                uri=uri,
                expected=item.sha256_hex,
                actual=sha256_hex,
            )
        fsync_file(temporary)
        verified = True
        return temporary
    finally:
        if not verified:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()


def place_verified(item: FileDownload, temporary: Path) -> DownloadAction:
    """Hard-link a verified temporary to its final name (never replacing a file), then remove it."""
    try:
        try:
            os.link(temporary, item.local)
        except FileExistsError:
            # A concurrent bootstrap placed it first: fine if it holds the same bytes.
            if local_file_matches(item.local, item.sha256_hex, item.size):
                return DownloadAction.SKIPPED
            raise SnapshotError(
                f"local file {item.local} appeared during the download with other content; move it away "
                "and bootstrap again"
            ) from None
        fsync_directory(item.local.parent)
        return DownloadAction.DOWNLOADED
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def download_verified(
    client: S3Client,
    item: FileDownload,
    *,
    stop_at: Path,
    ranged_threshold: int,
    chunksize: int,
    max_concurrency: int,
) -> DownloadAction:
    """`fetch_verified` then `place_verified`: fetch `item` unless an identical local file exists."""
    temporary = fetch_verified(
        client,
        item,
        stop_at=stop_at,
        ranged_threshold=ranged_threshold,
        chunksize=chunksize,
        max_concurrency=max_concurrency,
    )
    if temporary is None:
        return DownloadAction.SKIPPED
    return place_verified(item, temporary)
