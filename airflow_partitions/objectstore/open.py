"""A store from a location: `s3://bucket/prefix` (with the given S3 settings) or a local directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_partitions.exceptions import AirflowPartitionsError, ObjectStoreError
from airflow_partitions.objectstore.base import ObjectStore
from airflow_partitions.objectstore.local import LocalStore
from airflow_partitions.objectstore.location import is_s3_url, parse_s3_location
from airflow_partitions.objectstore.s3 import S3Store
from airflow_partitions.objectstore.settings import SettingsLike, resolve_settings


def store_from_url(url: str, *, settings: SettingsLike | None = None, what: str = "location") -> ObjectStore:
    """`S3Store` for `s3://bucket/prefix` reached with `settings` (else the AWS environment), or `LocalStore`.

    `what` names the location in error messages ("catalog location").
    """
    if is_s3_url(url):
        return S3Store.at(parse_s3_location(url, what=what, error=ObjectStoreError), settings)
    if "://" in url and not url.startswith("file://"):
        raise ObjectStoreError(f"unsupported {what} {url!r}; use a local path or s3://bucket/prefix")
    return LocalStore(Path(url.removeprefix("file://")))


def remote_filesystem(url: str, *, settings: SettingsLike | None = None) -> Any | None:
    """The pyarrow filesystem that reads the files under `url` where they are, or None when `url` is a
    local directory (read in place).

    For `s3://bucket/prefix`: a bucket-level filesystem (paths `bucket/key`) built from `settings`
    completed from the AWS environment, its reads repeated after transient faults (`objectstore.arrow`).
    """
    if not is_s3_url(url):
        return None
    from airflow_partitions.objectstore.arrow import repeating_filesystem  # lazy: loads pyarrow

    return repeating_filesystem(resolve_settings(settings).arrow_filesystem())


def filesystem_path(url: str, *, error: type[AirflowPartitionsError] = ObjectStoreError) -> str:
    """The path of `url` in the filesystem `remote_filesystem` gives (`bucket/prefix` for
    `s3://bucket/prefix`), or `url` itself for a local directory."""
    if not is_s3_url(url):
        return url
    location = parse_s3_location(url, what="data_root", error=error, strict=False)
    return location.uri().removeprefix("s3://").rstrip("/")


def is_local_location(url: str) -> bool:
    """Whether `url` is a directory on this machine's filesystem (not an object store location)."""
    return not is_s3_url(url)
