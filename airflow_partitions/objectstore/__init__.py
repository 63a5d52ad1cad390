"""Object storage: S3 settings, `s3://` locations, and local / S3 stores behind one interface.

Everything that reads or writes objects (the catalog, snapshots, file sources) goes through here: one
settings type (`S3Settings`), one URL parser (`parse_s3_location`), one conditional-write rule
(`objectstore.base`). boto3 and pyarrow load only when a client or filesystem is built.
"""

from __future__ import annotations

from airflow_partitions.objectstore.base import CONFLICT_RETRIES, TEMP_PREFIX, ObjectInfo, ObjectStore
from airflow_partitions.objectstore.local import LocalStore
from airflow_partitions.objectstore.location import S3Location, is_s3_url, parse_s3_location, parse_s3_uri
from airflow_partitions.objectstore.open import (
    filesystem_path,
    is_local_location,
    remote_filesystem,
    store_from_url,
)
from airflow_partitions.objectstore.s3 import S3Store
from airflow_partitions.objectstore.settings import (
    AddressingStyle,
    S3Settings,
    SettingsLike,
    as_settings,
    create_s3_client,
    resolve_settings,
    shared_s3_client,
)

__all__ = [
    "CONFLICT_RETRIES",
    "TEMP_PREFIX",
    "AddressingStyle",
    "LocalStore",
    "ObjectInfo",
    "ObjectStore",
    "S3Location",
    "S3Settings",
    "S3Store",
    "SettingsLike",
    "as_settings",
    "create_s3_client",
    "filesystem_path",
    "is_local_location",
    "is_s3_url",
    "parse_s3_location",
    "parse_s3_uri",
    "remote_filesystem",
    "resolve_settings",
    "shared_s3_client",
    "store_from_url",
]
