"""Snapshot settings, locations, object layout, checksums and modes: the parts that need no S3 server."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import pytest

from airflow_partitions.exceptions import SnapshotError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.objectstore import S3Settings, as_settings, parse_s3_uri
from airflow_partitions.snapshots.checksums import (
    MIN_PART_SIZE,
    digest_file,
    part_size_for,
    s3_checksum_matches,
)
from airflow_partitions.snapshots.layout import SnapshotLayout, safe_relative_path
from airflow_partitions.snapshots.modes import SNAPSHOT_ACTIONS, SnapshotActions, snapshot_actions
from airflow_partitions.spec.model import SnapshotMode


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://bucket/prefix", ("bucket", "prefix")),
        ("s3://bucket/a/b/c/", ("bucket", "a/b/c")),
        ("s3://bucket", ("bucket", "")),
        ("s3://bucket/", ("bucket", "")),
        ("s3://my.bucket-1/x", ("my.bucket-1", "x")),
    ],
)
def test_parse_s3_uri_splits_bucket_and_prefix(uri: str, expected: tuple[str, str]) -> None:
    assert parse_s3_uri(uri) == expected


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("bucket/prefix", "must start with s3://"),
        ("s3a://bucket/prefix", "s3a:// and s3n:// are Hadoop spellings"),
        ("https://bucket/prefix", "must start with s3://"),
        ("s3:///prefix", "has no bucket"),
        ("s3://Bucket/prefix", "bucket name 'Bucket'"),
        ("s3://ab/prefix", "bucket name 'ab'"),
        ("s3://bucket/a/../b", "'..' segment"),
        ("s3://bucket/a//b", "empty"),
        ("s3://bucket/p?versionId=1", "contains '?'"),
    ],
)
def test_parse_s3_uri_rejects_malformed_locations(uri: str, message: str) -> None:
    with pytest.raises(SnapshotError, match=message.replace("?", r"\?").replace(".", r"\.")):
        parse_s3_uri(uri)


def test_settings_from_dict_accepts_connection_fields_and_hides_secrets() -> None:
    settings = as_settings(
        {
            "endpoint_url": "http://127.0.0.1:9000",
            "region": "eu-west-1",
            "aws_access_key_id": "AKIAEXAMPLE",
            "aws_secret_access_key": "very-secret-value",
            "aws_session_token": "session-token-value",
            "addressing_style": "path",
            "verify_tls": None,  # None means "not set": the default applies
        }
    )
    assert settings.region_name == "eu-west-1"
    assert settings.verify_tls is True
    assert "very-secret-value" not in repr(settings)
    assert "session-token-value" not in repr(settings)
    client = settings.create_client()
    assert client.meta.endpoint_url == "http://127.0.0.1:9000"
    assert client.meta.region_name == "eu-west-1"
    assert getattr(client.meta.config, "s3", None) == {"addressing_style": "path"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [("false", False), ("True", True), ("0", False), ("/etc/ssl/ca.pem", "/etc/ssl/ca.pem")],
)
def test_verify_tls_from_connection_text(text: str, expected: bool | str) -> None:
    settings = S3Settings.from_mapping({"verify_tls": text, "max_pool_connections": "8"})
    assert settings.verify_tls == expected
    assert settings.max_pool_connections == 8


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"endpoint": "http://x"}, "unknown S3 setting"),
        ({"addressing_style": "dns"}, "addressing_style 'dns'"),
        ({"endpoint_url": "localhost:9000"}, "must be an http"),
        ({"aws_access_key_id": "only-the-key"}, "must be given together"),
    ],
)
def test_settings_reject_bad_values(values: dict[str, str], message: str) -> None:
    with pytest.raises(SnapshotError, match=message):
        S3Settings.from_mapping(values)


def test_layout_keys_escape_dataset_and_keep_escaped_key_paths() -> None:
    layout = SnapshotLayout.of("s3://bucket/snapshots/", "trips 2026/x")
    key_path = PartitionKey(("a/b", "100%", None)).path(["region", "rate=x", "nulls"])
    key = layout.data_key(f"{key_path}/part-0.parquet")
    assert key == (
        "snapshots/trips%202026%2Fx/data/region=a%2Fb/rate%3Dx=100%25/nulls=%NULL/part-0.parquet"
    ), "the dataset name is escaped with keys.escape_component; key paths are used as already escaped"
    assert layout.manifest_key(7) == "snapshots/trips%202026%2Fx/manifests/v00000000000000000007.json"
    assert layout.version_of_manifest_key(layout.manifest_key(123)) == 123
    assert layout.version_of_manifest_key(layout.latest_key) is None


@pytest.mark.parametrize("path", ["", "/etc/passwd", "../x", "a/../../x", "a//b", "a/./b", "a\\b", "a/\x00b"])
def test_relative_paths_that_leave_the_dataset_root_are_refused(path: str) -> None:
    with pytest.raises(SnapshotError):
        safe_relative_path(path)


def test_digest_single_part_matches_sha256(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    digest = digest_file(path)
    assert digest.size == len(data)
    assert digest.sha256_hex == hashlib.sha256(data).hexdigest()
    assert digest.s3_checksum == base64.b64encode(hashlib.sha256(data).digest()).decode()
    assert digest.part_count is None


@pytest.mark.parametrize("extra", [0, 1, MIN_PART_SIZE - 1])
def test_digest_composite_is_sha256_of_part_digests(tmp_path: Path, extra: int) -> None:
    part = MIN_PART_SIZE
    data = os.urandom(2 * part + extra)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    digest = digest_file(path, part_size=part)
    parts = [data[i : i + part] for i in range(0, len(data), part)]
    expected = hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in parts)).digest()
    assert digest.part_count == len(parts)
    assert digest.s3_checksum == base64.b64encode(expected).decode()
    assert digest.sha256_hex == hashlib.sha256(data).hexdigest(), "the whole-file digest is kept as well"
    assert s3_checksum_matches(f"{digest.s3_checksum}-{len(parts)}", digest)
    assert not s3_checksum_matches(f"{digest.s3_checksum}-{len(parts) + 1}", digest)


def test_part_size_doubles_to_stay_under_ten_thousand_parts() -> None:
    assert part_size_for(100, MIN_PART_SIZE) == MIN_PART_SIZE
    assert part_size_for(10_000 * MIN_PART_SIZE + 1, MIN_PART_SIZE) == 2 * MIN_PART_SIZE
    with pytest.raises(SnapshotError, match="minimum part size"):
        part_size_for(100, MIN_PART_SIZE - 1)


@pytest.mark.parametrize(
    ("mode", "upload", "bootstrap"),
    [
        (SnapshotMode.ENABLED, True, True),
        (SnapshotMode.BOOTSTRAP_ONLY, False, True),
        (SnapshotMode.DISABLED, False, False),
        ("bootstrap_only", False, True),
    ],
)
def test_snapshot_actions_per_mode(mode: SnapshotMode | str, upload: bool, bootstrap: bool) -> None:
    assert snapshot_actions(mode) == SnapshotActions(upload=upload, bootstrap=bootstrap)


def test_every_mode_has_actions_and_unknown_modes_are_refused() -> None:
    assert set(SNAPSHOT_ACTIONS) == set(SnapshotMode)
    with pytest.raises(SnapshotError, match="use one of enabled, bootstrap_only, disabled"):
        snapshot_actions("upload_only")


def test_importing_snapshots_loads_no_heavy_module() -> None:
    """Operators import this package while DAG files are parsed: boto3 and pyarrow must load later."""
    import subprocess
    import sys

    code = (
        "import sys, airflow_partitions.snapshots; "
        "print(sorted(m for m in ('boto3', 'botocore', 'pyarrow', 'duckdb', 'pyspark') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
