"""Catalog: versions, time travel, atomic multi-partition commits, OCC rebase and conflicts, vacuum."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_partitions.catalog import (
    Catalog,
    LocalStore,
    ObjectStore,
    PartitionEntry,
    PartitionSpecInfo,
    S3Store,
)
from airflow_partitions.exceptions import (
    CatalogError,
    CommitConflictError,
    PartitionSpecChangedError,
    VersionNotFoundError,
)
from airflow_partitions.keys import PartitionKey
from airflow_partitions.objectstore import store_from_url
from airflow_partitions.storage import DataFile, get_storage

SPEC = PartitionSpecInfo.from_fields([("region", "region", "string")])
NEW_SPEC = PartitionSpecInfo.from_fields([("region", "region", "string"), ("day", "day(ts)", "date")])


def entry(region: str, fingerprint: str, *, rows: int = 10, spec: PartitionSpecInfo = SPEC) -> PartitionEntry:
    """A catalog entry with one (descriptor-only) data file; the catalog never opens data files."""
    values: tuple[Any, ...] = (region,) if len(spec.fields) == 1 else (region, dt.date(2026, 1, 1))
    key = PartitionKey(values)
    data_file = DataFile(
        path=f"{key.path(spec.names)}/part-{uuid.uuid4().hex}-0000.parquet",
        format="parquet",
        rows=rows,
        bytes=rows * 100,
        checksum="0" * 64,
    )
    return PartitionEntry.from_files(key, spec, [data_file], source_fingerprint=fingerprint)


def key_path(region: str) -> str:
    return PartitionKey((region,)).path(SPEC.names)


def fingerprints(catalog: Catalog, version: int | None = None) -> dict[str, str | None]:
    snapshot = catalog.snapshot(version)
    return {k: e.source_fingerprint for k, e in snapshot.partitions.items()}


def commit(catalog: Catalog, *entries: PartitionEntry, removes: tuple[str, ...] = (), **kwargs: Any) -> int:
    newest = catalog.latest()
    return catalog.commit(
        base_version=newest.version if newest else None,
        upserts=list(entries),
        removes=list(removes),
        partition_spec=kwargs.pop("partition_spec", SPEC),
        **kwargs,
    )


@pytest.fixture
def local_catalog(tmp_path: Path) -> Catalog:
    return Catalog(LocalStore(tmp_path), "sales", checkpoint_interval=3)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], ObjectStore]:
    """A fresh store factory per test: a local directory, or a prefix on the moto S3 server."""
    if request.param == "local":
        return lambda: LocalStore(tmp_path)
    import boto3

    settings = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    client = boto3.client("s3", **settings)
    return lambda: S3Store(client, bucket, "catalogs")


def test_empty_catalog_has_no_versions(local_catalog: Catalog) -> None:
    assert local_catalog.latest() is None
    assert local_catalog.versions() == []
    assert local_catalog.head_version() == 0
    with pytest.raises(VersionNotFoundError, match="no committed version"):
        local_catalog.snapshot()


def test_commits_make_versions_and_every_version_stays_readable(
    make_store: Callable[[], ObjectStore],
) -> None:
    catalog = Catalog(make_store(), "sales", checkpoint_interval=3)
    expected: dict[int, dict[str, str | None]] = {}
    state: dict[str, str | None] = {}
    for step in range(8):
        region = f"r{step % 3}"
        version = commit(catalog, entry(region, f"fp{step}", rows=step + 1))
        assert version == step + 1
        state[key_path(region)] = f"fp{step}"
        expected[version] = dict(state)
    removed_version = commit(catalog, removes=(key_path("r1"),), operation="remove")
    del state[key_path("r1")]
    expected[removed_version] = dict(state)

    reopened = Catalog(make_store(), "sales")  # a fresh process: checkpoints + records only
    for version, content in expected.items():
        assert fingerprints(reopened, version) == content, f"version {version} differs after reopening"
    latest = reopened.latest()
    assert latest is not None
    assert latest.version == removed_version
    assert latest.partition_count == 2
    assert latest.total_rows == 7 + 6, "r0 last written at step 6 (7 rows), r2 at step 5 (6 rows)"
    infos = reopened.versions()
    assert [i.version for i in infos] == list(range(1, removed_version + 1))
    assert infos[-1].operation == "remove"
    assert infos[-1].partitions_removed == 1
    assert infos[-1].total_partitions == 2
    assert infos[-1].total_rows == latest.total_rows
    assert infos[2].partitions_changed == 1
    assert infos[2].rows == 3
    assert [i.version for i in reopened.versions(limit=2)] == [removed_version - 1, removed_version]
    with pytest.raises(VersionNotFoundError, match="does not exist"):
        reopened.snapshot(removed_version + 1)


def test_checkpoints_are_written_and_only_an_optimisation(tmp_path: Path, local_catalog: Catalog) -> None:
    for step in range(7):
        commit(local_catalog, entry(f"r{step}", f"fp{step}"))
    catalog_dir = tmp_path / "sales" / "_catalog"
    checkpoints = sorted(p.name for p in (catalog_dir / "checkpoints").iterdir() if p.suffix == ".arrow")
    assert checkpoints == ["00000000000000000003.arrow", "00000000000000000006.arrow"]
    assert json.loads((catalog_dir / "_last_checkpoint").read_text()) == {"version": 6}
    before = {v: fingerprints(Catalog(LocalStore(tmp_path), "sales"), v) for v in range(1, 8)}
    for checkpoint in (catalog_dir / "checkpoints").iterdir():
        checkpoint.unlink()
    (catalog_dir / "_last_checkpoint").write_text("{not json")
    after = {v: fingerprints(Catalog(LocalStore(tmp_path), "sales"), v) for v in range(1, 8)}
    assert after == before, "records alone must rebuild every version"


def test_multi_partition_commit_is_one_version(local_catalog: Catalog) -> None:
    commit(local_catalog, entry("a", "a1"), entry("b", "b1"), entry("c", "c1"))
    version = commit(local_catalog, entry("a", "a2"), entry("d", "d1"), removes=(key_path("b"),))
    assert version == 2
    assert fingerprints(local_catalog, 1) == {key_path("a"): "a1", key_path("b"): "b1", key_path("c"): "c1"}
    assert fingerprints(local_catalog, 2) == {key_path("a"): "a2", key_path("c"): "c1", key_path("d"): "d1"}
    info = local_catalog.versions()[-1]
    assert (info.partitions_changed, info.partitions_removed, info.total_partitions) == (2, 1, 3)


def test_loser_rebases_when_partitions_are_disjoint(make_store: Callable[[], ObjectStore]) -> None:
    first, second = Catalog(make_store(), "sales"), Catalog(make_store(), "sales")
    base = first.commit(base_version=None, upserts=[entry("a", "a1"), entry("b", "b1")], partition_spec=SPEC)
    assert first.commit(base_version=base, upserts=[entry("a", "a2")], partition_spec=SPEC) == 2
    rebased = second.commit(base_version=base, upserts=[entry("b", "b2")], partition_spec=SPEC)
    assert rebased == 3
    assert fingerprints(Catalog(make_store(), "sales"), 3) == {key_path("a"): "a2", key_path("b"): "b2"}
    assert Catalog(make_store(), "sales").versions()[-1].total_partitions == 2


def test_loser_touching_the_same_partition_gets_a_conflict(make_store: Callable[[], ObjectStore]) -> None:
    first, second = Catalog(make_store(), "sales"), Catalog(make_store(), "sales")
    base = first.commit(base_version=None, upserts=[entry("a", "a1"), entry("b", "b1")], partition_spec=SPEC)
    first.commit(base_version=base, upserts=[entry("a", "a2")], partition_spec=SPEC)
    with pytest.raises(CommitConflictError, match=r"region=a.*changed in version 2") as caught:
        second.commit(base_version=base, upserts=[entry("a", "a3"), entry("b", "b3")], partition_spec=SPEC)
    assert caught.value.partitions == (key_path("a"),)
    assert caught.value.version == 2
    with pytest.raises(CommitConflictError):
        second.commit(base_version=base, upserts=[], removes=[key_path("a")], partition_spec=SPEC)
    assert Catalog(make_store(), "sales").head_version() == 2, "a conflicting commit leaves no trace"
    assert fingerprints(Catalog(make_store(), "sales")) == {key_path("a"): "a2", key_path("b"): "b1"}


def test_a_writer_losing_race_after_race_backs_off_and_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every attempt of one writer is beaten by another writer's commit to another partition (a slow
    process among fast ones). From the second lost race on it waits, with exponential backoff and full
    jitter, so the others can finish instead of starving it; it lands once it stops losing, and only
    gives up (CommitConflictError) after max_retries."""
    from airflow_partitions.catalog import catalog as catalog_module

    store = LocalStore(tmp_path)
    slow, fast = Catalog(store, "sales"), Catalog(LocalStore(tmp_path), "sales")
    base = commit(slow, entry("a", "a1"))
    waits: list[float] = []
    monkeypatch.setattr(catalog_module.time, "sleep", waits.append)
    real_publish = slow._publish
    beaten = {"left": 7, "count": 0}

    def publish_after_a_faster_writer(record: Any, data: bytes) -> bool:
        if beaten["left"] > 0:
            beaten["left"] -= 1
            beaten["count"] += 1
            fast.commit(
                base_version=fast.head_version(),
                upserts=[entry(f"other{beaten['count']}", "x")],
                partition_spec=SPEC,
            )
        return bool(real_publish(record, data))

    monkeypatch.setattr(slow, "_publish", publish_after_a_faster_writer)
    version = slow.commit(base_version=base, upserts=[entry("a", "a2")], partition_spec=SPEC)
    assert version == base + 8, "landed after the 7 commits that beat it"
    assert fingerprints(slow, version)[key_path("a")] == "a2"
    assert len(fingerprints(slow, version)) == 8, "nothing the faster writer published was lost"
    assert len(waits) == 6, "no wait after the first lost race, one after each later one"
    for lost, wait in enumerate(waits, start=1):
        assert 0.0 <= wait <= min(catalog_module.COMMIT_BACKOFF_CAP_S, 0.01 * 2 ** (lost - 1))
    beaten["left"] = 3
    with pytest.raises(CommitConflictError, match="lost the race 3 times"):
        slow.commit(
            base_version=slow.head_version(), upserts=[entry("a", "a3")], partition_spec=SPEC, max_retries=2
        )


def test_replace_all_conflicts_with_any_intervening_commit(local_catalog: Catalog) -> None:
    base = commit(local_catalog, entry("a", "a1"))
    commit(local_catalog, entry("z", "z1"))
    with pytest.raises(CommitConflictError, match=r"replaces every partition .* must be based on the newest"):
        local_catalog.commit(
            base_version=base, upserts=[entry("q", "q1")], partition_spec=SPEC, replace_all=True
        )
    other = Catalog(local_catalog.store, "sales")
    replaced = commit(other, entry("q", "q1"), replace_all=True, operation="repartition")
    assert fingerprints(other, replaced) == {key_path("q"): "q1"}
    with pytest.raises(CommitConflictError, match="replaced every partition"):
        local_catalog.commit(base_version=base + 1, upserts=[entry("z", "z2")], partition_spec=SPEC)


def test_commit_id_makes_a_retried_commit_idempotent(local_catalog: Catalog) -> None:
    base = commit(local_catalog, entry("a", "a1"))
    first = local_catalog.commit(
        base_version=base, upserts=[entry("a", "a2")], partition_spec=SPEC, commit_id="run-1"
    )
    retry = Catalog(local_catalog.store, "sales").commit(
        base_version=base, upserts=[entry("a", "a2")], partition_spec=SPEC, commit_id="run-1"
    )
    assert retry == first
    assert local_catalog.head_version() == first


def test_changing_partition_by_is_rejected_with_how_to_repartition(local_catalog: Catalog) -> None:
    old = commit(local_catalog, entry("a", "a1"), entry("b", "b1"))
    with pytest.raises(PartitionSpecChangedError) as caught:
        commit(local_catalog, entry("a", "a2", spec=NEW_SPEC), partition_spec=NEW_SPEC)
    message = str(caught.value)
    assert "partition_by expressions" in message
    assert "refresh SPEC DATASET --full" in message
    assert "revert partition_by" in message
    assert "accelerator_dir" in message
    new = commit(local_catalog, entry("a", "a2", spec=NEW_SPEC), partition_spec=NEW_SPEC, replace_all=True)
    snapshot = local_catalog.snapshot(new)
    assert snapshot.partition_spec == NEW_SPEC
    assert {e.spec_id for e in snapshot.partitions.values()} == {NEW_SPEC.spec_id}
    assert snapshot.partition_count == 1
    previous = Catalog(local_catalog.store, "sales").snapshot(old)
    assert previous.partition_spec == SPEC, "old versions stay readable under their own spec"
    assert {e.spec_id for e in previous.partitions.values()} == {SPEC.spec_id}
    assert local_catalog.versions()[-1].replace_all
    with pytest.raises(PartitionSpecChangedError, match="partition_by expressions"):
        local_catalog.commit(base_version=old, upserts=[entry("c", "c1")], partition_spec=SPEC)


def test_malformed_commits_are_refused_before_anything_is_written(local_catalog: Catalog) -> None:
    commit(local_catalog, entry("a", "a1"))
    mislabelled = dataclasses.replace(entry("b", "b1"), key_path="region=c")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"upserts": [mislabelled]}, "does not match its key"),
        ({"upserts": [entry("b", "1"), entry("b", "2")]}, "appears twice"),
        ({"upserts": [entry("b", "1")], "removes": [key_path("b")]}, "both upserted and removed"),
        ({"upserts": [], "removes": [key_path("nope")]}, "not in base version"),
        (
            {"upserts": [entry("b", "1", spec=NEW_SPEC)]},
            "does not match its key|written under partition spec",
        ),
        ({"upserts": [entry("b", "1")], "removes": [key_path("a")], "replace_all": True}, "pass no removes"),
    ]
    for arguments, message in cases:
        with pytest.raises(CatalogError, match=message):
            local_catalog.commit(base_version=1, partition_spec=SPEC, **arguments)
    assert local_catalog.head_version() == 1
    with pytest.raises(VersionNotFoundError):
        local_catalog.commit(base_version=5, upserts=[entry("b", "1")], partition_spec=SPEC)


def test_snapshot_columnar_access_matches_entries(local_catalog: Catalog) -> None:
    regions = [f"r{i:03d}" for i in range(40)] + ["", "é/=%", "%NULL"]
    commit(local_catalog, *[entry(r, f"fp-{r}", rows=i) for i, r in enumerate(regions)])
    commit(local_catalog, entry("r005", "changed", rows=1000), removes=(key_path("r006"),))
    snapshot = Catalog(local_catalog.store, "sales").latest()
    assert snapshot is not None
    keys = snapshot.keys()
    assert len(keys) == len(regions) - 1
    assert keys[key_path("é/=%")] == PartitionKey(("é/=%",))
    assert key_path("r006") not in snapshot.partitions
    assert snapshot.partitions[key_path("r005")].rows == 1000
    bulk = {e.key_path: e for e in snapshot.partitions.values()}
    single = {k: snapshot.partitions[k] for k in snapshot.partitions}
    assert bulk == single
    assert snapshot.total_rows == sum(e.rows for e in bulk.values())
    assert snapshot.table.column_names[:3] == ["key_path", "key", "spec_id"]
    assert snapshot.last_refreshed_at is not None


def write_real_partition(catalog: Catalog, region: str, value: int) -> PartitionEntry:
    storage = get_storage("parquet")
    assert catalog.data_root is not None
    key = PartitionKey((region,))
    files = storage.write(pa.table({"v": [value]}), catalog.data_root, key.path(SPEC.names))
    return PartitionEntry.from_files(key, SPEC, files, source_fingerprint=f"{region}-{value}")


def age(path: Path, seconds: float) -> None:
    stamp = dt.datetime.now().timestamp() - seconds
    os.utime(path, (stamp, stamp))


def test_vacuum_keeps_what_retained_versions_need_and_removes_the_rest(tmp_path: Path) -> None:
    catalog = Catalog(LocalStore(tmp_path), "sales", storage=get_storage("parquet"), checkpoint_interval=4)
    storage = get_storage("parquet")
    for value in range(6):
        commit(
            catalog,
            write_real_partition(catalog, "a", value),
            write_real_partition(catalog, f"b{value % 2}", value),
        )
    assert catalog.data_root is not None
    # Leftovers of a crashed refresh: an orphan file and a temporary, one old and one young.
    orphan_old = write_real_partition(catalog, "a", 100).files[0]
    orphan_young = write_real_partition(catalog, "a", 101).files[0]
    temporary = catalog.data_root / key_path("a") / ".tmp-part-crashed.parquet"
    temporary.write_bytes(b"half a file")
    for path in catalog.data_root.rglob("*"):
        if path.is_file():
            age(path, 7200)
    age(catalog.data_root / orphan_young.path, -600)  # written "after" the vacuum's cutoff
    # grace=0: the versions were all committed a moment ago; file ages are what the test controls.
    dry = catalog.vacuum(retain_versions=2, grace=dt.timedelta(0), dry_run=True)
    assert dry.removed_versions == (1, 2, 3, 4)
    assert fingerprints(Catalog(LocalStore(tmp_path), "sales"), 1), "a dry run removes nothing"

    report = catalog.vacuum(retain_versions=2, grace=dt.timedelta(0))
    assert report.oldest_retained_version == 5
    assert report.removed_versions == (1, 2, 3, 4)
    assert report.young_files_kept == 1, "the young orphan may belong to a commit in flight"
    removed = {f.path for f in report.removed_files}
    assert orphan_old.path in removed
    assert f"{key_path('a')}/.tmp-part-crashed.parquet" in removed
    assert (catalog.data_root / orphan_young.path).exists()
    fresh = Catalog(LocalStore(tmp_path), "sales")
    for version in (5, 6):
        for partition in fresh.snapshot(version).partitions.values():
            assert storage.read(catalog.data_root, partition.files).num_rows == 1, f"v{version} lost a file"
    with pytest.raises(VersionNotFoundError, match=r"vacuumed; retained versions are 5\.\.6"):
        fresh.snapshot(3)
    assert [i.version for i in fresh.versions()] == [5, 6]
    on_disk = {p.relative_to(catalog.data_root).as_posix() for p in catalog.data_root.rglob("part-*")}
    needed = {f.path for v in (5, 6) for e in fresh.snapshot(v).partitions.values() for f in e.files}
    assert on_disk == needed | {orphan_young.path}
    assert commit(fresh, write_real_partition(fresh, "c", 1)) == 7, "commits continue after vacuum"


def test_vacuum_by_age_keeps_versions_replaced_within_the_grace_period(tmp_path: Path) -> None:
    catalog = Catalog(LocalStore(tmp_path), "sales")
    for step in range(4):
        commit(catalog, entry("a", f"a{step}"))
    times = [i.committed_at for i in catalog.versions()]
    later = times[-1] + dt.timedelta(days=10)
    report = catalog.vacuum(
        older_than=dt.timedelta(days=1), grace=dt.timedelta(hours=1), now=later, dry_run=True
    )
    assert report.oldest_retained_version == 4, "everything older than a day goes, the newest always stays"
    report = catalog.vacuum(older_than=dt.timedelta(days=1), grace=dt.timedelta(hours=1))
    assert report.removed_versions == (), "versions replaced minutes ago may still be read"
    with pytest.raises(CatalogError, match="retain_versions"):
        catalog.vacuum(retain_versions=0)


def test_local_store_lists_in_key_order_across_shards(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    keys = [
        "p/log/0000000000/00000000000000000999.json",
        "p/log/0000000001/00000000000000001000.json",
        "p/log/0000000001/00000000000000001001.json",
        "p/log/0000000002/00000000000000002000.json",
        "p/other-x",
        "p/other/y",
    ]
    for key in reversed(keys):
        assert store.put_if_absent(key, key.encode())
    assert not store.put_if_absent(keys[0], b"second writer"), "put_if_absent never replaces"
    assert store.get(keys[0]) == keys[0].encode()
    assert [i.key for i in store.list("p/")] == sorted(keys)
    assert [i.key for i in store.list("p/log/", start_after=keys[1])] == keys[2:4]
    assert store.get_range(keys[0], 0, 5) == b"p/log"
    store.delete(keys[0])
    store.delete(keys[0])
    assert store.get(keys[0]) is None
    with pytest.raises(CatalogError):
        store.get("../outside")


@pytest.mark.s3
def test_s3_store_uses_conditional_writes(s3_server: dict[str, str], s3_bucket: str) -> None:
    store = store_from_url(f"s3://{s3_bucket}/some/prefix", settings=s3_server)
    assert isinstance(store, S3Store)
    assert store.put_if_absent("a/1", b"first")
    assert not store.put_if_absent("a/1", b"second"), "the server answers 412 to If-None-Match: *"
    assert store.get("a/1") == b"first"
    assert store.get_range("a/1", 0, 2) == b"fi"
    assert store.get("a/missing") is None
    store.put("a/2", b"x")
    store.put("a/3", b"y")
    assert [i.key for i in store.list("a/")] == ["a/1", "a/2", "a/3"]
    assert [i.key for i in store.list("a/", start_after="a/1")] == ["a/2", "a/3"]
    store.delete("a/2")
    store.delete("a/2")
    assert [i.key for i in store.list("a/")] == ["a/1", "a/3"]


@pytest.mark.s3
def test_s3_catalog_caches_checkpoints_on_the_host(
    s3_server: dict[str, Any], s3_bucket: str, tmp_path: Path
) -> None:
    import boto3

    store = S3Store(boto3.client("s3", **s3_server), s3_bucket, "c")
    catalog = Catalog(store, "sales", checkpoint_interval=2)
    for step in range(5):
        commit(catalog, entry(f"r{step}", f"fp{step}"))
    cache = tmp_path / "cache"
    cached = Catalog(store, "sales", cache_dir=cache)
    assert fingerprints(cached) == fingerprints(Catalog(store, "sales"))
    assert [p.name for p in cache.iterdir()] == ["00000000000000000004.arrow"]
    assert fingerprints(Catalog(store, "sales", cache_dir=cache), 3) == fingerprints(catalog, 3)


def test_a_vacuum_interrupted_half_way_leaves_every_retained_version_readable(tmp_path: Path) -> None:
    catalog = Catalog(LocalStore(tmp_path), "sales", checkpoint_interval=3)
    for step in range(10):
        commit(catalog, entry(f"r{step % 4}", f"fp{step}"))
    expected = {v: fingerprints(catalog, v) for v in (8, 9, 10)}
    catalog.write_checkpoint(catalog.snapshot(8))
    # Killed after deleting versions 1..7 but before the old checkpoints, with a stale hint left behind.
    log_dir = tmp_path / "sales" / "_catalog" / "log" / "0000000000"
    for version in range(1, 8):
        (log_dir / f"{version:020d}.json").unlink()
    (tmp_path / "sales" / "_catalog" / "_last_checkpoint").write_text('{"version": 3}')
    reopened = Catalog(LocalStore(tmp_path), "sales")
    latest = reopened.latest()
    assert latest is not None
    assert latest.version == 10
    for version, content in expected.items():
        assert fingerprints(Catalog(LocalStore(tmp_path), "sales"), version) == content
    with pytest.raises(VersionNotFoundError, match="vacuumed"):
        Catalog(LocalStore(tmp_path), "sales").snapshot(5)
    report = reopened.vacuum(retain_versions=3, grace=dt.timedelta(0))
    assert report.removed_checkpoints == (3, 6)
    assert commit(reopened, entry("new", "x")) == 11


def test_vacuum_drops_shared_duckdb_tables_no_retained_version_uses(tmp_path: Path) -> None:
    storage = get_storage("duckdb", "tables")
    catalog = Catalog(LocalStore(tmp_path), "sales", storage=storage)
    assert catalog.data_root is not None
    key = PartitionKey(("eu",))
    for value in range(3):
        files = storage.write(pa.table({"v": [value]}), catalog.data_root, key.path(SPEC.names))
        commit(catalog, PartitionEntry.from_files(key, SPEC, storage.publish(catalog.data_root, files)))
    report = catalog.vacuum(retain_versions=1, grace=dt.timedelta(0))
    dropped = sorted(f.path for f in report.removed_files if "#" in f.path)
    assert len(dropped) == 2, report.removed_files
    assert len([f for f in report.removed_files if f.path.endswith(".duckdb")]) == 2, "staged copies go too"
    (current,) = Catalog(LocalStore(tmp_path), "sales").snapshot().partitions.values()
    assert storage.read(catalog.data_root, current.files).column("v").to_pylist() == [2]


def test_a_commit_of_many_changed_partitions_decodes_their_old_entries_in_one_batch(
    local_catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The version summary needs the old size of every changed partition. Looked up one key at a time, each
    lookup took from the whole table: 1,000 changed partitions of a 100,000-partition catalog cost a
    thousand takes. They must be decoded together, and the totals stay exact."""
    from airflow_partitions.catalog.state import PartitionMap

    commit(local_catalog, *(entry(f"r{i:04d}", "v1", rows=10) for i in range(120)))
    decoded_batches: list[int] = []
    decode = PartitionMap._decode_rows

    def counting_decode(self: PartitionMap, rows: Any) -> Any:
        decoded_batches.append(len(rows))
        return decode(self, rows)

    monkeypatch.setattr(PartitionMap, "_decode_rows", counting_decode)
    changed = [entry(f"r{i:04d}", "v2", rows=25) for i in range(0, 120, 2)]
    commit(local_catalog, *changed, entry("new", "v2", rows=7), removes=(key_path("r0001"),))
    assert len(decoded_batches) <= 2, f"{len(decoded_batches)} decodes for 61 touched partitions"
    info = local_catalog.versions()[-1]
    assert info.total_partitions == 120 + 1 - 1
    assert info.total_rows == 120 * 10 + 60 * (25 - 10) + 7 - 10
