"""How to reach S3 or an S3-compatible store (MinIO, Ceph, moto): one settings type for the whole package.

File sources (`s3://` data, `S3Settings.from_source_params`), snapshots and a catalog on S3 (`from_mapping`,
from an Airflow AWS connection) share it; stores take a client it builds (`create_client()`), readers its
pyarrow filesystem (`arrow_filesystem()`). boto3 and pyarrow are imported only when a client or filesystem
is built, so the Airflow layer can import this module while parsing DAGs.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal, TypeAlias
from urllib.parse import urlsplit

from airflow_partitions.exceptions import S3SettingsError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# Source params naming the endpoint; unset, the standard AWS environment variables are used.
SOURCE_ENDPOINT_PARAMS = ("endpoint_url", "s3_endpoint_url", "s3_endpoint")
SOURCE_ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
REGION_ENV = ("AWS_REGION", "AWS_DEFAULT_REGION")
# boto3's switch that makes it ignore the endpoint variables above; honoured the same way here.
IGNORE_ENDPOINT_ENV = "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"

AddressingStyle: TypeAlias = Literal["auto", "path", "virtual"]
ADDRESSING_STYLES: tuple[AddressingStyle, ...] = ("auto", "path", "virtual")


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
            raise S3SettingsError(
                f"addressing_style {self.addressing_style!r} is not one of {', '.join(ADDRESSING_STYLES)}; "
                "use 'path' for MinIO and most S3-compatible stores"
            )
        if self.endpoint_url is not None and not re.match(r"^https?://[^/]+", self.endpoint_url):
            raise S3SettingsError(
                f"endpoint_url {self.endpoint_url!r} must be an http(s) URL such as http://localhost:9000"
            )
        if (self.aws_access_key_id is None) != (self.aws_secret_access_key is None):
            raise S3SettingsError(
                "aws_access_key_id and aws_secret_access_key must be given together (or both left unset "
                "to use boto3's default credential chain)"
            )
        if self.max_pool_connections < 1:
            raise S3SettingsError(f"max_pool_connections must be >= 1, got {self.max_pool_connections}")

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
            raise S3SettingsError(
                f"unknown S3 setting(s) {sorted(unknown)}; expected some of {sorted(known | set(aliases))}"
            )
        # Connection extras often arrive as text: "false" must not become a CA-bundle path named "false".
        if isinstance(values.get("verify_tls"), str):
            values["verify_tls"] = _text_to_verify(values["verify_tls"])
        if "max_pool_connections" in values:
            try:
                values["max_pool_connections"] = int(values["max_pool_connections"])
            except (TypeError, ValueError) as err:
                raise S3SettingsError(
                    f"max_pool_connections must be an integer, got {values['max_pool_connections']!r}"
                ) from err
        return cls(**values)

    @classmethod
    def from_source_params(cls, params: Mapping[str, Any]) -> S3Settings:
        """Settings of an `s3://` source from its params, then the standard AWS environment variables.

        Params: `endpoint_url` (or `s3_endpoint_url`, `s3_endpoint`), `region` (or `region_name`,
        `aws_region`), `aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`,
        `addressing_style`. Unset credentials fall back to boto3's and pyarrow's own chains.
        """

        def pick(names: tuple[str, ...], env: tuple[str, ...] = ()) -> str | None:
            for name in names:
                value = params.get(name)
                if value not in (None, ""):
                    return str(value)
            for name in env:
                value = os.environ.get(name)
                if value:
                    return value
            return None

        return cls.from_mapping(
            {
                "endpoint_url": pick(SOURCE_ENDPOINT_PARAMS, SOURCE_ENDPOINT_ENV),
                "region_name": pick(("region", "region_name", "aws_region"), REGION_ENV),
                "aws_access_key_id": pick(("aws_access_key_id", "access_key_id")),
                "aws_secret_access_key": pick(("aws_secret_access_key", "secret_access_key")),
                "aws_session_token": pick(("aws_session_token", "session_token")),
                "addressing_style": pick(("addressing_style",)),
            }
        )

    def resolved(self) -> S3Settings:
        """These settings with an unset endpoint and region taken from the standard AWS environment
        variables (`AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`; `AWS_REGION`, `AWS_DEFAULT_REGION`).

        boto3 reads those variables by itself, pyarrow's `S3FileSystem` ignores the endpoint ones: resolved
        here once, the boto3 client and the pyarrow filesystem built from one `S3Settings` reach the same
        store (catalog and files alike). Credentials are left to both libraries' own default chains.
        """
        endpoint, region = self.endpoint_url, self.region_name
        if endpoint is None and os.environ.get(IGNORE_ENDPOINT_ENV, "").strip().lower() != "true":
            endpoint = next((os.environ[n] for n in SOURCE_ENDPOINT_ENV if os.environ.get(n)), None)
        if region is None:
            region = next((os.environ[n] for n in REGION_ENV if os.environ.get(n)), None)
        if (endpoint, region) == (self.endpoint_url, self.region_name):
            return self
        return replace(self, endpoint_url=endpoint, region_name=region)

    def create_client(self) -> S3Client:
        """A new boto3 S3 client for these settings, resolved (`resolved()`); boto3 is imported here."""
        import boto3
        from botocore.config import Config

        settings = self.resolved()
        config = Config(
            s3={"addressing_style": settings.addressing_style},
            max_pool_connections=settings.max_pool_connections,
            retries={"max_attempts": 5, "mode": "standard"},
            # SHA-256 is requested explicitly where it matters. boto3's default CRC32 on every request
            # adds a second, weaker checksum, and older MinIO releases reject its aws-chunked trailers.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        session = boto3.session.Session(
            aws_access_key_id=settings.aws_access_key_id,
            aws_secret_access_key=settings.aws_secret_access_key,
            aws_session_token=settings.aws_session_token,
            region_name=settings.region_name,
        )
        return session.client(
            "s3", endpoint_url=settings.endpoint_url, verify=settings.verify_tls, config=config
        )

    def arrow_filesystem(self) -> Any:
        """A pyarrow `S3FileSystem` with the same endpoint, region and credentials as `create_client()`.

        The one builder of pyarrow S3 filesystems in the package: pyarrow does not read
        `AWS_ENDPOINT_URL`, so the resolved endpoint is passed explicitly (`resolved()`).
        """
        from pyarrow import fs

        settings = self.resolved()
        kwargs: dict[str, Any] = {}
        if settings.endpoint_url:
            parts = urlsplit(settings.endpoint_url)
            kwargs["endpoint_override"] = parts.netloc + parts.path.rstrip("/")
            kwargs["scheme"] = parts.scheme
        if settings.region_name:
            kwargs["region"] = settings.region_name
        if settings.aws_access_key_id and settings.aws_secret_access_key:
            kwargs["access_key"] = settings.aws_access_key_id
            kwargs["secret_key"] = settings.aws_secret_access_key
            if settings.aws_session_token:
                kwargs["session_token"] = settings.aws_session_token
        if settings.addressing_style == "virtual":
            kwargs["force_virtual_addressing"] = True
        return fs.S3FileSystem(**kwargs)


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
    raise S3SettingsError(f"S3 settings must be an S3Settings or a dict, got {type(settings).__name__}")


def resolve_settings(settings: SettingsLike | None) -> S3Settings:
    """`settings` (None: none given) completed from the standard AWS environment (`S3Settings.resolved`):
    the one resolution a store's client and its pyarrow filesystem are both built from."""
    return (as_settings(settings) if settings is not None else S3Settings()).resolved()


def create_s3_client(settings: SettingsLike) -> S3Client:
    """A new boto3 S3 client for `settings` (an `S3Settings` or its dict form)."""
    return as_settings(settings).create_client()


def shared_s3_client(settings: SettingsLike) -> S3Client:
    """A client reused across calls in this process (boto3 clients are thread-safe, and slow to build)."""
    # Keyed on the pid as well: a client's connection pool must not cross a fork.
    return _cached_client(resolve_settings(settings), os.getpid())


@functools.lru_cache(maxsize=16)
def _cached_client(settings: S3Settings, pid: int) -> S3Client:
    del pid
    return settings.create_client()
