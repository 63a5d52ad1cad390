"""S3 under faults: the catalog and snapshots through a proxy that breaks requests (tests/fault_proxy.py).

The proxy sits between boto3 and the moto server and injects 500 / 503 answers, connection resets before a
request is forwarded, resets after it was applied (the response is lost) and truncated response bodies.
Whatever it does: a commit is published once or not at all and its caller is told which, nothing committed
is lost, a failure that reaches the caller is a typed error (never a raw botocore exception), and the rows
a snapshot carries arrive intact.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fault_proxy import Fault, FaultProxy

from airflow_partitions.catalog import Catalog, LocalStore, PartitionEntry, PartitionSpecInfo, S3Store
from airflow_partitions.exceptions import (
    AirflowPartitionsError,
    CommitOutcomeUnknownError,
    ObjectStoreError,
)
from airflow_partitions.keys import PartitionKey
from airflow_partitions.objectstore import S3Settings
from airflow_partitions.snapshots import (
    bootstrap_snapshot,
    upload_partition_snapshot,
    upload_snapshot_manifest,
)
from airflow_partitions.storage import DataFile, get_storage

pytestmark = pytest.mark.s3

SPEC = PartitionSpecInfo.from_fields([("owner", "owner", "string")])
LOG_PATH = "/_catalog/log/"


@pytest.fixture(autouse=True)
def quiet_request_log() -> Iterator[None]:
    logger = logging.getLogger("werkzeug")
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield
    logger.setLevel(level)


def s3_store(proxy: FaultProxy, s3_server: dict[str, str], bucket: str) -> S3Store:
    """A store with its own client whose every request goes through the proxy."""
    client = S3Settings.from_mapping(proxy.through(s3_server)).create_client()
    return S3Store(client, bucket, "catalogs")


def entry(owner: str, fingerprint: str, rows: int) -> PartitionEntry:
    key = PartitionKey((owner,))
    data_file = DataFile(
        path=f"{key.path(SPEC.names)}/part-{uuid.uuid4().hex}-0000.parquet",
        format="parquet",
        rows=rows,
        bytes=rows * 8,
        checksum="0" * 64,
    )
    return PartitionEntry.from_files(key, SPEC, [data_file], source_fingerprint=fingerprint)


def commit_one(
    catalog: Catalog, owner: str, fingerprint: str, rows: int = 1, commit_id: str | None = None
) -> int:
    base = catalog.latest()
    return catalog.commit(
        base_version=base.version if base is not None else None,
        upserts=[entry(owner, fingerprint, rows)],
        partition_spec=SPEC,
        commit_id=commit_id,
    )


def fingerprints_by_version(catalog: Catalog) -> dict[int, list[str]]:
    """Each retained version's committed fingerprints, read from the log itself."""
    found: dict[int, list[str]] = {}
    for info in catalog.versions():
        record = catalog._read_record(catalog._log_key(info.version))
        found[info.version] = [upsert["source_fingerprint"] for upsert in record.upserts]
    return found


# --- the proxy itself -----------------------------------------------------------------------------


def test_the_proxy_injects_each_fault_it_is_asked_for(
    s3_fault_proxy: FaultProxy, s3_server: dict[str, str], s3_bucket: str
) -> None:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError, ConnectionClosedError, ResponseStreamingError

    client = boto3.client(
        "s3", config=Config(retries={"total_max_attempts": 1}), **s3_fault_proxy.through(s3_server)
    )
    client.put_object(Bucket=s3_bucket, Key="k", Body=b"payload-" * 100)

    s3_fault_proxy.inject_next(Fault.ERROR_503, method="GET")
    with pytest.raises(ClientError, match="SlowDown"):
        client.get_object(Bucket=s3_bucket, Key="k")
    s3_fault_proxy.inject_next(Fault.RESET_BEFORE, method="PUT")
    with pytest.raises(ConnectionClosedError):
        client.put_object(Bucket=s3_bucket, Key="before", Body=b"x")
    assert "Contents" not in client.list_objects_v2(Bucket=s3_bucket, Prefix="before")
    s3_fault_proxy.inject_next(Fault.RESET_AFTER, method="PUT")
    with pytest.raises(ConnectionClosedError):
        client.put_object(Bucket=s3_bucket, Key="after", Body=b"x")
    assert client.get_object(Bucket=s3_bucket, Key="after")["Body"].read() == b"x", "applied, response lost"
    s3_fault_proxy.inject_next(Fault.TRUNCATE, method="GET")
    with pytest.raises(ResponseStreamingError):
        client.get_object(Bucket=s3_bucket, Key="k")["Body"].read()
    assert s3_fault_proxy.injected == dict.fromkeys(
        (Fault.ERROR_503, Fault.RESET_BEFORE, Fault.RESET_AFTER, Fault.TRUNCATE), 1
    )


# --- one exact fault ------------------------------------------------------------------------------


def test_a_commit_whose_response_is_lost_returns_its_own_version(
    s3_fault_proxy: FaultProxy, s3_server: dict[str, str], s3_bucket: str
) -> None:
    """botocore retries the lost PUT and gets 412 from its own record: that is success, not a conflict."""
    catalog = Catalog(s3_store(s3_fault_proxy, s3_server, s3_bucket), "events")
    assert commit_one(catalog, "a", "a-1") == 1
    s3_fault_proxy.inject_next(Fault.RESET_AFTER, method="PUT", path_contains=LOG_PATH)
    assert commit_one(catalog, "a", "a-2") == 2
    assert s3_fault_proxy.injected[Fault.RESET_AFTER] == 1
    fresh = Catalog(s3_store(s3_fault_proxy, s3_server, s3_bucket), "events")
    assert fingerprints_by_version(fresh) == {1: ["a-1"], 2: ["a-2"]}


def test_a_commit_whose_write_failed_after_landing_still_returns_its_version(
    s3_fault_proxy: FaultProxy, s3_server: dict[str, str], s3_bucket: str
) -> None:
    """The first PUT lands and its response is lost; every retry is refused (503) until botocore gives up.

    The record is there: the commit reads it back, finds its own token, and reports the version.
    """
    catalog = Catalog(s3_store(s3_fault_proxy, s3_server, s3_bucket), "events")
    assert commit_one(catalog, "a", "a-1") == 1
    s3_fault_proxy.inject_next(Fault.RESET_AFTER, method="PUT", path_contains=LOG_PATH)
    s3_fault_proxy.inject_next(Fault.ERROR_503, method="PUT", path_contains=LOG_PATH, times=4)
    assert commit_one(catalog, "b", "b-1") == 2
    assert s3_fault_proxy.injected[Fault.ERROR_503] == 4
    fresh = Catalog(s3_store(s3_fault_proxy, s3_server, s3_bucket), "events")
    assert fingerprints_by_version(fresh) == {1: ["a-1"], 2: ["b-1"]}


def test_a_commit_that_never_reached_the_store_is_a_typed_error_and_publishes_nothing(
    s3_fault_proxy: FaultProxy, s3_server: dict[str, str], s3_bucket: str
) -> None:
    catalog = Catalog(s3_store(s3_fault_proxy, s3_server, s3_bucket), "events")
    assert commit_one(catalog, "a", "a-1") == 1
    s3_fault_proxy.inject_next(Fault.RESET_BEFORE, method="PUT", path_contains=LOG_PATH, times=1000)
    with pytest.raises(ObjectStoreError, match="s3://") as caught:
        commit_one(catalog, "a", "a-2")
    s3_fault_proxy.clear()
    assert "nothing was published" in str(caught.value).lower()
    assert s3_fault_proxy.injected[Fault.RESET_BEFORE] > 5, "the client and the catalog both tried again"
    fresh = Catalog(s3_store(s3_fault_proxy, s3_server, s3_bucket), "events")
    assert fingerprints_by_version(fresh) == {1: ["a-1"]}


def test_truncated_reads_are_retried_and_a_read_that_keeps_failing_is_typed(
    s3_fault_proxy: FaultProxy, s3_server: dict[str, str], s3_bucket: str
) -> None:
    store = s3_store(s3_fault_proxy, s3_server, s3_bucket)
    payload = bytes(range(256)) * 64
    store.put("blob", payload)
    s3_fault_proxy.inject_next(Fault.TRUNCATE, method="GET", times=2)
    assert store.get("blob") == payload
    s3_fault_proxy.inject_next(Fault.TRUNCATE, method="GET")
    assert store.get_range("blob", 100, 1000) == payload[100:1100]
    # A 404's error body cut short escapes botocore as urllib3's ProtocolError: retried too.
    s3_fault_proxy.inject_next(Fault.TRUNCATE, method="GET", times=2)
    assert store.get("missing") is None
    assert s3_fault_proxy.injected[Fault.TRUNCATE] == 5
    s3_fault_proxy.inject_next(Fault.TRUNCATE, method="GET", times=1000)
    with pytest.raises(ObjectStoreError, match=r"s3://.*blob.*kept failing"):
        store.get("blob")
    s3_fault_proxy.clear()


# --- random faults --------------------------------------------------------------------------------

WRITERS = 4
COMMITS = 12
SHARED_EVERY = 4


def test_concurrent_writers_under_random_faults_commit_exactly_once(
    s3_fault_proxy: FaultProxy, s3_server: dict[str, str], s3_bucket: str
) -> None:
    """4 writers x 12 commits at 20% faults; a writer re-plans after any typed failure, with no commit id
    of its own (after `CommitOutcomeUnknownError`, with the one the error carries, as its message says).

    Afterwards: every acknowledged commit is the one record of its version (none lost), no commit is in two
    versions (none duplicated), every failure was typed, and the newest version's rows are exactly the
    rows of the last acknowledged commit of each partition.
    """
    acknowledged: list[tuple[int, str, str, int]] = []
    typed: list[str] = []
    untyped: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(WRITERS)

    def writer(number: int) -> None:
        catalog = Catalog(s3_store(s3_fault_proxy, s3_server, s3_bucket), "events")
        barrier.wait()
        for index in range(COMMITS):
            owner = f"shared{index % 2}" if index % SHARED_EVERY == 0 else f"w{number}"
            fingerprint = f"w{number}-{index}"
            rows = 1 + number * 100 + index
            commit_id = None
            while True:
                try:
                    version = commit_one(catalog, owner, fingerprint, rows, commit_id)
                except AirflowPartitionsError as err:
                    with lock:
                        typed.append(type(err).__name__)
                    if isinstance(err, CommitOutcomeUnknownError):
                        commit_id = err.commit_id  # as the error says: again, with its commit id
                    continue
                except Exception as err:  # a raw library error escaped: recorded and fails the test
                    with lock:
                        untyped.append(err)
                    continue
                with lock:
                    acknowledged.append((version, owner, fingerprint, rows))
                break

    with s3_fault_proxy.faulty(0.2):
        threads = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
    assert sum(s3_fault_proxy.injected.values()) > 50, "faults were injected"
    assert untyped == [], f"raw errors escaped: {untyped[:3]!r}"

    catalog = Catalog(s3_store(s3_fault_proxy, s3_server, s3_bucket), "events")
    logged = fingerprints_by_version(catalog)
    published = [fp for fingerprints in logged.values() for fp in fingerprints]
    duplicated = len(published) - len(set(published))
    assert duplicated == 0, f"{duplicated} commit(s) published twice"
    assert len(acknowledged) == WRITERS * COMMITS
    lost = [a for a in acknowledged if logged.get(a[0]) != [a[2]]]
    assert lost == [], f"acknowledged but not the record of their version: {lost[:3]}"
    assert sorted(logged) == list(range(1, len(acknowledged) + 1)), "one version per acknowledged commit"
    assert set(typed) <= {"CommitConflictError", "ObjectStoreError", "CommitOutcomeUnknownError"}

    latest = catalog.latest()
    assert latest is not None
    last_rows = {owner: rows for _v, owner, _fp, rows in sorted(acknowledged)}
    assert {k: e.rows for k, e in latest.partitions.items()} == {
        PartitionKey((owner,)).path(SPEC.names): rows for owner, rows in last_rows.items()
    }
    assert latest.total_rows == sum(last_rows.values()), "rows conserved through every commit"


def test_snapshot_upload_and_bootstrap_under_random_faults_conserve_rows(
    s3_fault_proxy: FaultProxy, s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    """Publish 6 partitions and bootstrap them at 20% faults; a failed step is typed and simply re-run."""
    storage = get_storage("parquet", None)
    (tmp_path / "source").mkdir()
    source = Catalog(LocalStore(tmp_path / "source"), "trips", storage=storage)
    assert source.data_root is not None
    entries = []
    for index, owner in enumerate(["EU", "a/b", "100%", "k=v", "Überprüfung ✓", ".."]):
        key = PartitionKey((owner,))
        table = pa.table(
            {
                "owner": pa.array([owner] * (index + 3), pa.string()),
                "trip_id": pa.array(range(index * 100, index * 100 + index + 3), pa.int64()),
            }
        )
        files = storage.publish(
            source.data_root, storage.write(table, source.data_root, key.path(SPEC.names))
        )
        entries.append(PartitionEntry.from_files(key, SPEC, files))
    source.commit(base_version=None, upserts=entries, partition_spec=SPEC)
    published = source.latest()
    assert published is not None
    settings = s3_fault_proxy.through(s3_server)
    location = f"s3://{s3_bucket}/snapshots"
    failures: list[str] = []

    def until_done(step: Any) -> Any:
        for _ in range(50):
            try:
                return step()
            except AirflowPartitionsError as err:
                failures.append(type(err).__name__)
        raise AssertionError(f"50 attempts failed: {failures[-5:]}")

    (tmp_path / "replica").mkdir()
    replica = Catalog(LocalStore(tmp_path / "replica"), "trips", storage=storage)
    assert replica.data_root is not None
    with s3_fault_proxy.faulty(0.2):
        for partition in published.partitions.values():
            until_done(
                lambda p=partition: upload_partition_snapshot(
                    settings, location, source.data_root, p, dataset="trips"
                )
            )
        until_done(lambda: upload_snapshot_manifest(settings, location, "trips", published))
        result = until_done(
            lambda: bootstrap_snapshot(settings, location, "trips", replica.data_root, catalog=replica)
        )
    assert sum(s3_fault_proxy.injected.values()) > 5, "faults were injected"
    assert result.version == 1
    local = replica.latest()
    assert local is not None
    assert local.partitions == published.partitions
    assert local.total_rows == published.total_rows == sum(range(3, 9))
    for entry_ in published.partitions.values():
        for data_file in entry_.files:
            assert (replica.data_root / data_file.path).read_bytes() == (
                source.data_root / data_file.path
            ).read_bytes()
    assert [p for p in replica.data_root.rglob("*") if p.name.startswith(".tmp-")] == []


@pytest.mark.spark
def test_a_refresh_from_s3_under_random_faults_fails_typed_and_publishes_once(
    spark: Any,
    s3_fault_proxy: FaultProxy,
    s3_server: dict[str, str],
    s3_bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refresh whose source and catalog sit behind a faulty S3: every failed attempt is a typed error and
    publishes nothing; once one succeeds there is exactly one version and a full read equals the source."""
    import datetime as dt
    import io

    import boto3
    import pyarrow.parquet as pq

    from airflow_partitions.catalog import open_catalog
    from airflow_partitions.read import PartitionedDatasetReader
    from airflow_partitions.refresh import refresh_dataset
    from airflow_partitions.spec import load_spec

    regions = ["EU", "a/b=c", "50%", "it's", "Zürich", "", None]
    client = boto3.client("s3", **s3_server)
    expected: list[tuple[Any, ...]] = []
    for part in range(3):
        ids = [part * 100 + i if i % 9 else None for i in range(40)]
        rows = {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array([regions[(i + part) % len(regions)] for i in range(40)], pa.string()),
            "ts": pa.array(
                [
                    None if i % 11 == 0 else dt.datetime(2026, 1, 1) + dt.timedelta(hours=i * 7)
                    for i in range(40)
                ],
                pa.timestamp("us"),
            ),
        }
        table = pa.table(rows)
        expected.extend(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))
        body = io.BytesIO()
        pq.write_table(table, body)
        client.put_object(Bucket=s3_bucket, Key=f"faulty-src/part-{part}.parquet", Body=body.getvalue())
    proxied = s3_fault_proxy.through(s3_server)
    # The catalog on S3 is reached with the environment's settings: they point at the proxy too.
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxied["endpoint_url"])
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: trips\n"
        f"    from: s3://{s3_bucket}/faulty-src\n"
        f"    params: {{file_format: parquet, endpoint_url: '{proxied['endpoint_url']}'}}\n"
        "    acceleration:\n"
        "      partition_by: ['bucket(4, id)', region]\n"
        f"      params: {{catalog_location: 's3://{s3_bucket}/faulty-catalog'}}\n"
    )
    failures: list[str] = []
    summary = None
    with s3_fault_proxy.faulty(0.2):
        for _ in range(25):
            try:
                summary = refresh_dataset(tmp_path / "spec.yaml", "trips", spark=spark)
                break
            except AirflowPartitionsError as err:  # anything else fails the test: untyped
                failures.append(type(err).__name__)
    assert summary is not None, f"25 attempts failed: {failures[-5:]}"
    assert sum(s3_fault_proxy.injected.values()) > 0, "faults were injected"
    project = load_spec(tmp_path / "spec.yaml")
    catalog = open_catalog(project, project.dataset("trips"))
    assert [v.version for v in catalog.versions()] == [1], "published exactly once"
    with PartitionedDatasetReader(project, "trips") as reader:
        table = reader.read()
    got = list(zip(*(table.column(c).to_pylist() for c in ["id", "region", "ts"]), strict=True))
    assert sorted(got, key=repr) == sorted(expected, key=repr)


def test_a_bootstrap_download_cut_short_is_sent_again(
    s3_fault_proxy: FaultProxy, s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    """A data object whose body is truncated on the way is fetched again, not a failed bootstrap."""
    storage = get_storage("parquet", None)
    (tmp_path / "source").mkdir()
    source = Catalog(LocalStore(tmp_path / "source"), "trips", storage=storage)
    assert source.data_root is not None
    key = PartitionKey(("a/b=c",))
    table = pa.table({"owner": pa.array(["a/b=c"] * 500, pa.string()), "n": pa.array(range(500), pa.int64())})
    files = storage.publish(source.data_root, storage.write(table, source.data_root, key.path(SPEC.names)))
    source.commit(
        base_version=None, upserts=[PartitionEntry.from_files(key, SPEC, files)], partition_spec=SPEC
    )
    published = source.latest()
    assert published is not None
    settings = s3_fault_proxy.through(s3_server)
    location = f"s3://{s3_bucket}/cut-short"
    for partition in published.partitions.values():
        upload_partition_snapshot(settings, location, source.data_root, partition, dataset="trips")
    upload_snapshot_manifest(settings, location, "trips", published)
    (tmp_path / "replica").mkdir()
    replica = Catalog(LocalStore(tmp_path / "replica"), "trips", storage=storage)
    assert replica.data_root is not None
    s3_fault_proxy.inject_next(Fault.TRUNCATE, method="GET", path_contains="/data/", times=2)
    result = bootstrap_snapshot(settings, location, "trips", replica.data_root, catalog=replica)
    assert s3_fault_proxy.injected[Fault.TRUNCATE] == 2, "the data object was cut short twice"
    assert result.version == 1
    for data_file in files:
        assert (replica.data_root / data_file.path).read_bytes() == (
            source.data_root / data_file.path
        ).read_bytes()
    assert [p for p in replica.data_root.rglob("*") if p.name.startswith(".tmp-")] == []


def test_a_multipart_snapshot_upload_repeats_transient_faults_like_the_store(
    s3_fault_proxy: FaultProxy, s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    """The transfer manager's parts meet more 503s in a row than botocore retries: the upload is sent
    again (the store's repeat rule), and the object holds the partition's bytes."""
    storage = get_storage("parquet", None)
    (tmp_path / "source").mkdir()
    source = Catalog(LocalStore(tmp_path / "source"), "trips", storage=storage)
    assert source.data_root is not None
    key = PartitionKey(("a/b %'Ü",))
    table = pa.table(
        {"owner": pa.array(["a/b %'Ü", None, ""]), "trip_id": pa.array([1, None, 3], pa.int64())}
    )
    files = storage.publish(source.data_root, storage.write(table, source.data_root, key.path(SPEC.names)))
    partition = PartitionEntry.from_files(key, SPEC, files)
    settings = s3_fault_proxy.through(s3_server)
    s3_fault_proxy.inject_next(Fault.ERROR_503, method="PUT", path_contains="partNumber", times=6)
    try:
        outcome = upload_partition_snapshot(
            settings,
            f"s3://{s3_bucket}/multipart-faults",
            source.data_root,
            partition,
            dataset="trips",
            multipart_threshold=1,
        )
    finally:
        s3_fault_proxy.clear()
    assert s3_fault_proxy.injected[Fault.ERROR_503] >= 6
    [uploaded] = outcome.files
    assert uploaded.multipart
    assert uploaded.checksum == files[0].checksum
    client = S3Settings.from_mapping(s3_server).create_client()
    body = client.get_object(Bucket=s3_bucket, Key=uploaded.key)["Body"].read()
    assert body == (source.data_root / files[0].path).read_bytes()
