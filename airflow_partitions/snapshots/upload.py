"""Upload one partition's files to object storage: checksummed, write-once, skipped when already there.

A file whose object already holds the SHA-256 the storage layer recorded is skipped without being read.
Every file to send is read first and must match that SHA-256; a mismatch fails the whole partition
before any byte leaves the machine. A single PUT carries the SHA-256 (S3 rejects bytes that differ); a
multipart upload sends a SHA-256 per part and its composite checksum is checked once complete. Objects
are created with `If-None-Match: *` (on the PUT, or on the multipart completion), so an existing object
is never overwritten, and S3 shows an object only once it is complete. After the upload, HEAD must
report the expected size, SHA-256 metadata and S3 checksum, or the object is removed again.
"""

from __future__ import annotations

import base64
import functools
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from airflow_partitions.exceptions import SnapshotError
from airflow_partitions.objectstore import (
    CONFLICT_RETRIES,
    S3Location,
    S3Settings,
    S3Store,
    SettingsLike,
    as_settings,
)
from airflow_partitions.objectstore.errors import (
    is_precondition_failed,
    is_transient,
    is_write_conflict,
    store_error,
)
from airflow_partitions.objectstore.repeat import REQUEST_ATTEMPTS, transient_backoff
from airflow_partitions.snapshots.checksums import FileDigest, digest_file, part_size_for, s3_checksum_matches
from airflow_partitions.snapshots.layout import SHA256_METADATA_KEY, SnapshotLayout, local_file
from airflow_partitions.snapshots.parallel import run_all

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

DEFAULT_MULTIPART_THRESHOLD = 64 * 1024 * 1024
DEFAULT_MULTIPART_CHUNKSIZE = 16 * 1024 * 1024
DEFAULT_MAX_CONCURRENCY = 4
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


class FileLike(Protocol):
    """What upload needs of a partition file (storage's `DataFile` has it)."""

    @property
    def path(self) -> str: ...
    @property
    def bytes(self) -> int: ...
    @property
    def checksum(self) -> str: ...


class EntryLike(Protocol):
    """What upload needs of a partition (the catalog's `PartitionEntry` has it)."""

    @property
    def files(self) -> Sequence[Any]: ...


class UploadAction(StrEnum):
    UPLOADED = "uploaded"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class FileUploadOutcome:
    """What happened to one partition file."""

    path: str
    key: str
    bytes: int
    checksum: str
    action: UploadAction
    multipart: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "key": self.key,
            "bytes": self.bytes,
            "checksum": self.checksum,
            "action": self.action.value,
            "multipart": self.multipart,
        }


@dataclass(frozen=True, slots=True)
class SnapshotUploadResult:
    """The files of one upload call and whether each was sent or was already there."""

    dataset: str
    location: str
    files: tuple[FileUploadOutcome, ...]

    @property
    def uploaded(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files if f.action is UploadAction.UPLOADED)

    @property
    def skipped(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files if f.action is UploadAction.SKIPPED)

    @property
    def uploaded_bytes(self) -> int:
        return sum(f.bytes for f in self.files if f.action is UploadAction.UPLOADED)

    @property
    def skipped_bytes(self) -> int:
        return sum(f.bytes for f in self.files if f.action is UploadAction.SKIPPED)

    def to_json(self) -> dict[str, Any]:
        """A small JSON-safe summary (for XCom and logs)."""
        return {
            "dataset": self.dataset,
            "location": self.location,
            "uploaded": len(self.uploaded),
            "skipped": len(self.skipped),
            "uploaded_bytes": self.uploaded_bytes,
            "skipped_bytes": self.skipped_bytes,
            "files": [f.to_json() for f in self.files],
        }


@dataclass(frozen=True, slots=True)
class _PlannedFile:
    """A file to upload, checked for a safe path and a recorded checksum, before any I/O."""

    path: str
    local: Path
    key: str
    sha256_hex: str
    size: int


@dataclass(frozen=True, slots=True)
class _PreparedFile:
    """A file to upload whose local bytes were read and match the recorded checksum."""

    path: str
    local: Path
    key: str
    digest: FileDigest
    part_size: int | None


def upload_partition_snapshot(
    settings: SettingsLike,
    location: str | S3Location,
    dataset_root: str | Path,
    entry_or_files: EntryLike | Sequence[FileLike],
    *,
    dataset: str,
    multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
    multipart_chunksize: int = DEFAULT_MULTIPART_CHUNKSIZE,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
) -> SnapshotUploadResult:
    """Upload a partition's files to `<location>/<dataset>/data/<path relative to the dataset root>`.

    `entry_or_files` is a catalog `PartitionEntry` (its `.files`) or a sequence of storage `DataFile`s.
    Files at or above `multipart_threshold` bytes go up in parts of `multipart_chunksize` (>= 5 MiB).
    A file whose object already holds the recorded checksum is skipped without being read or sent.
    Raises `SnapshotError` when a local file to send does not match its recorded checksum (then no file
    of the call is sent), when an object already exists under the key with different content, or when
    S3 fails.
    """
    if multipart_threshold < 1:
        raise SnapshotError(f"multipart_threshold must be >= 1 byte, got {multipart_threshold}")
    part_size_for(0, multipart_chunksize)  # validates the chunk size before any file is read
    if max_concurrency < 1:
        raise SnapshotError(f"max_concurrency must be >= 1, got {max_concurrency}")
    layout = SnapshotLayout.of(location, dataset)
    root = Path(dataset_root)
    planned = [_plan(data_file, root, layout) for data_file in _files_of(entry_or_files)]
    _refuse_duplicate_keys(planned)
    store = S3Store(upload_client(settings), layout.bucket)

    heads = run_all(lambda item: store.head(item.key), planned, max_concurrency)
    outcomes: dict[str, FileUploadOutcome] = {}
    missing: list[_PlannedFile] = []
    for item, head in zip(planned, heads, strict=True):
        if head is None:
            missing.append(item)
        else:
            _check_existing(head, item, layout.uri(item.key))
            outcomes[item.path] = _outcome(item, UploadAction.SKIPPED, multipart=False)

    # Every file to send is read and checked first, so a corrupt file stops the partition before any
    # of its files is uploaded.
    prepared = run_all(
        lambda item: _read_and_check(item, multipart_threshold, multipart_chunksize), missing, max_concurrency
    )
    upload = functools.partial(_upload_one, store, max_concurrency=max_concurrency)
    for sent in run_all(upload, prepared, max_concurrency):
        outcomes[sent.path] = sent
    return SnapshotUploadResult(dataset, layout.location.uri(), tuple(outcomes[p.path] for p in planned))


def _files_of(entry_or_files: EntryLike | Sequence[FileLike]) -> list[FileLike]:
    files = getattr(entry_or_files, "files", entry_or_files)
    if isinstance(files, str | bytes) or not isinstance(files, Sequence):
        raise SnapshotError(
            f"expected a PartitionEntry or a sequence of DataFile, got {type(entry_or_files).__name__}"
        )
    for item in files:
        if not all(hasattr(item, attr) for attr in ("path", "bytes", "checksum")):
            raise SnapshotError(f"{item!r} is not a DataFile (needs path, bytes and checksum)")
    return list(files)


def _plan(data_file: FileLike, root: Path, layout: SnapshotLayout) -> _PlannedFile:
    recorded = str(data_file.checksum or "").lower()
    if not _SHA256_HEX.match(recorded):
        raise SnapshotError(
            f"partition file {data_file.path!r} has no SHA-256 checksum recorded ({data_file.checksum!r}); "
            "files must come from the storage layer, which records one when it writes them"
        )
    if isinstance(data_file.bytes, bool) or not isinstance(data_file.bytes, int) or data_file.bytes < 0:
        raise SnapshotError(f"partition file {data_file.path!r} has an invalid size {data_file.bytes!r}")
    key = layout.data_key(data_file.path)
    return _PlannedFile(data_file.path, local_file(root, data_file.path), key, recorded, data_file.bytes)


def _refuse_duplicate_keys(planned: Sequence[_PlannedFile]) -> None:
    seen: set[str] = set()
    for item in planned:
        if item.key in seen:
            raise SnapshotError(f"partition file {item.path!r} is listed twice")
        seen.add(item.key)


def _read_and_check(item: _PlannedFile, threshold: int, chunksize: int) -> _PreparedFile:
    try:
        size = item.local.stat().st_size
    except FileNotFoundError as err:
        raise SnapshotError(
            f"partition file {item.local} does not exist and is not in the snapshot yet; was the "
            "partition vacuumed or written on another machine? (DuckDB `tables` mode deletes a staged "
            "file once its table is published when the dataset's snapshots are not `enabled`: refresh "
            "such partitions with snapshots enabled, e.g. a full refresh, to upload them)"
        ) from err
    multipart = size > 0 and size >= threshold
    part_size = part_size_for(size, chunksize) if multipart else None
    digest = digest_file(item.local, part_size=part_size)
    if digest.sha256_hex != item.sha256_hex:
        raise SnapshotError(
            f"partition file {item.local} changed after it was written: SHA-256 is {digest.sha256_hex}, "
            f"the catalog recorded {item.sha256_hex}. Nothing was uploaded; refresh the partition again "
            "to rewrite it"
        )
    if digest.size != item.size:
        raise SnapshotError(
            f"partition file {item.local} is {digest.size} bytes, the catalog recorded {item.size}"
        )
    return _PreparedFile(item.path, item.local, item.key, digest, part_size)


def upload_client(settings: SettingsLike) -> S3Client:
    """The client uploads use for `settings`, reused within a process.

    Its multipart completions are conditional (`If-None-Match: *`) like its single PUTs. Register
    botocore event handlers on it to observe uploads (metrics, request counts).
    """
    # The pid is part of the cache key: a client's connection pool must not cross a fork.
    return _cached_write_once_client(as_settings(settings), os.getpid())


@functools.lru_cache(maxsize=16)
def _cached_write_once_client(settings: S3Settings, pid: int) -> S3Client:
    del pid
    client = settings.create_client()

    def complete_only_if_absent(params: dict[str, Any], **_: Any) -> None:
        # boto3's transfer manager does not pass IfNoneMatch through; add it where the object appears.
        params.setdefault("IfNoneMatch", "*")

    client.meta.events.register("before-parameter-build.s3.CompleteMultipartUpload", complete_only_if_absent)
    return client


def _upload_one(store: S3Store, item: _PreparedFile, *, max_concurrency: int) -> FileUploadOutcome:
    uri = store.uri(item.key)
    multipart = item.part_size is not None
    if multipart:
        created = _upload_parts(store, item, max_concurrency=max_concurrency)
    else:
        # The digest of the bytes we checked goes in the request: S3 rejects the PUT if the bytes it
        # receives differ (the file changed since), so a wrong object never becomes visible.
        with item.local.open("rb") as body:
            created = store.put_if_absent(
                item.key,
                body,
                metadata={SHA256_METADATA_KEY: item.digest.sha256_hex},
                checksum_sha256=item.digest.s3_checksum,
            )
    if not created:
        # Another writer created the object between our HEAD and PUT: same content means done.
        existing = store.head(item.key)
        if existing is None:
            raise SnapshotError(
                f"{uri} was created by a concurrent writer and deleted again; retry the upload"
            )
        planned = _PlannedFile(item.path, item.local, item.key, item.digest.sha256_hex, item.digest.size)
        _check_existing(existing, planned, uri)
        return _outcome(item, UploadAction.SKIPPED, multipart=multipart)
    _verify_uploaded(store, item, uri)
    return _outcome(item, UploadAction.UPLOADED, multipart=multipart)


def _upload_parts(store: S3Store, item: _PreparedFile, *, max_concurrency: int) -> bool:
    """A multipart upload completed with `If-None-Match: *`; False when the key exists.

    The conditional-write rule of `objectstore.base`: 412 means the key exists; 409 means a concurrent
    completion of the key was in flight, so once it settles the key either exists (False) or the upload
    is sent again.
    """
    from boto3.exceptions import S3UploadFailedError
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import BotoCoreError, ClientError

    config = TransferConfig(
        multipart_threshold=1,
        multipart_chunksize=item.part_size,
        max_concurrency=max_concurrency,
        use_threads=max_concurrency > 1,
    )
    extra = {"ChecksumAlgorithm": "SHA256", "Metadata": {SHA256_METADATA_KEY: item.digest.sha256_hex}}
    transient = 0
    for attempt in range(CONFLICT_RETRIES):
        try:
            store.client.upload_file(str(item.local), store.bucket, item.key, ExtraArgs=extra, Config=config)
            return True
        except (ClientError, BotoCoreError, S3UploadFailedError) as err:
            if is_precondition_failed(err):
                return False
            # A part or the completion failed transiently: the store's repeat rule (`REQUEST_ATTEMPTS`);
            # a completion that landed although its answer was lost is found by `exists` below.
            if is_transient(err) and transient < REQUEST_ATTEMPTS - 1:
                transient += 1
                time.sleep(transient_backoff(transient))
                if store.exists(item.key):
                    return False
                continue
            if not is_write_conflict(err):
                raise store_error(err, "upload", store.uri(item.key)) from err
        time.sleep(0.02 * (attempt + 1))
        if store.exists(item.key):
            return False
    raise SnapshotError(
        f"cannot upload {store.uri(item.key)}: it stayed in conflict with concurrent writers after "
        f"{CONFLICT_RETRIES} attempts (HTTP 409); retry later"
    )


def _outcome(
    item: _PlannedFile | _PreparedFile, action: UploadAction, *, multipart: bool
) -> FileUploadOutcome:
    if isinstance(item, _PreparedFile):
        return FileUploadOutcome(
            item.path, item.key, item.digest.size, item.digest.sha256_hex, action, multipart
        )
    return FileUploadOutcome(item.path, item.key, item.size, item.sha256_hex, action, multipart)


def _check_existing(head: Mapping[str, Any], item: _PlannedFile, uri: str) -> None:
    """Accept an object already under the key only if it provably holds the recorded bytes."""
    size = int(head.get("ContentLength", -1))
    remote_sha = (head.get("Metadata") or {}).get(SHA256_METADATA_KEY)
    reported = head.get("ChecksumSHA256")
    single_part = "-" not in str(head.get("ETag", ""))
    same: bool | None = None
    if size != item.size:
        same = False
    elif remote_sha is not None:
        same = remote_sha.lower() == item.sha256_hex
    elif reported is not None and single_part:
        # Written by another tool with a SHA-256 checksum: for a single PUT that is the file's digest.
        same = str(reported) == base64.b64encode(bytes.fromhex(item.sha256_hex)).decode("ascii")
    if same is None:
        raise SnapshotError(
            f"{uri} already exists without a SHA-256 to compare with, so it cannot be proven to hold "
            f"{item.local}; data files are write-once, so delete that object if it is stale and retry"
        )
    if not same:
        raise SnapshotError(
            f"{uri} already exists with different content (size {size}, sha256 {remote_sha}) than "
            f"{item.local} (size {item.size}, sha256 {item.sha256_hex}). Data files are immutable and "
            "never overwritten: another dataset or catalog may share this snapshot location; give each "
            "its own location"
        )


def _verify_uploaded(store: S3Store, item: _PreparedFile, uri: str) -> None:
    head = store.head(item.key)
    problem: str | None = None
    if head is None:
        problem = "it is missing right after the upload"
    else:
        size = int(head.get("ContentLength", -1))
        remote_sha = (head.get("Metadata") or {}).get(SHA256_METADATA_KEY)
        reported = head.get("ChecksumSHA256")
        if size != item.digest.size:
            problem = f"its size is {size}, expected {item.digest.size}"
        elif remote_sha != item.digest.sha256_hex:
            problem = f"its sha256 metadata is {remote_sha!r}, expected {item.digest.sha256_hex}"
        elif reported is not None and not s3_checksum_matches(str(reported), item.digest):
            # The S3 checksum is computed from the bytes actually sent; a file rewritten between the
            # digest and the upload shows here.
            problem = f"S3 reports checksum {reported}, expected {item.digest.s3_checksum}"
    if problem is None:
        return
    if head is not None:
        try:
            store.delete(item.key)
        except SnapshotError as err:
            raise SnapshotError(
                f"upload of {item.local} to {uri} failed verification ({problem}) and the bad object "
                f"could not be removed ({err}); delete it by hand before retrying"
            ) from err
    raise SnapshotError(
        f"upload of {item.local} to {uri} failed verification: {problem}. The object was removed; "
        "check that nothing rewrites partition files during upload, then retry"
    )
