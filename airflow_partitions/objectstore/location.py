"""`s3://bucket/prefix` URLs: the one parser of the package, for snapshot, catalog and source locations."""

from __future__ import annotations

import re
from dataclasses import dataclass

from airflow_partitions.exceptions import AirflowPartitionsError, SnapshotError

# Bucket rules of S3 (and MinIO): 3-63 chars of lowercase letters, digits, dots and hyphens,
# starting and ending with a letter or digit.
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True, slots=True)
class S3Location:
    """A bucket and a key prefix (no leading or trailing slash; empty for the bucket root)."""

    bucket: str
    prefix: str

    def key(self, *parts: str) -> str:
        """The object key of `parts` joined under this prefix."""
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def uri(self, *parts: str) -> str:
        return f"s3://{self.bucket}/{self.key(*parts)}"


def is_s3_url(url: object) -> bool:
    """Whether `url` names a location on S3 (`s3://...`): the one spelling of that test outside this
    layer's own parsers (None and local paths are not)."""
    return isinstance(url, str) and url.startswith("s3://")


def is_valid_bucket_name(bucket: str) -> bool:
    """S3's bucket naming rules (MinIO's too): the spec checks them when it is loaded, the parser here."""
    return bool(_BUCKET_RE.match(bucket)) and ".." not in bucket


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """Split `s3://bucket/prefix` into `(bucket, prefix)`; the prefix has no leading or trailing slash."""
    location = parse_s3_location(uri)
    return location.bucket, location.prefix


def parse_s3_location(
    uri: str,
    *,
    what: str = "snapshot location",
    error: type[AirflowPartitionsError] = SnapshotError,
    strict: bool = True,
) -> S3Location:
    """`s3://bucket/prefix` as an `S3Location`; `what` names the location and `error` is raised in messages.

    Strict (snapshot and catalog locations): only `s3://`, a valid bucket name and plain prefix segments.
    Not strict (source paths, already checked by the spec, which may hold globs): `s3a://` and a bare
    `bucket/key` are accepted too, and only a missing bucket is refused.
    """
    if not isinstance(uri, str):
        raise error(f"{what} must be a string like s3://bucket/prefix, got {uri!r}")
    scheme, sep, rest = uri.partition("://")
    if not strict:
        rest = rest.lstrip("/") if sep and scheme in ("s3", "s3a") else uri.lstrip("/")
    elif not sep or scheme != "s3":
        hint = " (s3a:// and s3n:// are Hadoop spellings; write s3://)" if scheme in ("s3a", "s3n") else ""
        raise error(f"{what} {uri!r} must start with s3://{hint}")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise error(f"{what} {uri!r} has no bucket; expected s3://bucket/prefix")
    if not strict:
        return S3Location(bucket, prefix.strip("/"))
    if any(ch in rest for ch in "?#\\") or any(ord(ch) < 32 for ch in rest):
        raise error(
            f"{what} {uri!r} contains '?', '#', a backslash or a control character; "
            "give a plain s3://bucket/prefix"
        )
    if not is_valid_bucket_name(bucket):
        raise error(
            f"bucket name {bucket!r} in {uri!r} is invalid: use 3-63 lowercase letters, digits, dots or "
            "hyphens, starting and ending with a letter or digit"
        )
    prefix = prefix.strip("/")
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        raise error(
            f"prefix {prefix!r} in {uri!r} has an empty, '.' or '..' segment; give a plain path like a/b"
        )
    return S3Location(bucket, prefix)
