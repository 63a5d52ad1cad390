"""Concurrent commits from 8 processes x 25 commits, on the local store and on the moto S3 server.

Each process commits its own partition and, every fourth commit, one of three partitions all processes
share, after a short pause between reading the base version and committing (to make races likely).
Afterwards: every successful commit is exactly one version (none lost, none doubled), every committed
partition version is present in the version it was committed as, and no commit touching a shared
partition was accepted on top of a concurrent change to it (conflicts detected, never lost).
Workers are separate processes started from a forkserver that preloads the heavy imports once.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_partitions.catalog import (
    Catalog,
    LocalStore,
    ObjectStore,
    PartitionEntry,
    PartitionSpecInfo,
    S3Store,
)
from airflow_partitions.exceptions import CommitConflictError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.storage import DataFile

PROCESSES = 8
COMMITS = 25
SHARED_EVERY = 4
SHARED_PARTITIONS = 3
SPEC = PartitionSpecInfo.from_fields([("owner", "owner", "string")])


@pytest.fixture(autouse=True)
def quiet_request_log() -> Iterator[None]:
    """moto's server logs every request; thousands of captured lines only slow the run down."""
    logger = logging.getLogger("werkzeug")
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield
    logger.setLevel(level)


def open_store(location: dict[str, Any]) -> ObjectStore:
    if location["kind"] == "local":
        return LocalStore(Path(location["root"]))
    import boto3

    return S3Store(boto3.client("s3", **location["settings"]), location["bucket"], "catalogs")


def partition(owner: str, fingerprint: str) -> PartitionEntry:
    key = PartitionKey((owner,))
    data_file = DataFile(
        path=f"{key.path(SPEC.names)}/part-{uuid.uuid4().hex}-0000.parquet",
        format="parquet",
        rows=1,
        bytes=1,
        checksum="0" * 64,
    )
    return PartitionEntry.from_files(key, SPEC, [data_file], source_fingerprint=fingerprint)


def worker(location: dict[str, Any], process: int, barrier: Any, output: str) -> None:
    """Commit COMMITS times; record (version, partition, fingerprint, base) of each success."""
    catalog = Catalog(open_store(location), "events")
    rng = random.Random(process)
    successes: list[list[Any]] = []
    conflicts = 0
    barrier.wait()
    for index in range(COMMITS):
        shared = index % SHARED_EVERY == 0
        owner = f"shared{rng.randrange(SHARED_PARTITIONS)}" if shared else f"p{process}"
        fingerprint = f"p{process}-{index}"
        while True:
            base = catalog.latest()
            base_version = base.version if base is not None else None
            if shared:
                time.sleep(rng.uniform(0.0, 0.01))  # widen the race window on the contended partitions
            try:
                version = catalog.commit(
                    base_version=base_version, upserts=[partition(owner, fingerprint)], partition_spec=SPEC
                )
            except CommitConflictError as err:
                if not shared or err.partitions != (PartitionKey((owner,)).path(SPEC.names),):
                    raise AssertionError(f"unexpected conflict on {owner}: {err}") from err
                conflicts += 1
                continue
            successes.append([version, owner, fingerprint, base_version or 0])
            break
    Path(output).write_text(json.dumps({"successes": successes, "conflicts": conflicts}))


def run_workers(location: dict[str, Any], tmp_path: Path) -> tuple[list[list[Any]], int]:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["pyarrow", "pyarrow.compute", "pandas", "boto3", "pytest", __name__])
    barrier = context.Barrier(PROCESSES)
    outputs = [tmp_path / f"worker-{i}.json" for i in range(PROCESSES)]
    processes = [
        context.Process(target=worker, args=(location, i, barrier, str(outputs[i]))) for i in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0, f"worker exited with {process.exitcode}"
    successes: list[list[Any]] = []
    conflicts = 0
    for output in outputs:
        data = json.loads(output.read_text())
        successes += data["successes"]
        conflicts += data["conflicts"]
    return successes, conflicts


def check_history(store: ObjectStore, successes: list[list[Any]], conflicts: int) -> None:
    catalog = Catalog(store, "events")
    head = catalog.head_version()
    versions = sorted(s[0] for s in successes)
    assert len(successes) == PROCESSES * COMMITS
    assert versions == list(range(1, head + 1)), "each successful commit is exactly one version, none lost"
    touched_by = {version: owner for version, owner, _fp, _base in successes}
    for version, owner, fingerprint, _base in successes:
        entry = catalog.snapshot(version).partitions[PartitionKey((owner,)).path(SPEC.names)]
        assert entry.source_fingerprint == fingerprint, f"version {version} lost {owner}={fingerprint}"
    for version, owner, _fingerprint, base in successes:
        if owner.startswith("shared"):
            between = [v for v in range(base + 1, version) if touched_by[v] == owner]
            assert not between, f"v{version} (base {base}) accepted over concurrent {owner} commits {between}"
    latest = catalog.snapshot(head)
    for process in range(PROCESSES):
        last_own = max((s for s in successes if s[1] == f"p{process}"), key=lambda s: s[0])
        assert (
            latest.partitions[PartitionKey((f"p{process}",)).path(SPEC.names)].source_fingerprint
            == last_own[2]
        )
    shared_owners = sorted({s[1] for s in successes if s[1].startswith("shared")})
    for owner in shared_owners:
        last = max((s for s in successes if s[1] == owner), key=lambda s: s[0])
        assert latest.partitions[PartitionKey((owner,)).path(SPEC.names)].source_fingerprint == last[2]
    assert latest.partition_count == PROCESSES + len(shared_owners)
    assert conflicts > 0, "the shared partitions were contended: some commits must have been refused"


@pytest.mark.slow
def test_concurrent_commits_on_the_local_store(tmp_path: Path) -> None:
    location = {"kind": "local", "root": str(tmp_path / "store")}
    successes, conflicts = run_workers(location, tmp_path)
    check_history(open_store(location), successes, conflicts)


@pytest.mark.s3
@pytest.mark.slow
def test_concurrent_commits_on_s3(tmp_path: Path, s3_server: dict[str, str], s3_bucket: str) -> None:
    location = {"kind": "s3", "settings": s3_server, "bucket": s3_bucket}
    successes, conflicts = run_workers(location, tmp_path)
    check_history(open_store(location), successes, conflicts)
