"""Snapshot integrity: an edited manifest or a corrupted object is refused before anything is installed."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_partitions.catalog import Catalog, LocalStore, PartitionEntry, PartitionSpecInfo, Snapshot
from airflow_partitions.exceptions import SnapshotError, SnapshotIntegrityError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.snapshots import (
    bootstrap_snapshot,
    read_snapshot_manifest,
    upload_partition_snapshot,
    upload_snapshot_manifest,
    vacuum_snapshots,
)
from airflow_partitions.storage import get_storage

pytestmark = pytest.mark.s3

SPEC = PartitionSpecInfo.from_fields([("region", "region", "string")])
REGIONS: list[str | None] = ["EU", "a/b", "100%", "k=v", "Überprüfung ✓", "", None]
PREFIX = "snapshots/trips/manifests/"


def _catalog(directory: Path) -> Catalog:
    directory.mkdir(parents=True, exist_ok=True)
    return Catalog(LocalStore(directory), "trips", storage=get_storage("parquet"))


def _root(catalog: Catalog) -> Path:
    assert catalog.data_root is not None
    return Path(catalog.data_root)


def _rows(region: str | None, first_id: int) -> pa.Table:
    return pa.table(
        {
            "region": pa.array([region, region], pa.string()),
            "id": pa.array([first_id, None], pa.int64()),
            "note": pa.array(["quote ' \" = / %", None], pa.string()),
        }
    )


def _refresh_and_publish(
    settings: Mapping[str, str], location: str, catalog: Catalog, regions: list[str | None], first_id: int
) -> int:
    storage = get_storage("parquet")
    entries = []
    for offset, region in enumerate(regions):
        key = PartitionKey((region,))
        files = storage.write(_rows(region, first_id + offset), _root(catalog), key.path(SPEC.names))
        entries.append(PartitionEntry.from_files(key, SPEC, files))
    latest = catalog.latest()
    version = catalog.commit(
        base_version=latest.version if latest else None, upserts=entries, partition_spec=SPEC
    )
    snapshot = catalog.latest()
    assert snapshot is not None
    for entry in snapshot.partitions.values():
        upload_partition_snapshot(settings, location, _root(catalog), entry, dataset="trips")
    upload_snapshot_manifest(settings, location, "trips", snapshot)
    return version


def _client(settings: Mapping[str, str]) -> Any:
    import boto3

    return boto3.client("s3", **settings)


def _manifest_key(version: int) -> str:
    return f"{PREFIX}v{version:020d}.json"


def _edit_id_max_by_one_digit(settings: Mapping[str, str], bucket: str, version: int) -> tuple[int, int]:
    """Change the last digit of one partition's `id` max statistic in the stored manifest, nothing else."""
    client = _client(settings)
    key = _manifest_key(version)
    text = client.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8")
    document = json.loads(text)

    def encode(doc: Any) -> str:
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    assert encode(document) == text, "re-encoding reproduces the stored bytes, so only the edit differs"
    bounds = document["partitions"][0]["files"][0]["stats"]["id"]  # [min, max, null_count]
    old = int(bounds[1])
    new = old - 1 if old % 10 else old + 1
    bounds[1] = new
    edited = encode(document)
    assert len(edited) == len(text)
    assert sum(a != b for a, b in zip(edited, text, strict=True)) == 1, "exactly one digit differs"
    client.put_object(Bucket=bucket, Key=key, Body=edited.encode("utf-8"))
    return old, new


def _files_under(path: Path) -> list[str]:
    return (
        sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
        if path.exists()
        else []
    )


def _latest(catalog: Catalog) -> Snapshot:
    snapshot = catalog.latest()
    assert snapshot is not None
    return snapshot


def test_manifest_with_one_statistic_digit_edited_is_refused_and_nothing_is_installed(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _catalog(tmp_path / "source")
    _refresh_and_publish(s3_server, location, source, REGIONS, first_id=100)
    old, new = _edit_id_max_by_one_digit(s3_server, s3_bucket, 1)
    assert old != new

    fresh = _catalog(tmp_path / "fresh")
    with pytest.raises(SnapshotIntegrityError) as refused:
        bootstrap_snapshot(s3_server, location, "trips", _root(fresh), catalog=fresh)
    error = refused.value
    assert error.uri == f"s3://{s3_bucket}/{_manifest_key(1)}", "the error names the object"
    assert error.expected is not None
    assert error.expected != error.actual
    assert error.expected in str(error)
    assert error.actual in str(error)
    assert "publish version 1 again" in str(error), "the error says what to do"
    assert _files_under(_root(fresh)) == [], "a refused bootstrap leaves no file in the destination"
    assert fresh.latest() is None, "nothing was committed"
    with pytest.raises(SnapshotIntegrityError):
        read_snapshot_manifest(s3_server, location, "trips")
    with pytest.raises(SnapshotIntegrityError):
        read_snapshot_manifest(s3_server, location, "trips", version=1)


def test_edited_manifest_of_a_newer_version_leaves_a_bootstrapped_replica_unchanged(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _catalog(tmp_path / "source")
    _refresh_and_publish(s3_server, location, source, ["EU", None], first_id=1)
    replica = _catalog(tmp_path / "replica")
    assert bootstrap_snapshot(s3_server, location, "trips", _root(replica), catalog=replica).committed_version
    before_files = _files_under(_root(replica))
    before = _latest(replica)

    _refresh_and_publish(s3_server, location, source, ["US", "a/b"], first_id=50)
    _edit_id_max_by_one_digit(s3_server, s3_bucket, 2)
    with pytest.raises(SnapshotIntegrityError, match=r"v00000000000000000002\.json"):
        bootstrap_snapshot(s3_server, location, "trips", _root(replica), catalog=replica)
    after = _latest(replica)
    assert after.version == before.version, "the local catalog is unchanged"
    assert dict(after.partitions) == dict(before.partitions)
    assert _files_under(_root(replica)) == before_files, "no file of the refused version was left behind"

    # Version 1 is still intact: asking for it by number verifies it against its own digest record.
    assert bootstrap_snapshot(s3_server, location, "trips", _root(replica), catalog=replica, version=1).found


def test_a_specific_version_is_verified_too(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _catalog(tmp_path / "source")
    _refresh_and_publish(s3_server, location, source, ["EU", "k=v"], first_id=1)
    _refresh_and_publish(s3_server, location, source, ["US"], first_id=20)
    _edit_id_max_by_one_digit(s3_server, s3_bucket, 1)

    replica = _catalog(tmp_path / "replica")
    with pytest.raises(SnapshotIntegrityError, match=r"v00000000000000000001\.json"):
        bootstrap_snapshot(s3_server, location, "trips", _root(replica), catalog=replica, version=1)
    assert _files_under(_root(replica)) == []
    assert replica.latest() is None
    # The untouched newest version still works and reads back every row.
    result = bootstrap_snapshot(s3_server, location, "trips", _root(replica), catalog=replica)
    assert result.version == 2
    storage = get_storage("parquet")
    local = _latest(replica)
    rows = storage.read(_root(replica), [f for e in local.partitions.values() for f in e.files])
    assert sorted(rows.column("id").to_pylist(), key=lambda v: (v is None, v or 0)) == [
        1,
        2,
        20,
        None,
        None,
        None,
    ]


def test_corrupted_data_object_refuses_the_bootstrap_and_removes_every_download(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _catalog(tmp_path / "source")
    _refresh_and_publish(s3_server, location, source, REGIONS, first_id=1)
    # The last file in download order is corrupted, so the others are fetched before the failure.
    entries = sorted(_latest(source).partitions.values(), key=lambda e: e.key_path)
    victim = entries[-1].files[0]
    _client(s3_server).put_object(
        Bucket=s3_bucket, Key=f"snapshots/trips/data/{victim.path}", Body=os.urandom(victim.bytes)
    )

    for concurrency in (1, 4):
        replica = _catalog(tmp_path / f"replica-{concurrency}")
        with pytest.raises(SnapshotIntegrityError, match="does not match the snapshot manifest") as refused:
            bootstrap_snapshot(
                s3_server, location, "trips", _root(replica), catalog=replica, max_concurrency=concurrency
            )
        assert refused.value.expected == victim.checksum
        assert _files_under(_root(replica)) == [], f"nothing downloaded stays (max_concurrency={concurrency})"
        assert replica.latest() is None


def test_untouched_snapshot_bootstraps_and_digest_records_follow_the_versions(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _catalog(tmp_path / "source")
    _refresh_and_publish(s3_server, location, source, REGIONS, first_id=1)
    _refresh_and_publish(s3_server, location, source, ["US"], first_id=40)
    client = _client(s3_server)
    for version in (1, 2):
        record = json.loads(
            client.get_object(Bucket=s3_bucket, Key=_manifest_key(version) + ".sha256")["Body"].read()
        )
        manifest = read_snapshot_manifest(s3_server, location, "trips", version=version)
        assert manifest is not None
        assert record["sha256"] == manifest.sha256

    replica = _catalog(tmp_path / "replica")
    result = bootstrap_snapshot(s3_server, location, "trips", _root(replica), catalog=replica)
    assert result.version == 2
    assert dict(_latest(replica).partitions) == dict(_latest(source).partitions)

    # Publishing a version again is still a no-op, with its digest record unchanged.
    again = upload_snapshot_manifest(s3_server, location, "trips", _latest(source))
    assert again.created is False

    # Vacuum removes an expired version's digest record with its manifest.
    report = vacuum_snapshots(s3_server, location, "trips", retain_versions=1, grace=dt.timedelta(0))
    assert report.expired_versions == (1,)
    keys = [item["Key"] for item in client.list_objects_v2(Bucket=s3_bucket, Prefix=PREFIX)["Contents"]]
    assert sorted(keys) == sorted([_manifest_key(2), _manifest_key(2) + ".sha256", f"{PREFIX}latest.json"])


def test_manifest_without_a_recorded_digest_is_refused_until_published_again(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _catalog(tmp_path / "source")
    _refresh_and_publish(s3_server, location, source, ["EU"], first_id=1)
    first = source.snapshot(1)
    _refresh_and_publish(s3_server, location, source, ["US"], first_id=2)
    client = _client(s3_server)
    # As a manifest published before digests were recorded: no record object.
    client.delete_object(Bucket=s3_bucket, Key=_manifest_key(1) + ".sha256")
    client.delete_object(Bucket=s3_bucket, Key=_manifest_key(2) + ".sha256")

    replica = _catalog(tmp_path / "replica")
    with pytest.raises(SnapshotIntegrityError, match="no recorded digest") as refused:
        bootstrap_snapshot(s3_server, location, "trips", _root(replica), catalog=replica, version=1)
    assert refused.value.expected is None
    assert _files_under(_root(replica)) == []
    # latest.json still records the newest manifest's digest: that version verifies against it.
    assert bootstrap_snapshot(s3_server, location, "trips", _root(replica), catalog=replica).version == 2

    # Publishing the identical manifest again records its digest; then version 1 reads.
    assert upload_snapshot_manifest(s3_server, location, "trips", first).created is False
    manifest = read_snapshot_manifest(s3_server, location, "trips", version=1)
    assert manifest is not None
    assert manifest.version == 1


def test_latest_pointer_digest_must_agree_with_the_record(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _catalog(tmp_path / "source")
    _refresh_and_publish(s3_server, location, source, ["EU"], first_id=1)
    client = _client(s3_server)
    pointer_key = f"{PREFIX}latest.json"
    pointer = json.loads(client.get_object(Bucket=s3_bucket, Key=pointer_key)["Body"].read())
    pointer["sha256"] = "0" * 64
    client.put_object(Bucket=s3_bucket, Key=pointer_key, Body=json.dumps(pointer).encode())
    with pytest.raises(SnapshotIntegrityError, match=r"latest\.json recorded 0{64}"):
        read_snapshot_manifest(s3_server, location, "trips")


def test_a_foreign_file_in_the_way_refuses_the_bootstrap_and_only_it_stays(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _catalog(tmp_path / "source")
    _refresh_and_publish(s3_server, location, source, REGIONS, first_id=1)
    entries = sorted(_latest(source).partitions.values(), key=lambda e: e.key_path)
    in_the_way = entries[len(entries) // 2].files[0]
    replica = _catalog(tmp_path / "replica")
    foreign = _root(replica) / in_the_way.path
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(b"written by something else")

    with pytest.raises(SnapshotError, match="exists with content other than the snapshot's"):
        bootstrap_snapshot(s3_server, location, "trips", _root(replica), catalog=replica, max_concurrency=4)
    assert _files_under(_root(replica)) == [in_the_way.path], "only the file that was already there remains"
    assert foreign.read_bytes() == b"written by something else", "a local file is never overwritten"
    assert replica.latest() is None
