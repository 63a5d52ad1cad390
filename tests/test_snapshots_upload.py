"""Partition file upload against a real S3 endpoint (moto's server over HTTP on loopback)."""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from airflow_partitions.exceptions import SnapshotError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.snapshots import upload_partition_snapshot
from airflow_partitions.snapshots.upload import upload_client
from airflow_partitions.storage.datafile import DataFile, file_checksum

pytestmark = pytest.mark.s3

MiB = 1024 * 1024


def _client(s3_server: dict[str, str]) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=s3_server["endpoint_url"],
        aws_access_key_id=s3_server["aws_access_key_id"],
        aws_secret_access_key=s3_server["aws_secret_access_key"],
        region_name=s3_server["region_name"],
    )


def _write_files(root: Path, key_path: str, sizes: list[int]) -> list[DataFile]:
    """Immutable partition files with the checksum the storage layer records."""
    files = []
    for index, size in enumerate(sizes):
        relative = f"{key_path}/part-{index:05d}-{os.urandom(4).hex()}.bin"
        local = root / relative
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(os.urandom(size))
        files.append(DataFile(relative, "parquet", rows=size, bytes=size, checksum=file_checksum(local)))
    return files


@contextmanager
def _writes_sent(s3_server: dict[str, str]) -> Iterator[list[str]]:
    """The write requests the upload client sends inside the block (observed with botocore events)."""
    writes: list[str] = []
    events = upload_client(s3_server).meta.events
    names = [
        f"before-call.s3.{operation}"
        for operation in ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload")
    ]

    def record(model: Any, **_: Any) -> None:
        writes.append(model.name)

    for name in names:
        events.register(name, record, unique_id=f"test-writes-{name}")
    try:
        yield writes
    finally:
        for name in names:
            events.unregister(name, unique_id=f"test-writes-{name}")


def _versions(client: Any, bucket: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket):
        for version in page.get("Versions", []):
            counts[version["Key"]] = counts.get(version["Key"], 0) + 1
    return counts


def test_upload_then_reupload_skips_every_file_without_a_put(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    client = _client(s3_server)
    # Versioning makes every PUT visible server-side: a second PUT of a key would add a version.
    client.put_bucket_versioning(Bucket=s3_bucket, VersioningConfiguration={"Status": "Enabled"})
    files = _write_files(tmp_path, "region=EU", [10, 2000, 0])
    location = f"s3://{s3_bucket}/snapshots"

    with _writes_sent(s3_server) as writes:
        first = upload_partition_snapshot(s3_server, location, tmp_path, files, dataset="trips")
    assert writes == ["PutObject"] * 3
    assert sorted(first.uploaded) == sorted(f.path for f in files)
    assert first.skipped == ()
    assert first.uploaded_bytes == 2010

    with _writes_sent(s3_server) as writes:
        second = upload_partition_snapshot(s3_server, location, tmp_path, files, dataset="trips")
    assert writes == [], "the second upload must not even attempt a PUT"
    assert second.uploaded == ()
    assert sorted(second.skipped) == sorted(f.path for f in files)
    assert second.skipped_bytes == 2010

    versions = _versions(client, s3_bucket)
    assert versions == {f"snapshots/trips/data/{f.path}": 1 for f in files}, "re-upload must not PUT again"
    for data_file in files:
        head = client.head_object(
            Bucket=s3_bucket, Key=f"snapshots/trips/data/{data_file.path}", ChecksumMode="ENABLED"
        )
        assert head["Metadata"]["sha256"] == data_file.checksum
        assert head["ChecksumSHA256"] == base64.b64encode(bytes.fromhex(data_file.checksum)).decode()
        body = client.get_object(Bucket=s3_bucket, Key=f"snapshots/trips/data/{data_file.path}")["Body"]
        assert body.read() == (tmp_path / data_file.path).read_bytes()
    assert first.to_json()["uploaded"] == 3
    assert second.to_json()["skipped"] == 3


def test_corrupted_local_file_fails_before_anything_is_uploaded(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    files = _write_files(tmp_path, "day=2026-01-01", [100, 200, 300])
    corrupted = tmp_path / files[1].path
    data = bytearray(corrupted.read_bytes())
    data[0] ^= 0xFF
    corrupted.write_bytes(bytes(data))

    with pytest.raises(SnapshotError, match="changed after it was written") as info:
        upload_partition_snapshot(s3_server, f"s3://{s3_bucket}/p", tmp_path, files, dataset="d")
    assert files[1].checksum in str(info.value)
    listing = _client(s3_server).list_objects_v2(Bucket=s3_bucket)
    assert listing.get("KeyCount", 0) == 0, "not even the intact files of the partition may be uploaded"


def test_multipart_upload_verifies_composite_checksum(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    files = _write_files(tmp_path, "bucket=3", [11 * MiB + 123, 1 * MiB])
    with _writes_sent(s3_server) as writes:
        result = upload_partition_snapshot(
            s3_server,
            f"s3://{s3_bucket}/mp",
            tmp_path,
            files,
            dataset="big",
            multipart_threshold=5 * MiB,
            multipart_chunksize=5 * MiB,
        )
    assert sorted(writes) == sorted(
        [
            "PutObject",
            "CreateMultipartUpload",
            "UploadPart",
            "UploadPart",
            "UploadPart",
            "CompleteMultipartUpload",
        ]
    ), "the 11 MiB file goes up in three 5 MiB parts, the 1 MiB file in one PUT"
    by_path = {outcome.path: outcome for outcome in result.files}
    assert by_path[files[0].path].multipart is True
    assert by_path[files[1].path].multipart is False

    client = _client(s3_server)
    head = client.head_object(Bucket=s3_bucket, Key=f"mp/big/data/{files[0].path}", ChecksumMode="ENABLED")
    assert head["ETag"].endswith('-3"'), "11 MiB in 5 MiB parts is a 3-part upload"
    raw = (tmp_path / files[0].path).read_bytes()
    part_digests = b"".join(
        hashlib.sha256(raw[i : i + 5 * MiB]).digest() for i in range(0, len(raw), 5 * MiB)
    )
    assert (
        head["ChecksumSHA256"].split("-")[0]
        == base64.b64encode(hashlib.sha256(part_digests).digest()).decode()
    )
    assert head["Metadata"]["sha256"] == files[0].checksum
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []

    again = upload_partition_snapshot(
        s3_server, f"s3://{s3_bucket}/mp", tmp_path, files, dataset="big", multipart_threshold=5 * MiB
    )
    assert len(again.skipped) == 2


def test_hostile_partition_values_map_to_exact_object_keys(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    names = ["region", "a=b", "pct"]
    values = [("x/y", "k=v", "100%"), ("Überprüfung ✓", "..", "%NULL"), (None, " ", "日本")]
    files = []
    for key_values in values:
        key_path = PartitionKey(key_values).path(names)
        files.extend(_write_files(tmp_path, key_path, [64]))
    result = upload_partition_snapshot(s3_server, f"s3://{s3_bucket}/h", tmp_path, files, dataset="hostile")
    assert len(result.uploaded) == 3

    listed = {obj["Key"] for obj in _client(s3_server).list_objects_v2(Bucket=s3_bucket)["Contents"]}
    assert listed == {f"h/hostile/data/{f.path}" for f in files}
    assert all(key.count("/") == 6 for key in listed), "escaped values never add path segments"


def test_existing_object_with_different_content_is_an_error_and_untouched(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    files = _write_files(tmp_path, "k=1", [500])
    client = _client(s3_server)
    key = f"s/d/data/{files[0].path}"
    other = os.urandom(500)
    client.put_object(
        Bucket=s3_bucket, Key=key, Body=other, Metadata={"sha256": hashlib.sha256(other).hexdigest()}
    )

    with pytest.raises(SnapshotError, match="already exists with different content"):
        upload_partition_snapshot(s3_server, f"s3://{s3_bucket}/s", tmp_path, files, dataset="d")
    assert client.get_object(Bucket=s3_bucket, Key=key)["Body"].read() == other, "never overwritten"


def test_existing_object_without_a_checksum_cannot_be_trusted(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    files = _write_files(tmp_path, "k=1", [500])
    client = _client(s3_server)
    client.put_object(
        Bucket=s3_bucket, Key=f"s/d/data/{files[0].path}", Body=(tmp_path / files[0].path).read_bytes()
    )
    with pytest.raises(SnapshotError, match="without a SHA-256"):
        upload_partition_snapshot(s3_server, f"s3://{s3_bucket}/s", tmp_path, files, dataset="d")


def test_concurrent_uploads_of_the_same_partition_both_succeed_with_one_object_each(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    client = _client(s3_server)
    client.put_bucket_versioning(Bucket=s3_bucket, VersioningConfiguration={"Status": "Enabled"})
    files = _write_files(tmp_path, "k=2", [1000] * 8)
    results: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(
                upload_partition_snapshot(s3_server, f"s3://{s3_bucket}/c", tmp_path, files, dataset="d")
            )
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    uploaded = [path for result in results for path in result.uploaded]
    assert sorted(uploaded) == sorted(f.path for f in files), "each file is uploaded by exactly one writer"
    assert set(_versions(client, s3_bucket).values()) == {1}


def test_unsafe_file_path_is_refused_before_any_request(tmp_path: Path) -> None:
    bad = DataFile("../outside.bin", "parquet", rows=1, bytes=1, checksum="0" * 64)
    # The endpoint is unreachable on purpose: the path check must fail first.
    settings = {"endpoint_url": "http://127.0.0.1:9", "aws_access_key_id": "x", "aws_secret_access_key": "x"}
    with pytest.raises(SnapshotError, match=r"'\.\.' segment"):
        upload_partition_snapshot(settings, "s3://bucket/p", tmp_path, [bad], dataset="d")


def test_missing_bucket_says_so(s3_server: dict[str, str], tmp_path: Path) -> None:
    files = _write_files(tmp_path, "k=1", [10])
    with pytest.raises(SnapshotError, match="bucket does not exist"):
        upload_partition_snapshot(s3_server, "s3://no-such-bucket-here/p", tmp_path, files, dataset="d")


def test_missing_checksum_is_refused(s3_server: dict[str, str], s3_bucket: str, tmp_path: Path) -> None:
    files = _write_files(tmp_path, "k=1", [10])
    unrecorded = DataFile(files[0].path, "parquet", rows=1, bytes=10, checksum="")
    with pytest.raises(SnapshotError, match="no SHA-256 checksum recorded"):
        upload_partition_snapshot(s3_server, f"s3://{s3_bucket}/p", tmp_path, [unrecorded], dataset="d")
