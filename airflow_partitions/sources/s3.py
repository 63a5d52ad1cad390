"""S3 access for file sources: settings from source params and the environment, boto3 and pyarrow clients."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from airflow_partitions.exceptions import SourceError

# Source params understood here; anything unset falls back to the standard AWS environment variables.
ENDPOINT_PARAMS = ("endpoint_url", "s3_endpoint_url", "s3_endpoint")
ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


@dataclass(frozen=True, slots=True)
class S3Settings:
    """How to reach an S3-compatible store (AWS, MinIO, moto): endpoint, region and optional static keys."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> S3Settings:
        """Settings from source params (`endpoint_url`, `region`, `aws_access_key_id`, ...), then env."""

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

        endpoint = pick(ENDPOINT_PARAMS, ENDPOINT_ENV)
        if endpoint is not None and not urlsplit(endpoint).scheme:
            raise SourceError(
                f"S3 endpoint {endpoint!r} has no scheme; write it as http://host:port or https://host"
            )
        return cls(
            endpoint_url=endpoint,
            region=pick(("region", "region_name", "aws_region"), ("AWS_REGION", "AWS_DEFAULT_REGION")),
            access_key_id=pick(("aws_access_key_id", "access_key_id")),
            secret_access_key=pick(("aws_secret_access_key", "secret_access_key")),
            session_token=pick(("aws_session_token", "session_token")),
        )

    def boto3_client(self) -> Any:
        """A boto3 S3 client for listing (ETags, sizes) and small reads."""
        import boto3

        kwargs: dict[str, Any] = {}
        if self.endpoint_url:
            kwargs["endpoint_url"] = self.endpoint_url
        if self.region:
            kwargs["region_name"] = self.region
        if self.access_key_id and self.secret_access_key:
            kwargs["aws_access_key_id"] = self.access_key_id
            kwargs["aws_secret_access_key"] = self.secret_access_key
            if self.session_token:
                kwargs["aws_session_token"] = self.session_token
        return boto3.client("s3", **kwargs)

    def arrow_filesystem(self) -> Any:
        """A pyarrow S3FileSystem with the same endpoint and credentials, for reading data files."""
        from pyarrow import fs

        kwargs: dict[str, Any] = {}
        if self.endpoint_url:
            parts = urlsplit(self.endpoint_url)
            kwargs["endpoint_override"] = parts.netloc + parts.path.rstrip("/")
            kwargs["scheme"] = parts.scheme
        if self.region:
            kwargs["region"] = self.region
        if self.access_key_id and self.secret_access_key:
            kwargs["access_key"] = self.access_key_id
            kwargs["secret_key"] = self.secret_access_key
            if self.session_token:
                kwargs["session_token"] = self.session_token
        return fs.S3FileSystem(**kwargs)


def split_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/key` (or `bucket/some/key`) -> (`bucket`, `some/key`)."""
    rest = uri.removeprefix("s3://").removeprefix("s3a://").lstrip("/")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise SourceError(f"S3 location {uri!r} names no bucket; write it as s3://bucket/prefix")
    return bucket, key
