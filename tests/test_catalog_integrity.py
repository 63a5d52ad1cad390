"""Catalog integrity: the digest chain of commit records and checkpoints, commit ids recognised across
re-planning, and commits that refuse to publish files that are gone."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_partitions.catalog import Catalog, LocalStore
from airflow_partitions.catalog.state import RECENT_COMMIT_IDS, CommitRecord
from airflow_partitions.exceptions import (
    CatalogError,
    CatalogIntegrityError,
    CommitFilesMissingError,
)
from airflow_partitions.table import open_handle
from tests.test_catalog import SPEC, commit, entry, fingerprints, key_path


def record_path(root: Path, version: int) -> Path:
    return root / "sales" / "_catalog" / "log" / f"{version // 1000:010d}" / f"{version:020d}.json"


def edit_record(root: Path, version: int, change: Any) -> None:
    """Edit a committed record in place the way a person would: parse its lines, change, write back."""
    path = record_path(root, version)
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    change(lines)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")


def legacy_bytes(record: CommitRecord) -> bytes:
    """A record as releases before the digest chain wrote it: no `parent_digest`, no `digest`."""
    header = {k: v for k, v in record.header().items() if k != "parent_digest"}
    lines = [json.dumps(header), *(json.dumps({"u": u}) for u in record.upserts)]
    return ("\n".join(lines) + "\n").encode()


def test_an_edited_statistic_in_a_commit_record_is_refused_on_load(tmp_path: Path) -> None:
    writer = Catalog(LocalStore(tmp_path), "sales")
    commit(writer, entry("a", "a1"), entry("b", "b1"))
    version = commit(writer, entry("a", "a2"))

    def lower_the_row_count(lines: list[dict[str, Any]]) -> None:
        lines[1]["u"]["rows"] = 1  # as an edited `max` of a column drops rows from filtered reads

    edit_record(tmp_path, version, lower_the_row_count)
    with pytest.raises(CatalogIntegrityError) as caught:
        Catalog(LocalStore(tmp_path), "sales").snapshot()
    message = str(caught.value)
    assert "'sales'" in message
    assert f"version {version}" in message
    assert "Restore it from a backup" in message
    assert "--full" in message
    assert (caught.value.dataset, caught.value.version) == ("sales", version)
    assert isinstance(caught.value, CatalogError)
    assert fingerprints(Catalog(LocalStore(tmp_path), "sales"), version - 1) == {
        key_path("a"): "a1",
        key_path("b"): "b1",
    }, "versions before the edited record stay readable"


def test_a_record_replaced_by_a_self_consistent_one_breaks_the_chain(tmp_path: Path) -> None:
    """A record rewritten with a valid digest of its own (a swap, a forged record) no longer matches the
    parent digest its successor names."""
    writer = Catalog(LocalStore(tmp_path), "sales", checkpoint_interval=100)
    commit(writer, entry("a", "a1"))
    middle = commit(writer, entry("b", "b1"))
    commit(writer, entry("c", "c1"))
    original = CommitRecord.decode(record_path(tmp_path, middle).read_bytes(), where="test")
    forged_entry = dict(original.upserts[0], rows=999)
    _, forged = CommitRecord(
        **{**{f: getattr(original, f) for f in original.__dataclass_fields__}, "upserts": (forged_entry,)}
    ).seal()
    record_path(tmp_path, middle).write_bytes(forged)
    with pytest.raises(CatalogIntegrityError, match=f"version {middle + 1}"):
        Catalog(LocalStore(tmp_path), "sales").snapshot()


def test_records_before_the_digest_chain_load_and_the_chain_starts_after_them(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    writer = Catalog(store, "sales", checkpoint_interval=100)
    commit(writer, entry("a", "a1"))
    commit(writer, entry("b", "b1"))
    for version in (1, 2):
        old = CommitRecord.decode(record_path(tmp_path, version).read_bytes(), where="test")
        record_path(tmp_path, version).write_bytes(legacy_bytes(old))
    reader = Catalog(store, "sales", checkpoint_interval=100)
    assert reader.snapshot().record_digest is None, "the legacy head carries no digest"
    third = commit(reader, entry("c", "c1"))
    fourth = commit(reader, entry("a", "a2"))
    assert fingerprints(Catalog(store, "sales"), fourth) == {
        key_path("a"): "a2",
        key_path("b"): "b1",
        key_path("c"): "c1",
    }
    # Once started, the chain may not be broken: a legacy-looking record after a sealed one is refused.
    sealed = CommitRecord.decode(record_path(tmp_path, fourth).read_bytes(), where="test")
    record_path(tmp_path, fourth).write_bytes(legacy_bytes(sealed))
    with pytest.raises(CatalogIntegrityError, match=f"version {fourth}"):
        Catalog(store, "sales").snapshot()
    assert Catalog(store, "sales").snapshot(third).version == third


def test_a_damaged_checkpoint_is_refused_and_one_without_its_digest_is_skipped(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    writer = Catalog(store, "sales", checkpoint_interval=2)
    for step in range(3):
        commit(writer, entry(f"r{step}", f"fp{step}"))
    checkpoint = tmp_path / "sales" / "_catalog" / "checkpoints" / f"{2:020d}.arrow"
    digest = checkpoint.with_name(checkpoint.name + ".sha256")
    assert checkpoint.exists()
    assert digest.exists()
    expected = fingerprints(Catalog(store, "sales"), 3)
    data = bytearray(checkpoint.read_bytes())
    data[len(data) // 2] ^= 0x01
    checkpoint.write_bytes(bytes(data))
    with pytest.raises(CatalogIntegrityError, match="checkpoint of version 2"):
        Catalog(store, "sales").snapshot()
    # A checkpoint written with digests but without its digest object (its writer stopped in between) is
    # not trusted: the version is rebuilt from the records instead.
    digest.unlink()
    assert fingerprints(Catalog(store, "sales"), 3) == expected


def test_a_commit_id_is_recognised_after_re_planning_from_a_base_that_holds_it(tmp_path: Path) -> None:
    """The retry of a commit whose response was lost plans again from the newest version, which already
    holds the first attempt: the commit id is found there, not published a second time."""
    store = LocalStore(tmp_path)
    writer = Catalog(store, "sales", checkpoint_interval=2)
    commit(writer, entry("a", "a1"))
    first = commit(writer, entry("a", "a2"), commit_id="write-1")
    commit(writer, entry("b", "b1"))
    commit(writer, entry("c", "c1"))  # a checkpoint after the first attempt: the id survives it
    retry = Catalog(store, "sales")
    head = retry.head_version()
    again = retry.commit(
        base_version=head, upserts=[entry("a", "a2")], partition_spec=SPEC, commit_id="write-1"
    )
    assert again == first
    assert retry.head_version() == head, "nothing published twice"


def test_the_recent_commit_ids_stay_bounded(tmp_path: Path) -> None:
    from airflow_partitions.catalog.state import remember_commit_ids

    records = [
        CommitRecord(
            version=v,
            committed_at=dt.datetime.now(dt.UTC),
            operation="append",
            replace_all=False,
            partition_spec=SPEC,
            commit_id=f"id-{v}",
            base_version=v - 1,
            summary={},
        )
        for v in range(1, RECENT_COMMIT_IDS + 11)
    ]
    known = remember_commit_ids({}, records)
    assert len(known) == RECENT_COMMIT_IDS
    assert "id-10" not in known
    assert known[f"id-{RECENT_COMMIT_IDS + 10}"] == RECENT_COMMIT_IDS + 10


def test_a_commit_refuses_files_that_are_gone(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    catalog = Catalog(store, "sales", check_files=True)
    present = entry("a", "a1")
    for file in present.files:
        path = tmp_path / "sales" / file.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    version = commit(catalog, present)
    gone = entry("b", "b1")
    with pytest.raises(CommitFilesMissingError) as caught:
        commit(catalog, gone)
    assert caught.value.missing == tuple(f.path for f in gone.files)
    assert gone.files[0].path in str(caught.value)
    assert "Nothing was published" in str(caught.value)
    assert catalog.head_version() == version
    # Files the base already references are not checked again (their partition keeps them).
    kept = present.with_files([*present.files])
    assert commit(catalog, kept) == version + 1


@pytest.mark.s3
def test_a_commit_refuses_files_missing_on_s3(
    tmp_path: Path, s3_server: dict[str, str], s3_bucket: str
) -> None:
    """Files on S3 (an `s3://` accelerator_dir): one HEAD per new file, run side by side."""
    import boto3

    from airflow_partitions.catalog import S3Store

    data_store = S3Store(boto3.client("s3", **s3_server), s3_bucket, "accelerations/sales")
    catalog = Catalog(LocalStore(tmp_path), "sales", data_root=None, data_store=data_store, check_files=True)
    catalog.data_root = None  # the partition files live on S3 only
    entries = [entry("a", "a1"), entry("b/=%'ü", "b1")]
    data_store.put(entries[0].files[0].path, b"x")
    with pytest.raises(CommitFilesMissingError) as caught:
        commit(catalog, *entries)
    assert caught.value.missing == (entries[1].files[0].path,)
    assert catalog.head_version() == 0
    data_store.put(entries[1].files[0].path, b"y")
    assert commit(catalog, *entries) == 1


# --- on real datasets: a refresh from Postgres, reads and writes through the package ---------------


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    from tests.writes_support import fresh_database

    with fresh_database() as url:
        yield url


@pytest.mark.postgres
def test_an_edited_id_maximum_fails_the_read_instead_of_dropping_its_row(pg_url: str, tmp_path: Path) -> None:
    from airflow_partitions.read import PartitionedDatasetReader
    from airflow_partitions.refresh.pipeline import refresh_dataset
    from tests.writes_support import Source, hostile_rows

    source = Source(pg_url, tmp_path)
    source.create(hostile_rows(61, range(1, 1001), regions=["EU", "US", None]))
    project = source.spec(["region"])
    refresh_dataset(project, "items")
    reader = PartitionedDatasetReader(project, "items")
    try:
        assert reader.read("id = 996").num_rows == 1
    finally:
        reader.close()
    log = sorted((tmp_path / "acc" / "items" / "_catalog" / "log").rglob("*.json"))[-1]
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    for line in lines[1:]:
        for file in line["u"]["files"]:
            low, high, nulls = file["stats"]["id"]
            if low <= 996 <= high:
                file["stats"]["id"] = [low, 990, nulls]  # the edit: the row with id 996 looks absent
    log.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    reader = PartitionedDatasetReader(project, "items")
    try:
        with pytest.raises(CatalogIntegrityError, match="'items': the commit record of version 1"):
            reader.read("id = 996")
    finally:
        reader.close()


@pytest.mark.postgres
def test_vacuum_with_no_grace_between_a_writes_files_and_its_commit_publishes_nothing(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`vacuum --grace 0s` runs after an append wrote its files and before it commits (the order forced
    by running the real CLI inside the commit call): the commit refuses, the head stays readable."""
    from airflow_partitions.cli.main import main
    from airflow_partitions.refresh.pipeline import refresh_dataset
    from airflow_partitions.write import commit as writes
    from tests.writes_support import Oracle, Source, assert_same_rows, hostile_rows, read_all

    source = Source(pg_url, tmp_path)
    source.create(hostile_rows(62, range(1, 201), regions=["EU", "a/b", None, "it's"]))
    project = source.spec(["region"])
    refresh_dataset(project, "items")
    oracle = Oracle(source.rows())
    real_commit = Catalog.commit
    vacuumed: list[int] = []

    def vacuum_then_commit(catalog: Catalog, **kwargs: Any) -> int:
        vacuumed.append(main(["vacuum", str(tmp_path / "spec.yaml"), "items", "--grace", "0s"]))
        return real_commit(catalog, **kwargs)

    monkeypatch.setattr(Catalog, "commit", vacuum_then_commit)
    appended = hostile_rows(63, range(500, 540), regions=["EU", "a/b", None, "it's"])
    with pytest.raises(CommitFilesMissingError, match="Nothing was published") as caught:
        writes.append(open_handle(project, project.dataset("items")), appended)
    assert vacuumed == [0]
    assert caught.value.missing
    monkeypatch.setattr(Catalog, "commit", real_commit)
    assert Catalog(LocalStore(tmp_path / "acc"), "items").head_version() == 1
    assert_same_rows(read_all(project), oracle.table(), "the head after the refused commit")
    writes.append(open_handle(project, project.dataset("items")), appended)
    oracle.append(appended)
    assert_same_rows(read_all(project), oracle.table(), "after writing again")
