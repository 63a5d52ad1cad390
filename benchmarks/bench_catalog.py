"""Catalog scale: open the newest version and commit one partition at 100,000 partitions, local and S3.

    python -m benchmarks.bench_catalog                  # 100,000 partitions, local store + moto S3 server
    python -m benchmarks.bench_catalog --quick          # 10,000 partitions
    python -m benchmarks.bench_catalog --partitions 50000 --no-s3

Targets (issue "Catalog and partition storage"): open the newest version for planning <= 100 ms, commit a
change to one partition <= 500 ms, at 100,000 partitions. Every partition has one data file with
statistics on 6 columns, as a refresh writes them.

Measured, per store:
* `open (cold)`: a new `Catalog` object (as in a fresh Airflow task) calls `latest()`: hint + log listing +
  checkpoint + the commit records after it. The OS page cache is warm, as on a busy worker.
* `open (checkpoint cached on host)` (S3 only): the same with `cache_dir`, where an earlier process on the
  host left the immutable checkpoint; only the hint, the listing and the newest records are fetched.
* `open (first in a process: checkpoint hashed)`: the same, with the checkpoint's SHA-256 checked against
  its digest object as the first open in a process does (later opens of the same file skip it).
* `open + key lookup`: the same, then one partition entry decoded (what a point read needs).
* `open + all keys`: the same, then every partition key decoded (what a partition-pruning planner needs).
* `commit 1 partition (cold)`: a new `Catalog` opens the newest version and commits one partition.
* `commit 1 partition (warm)`: consecutive commits from one `Catalog`, every tenth one also writing a
  checkpoint of the full table (p50 and max shown; the max is the checkpointing commit).

Anchor, in the same run: the manifest as one JSON document (what a catalog that rewrites its manifest on
every commit does): `anchor open` parses it, `anchor commit` re-serialises and writes it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_partitions.catalog import (
    Catalog,
    LocalStore,
    ObjectStore,
    PartitionEntry,
    PartitionSpecInfo,
    S3Store,
)
from airflow_partitions.catalog import catalog as catalog_module
from airflow_partitions.keys import PartitionKey
from airflow_partitions.storage.datafile import ColumnStats, DataFile
from benchmarks import load
from benchmarks.support import moto_server

OPEN_TARGET_MS = 100.0
COMMIT_TARGET_MS = 500.0
SPEC = PartitionSpecInfo.from_fields([("bucket", "bucket[100000](customer_id)", "int")])


def make_entry(index: int, generation: int = 0) -> PartitionEntry:
    """A partition as a refresh would describe it: one parquet file, stats on 6 columns."""
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    key = PartitionKey((index,))
    data_file = DataFile(
        path=f"bucket={index}/part-{uuid.uuid4().hex}-0000.parquet",
        format="parquet",
        rows=1000 + index % 97,
        bytes=65_536 + index,
        checksum=uuid.uuid4().hex + uuid.uuid4().hex,
        stats={
            "customer_id": ColumnStats(index * 10, index * 10 + 9, 0),
            "amount": ColumnStats(0.5, 999.25 + generation, 3),
            "region": ColumnStats("eu-central", "us-west", 0),
            "event_time": ColumnStats(base, base + dt.timedelta(days=30, seconds=index), 0),
            "event_day": ColumnStats(dt.date(2026, 1, 1), dt.date(2026, 1, 31), 0),
            "is_test": ColumnStats(False, True, 12),
        },
    )
    return PartitionEntry.from_files(
        key, SPEC, [data_file], source_fingerprint=f"fp-{index}-{generation}", refreshed_at=base
    )


def timed(action: Callable[[], Any], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def report(name: str, samples: list[float], target: float | None, anchor: float | None) -> None:
    median = statistics.median(samples)
    parts = [f"{name:<34} p50 {median:9.1f} ms   max {max(samples):9.1f} ms"]
    if target is not None:
        parts.append(f"target {target:5.0f} ms -> {median / target:5.2f}x of target")
    if anchor is not None:
        parts.append(f"anchor/ours {anchor / median:6.1f}x")
    print("   ".join(parts))


def bench_store(label: str, make_store: Callable[[], ObjectStore], partitions: int, commits: int) -> None:
    print(f"\n== {label}: {partitions:,} partitions ==")
    store = make_store()
    dataset = f"bench_{uuid.uuid4().hex[:8]}"
    entries = [make_entry(i) for i in range(partitions)]

    start = time.perf_counter()
    writer = Catalog(store, dataset)
    writer.commit(base_version=None, upserts=entries, partition_spec=SPEC, replace_all=True, operation="load")
    print(f"{'initial commit (all partitions)':<34} {(time.perf_counter() - start) * 1000:9.1f} ms (setup)")

    # Anchor: the same manifest as one JSON document, rewritten on every commit.
    manifest_key = f"{dataset}/anchor_manifest.json"
    manifest_entries = [e.to_json() for e in entries]

    def anchor_commit() -> None:
        manifest_entries[7] = make_entry(7, generation=int(time.time())).to_json()
        manifest = {"version": 1, "partitions": manifest_entries}
        store.put(manifest_key, json.dumps(manifest, separators=(",", ":")).encode())

    anchor_commit_samples = timed(anchor_commit, 3)

    def anchor_open() -> None:
        data = store.get(manifest_key)
        assert data is not None
        json.loads(data)

    anchor_open_samples = timed(anchor_open, 3)
    anchor_open_ms = statistics.median(anchor_open_samples)
    anchor_commit_ms = statistics.median(anchor_commit_samples)

    # The harness's own objects (100,000 entries, the anchor manifest) must not make the measured code pay
    # for full garbage collections of them.
    del entries
    gc.collect()
    gc.freeze()

    # A few commits so the newest version is a checkpoint plus some records, as in steady state.
    for generation in range(1, 5):
        newest = writer.latest()
        assert newest is not None
        writer.commit(
            base_version=newest.version,
            upserts=[make_entry(generation * 13, generation)],
            partition_spec=SPEC,
        )

    def open_cold() -> Any:
        snapshot = Catalog(store, dataset).latest()
        assert snapshot is not None
        assert snapshot.partition_count == partitions
        return snapshot

    def open_and_lookup() -> None:
        snapshot = open_cold()
        entry = snapshot.partitions[PartitionKey((partitions // 2,)).path(SPEC.names)]
        assert entry.files[0].stats["customer_id"].min == partitions // 2 * 10

    def open_and_keys() -> None:
        assert len(open_cold().keys()) == partitions

    report("open (cold)", timed(open_cold, 5), OPEN_TARGET_MS, anchor_open_ms)

    def open_first_in_process() -> None:
        # A local checkpoint's digest is checked once per process: forget that, as a new task would.
        catalog_module._verified_checkpoints.clear()
        open_cold()

    report(
        "open (first in a process: checkpoint hashed)",
        timed(open_first_in_process, 5),
        OPEN_TARGET_MS,
        anchor_open_ms,
    )
    if isinstance(store, S3Store):
        with tempfile.TemporaryDirectory(prefix="bench-catalog-cache-") as cache:

            def open_cached() -> None:
                snapshot = Catalog(store, dataset, cache_dir=Path(cache)).latest()
                assert snapshot is not None
                assert snapshot.partition_count == partitions

            open_cached()  # the first open downloads the checkpoint into the cache
            report("open (checkpoint cached on host)", timed(open_cached, 5), OPEN_TARGET_MS, anchor_open_ms)
    report("open + key lookup", timed(open_and_lookup, 5), OPEN_TARGET_MS, anchor_open_ms)
    report("open + all keys", timed(open_and_keys, 5), None, anchor_open_ms)

    generation = 100

    def commit_cold() -> None:
        nonlocal generation
        generation += 1
        catalog = Catalog(store, dataset)
        newest = catalog.latest()
        assert newest is not None
        catalog.commit(
            base_version=newest.version,
            upserts=[make_entry(generation % partitions, generation)],
            partition_spec=SPEC,
        )

    report("commit 1 partition (cold)", timed(commit_cold, 5), COMMIT_TARGET_MS, anchor_commit_ms)

    warm = Catalog(store, dataset)

    def commit_warm() -> None:
        nonlocal generation
        generation += 1
        newest = warm.latest()
        assert newest is not None
        warm.commit(
            base_version=newest.version,
            upserts=[make_entry(generation % partitions, generation)],
            partition_spec=SPEC,
        )

    report("commit 1 partition (warm)", timed(commit_warm, commits), COMMIT_TARGET_MS, anchor_commit_ms)
    report("anchor open (one JSON manifest)", anchor_open_samples, None, None)
    report("anchor commit (rewrite manifest)", anchor_commit_samples, None, None)
    final = Catalog(store, dataset).latest()
    assert final is not None
    assert final.partition_count == partitions


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=100_000)
    parser.add_argument("--commits", type=int, default=20, help="warm single-partition commits to time")
    parser.add_argument("--quick", action="store_true", help="10,000 partitions")
    parser.add_argument("--no-s3", action="store_true", help="skip the moto S3 server run")
    args = load.parse_args(parser, argv)
    partitions = 10_000 if args.quick else args.partitions
    print(f"catalog benchmark: {partitions:,} partitions, one file each with stats on 6 columns")
    with tempfile.TemporaryDirectory(prefix="bench-catalog-") as directory:
        bench_store("local store", lambda: LocalStore(Path(directory)), partitions, args.commits)
    if not args.no_s3:
        import boto3

        with moto_server() as settings:
            client = boto3.client("s3", **settings)  # type: ignore[call-overload]
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            client.create_bucket(Bucket=bucket)
            bench_store(
                "S3 store (moto server on loopback)",
                lambda: S3Store(client, bucket, "catalog"),
                partitions,
                args.commits,
            )


if __name__ == "__main__":
    main()
