"""Crash safety: a writer SIGKILLed at a random point of a write, publish, commit or checkpoint.

A child process loops: write a partition file, publish it (duckdb tables mode), open the newest version,
commit (every third commit also writes a checkpoint). The parent kills it at a random moment, then checks
that the newest version opens, every version is readable, every file the newest version references is
present with its checksum and row count, and that the next run succeeds. Children start from a forkserver
with the heavy modules preloaded, so each kill costs milliseconds of start-up, not seconds.

Two more: a vacuum that rewrites the shared DuckDB file, killed beside a publisher while a reader reads;
and the real `airflow-partitions refresh` (Spark stage, finalize, commit) killed at random points while
a reader polls, after which the next run and vacuum leave nothing behind.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import multiprocessing
import os
import random
import signal
import time
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
from airflow_partitions.keys import PartitionKey
from airflow_partitions.storage import PartitionStorage, get_storage

SPEC = PartitionSpecInfo.from_fields([("region", "region", "string")])
KILLS = 6


def open_store(config: dict[str, Any]) -> ObjectStore:
    if config["store"] == "local":
        return LocalStore(Path(config["root"]))
    import boto3

    return S3Store(boto3.client("s3", **config["settings"]), config["bucket"], "crash")


def open_catalog(config: dict[str, Any]) -> tuple[Catalog, PartitionStorage, Path]:
    storage = get_storage(config["engine"], config["mode"])
    data_root = Path(config["root"]) / "data"
    catalog = Catalog(
        open_store(config), "crashy", data_root=data_root, storage=storage, checkpoint_interval=3
    )
    return catalog, storage, data_root


def refresh_once(catalog: Catalog, storage: PartitionStorage, data_root: Path, rng: random.Random) -> int:
    region = f"r{rng.randrange(5)}"
    key = PartitionKey((region,))
    rows = rng.randrange(1, 3000)
    files = storage.write(pa.table({"v": pa.array(range(rows), pa.int64())}), data_root, key.path(SPEC.names))
    files = storage.publish(data_root, files)
    base = catalog.latest()
    removes = []
    if base is not None and rng.random() < 0.15:
        removes = [k for k in base.partitions if k != key.path(SPEC.names)][:1]
    return catalog.commit(
        base_version=base.version if base is not None else None,
        upserts=[PartitionEntry.from_files(key, SPEC, files, source_fingerprint=str(rows))],
        removes=removes,
        partition_spec=SPEC,
    )


def crash_worker(config: dict[str, Any], ready: Any, seed: int) -> None:
    catalog, storage, data_root = open_catalog(config)
    rng = random.Random(seed)
    ready.set()
    while True:
        refresh_once(catalog, storage, data_root, rng)


def check_intact(config: dict[str, Any]) -> int:
    """Assert the catalog and its files are whole; returns the newest version."""
    catalog, storage, data_root = open_catalog(config)
    latest = catalog.latest()
    if latest is None:
        return 0
    retained = [info.version for info in catalog.versions()]
    assert retained == list(range(retained[0], latest.version + 1)), "retained versions have no gaps"
    for version in retained:
        catalog.snapshot(version)  # every retained version opens
    for entry in latest.partitions.values():
        for file in entry.files:
            on_disk = data_root / file.path
            digest = hashlib.sha256(on_disk.read_bytes()).hexdigest()
            assert digest == file.checksum, f"{file.path} changed after it was committed"
        table = storage.read(data_root, entry.files)
        assert table.num_rows == entry.rows == int(entry.source_fingerprint or -1)
    return latest.version


CASES = [
    pytest.param("local", "parquet", "files", id="local-parquet"),
    pytest.param("local", "duckdb", "tables", id="local-duckdb-tables"),
    pytest.param("s3", "arrow", "files", id="s3-arrow", marks=pytest.mark.s3),
]


@pytest.mark.parametrize(("store", "engine", "mode"), CASES)
def test_sigkill_at_random_points_leaves_the_last_version_intact(
    request: pytest.FixtureRequest, tmp_path: Path, store: str, engine: str, mode: str
) -> None:
    config: dict[str, Any] = {"store": store, "engine": engine, "mode": mode, "root": str(tmp_path)}
    if store == "s3":
        config["settings"] = request.getfixturevalue("s3_server")
        config["bucket"] = request.getfixturevalue("s3_bucket")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(
        [
            "pytest",
            "pyarrow",
            "pyarrow.compute",
            "duckdb",
            "boto3",
            "pandas",
            "airflow_partitions.storage.parquet",
            "airflow_partitions.storage.arrow_ipc",
            "airflow_partitions.storage.duckdb_engine",
            __name__,
        ]
    )
    rng = random.Random(1234)
    versions = [0]
    for kill in range(KILLS):
        ready = context.Event()
        child = context.Process(target=crash_worker, args=(config, ready, kill))
        child.start()
        assert ready.wait(timeout=60), "the writer did not start"
        time.sleep(rng.uniform(0.02, 0.5))
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=30)
        assert child.exitcode == -signal.SIGKILL, "the writer must die mid-run, not finish"
        versions.append(check_intact(config))
    assert versions == sorted(versions), "versions only ever move forward"
    assert versions[-1] > 0, "the writers made progress between kills"

    catalog, storage, data_root = open_catalog(config)
    next_version = refresh_once(catalog, storage, data_root, random.Random(99))
    assert next_version == versions[-1] + 1, "the next run commits on top of the last intact version"
    report = catalog.vacuum(retain_versions=1, grace=dt.timedelta(0))
    leftovers = [f.path for f in report.removed_files if ".tmp-" in f.path]
    assert check_intact(config) == next_version
    if store == "local" and engine == "parquet":
        remaining = [p.name for p in data_root.rglob(".tmp-*")]
        assert remaining == [], f"vacuum must clear crashed writes' temporaries (removed {leftovers})"


def compacting_vacuum_worker(config: dict[str, Any], ready: Any, seed: int, compactions: Any) -> None:
    """Vacuum in a loop, rewriting the shared DuckDB file every time (whatever its free share)."""
    from airflow_partitions.storage import duckdb_engine

    duckdb_engine.COMPACT_FREE_SHARE = 0.0
    catalog, _storage, _data_root = open_catalog(config)
    rng = random.Random(seed)
    ready.set()
    while True:
        # A grace of an hour: nothing is dropped, only the file is rewritten under the writer's feet.
        report = catalog.vacuum(retain_versions=1)
        assert [c.compacted for c in report.shared_files] == [True], "the shared file is rewritten"
        with compactions.get_lock():
            compactions.value += 1
        time.sleep(rng.uniform(0.2, 0.5))


def test_compacting_vacuum_killed_beside_a_publisher_and_a_reader_loses_nothing(tmp_path: Path) -> None:
    config: dict[str, Any] = {"store": "local", "engine": "duckdb", "mode": "tables", "root": str(tmp_path)}
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(
        ["pytest", "pyarrow", "duckdb", "airflow_partitions.storage.duckdb_engine", __name__]
    )
    catalog, storage, data_root = open_catalog(config)
    refresh_once(catalog, storage, data_root, random.Random(7))
    rng = random.Random(4321)
    versions = [check_intact(config)]
    reads = 0
    compactions = context.Value("i", 0)
    for kill in range(KILLS):
        ready_writer, ready_vacuum = context.Event(), context.Event()
        writer = context.Process(target=crash_worker, args=(config, ready_writer, 100 + kill))
        vacuum = context.Process(
            target=compacting_vacuum_worker, args=(config, ready_vacuum, kill, compactions)
        )
        writer.start()
        vacuum.start()
        assert ready_writer.wait(timeout=60), "the writer did not start"
        assert ready_vacuum.wait(timeout=60), "the vacuum did not start"
        # Read the newest version all along: always whole, through every swap of the shared file. Kill
        # at a random moment once both children made progress (a commit and a compaction this round).
        start_version, start_compactions = versions[-1], compactions.value
        extra = rng.uniform(0.0, 1.0)
        progressed_at: float | None = None
        while progressed_at is None or time.monotonic() < progressed_at + extra:
            latest = Catalog(open_store(config), "crashy", data_root=data_root, storage=storage).latest()
            assert latest is not None
            for entry in latest.partitions.values():
                assert storage.read(data_root, entry.files).num_rows == entry.rows
            reads += 1
            if (
                progressed_at is None
                and latest.version > start_version
                and compactions.value > start_compactions
            ):
                progressed_at = time.monotonic()
            assert writer.is_alive(), "the writer must not fail beside the compacting vacuum"
            assert vacuum.is_alive(), "the vacuum must not fail beside the publisher"
            time.sleep(0.05)
        for child in rng.sample([writer, vacuum], 2):
            assert child.pid is not None
            os.kill(child.pid, signal.SIGKILL)
            child.join(timeout=30)
            assert child.exitcode == -signal.SIGKILL, "each child dies mid-run"
        versions.append(check_intact(config))
    assert versions == sorted(versions), "versions only ever move forward"
    assert versions[-1] > versions[0], "the writer made progress beside the vacuum"
    assert reads > 0

    catalog, storage, data_root = open_catalog(config)
    next_version = refresh_once(catalog, storage, data_root, random.Random(99))
    assert next_version == versions[-1] + 1
    catalog.vacuum(retain_versions=1)
    assert check_intact(config) == next_version
    assert sorted(p.name for p in data_root.glob("*_tables*")) == ["_tables.duckdb"], (
        "a killed compaction's new file is removed by the next vacuum"
    )


# --- the real CLI refresh, killed at random points --------------------------------------------------

CITIES = ["Zürich", "a/b", "k=v", "100%", 'say "hi"', "it's", "", "∅"]
CLI_KILLS = 3


def _write_orders(directory: Path, batch: int, rows: int) -> None:
    import pyarrow.csv as pacsv

    first = batch * 100_000
    table = pa.table(
        {
            "id": pa.array(range(first, first + rows), pa.int64()),
            "city": pa.array([CITIES[i % len(CITIES)] for i in range(rows)], pa.string()),
        }
    )
    pacsv.write_csv(table, directory / f"orders-{batch:03d}.csv")


def _source_rows(directory: Path) -> list[tuple[int, str]]:
    import pyarrow.csv as pacsv

    rows: list[tuple[int, str]] = []
    for path in sorted(directory.glob("*.csv")):
        table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(strings_can_be_null=False))
        rows.extend(zip(table["id"].to_pylist(), table["city"].to_pylist(), strict=True))
    return sorted(rows)


def _read_newest(spec_path: Path) -> tuple[int, list[tuple[int, str]]]:
    """The newest version and every row of it, read through its files."""
    from airflow_partitions.catalog import open_catalog as open_dataset_catalog
    from airflow_partitions.spec import load_spec

    project = load_spec(spec_path)
    dataset = project.dataset("orders")
    catalog = open_dataset_catalog(project, dataset)
    snapshot = catalog.latest()
    if snapshot is None:
        return 0, []
    assert catalog.data_root is not None
    files = [f for entry in snapshot.partitions.values() for f in entry.files]
    table = get_storage(dataset.acceleration).read(catalog.data_root, files)
    rows = zip(table["id"].to_pylist(), [c or "" for c in table["city"].to_pylist()], strict=True)
    return snapshot.version, sorted(rows)


def _cli_refresh(spec_path: Path) -> Any:
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "airflow_partitions.cli.main", "refresh", str(spec_path), "orders"],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # the run and its Spark JVM die together
    )


def _age_tree(directory: Path, seconds: float) -> None:
    stamp = time.time() - seconds
    for folder, dirs, names in os.walk(directory, topdown=False):
        for name in [*names, *dirs]:
            os.utime(os.path.join(folder, name), (stamp, stamp), follow_symlinks=False)


@pytest.mark.spark
@pytest.mark.slow
def test_cli_refresh_killed_at_random_points_keeps_the_previous_version_and_the_next_run_cleans_up(
    tmp_path: Path, spark: Any
) -> None:
    from airflow_partitions.cli.main import main

    source = tmp_path / "src"
    source.mkdir()
    _write_orders(source, 0, 3000)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(
        f"""accelerator_dir: {tmp_path / "acc"}
datasets:
  - name: orders
    from: file:{source}
    params: {{file_format: csv}}
    acceleration:
      engine: parquet
      partition_by:
        - b: "bucket(16, id)"
"""
    )
    started = time.monotonic()
    first = _cli_refresh(spec_path)
    assert first.wait(timeout=600) == 0, first.stderr.read() if first.stderr else ""
    duration = time.monotonic() - started
    expected = {1: _source_rows(source)}
    assert _read_newest(spec_path) == (1, expected[1])

    rng = random.Random(2026)
    for batch in range(1, CLI_KILLS + 1):
        _write_orders(source, batch, 2000 + batch)
        now_rows = _source_rows(source)
        before, _rows = _read_newest(spec_path)
        run = _cli_refresh(spec_path)
        kill_at = time.monotonic() + rng.uniform(0.3, 1.0) * duration
        polls = 0
        # A reader polls all along: always a whole version, the previous one or the new one.
        while time.monotonic() < kill_at and run.poll() is None:
            version, rows = _read_newest(spec_path)
            assert version in (before, before + 1)
            assert rows == (expected[before] if version == before else now_rows), f"version {version}"
            polls += 1
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=60)
        version, rows = _read_newest(spec_path)
        assert version in (before, before + 1), "a killed run commits at most its own version"
        expected[version] = rows
        assert rows == (expected[before] if version == before else now_rows), "the version read is whole"
        assert polls > 0

    # Time passes beyond the grace: the next run sweeps what the killed runs left in the staging root.
    staging = tmp_path / "acc" / "_staging" / "orders"
    _age_tree(staging, 2 * 3600)
    # Nothing is killed any more: the next run is the same command in this process, on the session's
    # Spark (a process of its own would only add a JVM start).
    assert main(["refresh", str(spec_path), "orders"]) == 0
    version, rows = _read_newest(spec_path)
    assert rows == _source_rows(source), "the next run publishes the whole source"
    assert sorted(p.name for p in staging.iterdir()) == [], "no stage is left in the staging root"
    # What the killed finalize tasks wrote and no version references goes with vacuum's grace.
    assert main(["vacuum", str(spec_path), "orders", "--retain-versions", "1", "--grace", "0s"]) == 0
    assert _read_newest(spec_path) == (version, rows)
    data_root = tmp_path / "acc" / "orders"
    from airflow_partitions.catalog import open_catalog as open_dataset_catalog
    from airflow_partitions.spec import load_spec

    project = load_spec(spec_path)
    snapshot = open_dataset_catalog(project, project.dataset("orders")).latest()
    assert snapshot is not None
    referenced = {f.path for entry in snapshot.partitions.values() for f in entry.files}
    from airflow_partitions.sources.file_facts import STATE_FILE

    on_disk = {
        p.relative_to(data_root).as_posix()
        for p in data_root.rglob("*")
        if p.is_file() and not p.relative_to(data_root).as_posix().startswith("_catalog")
    }
    # The source's per-file facts are state of the dataset (the next plan reads them), not an orphan.
    assert STATE_FILE in on_disk, "the refresh kept what it learnt of the source files"
    assert on_disk - {STATE_FILE} == referenced, "no orphan file or temporary is left"
