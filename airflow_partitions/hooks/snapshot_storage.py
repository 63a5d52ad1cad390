"""Resolves the AWS connection that snapshot uploads and bootstraps use into S3 client settings."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook, conf

from airflow_partitions.exceptions import OrchestrationError
from airflow_partitions.hooks.connections import get_connection
from airflow_partitions.objectstore import create_s3_client

CONFIG_SECTION = "airflow_partitions"

# Extra fields understood, in the spelling of Airflow's amazon provider where it has one.
_EXTRA_SETTINGS = {
    "endpoint_url": "endpoint_url",
    "region_name": "region_name",
    "region": "region_name",
    "aws_session_token": "aws_session_token",
    "addressing_style": "addressing_style",
    "verify": "verify_tls",
    "max_pool_connections": "max_pool_connections",
}


class SnapshotStorageHook(BaseHook):
    """S3 (or MinIO / any S3-compatible store) settings from an Airflow AWS connection.

    Login / password are the access key id / secret key (or `aws_access_key_id` / `aws_secret_access_key`
    in the extra); the extra may set `endpoint_url` (MinIO: `http://minio:9000`), `region_name`,
    `aws_session_token`, `addressing_style` (`path` for most S3-compatible stores) and `verify`.

    `aws_conn_id=None` means `[airflow_partitions] aws_conn_id` from the Airflow config, else
    `aws_default`; when that default connection does not exist, boto3's default credential chain
    (environment, profile, instance role) is used, as Airflow's amazon provider does. A connection id
    given explicitly must exist. The connection is read on first use, not when the hook is built.
    """

    conn_name_attr = "aws_conn_id"
    default_conn_name = "aws_default"
    conn_type = "aws"
    hook_name = "Snapshot storage (S3)"

    def __init__(self, aws_conn_id: str | None = None) -> None:
        super().__init__()
        configured = str(conf.get(CONFIG_SECTION, "aws_conn_id", fallback="") or "").strip()
        # Only the implicit default may be missing; a connection someone named must exist.
        self.explicit = bool(aws_conn_id) or bool(configured)
        self.aws_conn_id = aws_conn_id or configured or self.default_conn_name

    @cached_property
    def s3_settings(self) -> dict[str, Any]:
        """Settings for the core's `S3Settings.from_mapping` (secrets included: never log this)."""

        try:
            connection = get_connection(self.aws_conn_id)
        except OrchestrationError:
            if self.explicit:
                raise
            self.log.info("No connection %r: using boto3's default credential chain", self.aws_conn_id)
            return {}
        extra = dict(connection.extra_dejson or {})
        settings: dict[str, Any] = {}
        access_key = connection.login or extra.get("aws_access_key_id")
        secret_key = connection.password or extra.get("aws_secret_access_key")
        if bool(access_key) != bool(secret_key):
            raise OrchestrationError(
                f"AWS connection {self.aws_conn_id!r} has an access key id without a secret key (or the "
                "reverse); set both (login/password) or neither to use the default credential chain"
            )
        if access_key:
            settings["aws_access_key_id"] = access_key
            settings["aws_secret_access_key"] = secret_key
        for extra_key, setting in _EXTRA_SETTINGS.items():
            if extra.get(extra_key) not in (None, ""):
                settings[setting] = extra[extra_key]
        if "endpoint_url" not in settings and connection.host:
            settings["endpoint_url"] = connection.host
        return settings

    def dataset_settings(self, project: Any, dataset: Any) -> dict[str, Any] | None:
        """These settings when the dataset's catalog or files live on S3, else None (nothing to reach).

        The one resolution every Airflow-side caller (operators, the dataset hook, the Partitions page)
        opens a dataset's catalog and files with; the core completes it from the AWS environment
        (`objectstore.resolve_settings`) for boto3 and pyarrow alike.
        """
        from airflow_partitions.catalog import needs_s3_settings  # lazy: loads sqlglot

        return self.s3_settings if needs_s3_settings(project, dataset) else None

    def get_conn(self) -> Any:
        """A boto3 S3 client for these settings."""

        return create_s3_client(self.s3_settings)

    def test_connection(self) -> tuple[bool, str]:
        """Used by the UI's Test button: can we list buckets with these credentials?"""
        try:
            self.get_conn().list_buckets()
        except Exception as err:
            return False, str(err)
        return True, "Connection successfully tested"
