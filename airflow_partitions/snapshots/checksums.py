"""SHA-256 of local files in one pass: the whole-file digest and, for multipart uploads, S3's composite."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from pathlib import Path

from airflow_partitions.exceptions import SnapshotError

READ_BLOCK = 1024 * 1024
# S3's limits on multipart uploads: every part but the last is at least 5 MiB, at most 10,000 parts.
MIN_PART_SIZE = 5 * 1024 * 1024
MAX_PARTS = 10_000


@dataclass(frozen=True, slots=True)
class FileDigest:
    """What one read of a file proved: its size, SHA-256, and the S3 checksum expected once uploaded."""

    size: int
    sha256_hex: str
    # base64 SHA-256 as S3 reports it: of the whole object for a single PUT, or of the concatenated part
    # digests ("composite") for a multipart upload.
    s3_checksum: str
    part_count: int | None


def part_size_for(size: int, chunksize: int) -> int:
    """The part size a multipart upload of `size` bytes uses: `chunksize`, doubled until <= 10,000 parts.

    This is the rule boto3's transfer manager applies; passing its result back as the chunk size keeps the
    upload and the composite checksum computed here in agreement.
    """
    if chunksize < MIN_PART_SIZE:
        raise SnapshotError(
            f"multipart chunk size {chunksize} is below S3's minimum part size of {MIN_PART_SIZE} bytes "
            "(5 MiB); raise multipart_chunksize"
        )
    part_size = chunksize
    while -(-size // part_size) > MAX_PARTS:
        part_size *= 2
    return part_size


def digest_file(path: Path, *, part_size: int | None = None) -> FileDigest:
    """Read `path` once; `part_size` set means it will be uploaded in parts of that size."""
    whole = hashlib.sha256()
    part_digests: list[bytes] = []
    part = hashlib.sha256()
    in_part = 0
    size = 0
    try:
        with path.open("rb") as handle:
            while block := handle.read(READ_BLOCK):
                size += len(block)
                whole.update(block)
                if part_size is None:
                    continue
                view = memoryview(block)
                while view:
                    take = min(len(view), part_size - in_part)
                    part.update(view[:take])
                    in_part += take
                    view = view[take:]
                    if in_part == part_size:
                        part_digests.append(part.digest())
                        part, in_part = hashlib.sha256(), 0
    except OSError as err:
        raise SnapshotError(f"cannot read partition file {path}: {err}") from err
    if part_size is None:
        return FileDigest(size, whole.hexdigest(), base64.b64encode(whole.digest()).decode("ascii"), None)
    if in_part or not part_digests:
        part_digests.append(part.digest())
    composite = hashlib.sha256(b"".join(part_digests)).digest()
    return FileDigest(size, whole.hexdigest(), base64.b64encode(composite).decode("ascii"), len(part_digests))


def s3_checksum_matches(reported: str, digest: FileDigest) -> bool:
    """Whether the SHA-256 checksum S3 reports for an object is the one `digest` predicts.

    Some servers append `-<part count>` to composite (multipart) checksums; when present it must match too.
    """
    value, _, parts = reported.partition("-")
    if value != digest.s3_checksum:
        return False
    return not parts or digest.part_count is None or parts == str(digest.part_count)
