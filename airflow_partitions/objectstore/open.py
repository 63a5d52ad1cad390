"""A store from a location: `s3://bucket/prefix` (with the given S3 settings) or a local directory."""

from __future__ import annotations

from pathlib import Path

from airflow_partitions.exceptions import ObjectStoreError
from airflow_partitions.objectstore.base import ObjectStore
from airflow_partitions.objectstore.local import LocalStore
from airflow_partitions.objectstore.location import parse_s3_location
from airflow_partitions.objectstore.s3 import S3Store
from airflow_partitions.objectstore.settings import SettingsLike


def store_from_url(url: str, *, settings: SettingsLike | None = None, what: str = "location") -> ObjectStore:
    """`S3Store` for `s3://bucket/prefix` reached with `settings` (else the AWS environment), or `LocalStore`.

    `what` names the location in error messages ("catalog location").
    """
    if url.startswith("s3://"):
        return S3Store.at(parse_s3_location(url, what=what, error=ObjectStoreError), settings)
    if "://" in url and not url.startswith("file://"):
        raise ObjectStoreError(f"unsupported {what} {url!r}; use a local path or s3://bucket/prefix")
    return LocalStore(Path(url.removeprefix("file://")))
