"""S3 connection settings for snapshots, the boto3 client factory, and `s3://bucket/prefix` parsing."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from airflow_partitions.exceptions import SnapshotError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

AddressingStyle: TypeAlias = Literal["auto", "path", "virtual"]
ADDRESSING_STYLES: tuple[AddressingStyle, ...] = ("auto", "path", "virtual")
# Bucket rules of S3 (and MinIO): 3-63 chars of lowercase letters, digits, dots and hyphens,
# starting and ending with a letter or digit.
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True, slots=True)
class S3Settings:
    """Where and how to reach S3 or an S3-compatible store (MinIO, Ceph, ...); secrets never print.

    Every field is optional: unset credentials fall back to boto3's usual chain (environment, profile,
    instance role). Set `endpoint_url` (and usually `addressing_style="path"`) for MinIO.
    """

    endpoint_url: str | None = None
    region_name: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = field(default=None, repr=False)
    aws_session_token: str | None = field(default=None, repr=False)
    addressing_style: AddressingStyle = "auto"
    verify_tls: bool | str = True
    max_pool_connections: int = 32

    def __post_init__(self) -> None:
        if self.addressing_style not in ADDRESSING_STYLES:
            raise SnapshotError(
                f"addressing_style {self.addressing_style!r} is not one of {', '.join(ADDRESSING_STYLES)}; "
                "use 'path' for MinIO and most S3-compatible stores"
            )
        if self.endpoint_url is not None and not re.match(r"^https?://[^/]+", self.endpoint_url):
            raise SnapshotError(
                f"endpoint_url {self.endpoint_url!r} must be an http(s) URL such as http://localhost:9000"
            )
        if (self.aws_access_key_id is None) != (self.aws_secret_access_key is None):
            raise SnapshotError(
                "aws_access_key_id and aws_secret_access_key must be given together (or both left unset "
                "to use boto3's default credential chain)"
            )
        if self.max_pool_connections < 1:
            raise SnapshotError(f"max_pool_connections must be >= 1, got {self.max_pool_connections}")

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> S3Settings:
        """Build from a plain dict (the Airflow layer resolves an AWS connection into one).

        Accepts the field names above, plus `region` for `region_name`; `None` values are ignored.
        """
        aliases = {"region": "region_name"}
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        unknown: list[str] = []
        for raw_name, value in settings.items():
            name = aliases.get(raw_name, raw_name)
            if name not in known:
                unknown.append(raw_name)
            elif value is not None:
                values[name] = value
        if unknown:
            raise SnapshotError(
                f"unknown S3 setting(s) {sorted(unknown)}; expected some of {sorted(known | set(aliases))}"
            )
        # Connection extras often arrive as text: "false" must not become a CA-bundle path named "false".
        if isinstance(values.get("verify_tls"), str):
            values["verify_tls"] = _text_to_verify(values["verify_tls"])
        if "max_pool_connections" in values:
            try:
                values["max_pool_connections"] = int(values["max_pool_connections"])
            except (TypeError, ValueError) as err:
                raise SnapshotError(
                    f"max_pool_connections must be an integer, got {values['max_pool_connections']!r}"
                ) from err
        return cls(**values)

    def create_client(self) -> S3Client:
        """A new boto3 S3 client for these settings (boto3 is imported here, not at module import)."""
        import boto3
        from botocore.config import Config

        config = Config(
            s3={"addressing_style": self.addressing_style},
            max_pool_connections=self.max_pool_connections,
            retries={"max_attempts": 5, "mode": "standard"},
            # SHA-256 is requested explicitly where it matters. boto3's default CRC32 on every request
            # adds a second, weaker checksum, and older MinIO releases reject its aws-chunked trailers.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        session = boto3.session.Session(
            aws_access_key_id=self.aws_access_key_id,
            aws_secret_access_key=self.aws_secret_access_key,
            aws_session_token=self.aws_session_token,
            region_name=self.region_name,
        )
        return session.client("s3", endpoint_url=self.endpoint_url, verify=self.verify_tls, config=config)


SettingsLike: TypeAlias = S3Settings | Mapping[str, Any]


def _text_to_verify(text: str) -> bool | str:
    """`verify_tls` from text: a boolean word, else the path of a CA bundle."""
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "1", "on"):
        return True
    if lowered in ("false", "no", "0", "off"):
        return False
    return text


def as_settings(settings: SettingsLike) -> S3Settings:
    """Accept either an `S3Settings` or the plain dict form of one."""
    if isinstance(settings, S3Settings):
        return settings
    if isinstance(settings, Mapping):
        return S3Settings.from_mapping(settings)
    raise SnapshotError(f"S3 settings must be an S3Settings or a dict, got {type(settings).__name__}")


def create_s3_client(settings: SettingsLike) -> S3Client:
    """A new boto3 S3 client for `settings` (an `S3Settings` or its dict form)."""
    return as_settings(settings).create_client()


def shared_s3_client(settings: SettingsLike) -> S3Client:
    """A client reused across calls in this process (boto3 clients are thread-safe, and slow to build)."""
    # Keyed on the pid as well: a client's connection pool must not cross a fork.
    return _cached_client(as_settings(settings), os.getpid())


@functools.lru_cache(maxsize=16)
def _cached_client(settings: S3Settings, pid: int) -> S3Client:
    del pid
    return settings.create_client()


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


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """Split `s3://bucket/prefix` into `(bucket, prefix)`; the prefix has no leading or trailing slash."""
    location = parse_s3_location(uri)
    return location.bucket, location.prefix


def parse_s3_location(uri: str) -> S3Location:
    """`parse_s3_uri` returning an `S3Location`."""
    if not isinstance(uri, str):
        raise SnapshotError(f"snapshot location must be a string like s3://bucket/prefix, got {uri!r}")
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme != "s3":
        hint = " (s3a:// and s3n:// are Hadoop spellings; write s3://)" if scheme in ("s3a", "s3n") else ""
        raise SnapshotError(f"snapshot location {uri!r} must start with s3://{hint}")
    if any(ch in rest for ch in "?#\\") or any(ord(ch) < 32 for ch in rest):
        raise SnapshotError(
            f"snapshot location {uri!r} contains '?', '#', a backslash or a control character; "
            "give a plain s3://bucket/prefix"
        )
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise SnapshotError(f"snapshot location {uri!r} has no bucket; expected s3://bucket/prefix")
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise SnapshotError(
            f"bucket name {bucket!r} in {uri!r} is invalid: use 3-63 lowercase letters, digits, dots or "
            "hyphens, starting and ending with a letter or digit"
        )
    prefix = prefix.strip("/")
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        raise SnapshotError(
            f"prefix {prefix!r} in {uri!r} has an empty, '.' or '..' segment; give a plain path like a/b"
        )
    return S3Location(bucket, prefix)
