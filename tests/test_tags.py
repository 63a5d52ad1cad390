"""Version tags: stored in the catalog with conditional writes, read by reader, hook and CLI, kept by
vacuum."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_catalog import commit, entry
from test_catalog_tables import PARTITION_BY, hostile_table
from test_pruning_support import Acceleration, build_acceleration

from airflow_partitions.catalog import Catalog, LocalStore, ObjectStore, PartitionEntry, S3Store
from airflow_partitions.cli.main import main
from airflow_partitions.exceptions import TagError, UnknownTagError, VersionNotFoundError
from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook
from airflow_partitions.keys import PartitionKey
from airflow_partitions.storage import get_storage


def test_tags_are_set_moved_listed_and_deleted(make_store: Callable[[], ObjectStore]) -> None:
    catalog = Catalog(make_store(), "sales")
    first = commit(catalog, entry("EU", "a"))
    second = commit(catalog, entry("US", "b"))
    assert catalog.tag("release").version == second, "the newest version by default"
    catalog.tag("release", first)
    catalog.tag("nightly.2026-01-02_b")
    tags = Catalog(make_store(), "sales").tags()  # a fresh catalog object reads them back from the store
    assert {name: info.version for name, info in tags.items()} == {
        "nightly.2026-01-02_b": second,
        "release": first,
    }
    assert tags["release"].commit_id == catalog.version_commit_id(first)
    catalog.delete_tag("release")
    with pytest.raises(UnknownTagError, match=r"nightly\.2026-01-02_b") as raised:
        catalog.tagged_version("release")
    assert raised.value.known == ("nightly.2026-01-02_b",), "the error lists the tags there are"
    catalog.tag("release", second)
    assert catalog.tagged_version("release") == second, "a deleted tag can be set again"


@pytest.mark.parametrize("name", ["", "has space", "a/b", "-lead", "x" * 129, "ünï"])
def test_bad_tag_names_are_refused(local_catalog: Catalog, name: str) -> None:
    commit(local_catalog, entry("EU", "a"))
    with pytest.raises(TagError, match="letters, digits"):
        local_catalog.tag(name)


def test_a_tag_names_only_a_retained_version(local_catalog: Catalog) -> None:
    with pytest.raises(VersionNotFoundError, match="no committed version"):
        local_catalog.tag("release")
    commit(local_catalog, entry("EU", "a"))
    with pytest.raises(VersionNotFoundError, match="does not exist"):
        local_catalog.tag("release", 5)
    with pytest.raises(UnknownTagError, match=r"no tag 'release' to delete; its tags are \(none\)"):
        local_catalog.delete_tag("release")


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


@pytest.fixture
def local_catalog(tmp_path: Path) -> Catalog:
    return Catalog(LocalStore(tmp_path), "sales")


def test_concurrent_tag_writes_all_land_one_after_the_other(make_store: Callable[[], ObjectStore]) -> None:
    catalog = Catalog(make_store(), "sales")
    versions = [commit(catalog, entry(f"R{i}", str(i))) for i in range(6)]
    barrier = threading.Barrier(len(versions))
    errors: list[BaseException] = []

    def move(version: int) -> None:
        try:
            barrier.wait()
            Catalog(make_store(), "sales").tag("release", version)
        except BaseException as err:  # collected and re-raised on the main thread
            errors.append(err)

    threads = [threading.Thread(target=move, args=(v,)) for v in versions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    store = make_store()
    records = sorted(info.key for info in store.list(f"{catalog.prefix}/tags/release/"))
    assert len(records) == len(versions), "every write got a position of its own; none overwrote another"
    last = json.loads(store.get(records[-1]) or b"{}")
    assert catalog.tagged_version("release") == last["version"], "the tag is its newest record"
    assert sorted(json.loads(store.get(key) or b"{}")["version"] for key in records) == versions


# --- reads and vacuum over a real acceleration -------------------------------------------------------


def replace_partition(acc: Acceleration, rows: pa.Table, key: PartitionKey) -> int:
    snapshot = acc.snapshot()
    spec = snapshot.partition_spec
    files = get_storage("parquet").write(rows, acc.root / acc.dataset, key.path(spec.names))
    return acc.catalog.commit(
        base_version=snapshot.version,
        upserts=[PartitionEntry.from_files(key, spec, files)],
        partition_spec=spec,
        operation="upsert",
    )


def sorted_rows(table: pa.Table) -> list[dict[str, object]]:
    return sorted(table.to_pylist(), key=lambda row: int(row["id"]))  # type: ignore[call-overload]


def test_vacuum_keeps_tagged_versions_readable_with_their_rows(tmp_path: Path) -> None:
    source = hostile_table()
    acc = build_acceleration(tmp_path, source, PARTITION_BY)
    acc.catalog.tag("release-1")
    key = PartitionKey(("Zürich", 0))
    key_path = key.path(acc.snapshot().partition_spec.names)
    tagged_files = {f.path for f in acc.snapshot().partitions[key_path].files}
    replaced_rows = acc.snapshot().partitions[key_path].rows
    between = replace_partition(acc, source.slice(0, 5), key)
    between_files = {f.path for f in acc.snapshot().partitions[key_path].files}
    replace_partition(acc, source.slice(5, 2), key)
    report = acc.catalog.vacuum(retain_versions=1, grace=dt.timedelta(0))
    assert between in report.removed_versions, "vacuum did expire versions"
    dataset_root = acc.root / acc.dataset
    assert all((dataset_root / path).exists() for path in tagged_files), "the tagged version's files stay"
    assert not any((dataset_root / path).exists() for path in between_files), "untagged old files go"
    with acc.reader() as reader:
        assert sorted_rows(reader.read(tag="release-1")) == sorted_rows(source), (
            "reading the tag returns every row of the source as it was when tagged"
        )
        with pytest.raises(VersionNotFoundError):
            reader.read(version=between)
        newest = reader.query("SELECT count(*) AS c FROM events").to_pylist()[0]["c"]
        tagged = reader.query("SELECT count(*) AS c FROM events", tag="release-1").to_pylist()[0]["c"]
        plan = reader.plan("place = 'Zürich'", tag="release-1")
    assert tagged == source.num_rows
    assert newest == source.num_rows - replaced_rows + 2, "the newest version has the replaced partition"
    assert plan.version == 1
    # A second vacuum leaves the tagged version alone too; once the tag is gone, so is the version.
    acc.catalog.vacuum(retain_versions=1, grace=dt.timedelta(0))
    with acc.reader() as reader:
        assert reader.read(tag="release-1").num_rows == source.num_rows
    acc.catalog.delete_tag("release-1")
    acc.catalog.vacuum(retain_versions=1, grace=dt.timedelta(0))
    assert not any((dataset_root / path).exists() for path in tagged_files), "untagged, its files go"
    with acc.reader() as reader, pytest.raises(VersionNotFoundError):
        reader.read(version=1)


def test_hook_and_cli_pin_a_tag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = hostile_table()
    acc = build_acceleration(tmp_path, source, PARTITION_BY)
    spec = str(acc.spec_path)
    assert main(["tag", spec, "events", "release", "--json"]) == 0
    tagged = json.loads(capsys.readouterr().out)
    assert (tagged["tag"], tagged["version"], tagged["deleted"]) == ("release", 1, False)
    replace_partition(acc, source.slice(0, 3), PartitionKey(("Zürich", 0)))
    hook = PartitionedDatasetHook(dataset="events", spec_path=spec, tag="release")
    assert sorted_rows(hook.read()) == sorted_rows(source), "the hook's tag pins every read"
    assert hook.query("SELECT count(*) AS c FROM events").to_pylist() == [{"c": source.num_rows}]
    assert hook.read(version=2).num_rows != source.num_rows, "an explicit version wins over the hook's tag"
    assert main(["query", spec, "SELECT count(*) AS c FROM events", "--tag", "release", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"c": source.num_rows}
    assert main(["tags", spec, "events", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(t["tag"], t["version"]) for t in listed["tags"]] == [("release", 1)]
    assert main(["query", spec, "SELECT 1 FROM events", "--tag", "nope"]) == 2
    assert "no tag 'nope'; its tags are release" in capsys.readouterr().err
    assert main(["tag", spec, "events", "release", "--delete"]) == 0
    assert "deleted" in capsys.readouterr().out
    with pytest.raises(UnknownTagError):
        PartitionedDatasetHook(dataset="events", spec_path=spec, tag="release").read()


# --- a tag written while a vacuum expires its version -----------------------------------------------
#
# Each interleaving runs the tag write (on a catalog object of its own, as another process would) at one
# point inside the vacuum, or the vacuum at one point inside the tag write. Whatever the order, the end
# state must be one of the two serial outcomes: the tag write failed and left no tag naming the version,
# or it succeeded and the tagged version is still readable with every row it had.


def _tag_vacuum_race(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    source = hostile_table()
    acc = build_acceleration(tmp_path, source, PARTITION_BY)
    tagged_version = acc.version
    key = PartitionKey(("Zürich", 0))
    replace_partition(acc, source.slice(0, 5), key)
    replace_partition(acc, source.slice(5, 2), key)
    writer = Catalog(LocalStore(acc.root), acc.dataset)  # the tag writer's own catalog object
    outcome: list[BaseException | None] = []

    def write_tag_now() -> None:
        try:
            writer.tag("release", tagged_version)
            outcome.append(None)
        except (VersionNotFoundError, TagError) as err:
            outcome.append(err)

    def vacuum_now() -> None:
        Catalog(LocalStore(acc.root), acc.dataset).vacuum(retain_versions=1, grace=dt.timedelta(0))

    if where == "vacuum decided, then tag, then vacuum deletes":
        original = Catalog._keep_tagged

        def decided_then_tag(self: Catalog, *args: object, **kwargs: object) -> object:
            kept = original(self, *args, **kwargs)  # type: ignore[arg-type]
            if not outcome:
                write_tag_now()
            return kept

        monkeypatch.setattr(Catalog, "_keep_tagged", decided_then_tag)
        vacuum_now()
    elif where == "tag checked the version, then a whole vacuum, then tag writes":
        checked = writer.snapshot

        def check_then_vacuum(version: int | None = None) -> object:
            snapshot = checked(version)
            vacuum_now()
            return snapshot

        monkeypatch.setattr(writer, "snapshot", check_then_vacuum)
        write_tag_now()
    elif where == "vacuum started, then tag, then vacuum reads tags":
        import airflow_partitions.catalog.catalog as catalog_module

        monkeypatch.setattr("airflow_partitions.catalog.tags._UNDECIDED_WAIT_S", 0.2)
        original_list = catalog_module.list_tags

        def tag_then_list(catalog: Catalog) -> object:
            if not outcome:
                write_tag_now()
            return original_list(catalog)

        monkeypatch.setattr(catalog_module, "list_tags", tag_then_list)
        vacuum_now()
    else:
        raise AssertionError(where)
    monkeypatch.undo()
    assert len(outcome) == 1, "the tag write ran once, inside the vacuum"
    tags = Catalog(LocalStore(acc.root), acc.dataset).tags()
    if outcome[0] is not None:
        assert "release" not in tags, f"a refused tag write leaves no tag behind: {outcome[0]}"
        assert "vacuum" in str(outcome[0]) or "vacuumed" in str(outcome[0]), "the error says why"
        return
    assert tags["release"].version == tagged_version
    with acc.reader() as reader:
        assert sorted_rows(reader.read(tag="release")) == sorted_rows(source), (
            "a tag that was written keeps its version readable, with every row it had"
        )
    # And the next vacuum keeps it too.
    vacuum_now()
    with acc.reader() as reader:
        assert reader.read(tag="release").num_rows == source.num_rows


@pytest.mark.parametrize(
    "where",
    [
        "vacuum decided, then tag, then vacuum deletes",
        "tag checked the version, then a whole vacuum, then tag writes",
        "vacuum started, then tag, then vacuum reads tags",
    ],
)
def test_a_tag_written_during_vacuum_is_kept_or_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    _tag_vacuum_race(tmp_path, monkeypatch, where)


def test_tags_and_vacuums_racing_leave_every_tag_readable(tmp_path: Path) -> None:
    """Threads commit, vacuum (keeping one version) and tag recent versions at once, each on a catalog
    object of its own; every tag write that succeeded while its version was retained leaves the version
    readable, and at the end every tag names a readable version with its commit id."""
    root = tmp_path
    seed_catalog = Catalog(LocalStore(root), "sales")
    commit(seed_catalog, entry("EU", "0"))
    stop = threading.Event()
    errors: list[BaseException] = []
    written: list[tuple[str, int]] = []

    def committer() -> None:
        catalog = Catalog(LocalStore(root), "sales")
        for i in range(40):
            commit(catalog, entry(f"R{i % 5}", str(i)))
        stop.set()

    def vacuumer() -> None:
        while not stop.is_set():
            Catalog(LocalStore(root), "sales").vacuum(retain_versions=1, grace=dt.timedelta(0))

    def tagger(name: str) -> None:
        catalog = Catalog(LocalStore(root), "sales")
        while not stop.is_set():
            version = max(1, catalog.head_version() - 1)
            try:
                catalog.tag(name, version)
            except VersionNotFoundError:
                continue
            written.append((name, version))
            # Written and not moved since (this thread is the tag's only writer): readable now.
            Catalog(LocalStore(root), "sales").snapshot(version)

    def run(target: Callable[..., None], *args: str) -> None:
        try:
            target(*args)
        except BaseException as err:  # collected and re-raised on the main thread
            errors.append(err)
            stop.set()

    threads = [
        threading.Thread(target=run, args=(committer,)),
        threading.Thread(target=run, args=(vacuumer,)),
        threading.Thread(target=run, args=(tagger, "a")),
        threading.Thread(target=run, args=(tagger, "b")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert written, "some tag writes landed"
    fresh = Catalog(LocalStore(root), "sales")
    fresh.vacuum(retain_versions=1, grace=dt.timedelta(0))
    for info in fresh.tags().values():
        assert fresh.snapshot(info.version).version == info.version
        assert fresh.tagged_version(info.name) == info.version
    assert not list(LocalStore(root).list(f"{fresh.prefix}/vacuuming/")), "every vacuum removed its marker"


def test_a_reader_whose_checkpoint_listing_a_vacuum_outran_reads_the_version(tmp_path: Path) -> None:
    """A reader lists the checkpoints, then a vacuum writes a checkpoint at the version and expires the
    records the listed checkpoints needed (in that order: the checkpoint first). The version is retained
    the whole time, so the reader must still read it (it lists again), not call it vacuumed.

    Found by `test_tags_and_vacuums_racing_leave_every_tag_readable` once the suite stopped fsyncing:
    the vacuum then ran between the reader's listing and its record reads."""
    catalog = Catalog(LocalStore(tmp_path), "sales")
    for i in range(6):
        commit(catalog, entry(f"R{i % 3}", str(i)))
    reader = Catalog(LocalStore(tmp_path), "sales")
    real_list = reader.store.list
    vacuumed: list[bool] = []

    def list_then_vacuum(prefix: str, start_after: str | None = None) -> Any:
        listed = list(real_list(prefix, start_after))
        if prefix.endswith("/checkpoints/") and not vacuumed:
            vacuumed.append(True)
            # Keeps only the newest version 6, writing its checkpoint before expiring 1..5.
            Catalog(LocalStore(tmp_path), "sales").vacuum(retain_versions=1, grace=dt.timedelta(0))
        return iter(listed)

    reader.store.list = list_then_vacuum  # type: ignore[method-assign]
    assert reader.snapshot(6).version == 6
    assert vacuumed, "the vacuum ran between the listing and the reads"
    assert {e.key for e in reader.snapshot(6).partitions.values()} == {
        e.key for e in catalog.snapshot(6).partitions.values()
    }
