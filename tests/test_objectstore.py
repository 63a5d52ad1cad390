"""The object-store layer: one `s3://` parser, one conditional-write rule, one interface for both stores."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from airflow_partitions.catalog import Catalog, PartitionEntry, PartitionSpecInfo, open_catalog
from airflow_partitions.exceptions import (
    CatalogError,
    ObjectStoreError,
    SnapshotError,
    SourceError,
)
from airflow_partitions.keys import PartitionKey
from airflow_partitions.objectstore import (
    LocalStore,
    ObjectStore,
    S3Location,
    S3Settings,
    S3Store,
    parse_s3_location,
    shared_s3_client,
    store_from_url,
)
from airflow_partitions.spec import load_spec
from airflow_partitions.storage import DataFile

SPEC = PartitionSpecInfo.from_fields([("region", "region", "string")])

# What S3 answers while another conditional write of the same key is in flight. moto never sends it,
# so the tests below inject it into the real request path with a botocore `before-send` handler.
CONFLICT_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ConditionalRequestConflict</Code>'
    b"<Message>A conflicting conditional operation is currently in progress against this resource."
    b"</Message></Error>"
)


class _RawBody:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, *_: Any, **__: Any) -> Iterator[bytes]:
        yield self.body


@contextmanager
def answering_409(client: Any, times: int, before: Callable[[], None] = lambda: None) -> Iterator[list[str]]:
    """The first `times` PutObject requests of `client` get HTTP 409 instead of reaching the server.

    `before` runs just before each injected 409 (e.g. a competing writer finishing). Yields the
    PutObject attempts, in order: "409" for injected answers, "sent" for requests the server saw.
    """
    from botocore.awsrequest import AWSResponse

    attempts: list[str] = []

    def intercept(request: Any, **_: Any) -> AWSResponse | None:
        if sum(1 for a in attempts if a == "409") < times:
            attempts.append("409")
            before()
            return AWSResponse(request.url, 409, {}, _RawBody(CONFLICT_BODY))
        attempts.append("sent")
        return None

    handler_id = f"test-409-{uuid.uuid4().hex}"
    client.meta.events.register("before-send.s3.PutObject", intercept, unique_id=handler_id)
    try:
        yield attempts
    finally:
        client.meta.events.unregister("before-send.s3.PutObject", unique_id=handler_id)


@pytest.fixture
def s3_store(s3_server: dict[str, str], s3_bucket: str) -> S3Store:
    # A client of its own: the handlers the tests register must not reach other tests' clients.
    return S3Store(S3Settings.from_mapping(s3_server).create_client(), s3_bucket, "objects")


# --- one parser ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "strict", "expected"),
    [
        ("s3://bucket/a/b/", True, S3Location("bucket", "a/b")),
        ("s3://bucket", True, S3Location("bucket", "")),
        ("s3a://bucket/data/*.parquet", False, S3Location("bucket", "data/*.parquet")),
        ("bucket/data/file.csv", False, S3Location("bucket", "data/file.csv")),
        ("s3://Odd_Bucket/x", False, S3Location("Odd_Bucket", "x")),
    ],
)
def test_one_parser_for_snapshot_catalog_and_source_locations(
    text: str, strict: bool, expected: S3Location
) -> None:
    assert parse_s3_location(text, strict=strict) == expected


def test_the_parser_raises_the_error_type_of_its_caller() -> None:
    with pytest.raises(SourceError, match="S3 location 's3a://' has no bucket"):
        parse_s3_location("s3a://", what="S3 location", error=SourceError, strict=False)
    with pytest.raises(SnapshotError, match="snapshot location 'bucket/x' must start with s3://"):
        parse_s3_location("bucket/x")
    with pytest.raises(CatalogError, match="catalog location 's3:///x' has no bucket"):
        store_from_url("s3:///x", what="catalog location")
    with pytest.raises(CatalogError, match="unsupported catalog location"):
        store_from_url("gs://bucket/x", what="catalog location")


# --- one interface ---------------------------------------------------------------------------------


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalStore(tmp_path / "objects")
    return request.getfixturevalue("s3_store")  # type: ignore[no-any-return]


def test_both_stores_read_write_list_and_delete_alike(any_store: ObjectStore) -> None:
    store = any_store
    assert store.get("a/1") is None
    assert not store.exists("a/1")
    assert store.get_range("a/1", 0, 4) is None
    assert store.put_if_absent("a/1", b"0123456789")
    assert not store.put_if_absent("a/1", b"other"), "an existing key is never replaced"
    assert store.get("a/1") == b"0123456789"
    assert store.exists("a/1")
    assert store.get_range("a/1", 3, 4) == b"3456"
    assert store.get_range("a/1", 8, 100) == b"89", "a range past the end is cut at the end"
    for name in ("2", "3", "4"):
        store.put(f"a/{name}", name.encode())
    store.put("a/4", b"replaced")
    assert store.get("a/4") == b"replaced"
    listed = list(store.list("a/"))
    assert [i.key for i in listed] == ["a/1", "a/2", "a/3", "a/4"]
    assert [i.size for i in listed] == [10, 1, 1, 8]
    assert all(i.modified.tzinfo is dt.UTC or i.modified.utcoffset() == dt.timedelta(0) for i in listed)
    store.delete(["a/2", "a/3", "a/missing"])
    store.delete("a/4")
    assert [i.key for i in store.list("a/")] == ["a/1"]


# --- one conditional-write rule --------------------------------------------------------------------


@pytest.mark.s3
def test_412_means_the_key_exists(s3_store: S3Store) -> None:
    assert s3_store.put_if_absent("k", b"first")
    with answering_409(s3_store.client, 0) as attempts:
        assert not s3_store.put_if_absent("k", b"second")
    assert attempts == ["sent"], "one request: the server's 412 is a definite answer, not retried"
    assert s3_store.get("k") == b"first"


@pytest.mark.s3
def test_409_is_retried_until_the_server_answers_definitely(s3_store: S3Store) -> None:
    with answering_409(s3_store.client, 2) as attempts:
        assert s3_store.put_if_absent("k", b"mine"), "the concurrent write failed: this one creates the key"
    assert attempts == ["409", "409", "sent"]
    assert s3_store.get("k") == b"mine"


@pytest.mark.s3
def test_409_then_the_other_writer_won_is_an_existing_key(
    s3_store: S3Store, s3_server: dict[str, str]
) -> None:
    rival = S3Store(S3Settings.from_mapping(s3_server).create_client(), s3_store.bucket, s3_store.prefix)
    with answering_409(s3_store.client, 1, before=lambda: rival.put_if_absent("k", b"theirs")) as attempts:
        assert not s3_store.put_if_absent("k", b"mine")
    assert attempts == ["409", "sent"]
    assert s3_store.get("k") == b"theirs"


@pytest.mark.s3
def test_409_that_never_settles_is_an_error_not_an_answer(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("airflow_partitions.objectstore.s3.CONFLICT_RETRIES", 3)
    with answering_409(s3_store.client, 3), pytest.raises(ObjectStoreError, match="HTTP 409"):
        s3_store.put_if_absent("k", b"mine")
    assert s3_store.get("k") is None


@pytest.mark.s3
def test_compare_and_swap_follows_the_same_rule(s3_store: S3Store) -> None:
    s3_store.put("p", b"v1")
    found = s3_store.get_with_etag("p")
    assert found is not None
    with answering_409(s3_store.client, 1) as attempts:
        assert s3_store.put_if_match("p", b"v2", found[1])
    assert attempts == ["409", "sent"]
    assert not s3_store.put_if_match("p", b"v3", found[1]), "412: the ETag moved on"
    assert s3_store.get("p") == b"v2"


@pytest.mark.s3
def test_manifest_published_through_a_409_is_created_not_reported_as_another_catalog(
    tmp_path: Path, s3_server: dict[str, str], s3_bucket: str
) -> None:
    """A 409 on the manifest's write-once objects used to count as "exists": the re-read then found
    nothing yet and the publish failed, naming another catalog that did not exist."""
    import boto3

    from airflow_partitions.snapshots import read_snapshot_manifest, upload_snapshot_manifest

    catalog = Catalog(LocalStore(tmp_path), "trips")
    key = PartitionKey(("eu",))
    data_file = DataFile(
        f"{key.path(SPEC.names)}/part-0.parquet", "parquet", rows=1, bytes=5, checksum="0" * 64
    )
    entry = PartitionEntry.from_files(key, SPEC, [data_file], source_fingerprint="fp")
    catalog.commit(base_version=None, upserts=[entry], partition_spec=SPEC)
    location = f"s3://{s3_bucket}/snap"
    boto3.client("s3", **s3_server).put_object(
        Bucket=s3_bucket, Key=f"snap/trips/data/{data_file.path}", Body=b"12345"
    )
    with answering_409(shared_s3_client(s3_server), 1) as attempts:
        published = upload_snapshot_manifest(s3_server, location, "trips", catalog.snapshot(1))
    assert attempts[:2] == ["409", "sent"]
    assert published.created
    assert published.latest_version == 1
    manifest = read_snapshot_manifest(s3_server, location, "trips")
    assert manifest is not None
    assert manifest.version == 1


# --- the catalog on S3 reached with the settings it is given ---------------------------------------

CATALOG_SPEC = """\
accelerator_dir: accel
datasets:
  - name: sales
    from: file:data/
    params: {{file_format: parquet}}
    acceleration:
      engine: parquet
      partition_by:
        - region: region
      params: {{catalog_location: "s3://{bucket}/team"}}
"""


@pytest.mark.s3
def test_catalog_on_s3_uses_the_settings_passed_and_the_environment_otherwise(
    tmp_path: Path, s3_server: dict[str, str], s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec_path = tmp_path / "datasets.yaml"
    spec_path.write_text(CATALOG_SPEC.format(bucket=s3_bucket))
    project = load_spec(spec_path)
    dataset = project.dataset("sales")
    # Nothing passed: the standard AWS environment decides where the catalog is.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    from_environment = open_catalog(project, dataset).store
    assert isinstance(from_environment, S3Store)
    assert from_environment.client.meta.endpoint_url == "http://127.0.0.1:9"

    # Passed settings win over that environment, and they are the only way to reach the moto server here.
    catalog = open_catalog(project, dataset, s3_settings=S3Settings.from_mapping(s3_server))
    assert catalog.store.describe() == f"s3://{s3_bucket}/team"
    key = PartitionKey(("eu",))
    data_file = DataFile(
        f"{key.path(SPEC.names)}/part-0.parquet", "parquet", rows=1, bytes=5, checksum="0" * 64
    )
    # A commit publishes only files that exist (the data directory stays local here).
    assert catalog.data_root is not None
    (catalog.data_root / data_file.path).parent.mkdir(parents=True)
    (catalog.data_root / data_file.path).write_bytes(b"12345")
    catalog.commit(
        base_version=None,
        upserts=[PartitionEntry.from_files(key, SPEC, [data_file], source_fingerprint="fp")],
        partition_spec=PartitionSpecInfo.from_fields([("region", "region", "string")]),
    )
    listed = [i.key for i in S3Store(shared_s3_client(s3_server), s3_bucket).list("team/")]
    assert listed
    assert all(k.startswith("team/sales/_catalog/") for k in listed)


@pytest.mark.parametrize("skipped", [False, True])
def test_local_writes_fsync_unless_the_unsafe_switch_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, skipped: bool
) -> None:
    """Files, their directories and new directory levels are fsynced; AP_UNSAFE_NO_FSYNC=1 (the test
    suite sets it) skips every fsync and nothing else: the object is written and readable all the same."""
    import os

    from airflow_partitions.objectstore import local

    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda descriptor: synced.append(descriptor))
    if skipped:
        monkeypatch.setenv(local.NO_FSYNC_ENV, "1")
    else:
        monkeypatch.delenv(local.NO_FSYNC_ENV, raising=False)
    store = LocalStore(tmp_path / "store")
    store.put("a/b/c.json", b"{}")
    assert store.put_if_absent("a/b/d.json", b"[]") is True
    local.fsync_file(tmp_path / "store" / "a" / "b" / "c.json")
    local.fsync_directory(tmp_path / "store" / "a")
    assert store.get("a/b/c.json") == b"{}"
    assert store.get("a/b/d.json") == b"[]"
    if skipped:
        assert synced == []
    else:
        # Two temporaries, the new levels store/, a/, b/ (their parents), two renames or links, two calls.
        assert len(synced) >= 7, synced
