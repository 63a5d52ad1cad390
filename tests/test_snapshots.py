"""Snapshot manifests and bootstrap end to end: real storage files, real catalogs, a real S3 endpoint."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_partitions.catalog import Catalog, LocalStore, PartitionEntry, PartitionSpecInfo, Snapshot
from airflow_partitions.exceptions import CommitConflictError, PartitionSpecChangedError, SnapshotError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.snapshots import (
    bootstrap_snapshot,
    list_snapshot_versions,
    read_snapshot_manifest,
    select_where,
    upload_partition_snapshot,
    upload_snapshot_manifest,
)
from airflow_partitions.storage import PartitionStorage, get_storage

pytestmark = pytest.mark.s3

SPEC = PartitionSpecInfo.from_fields([("region", "region", "string")])
HOSTILE_REGIONS = ["EU", "a/b", "100%", "k=v", "Überprüfung ✓", ".."]


@dataclass
class Side:
    """One machine's accelerator directory: a catalog and the storage engine writing its files."""

    catalog: Catalog
    storage: PartitionStorage

    @property
    def root(self) -> Path:
        assert self.catalog.data_root is not None
        return Path(self.catalog.data_root)


def _side(directory: Path, engine: str = "parquet", partition_mode: str | None = None) -> Side:
    storage = get_storage(engine, partition_mode)
    directory.mkdir(parents=True)
    return Side(Catalog(LocalStore(directory), "trips", storage=storage), storage)


def _rows(region: str | None, count: int = 3, offset: int = 0) -> pa.Table:
    return pa.table(
        {
            "region": pa.array([region] * count, pa.string()),
            "trip_id": pa.array(range(offset, offset + count), pa.int64()),
            "fare": pa.array([1.5 * i for i in range(count)], pa.float64()),
        }
    )


def _refresh(side: Side, tables: Mapping[str | None, pa.Table], removes: Sequence[str] = ()) -> int:
    """Write one new file per partition and commit them, as a refresh run does."""
    entries = []
    for region, table in tables.items():
        key = PartitionKey((region,))
        files = side.storage.write(table, side.root, key.path(SPEC.names))
        files = side.storage.publish(side.root, files)
        entries.append(PartitionEntry.from_files(key, SPEC, files))
    latest = side.catalog.latest()
    return side.catalog.commit(
        base_version=latest.version if latest else None,
        upserts=entries,
        removes=list(removes),
        partition_spec=SPEC,
    )


def _latest(side: Side) -> Snapshot:
    snapshot = side.catalog.latest()
    assert snapshot is not None, "the side has committed partitions"
    return snapshot


def _upload_all(settings: Mapping[str, str], location: str, side: Side, **options: Any) -> None:
    for entry in _latest(side).partitions.values():
        upload_partition_snapshot(settings, location, side.root, entry, dataset="trips", **options)


def _client(s3_server: Mapping[str, str]) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=s3_server["endpoint_url"],
        aws_access_key_id=s3_server["aws_access_key_id"],
        aws_secret_access_key=s3_server["aws_secret_access_key"],
        region_name=s3_server["region_name"],
    )


def _keys(s3_server: Mapping[str, str], bucket: str, prefix: str) -> list[str]:
    listing = _client(s3_server).list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(item["Key"] for item in listing.get("Contents", []))


def _read_partition(side: Side, key_path: str) -> pa.Table:
    return side.storage.read(side.root, _latest(side).partitions[key_path].files).sort_by("trip_id")


def _key_path(region: str | None) -> str:
    return PartitionKey((region,)).path(SPEC.names)


# --- publishing -----------------------------------------------------------------------------------


def test_publish_then_bootstrap_everything_reads_back_identical_rows(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source")
    _refresh(
        source, {region: _rows(region, offset=i * 10) for i, region in enumerate([*HOSTILE_REGIONS, None])}
    )
    _upload_all(s3_server, location, source)
    published = upload_snapshot_manifest(s3_server, location, "trips", _latest(source))
    assert published.created
    assert published.latest_version == 1
    assert published.files_checked == 7

    replica = _side(tmp_path / "replica")
    result = bootstrap_snapshot(s3_server, location, "trips", replica.root, catalog=replica.catalog)
    assert result.version == 1
    assert result.committed_version == 1
    assert result.files_downloaded == 7
    assert result.partitions_total == 7

    local, remote = _latest(replica), _latest(source)
    assert sorted(local.partitions) == sorted(remote.partitions)
    for key_path, entry in remote.partitions.items():
        assert local.partitions[key_path] == entry, (
            f"{key_path}: the local entry must equal the published one"
        )
        for data_file in entry.files:
            assert (replica.root / data_file.path).read_bytes() == (source.root / data_file.path).read_bytes()
        assert _read_partition(replica, key_path).equals(_read_partition(source, key_path))
    leftovers = [p for p in replica.root.rglob("*") if p.name.startswith(".tmp-")]
    assert leftovers == [], "no temporary download may remain"


def test_manifest_is_not_published_while_a_file_is_missing(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source")
    _refresh(source, {"EU": _rows("EU"), "US": _rows("US"), "APAC": _rows("APAC")})
    snapshot = _latest(source)
    for key_path in [_key_path("EU"), _key_path("US")]:
        upload_partition_snapshot(
            s3_server, location, source.root, snapshot.partitions[key_path], dataset="trips"
        )

    with pytest.raises(SnapshotError, match="1 of its files are not in") as info:
        upload_snapshot_manifest(s3_server, location, "trips", snapshot)
    assert _key_path("APAC") in str(info.value)
    assert _keys(s3_server, s3_bucket, "snapshots/trips/manifests/") == [], "no manifest, no latest pointer"
    assert read_snapshot_manifest(s3_server, location, "trips") is None

    # With the dataset root at hand, publishing uploads what is missing first.
    published = upload_snapshot_manifest(s3_server, location, "trips", snapshot, dataset_root=source.root)
    assert published.files_uploaded == 1
    assert _keys(s3_server, s3_bucket, "snapshots/trips/manifests/") == [
        "snapshots/trips/manifests/latest.json",
        "snapshots/trips/manifests/v00000000000000000001.json",
        "snapshots/trips/manifests/v00000000000000000001.json.sha256",
    ]


def test_corrupted_partition_file_is_never_published(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source")
    _refresh(source, {"EU": _rows("EU", count=50)})
    snapshot = _latest(source)
    entry = snapshot.partitions[_key_path("EU")]
    path = source.root / entry.files[0].path
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))

    with pytest.raises(SnapshotError, match="changed after it was written"):
        upload_partition_snapshot(s3_server, location, source.root, entry, dataset="trips")
    with pytest.raises(SnapshotError, match="changed after it was written"):
        upload_snapshot_manifest(s3_server, location, "trips", snapshot, dataset_root=source.root)
    assert _keys(s3_server, s3_bucket, "snapshots/") == [], "neither the file nor a manifest may be visible"


def test_manifest_versions_are_write_once_and_latest_only_moves_forward(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source")
    _refresh(source, {"EU": _rows("EU")})
    _upload_all(s3_server, location, source)
    first = upload_snapshot_manifest(s3_server, location, "trips", source.catalog.snapshot(1))
    _refresh(source, {"US": _rows("US")})
    _upload_all(s3_server, location, source)
    second = upload_snapshot_manifest(s3_server, location, "trips", source.catalog.snapshot(2))
    assert (first.created, second.created, second.latest_version) == (True, True, 2)

    client = _client(s3_server)
    manifest_key = "snapshots/trips/manifests/v00000000000000000001.json"
    before = client.head_object(Bucket=s3_bucket, Key=manifest_key)["ETag"]
    again = upload_snapshot_manifest(s3_server, location, "trips", source.catalog.snapshot(1))
    assert again.created is False, "re-publishing an identical version is a no-op"
    assert again.latest_version == 2, "latest never moves back to an older version"
    assert client.head_object(Bucket=s3_bucket, Key=manifest_key)["ETag"] == before
    assert list_snapshot_versions(s3_server, location, "trips") == [1, 2]

    # Another catalog that also reached version 2 with other partitions must not replace the published one.
    other = _side(tmp_path / "other")
    _refresh(other, {"EU": _rows("EU", offset=100)})
    _refresh(other, {"APAC": _rows("APAC")})
    _upload_all(s3_server, location, other)
    with pytest.raises(SnapshotError, match="already holds a different snapshot of this version"):
        upload_snapshot_manifest(s3_server, location, "trips", other.catalog.snapshot(2))

    manifest = read_snapshot_manifest(s3_server, location, "trips")
    assert manifest is not None
    assert manifest.version == 2
    assert sorted(e.key_path for e in manifest.entries) == [_key_path("EU"), _key_path("US")]
    document = json.loads(client.get_object(Bucket=s3_bucket, Key=manifest.key)["Body"].read())
    eu = next(p for p in document["partitions"] if p["key_path"] == _key_path("EU"))
    assert (
        eu["files"][0]["checksum"] == source.catalog.snapshot(2).partitions[_key_path("EU")].files[0].checksum
    )
    assert set(eu["files"][0]["stats"]) == {"region", "trip_id", "fare"}, "per-column stats travel with files"


def test_bootstrap_finds_the_newest_manifest_when_latest_lags(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source")
    for version, region in enumerate(["EU", "US", "APAC"], start=1):
        _refresh(source, {region: _rows(region)})
        _upload_all(s3_server, location, source)
        upload_snapshot_manifest(s3_server, location, "trips", source.catalog.snapshot(version))
    # A publisher that died between the manifest and the pointer leaves latest.json behind.
    client = _client(s3_server)
    pointer = {"version": 1, "manifest": "snapshots/trips/manifests/v00000000000000000001.json", "sha256": ""}
    client.put_object(Bucket=s3_bucket, Key="snapshots/trips/manifests/latest.json", Body=json.dumps(pointer))

    replica = _side(tmp_path / "replica")
    result = bootstrap_snapshot(s3_server, location, "trips", replica.root, catalog=replica.catalog)
    assert result.version == 3, "manifests newer than the pointer are found by listing after it"
    assert replica.catalog.head_version() == 1
    assert len(_latest(replica).partitions) == 3

    pinned = _side(tmp_path / "pinned")
    result_v1 = bootstrap_snapshot(
        s3_server, location, "trips", pinned.root, catalog=pinned.catalog, version=1
    )
    assert result_v1.partitions_selected == (_key_path("EU"),)
    with pytest.raises(SnapshotError, match="published versions: 1, 2, 3"):
        bootstrap_snapshot(s3_server, location, "trips", pinned.root, catalog=pinned.catalog, version=9)


# --- bootstrap ------------------------------------------------------------------------------------


def test_bootstrap_filtered_by_predicate_or_key_paths(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source")
    _refresh(source, {region: _rows(region) for region in ["EU", "US", "APAC", "a/b"]})
    _upload_all(s3_server, location, source)
    upload_snapshot_manifest(s3_server, location, "trips", _latest(source))

    by_predicate = _side(tmp_path / "by_predicate")
    result = bootstrap_snapshot(
        s3_server,
        location,
        "trips",
        by_predicate.root,
        catalog=by_predicate.catalog,
        where_keys=lambda key: key.values[0] in ("EU", "a/b"),
    )
    assert sorted(result.partitions_committed) == sorted([_key_path("EU"), _key_path("a/b")])
    assert result.files_downloaded == 2
    local = _latest(by_predicate)
    assert sorted(local.partitions) == sorted([_key_path("EU"), _key_path("a/b")])
    downloaded = sorted(
        str(p.relative_to(by_predicate.root).parent) for p in by_predicate.root.rglob("part-*")
    )
    assert downloaded == sorted([_key_path("EU"), _key_path("a/b")]), "unselected partitions are not fetched"

    by_paths = _side(tmp_path / "by_paths")
    result = bootstrap_snapshot(
        s3_server, location, "trips", by_paths.root, catalog=by_paths.catalog, where_keys=[_key_path("US")]
    )
    assert result.partitions_committed == (_key_path("US"),)
    assert _read_partition(by_paths, _key_path("US")).equals(_read_partition(source, _key_path("US")))

    with pytest.raises(SnapshotError, match="are not in snapshot version 1"):
        bootstrap_snapshot(
            s3_server,
            location,
            "trips",
            by_paths.root,
            catalog=by_paths.catalog,
            where_keys=["region=Nowhere"],
        )


def test_rebootstrap_is_idempotent_and_then_follows_new_versions(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source")
    _refresh(source, {region: _rows(region) for region in ["EU", "US", "APAC"]})
    _upload_all(s3_server, location, source)
    upload_snapshot_manifest(s3_server, location, "trips", _latest(source))

    replica = _side(tmp_path / "replica")
    first = bootstrap_snapshot(s3_server, location, "trips", replica.root, catalog=replica.catalog)
    files_before = {p: p.stat().st_mtime_ns for p in replica.root.rglob("part-*")}
    again = bootstrap_snapshot(s3_server, location, "trips", replica.root, catalog=replica.catalog)
    assert first.committed_version == 1
    assert again.committed_version is None, "nothing changed, so no new local version"
    assert (again.files_downloaded, again.files_skipped) == (0, 3)
    assert replica.catalog.head_version() == 1
    assert {p: p.stat().st_mtime_ns for p in replica.root.rglob("part-*")} == files_before

    # The source refreshes EU and drops APAC; the replica follows with one commit.
    _refresh(source, {"EU": _rows("EU", count=5, offset=100)}, removes=[_key_path("APAC")])
    _upload_all(s3_server, location, source)
    upload_snapshot_manifest(s3_server, location, "trips", _latest(source))
    follow = bootstrap_snapshot(s3_server, location, "trips", replica.root, catalog=replica.catalog)
    assert follow.version == 2
    assert follow.partitions_committed == (_key_path("EU"),)
    assert follow.partitions_removed == (_key_path("APAC"),)
    assert (follow.files_downloaded, follow.files_skipped) == (1, 1)
    assert replica.catalog.head_version() == 2
    assert _read_partition(replica, _key_path("EU")).num_rows == 5


def test_bootstrap_rejects_an_object_changed_after_publishing(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source")
    _refresh(source, {"EU": _rows("EU"), "US": _rows("US")})
    _upload_all(s3_server, location, source)
    upload_snapshot_manifest(s3_server, location, "trips", _latest(source))
    eu_file = _latest(source).partitions[_key_path("EU")].files[0]
    tampered = os.urandom(eu_file.bytes)
    _client(s3_server).put_object(Bucket=s3_bucket, Key=f"snapshots/trips/data/{eu_file.path}", Body=tampered)

    replica = _side(tmp_path / "replica")
    with pytest.raises(SnapshotError, match="does not match the snapshot manifest"):
        bootstrap_snapshot(s3_server, location, "trips", replica.root, catalog=replica.catalog)
    assert not (replica.root / eu_file.path).exists(), "a bad download never reaches its final name"
    assert list(replica.root.rglob(".tmp-*")) == []
    assert replica.catalog.latest() is None, "nothing is committed when any selected file fails"


def test_bootstrap_refuses_a_manifest_with_path_traversal(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source")
    _refresh(source, {"EU": _rows("EU")})
    _upload_all(s3_server, location, source)
    upload_snapshot_manifest(s3_server, location, "trips", _latest(source))
    client = _client(s3_server)
    key = "snapshots/trips/manifests/v00000000000000000001.json"
    document = json.loads(client.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
    document["version"] = 2
    document["partitions"][0]["files"][0]["path"] = "../../escaped.parquet"
    forged = json.dumps(document).encode()
    client.put_object(
        Bucket=s3_bucket, Key="snapshots/trips/manifests/v00000000000000000002.json", Body=forged
    )
    # With a matching digest record, as a forger with write access would add: the path check still holds.
    client.put_object(
        Bucket=s3_bucket,
        Key="snapshots/trips/manifests/v00000000000000000002.json.sha256",
        Body=json.dumps({"sha256": hashlib.sha256(forged).hexdigest()}),
    )

    replica = _side(tmp_path / "replica")
    with pytest.raises(SnapshotError, match=r"'\.\.' segment"):
        bootstrap_snapshot(s3_server, location, "trips", replica.root, catalog=replica.catalog)
    assert not (tmp_path / "escaped.parquet").exists()
    assert not (tmp_path / "replica" / "escaped.parquet").exists()


def test_bootstrap_without_any_snapshot_reports_not_found(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    replica = _side(tmp_path / "replica")
    result = bootstrap_snapshot(
        s3_server, f"s3://{s3_bucket}/empty", "trips", replica.root, catalog=replica.catalog
    )
    assert result.found is False
    assert result.committed_version is None
    assert replica.catalog.latest() is None


def test_bootstrap_refuses_a_snapshot_of_another_partition_spec(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source")
    _refresh(source, {"EU": _rows("EU")})
    _upload_all(s3_server, location, source)
    upload_snapshot_manifest(s3_server, location, "trips", _latest(source))

    replica = _side(tmp_path / "replica")
    other_spec = PartitionSpecInfo.from_fields([("bucket", "bucket[4](trip_id)", "int")])
    key = PartitionKey((1,))
    files = replica.storage.write(_rows("EU"), replica.root, key.path(other_spec.names))
    replica.catalog.commit(
        base_version=None,
        upserts=[PartitionEntry.from_files(key, other_spec, files)],
        partition_spec=other_spec,
    )
    with pytest.raises(PartitionSpecChangedError, match="was written with partition_by"):
        bootstrap_snapshot(s3_server, location, "trips", replica.root, catalog=replica.catalog)
    assert replica.catalog.head_version() == 1


def test_large_files_go_up_in_parts_and_come_down_in_ranges(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source")
    # Random payloads do not compress: the parquet file ends up above the 5 MiB part size.
    big = pa.table(
        {
            "region": pa.array(["EU"] * 700, pa.string()),
            "trip_id": pa.array(range(700), pa.int64()),
            "payload": pa.array([os.urandom(10_000) for _ in range(700)], pa.binary()),
        }
    )
    _refresh(source, {"EU": big})
    entry = _latest(source).partitions[_key_path("EU")]
    assert entry.bytes > 6 * 1024 * 1024
    result = upload_partition_snapshot(
        s3_server,
        location,
        source.root,
        entry,
        dataset="trips",
        multipart_threshold=5 * 1024 * 1024,
        multipart_chunksize=5 * 1024 * 1024,
    )
    assert result.files[0].multipart
    upload_snapshot_manifest(s3_server, location, "trips", _latest(source))

    replica = _side(tmp_path / "replica")
    fetched = bootstrap_snapshot(
        s3_server,
        location,
        "trips",
        replica.root,
        catalog=replica.catalog,
        ranged_threshold=5 * 1024 * 1024,
        chunksize=5 * 1024 * 1024,
    )
    assert fetched.bytes_downloaded == entry.bytes
    assert (replica.root / entry.files[0].path).read_bytes() == (
        source.root / entry.files[0].path
    ).read_bytes()


def test_duckdb_tables_mode_bootstrap_rebuilds_the_shared_file(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source", "duckdb", "tables")
    _refresh(source, {"EU": _rows("EU"), "US": _rows("US", offset=50)})
    _upload_all(s3_server, location, source)
    upload_snapshot_manifest(s3_server, location, "trips", _latest(source))
    tables = [f.table for e in _latest(source).partitions.values() for f in e.files]
    assert None not in tables, "tables mode names the shared-file table of every published file"

    replica = _side(tmp_path / "replica", "duckdb", "tables")
    result = bootstrap_snapshot(s3_server, location, "trips", replica.root, catalog=replica.catalog)
    assert result.committed_version == 1
    for region in ["EU", "US"]:
        assert _read_partition(replica, _key_path(region)).equals(_read_partition(source, _key_path(region)))

    without_storage = Catalog(LocalStore(tmp_path / "bare"), "trips")
    assert without_storage.data_root is not None
    with pytest.raises(SnapshotError, match="pass the dataset's storage"):
        bootstrap_snapshot(s3_server, location, "trips", without_storage.data_root, catalog=without_storage)
    assert not (tmp_path / "bare").exists(), "the missing storage is reported before anything is fetched"


def test_bootstrap_only_the_partitions_a_pruning_plan_selects(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    from airflow_partitions.pruning import PartitionIndex, plan_partitions

    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source")
    _refresh(source, {region: _rows(region) for region in ["EU", "US", "APAC", "a/b", None]})
    _upload_all(s3_server, location, source)
    upload_snapshot_manifest(s3_server, location, "trips", _latest(source))

    manifest = read_snapshot_manifest(s3_server, location, "trips")
    assert manifest is not None
    schema = _rows("EU").schema
    chosen = select_where(manifest, schema, "region IN ('EU', 'a/b') OR region IS NULL")
    assert sorted(chosen) == sorted([_key_path("EU"), _key_path("a/b"), _key_path(None)]), (
        "the plan over the remote manifest keeps exactly the filtered regions"
    )

    replica = _side(tmp_path / "replica")
    result = bootstrap_snapshot(
        s3_server,
        location,
        "trips",
        replica.root,
        catalog=replica.catalog,
        where_keys=chosen,
        manifest=manifest,
    )
    assert sorted(result.partitions_committed) == sorted(chosen)
    assert result.partitions_total == 5
    local_plan = plan_partitions(PartitionIndex.from_snapshot(_latest(replica), schema), "region = 'EU'")
    assert [s.key_path for s in local_plan.selected] == [_key_path("EU")]
    rows = replica.storage.read(replica.root, local_plan.files)
    assert rows.column("region").to_pylist() == ["EU"] * 3, "a pruned read works right after bootstrap"


def test_bootstrap_never_rolls_back_a_partition_refreshed_locally_since(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source")
    _refresh(source, {"EU": _rows("EU"), "US": _rows("US")})
    _upload_all(s3_server, location, source)
    upload_snapshot_manifest(s3_server, location, "trips", _latest(source))
    replica = _side(tmp_path / "replica")
    bootstrap_snapshot(s3_server, location, "trips", replica.root, catalog=replica.catalog)

    _refresh(replica, {"EU": _rows("EU", count=7, offset=500)})  # local work, newer than the snapshot's EU
    _refresh(source, {"US": _rows("US", count=4, offset=900)})
    _upload_all(s3_server, location, source)
    upload_snapshot_manifest(s3_server, location, "trips", _latest(source))

    result = bootstrap_snapshot(s3_server, location, "trips", replica.root, catalog=replica.catalog)
    assert result.partitions_kept_local == (_key_path("EU"),)
    assert result.partitions_committed == (_key_path("US"),)
    assert _read_partition(replica, _key_path("EU")).num_rows == 7, "the local refresh survives"
    assert _read_partition(replica, _key_path("US")).num_rows == 4, "the snapshot's newer US arrives"


def _publish(s3_server: Mapping[str, str], location: str, side: Side) -> int:
    _upload_all(s3_server, location, side)
    return upload_snapshot_manifest(s3_server, location, "trips", _latest(side)).version


def _three_published_versions(s3_server: Mapping[str, str], location: str, side: Side) -> dict[int, set[str]]:
    """v1 {EU, a/b}; v2 rewrites EU; v3 rewrites a/b. Returns each version's data object keys."""
    _refresh(side, {"EU": _rows("EU"), "a/b": _rows("a/b", offset=10)})
    _publish(s3_server, location, side)
    _refresh(side, {"EU": _rows("EU", offset=20)})
    _publish(s3_server, location, side)
    _refresh(side, {"a/b": _rows("a/b", offset=30)})
    _publish(s3_server, location, side)
    _, _, prefix = location.removeprefix("s3://").partition("/")
    return {
        version: {
            f"{prefix}/trips/data/{f.path}"
            for entry in side.catalog.snapshot(version).partitions.values()
            for f in entry.files
        }
        for version in (1, 2, 3)
    }


def test_snapshot_vacuum_expires_old_versions_and_only_their_own_objects(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    from airflow_partitions.snapshots import vacuum_snapshots

    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source")
    files = _three_published_versions(s3_server, location, source)
    only_old = (files[1] | files[2]) - files[3]
    assert len(only_old) == 2, "v1's EU and a/b files are referenced by no later version"
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)  # everything is past the 1 h grace period

    dry = vacuum_snapshots(s3_server, location, "trips", retain_versions=1, dry_run=True, now=later)
    assert (dry.latest_version, dry.retained_versions, dry.expired_versions) == (3, (3,), (1, 2))
    assert dry.deleted_objects == 2
    assert set(_keys(s3_server, s3_bucket, "snapshots/trips/data/")) == files[1] | files[2] | files[3]

    report = vacuum_snapshots(s3_server, location, "trips", retain_versions=1, now=later)
    assert report.to_json() == {**dry.to_json(), "dry_run": False}
    assert set(_keys(s3_server, s3_bucket, "snapshots/trips/data/")) == files[3]
    assert _keys(s3_server, s3_bucket, "snapshots/trips/manifests/") == [
        "snapshots/trips/manifests/latest.json",
        "snapshots/trips/manifests/v00000000000000000003.json",
        "snapshots/trips/manifests/v00000000000000000003.json.sha256",
    ]
    with pytest.raises(SnapshotError, match="published versions: 3"):
        read_snapshot_manifest(s3_server, location, "trips", version=1)

    # What remains is complete: a new replica bootstraps the newest version and reads the same rows.
    replica = _side(tmp_path / "replica")
    result = bootstrap_snapshot(s3_server, location, "trips", replica.root, catalog=replica.catalog)
    assert result.version == 3
    for key_path in _latest(source).partitions:
        assert _read_partition(replica, key_path).equals(_read_partition(source, key_path))

    again = vacuum_snapshots(s3_server, location, "trips", retain_versions=1, now=later)
    assert (again.expired_versions, again.deleted_objects) == ((), 0), "a second vacuum finds nothing"


def test_snapshot_vacuum_grace_keeps_versions_readers_may_be_on_and_uploads_in_flight(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    from airflow_partitions.snapshots import vacuum_snapshots

    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source")
    files = _three_published_versions(s3_server, location, source)
    # A partition file of a version still being published: uploaded, no manifest names it yet.
    _refresh(source, {"US": _rows("US", offset=40)})
    _upload_all(s3_server, location, source)
    in_flight = set(_keys(s3_server, s3_bucket, "snapshots/trips/data/")) - (files[1] | files[2] | files[3])
    assert len(in_flight) == 1

    now = vacuum_snapshots(s3_server, location, "trips", retain_versions=1)
    assert now.retained_versions == (1, 2, 3), "versions superseded within the grace period are kept"
    assert (now.deleted_objects, now.kept_recent_objects) == (0, 1)
    assert in_flight <= set(_keys(s3_server, s3_bucket, "snapshots/trips/data/"))

    by_age = vacuum_snapshots(s3_server, location, "trips", older_than=dt.timedelta(days=7))
    assert by_age.expired_versions == (), "every version is younger than the retention"

    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    after = vacuum_snapshots(s3_server, location, "trips", retain_versions=2, now=later)
    assert after.retained_versions == (2, 3)
    remaining = set(_keys(s3_server, s3_bucket, "snapshots/trips/data/"))
    assert remaining == files[2] | files[3], "the abandoned upload is gone once past the grace period"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retain_versions": 0}, "retain_versions must be at least 1"),
        ({"grace": dt.timedelta(seconds=-1)}, "grace must not be negative"),
    ],
)
def test_snapshot_vacuum_rejects_bad_retention(
    s3_server: dict[str, str], s3_bucket: str, options: dict[str, Any], message: str
) -> None:
    from airflow_partitions.snapshots import vacuum_snapshots

    with pytest.raises(SnapshotError, match=message):
        vacuum_snapshots(s3_server, f"s3://{s3_bucket}/snapshots", "trips", **options)
    empty = vacuum_snapshots(s3_server, f"s3://{s3_bucket}/snapshots", "trips")
    assert empty.latest_version is None
    assert empty.deleted_objects == 0


# --- a refused bootstrap leaves nothing behind ----------------------------------------------------


def _tree(root: Path) -> list[str]:
    """Every path under `root` (files and directories), relative; empty when `root` does not exist."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


@pytest.mark.parametrize(("engine", "mode"), [("parquet", None), ("duckdb", "tables")])
def test_refused_bootstrap_leaves_nothing_downloaded_when_one_object_is_corrupt(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path, engine: str, mode: str | None
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source", engine, mode)
    _refresh(source, {region: _rows(region, offset=10 * i) for i, region in enumerate(HOSTILE_REGIONS)})
    _upload_all(s3_server, location, source)
    upload_snapshot_manifest(s3_server, location, "trips", _latest(source))
    # The last partition in key order is corrupted: every other file downloads and verifies first.
    last = sorted(_latest(source).partitions)[-1]
    bad = _latest(source).partitions[last].files[0]
    _client(s3_server).put_object(
        Bucket=s3_bucket, Key=f"snapshots/trips/data/{bad.path}", Body=os.urandom(bad.bytes)
    )

    replica = _side(tmp_path / "replica", engine, mode)
    before = _tree(tmp_path / "replica")
    with pytest.raises(SnapshotError, match="does not match the snapshot manifest"):
        bootstrap_snapshot(
            s3_server, location, "trips", replica.root, catalog=replica.catalog, storage=replica.storage
        )
    assert _tree(tmp_path / "replica") == before, "no file, temporary, directory or shared file is left"
    assert replica.catalog.latest() is None


class _RacedCatalog(Catalog):
    """A catalog whose first commit loses to another local writer refreshing the same partition."""

    def __init__(self, *args: Any, race: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.race = race

    def commit(self, **kwargs: Any) -> int:
        if self.race is not None:
            race, self.race = self.race, None
            race()
        return super().commit(**kwargs)


def test_bootstrap_refused_at_commit_removes_the_files_it_placed(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{s3_bucket}/snapshots"
    source = _side(tmp_path / "source")
    _refresh(source, {"EU": _rows("EU"), "k=v": _rows("k=v", offset=40)})
    _upload_all(s3_server, location, source)
    upload_snapshot_manifest(s3_server, location, "trips", _latest(source))

    replica = _side(tmp_path / "replica")
    _refresh(replica, {"EU": _rows("EU", count=2, offset=900)})  # local version 1
    local_files = _tree(replica.root)
    # While the bootstrap downloads, a local refresh of the snapshot's partitions commits version 2.
    raced = _RacedCatalog(
        LocalStore(tmp_path / "replica"),
        "trips",
        storage=replica.storage,
        race=lambda: _refresh(replica, {"k=v": _rows("k=v", count=5, offset=700)}),
    )
    with pytest.raises(CommitConflictError, match="changed in version 2"):
        bootstrap_snapshot(s3_server, location, "trips", replica.root, catalog=raced)
    latest = _latest(replica)
    assert latest.version == 2, "only the racing local refresh committed"
    kept = {f.path for e in latest.partitions.values() for f in e.files}
    leftover = [p for p in _tree(replica.root) if p not in local_files and p not in kept]
    leftover = [p for p in leftover if not (replica.root / p).is_dir() and not p.startswith("_catalog/")]
    assert leftover == [], "the files the refused bootstrap downloaded are gone"
