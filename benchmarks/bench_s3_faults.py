"""The catalog on S3 under injected faults: are commits published exactly once, and are failures typed?

    python -m benchmarks.bench_s3_faults                 # 4 writers x 40 commits at 0%, 20% and 40% faults
    python -m benchmarks.bench_s3_faults --quick         # 4 writers x 10 commits
    python -m benchmarks.bench_s3_faults --rates 0 0.3 --writers 8

A moto S3 server runs in its own process behind `tests/fault_proxy.py`, which answers 500 / 503, resets
the connection before forwarding or after the request was applied (response lost), or truncates the
response body, at the given rate, from a seeded RNG. Writers (threads, each with its own client and
`Catalog`) commit their own partition and, every fourth commit, one of two shared partitions, re-planning
after any failure without a commit id of its own, as a task retried by its scheduler would: after a
conflict as often as it takes, after any other failure at most `--tries` times. An error that carries a
commit id (the outcome is unknown) is followed as its message says: the next try passes that id.

Printed per rate: commits attempted, published (distinct commits in the log), duplicated (extra versions of
a commit already published), lost (acknowledged with a version whose record is not theirs), abandoned
(every try failed, nothing published), failures that reached the writer split into typed
(`AirflowPartitionsError`: conflicts, store errors) and untyped (anything else), the faults injected, and
the wall time as a ratio to the 0% anchor measured in the same run.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from airflow_partitions.catalog import Catalog, PartitionEntry, PartitionSpecInfo, S3Store
from airflow_partitions.exceptions import AirflowPartitionsError, CommitConflictError, ObjectStoreError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.objectstore import S3Settings
from airflow_partitions.storage.datafile import DataFile
from benchmarks import load
from benchmarks.support import moto_server
from tests.fault_proxy import FaultProxy

SPEC = PartitionSpecInfo.from_fields([("owner", "owner", "string")])
SHARED_EVERY = 4


@dataclass
class RateResult:
    rate: float
    attempted: int = 0
    acknowledged: list[tuple[int, str]] = field(default_factory=list)  # (version, fingerprint)
    abandoned: int = 0
    conflicts: int = 0
    store_errors: int = 0
    other_typed: int = 0
    untyped: Counter[str] = field(default_factory=Counter)
    failures: dict[str, list[str]] = field(default_factory=dict)  # fingerprint -> failures it met
    duplicates: dict[str, list[int]] = field(default_factory=dict)  # fingerprint -> versions holding it
    published: int = 0
    duplicated: int = 0
    lost: int = 0
    injected: int = 0
    requests: int = 0
    seconds: float = 0.0


def entry(owner: str, fingerprint: str) -> PartitionEntry:
    key = PartitionKey((owner,))
    data_file = DataFile(
        path=f"{key.path(SPEC.names)}/part-{uuid.uuid4().hex}-0000.parquet",
        format="parquet",
        rows=1,
        bytes=8,
        checksum="0" * 64,
    )
    return PartitionEntry.from_files(key, SPEC, [data_file], source_fingerprint=fingerprint)


def store_for(settings: dict[str, str], bucket: str) -> S3Store:
    return S3Store(S3Settings.from_mapping(settings).create_client(), bucket, "catalogs")


def run_rate(
    upstream: dict[str, str], rate: float, *, writers: int, commits: int, tries: int, seed: int
) -> RateResult:
    import boto3

    bucket = f"faults-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", **upstream).create_bucket(Bucket=bucket)
    result = RateResult(rate)
    lock = threading.Lock()
    with FaultProxy(upstream["endpoint_url"], seed=seed, serialise=True) as proxy:
        settings = proxy.through(upstream)
        barrier = threading.Barrier(writers)

        def writer(number: int) -> None:
            catalog = Catalog(store_for(settings, bucket), "events")
            barrier.wait()
            for index in range(commits):
                owner = f"shared{index % 2}" if index % SHARED_EVERY == 0 else f"w{number}"
                fingerprint = f"w{number}-{index}"
                with lock:
                    result.attempted += 1
                failures = 0
                commit_id: str | None = None
                while failures < tries:
                    try:
                        base = catalog.latest()
                        version = catalog.commit(
                            base_version=base.version if base is not None else None,
                            upserts=[entry(owner, fingerprint)],
                            partition_spec=SPEC,
                            commit_id=commit_id,
                        )
                    except CommitConflictError as err:
                        with lock:
                            result.conflicts += 1
                            result.failures.setdefault(fingerprint, []).append(f"{type(err).__name__}: {err}")
                        continue  # a genuine race on a shared partition: plan again, as often as it takes
                    except AirflowPartitionsError as err:
                        with lock:
                            result.failures.setdefault(fingerprint, []).append(f"{type(err).__name__}: {err}")
                            if isinstance(err, ObjectStoreError):
                                result.store_errors += 1
                            else:
                                result.other_typed += 1
                        # An unknown outcome carries the id to commit again with (CommitOutcomeUnknownError).
                        commit_id = getattr(err, "commit_id", None) or commit_id
                        failures += 1
                        continue
                    except Exception as err:  # what the benchmark is here to count
                        with lock:
                            result.failures.setdefault(fingerprint, []).append(f"{type(err).__name__}: {err}")
                            result.untyped[type(err).__name__] += 1
                        failures += 1
                        continue
                    with lock:
                        result.acknowledged.append((version, fingerprint))
                    break
                else:
                    with lock:
                        result.abandoned += 1

        started = time.perf_counter()
        proxy.rate = rate
        threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        result.seconds = time.perf_counter() - started
        proxy.rate = 0.0
        result.injected = sum(proxy.injected.values())
        result.requests = proxy.requests
    audit(result, store_for(upstream, bucket))
    return result


def audit(result: RateResult, store: S3Store) -> None:
    """Read the log without faults: which commits it holds, and how often."""
    catalog = Catalog(store, "events")
    logged: dict[int, list[str]] = {}
    for info in catalog.versions():
        record = catalog._read_record(catalog._log_key(info.version))
        logged[info.version] = [upsert["source_fingerprint"] for upsert in record.upserts]
    published = Counter(fp for fingerprints in logged.values() for fp in fingerprints)
    result.published = len(published)
    result.duplicated = sum(count - 1 for count in published.values())
    result.duplicates = {
        fp: [v for v, fps in logged.items() if fp in fps] for fp, count in published.items() if count > 1
    }
    result.lost = sum(1 for version, fp in result.acknowledged if logged.get(version) != [fp])


def report(results: list[RateResult]) -> None:
    anchor = results[0]
    print(
        f"{'faults':>6} {'attempted':>9} {'published':>9} {'duplicated':>10} {'lost':>4} {'abandoned':>9} "
        f"{'conflicts':>9} {'store errs':>10} {'untyped':>7} {'injected':>8} {'requests':>8} "
        f"{'time vs anchor':>14}"
    )
    for r in results:
        untyped = sum(r.untyped.values())
        ratio = r.seconds / anchor.seconds if anchor.seconds else float("nan")
        print(
            f"{r.rate:>6.0%} {r.attempted:>9} {r.published:>9} {r.duplicated:>10} {r.lost:>4} "
            f"{r.abandoned:>9} {r.conflicts:>9} {r.store_errors + r.other_typed:>10} {untyped:>7} "
            f"{r.injected:>8} {r.requests:>8} {ratio:>13.2f}x"
        )
        if r.untyped:
            print(f"       untyped: {dict(r.untyped)}")
        kinds = Counter(
            " ".join(message.split(" ")[:3]).rstrip(":")
            for messages in r.failures.values()
            for message in messages
            if not message.startswith("CommitConflictError")
        )
        for kind, count in kinds.most_common(5):
            print(f"       {count:>4} x {kind} ...")
        for fingerprint, versions in list(r.duplicates.items())[:3]:
            print(f"       {fingerprint} is in versions {versions}")
    print(
        f"anchor: {anchor.rate:.0%} faults, {anchor.seconds:.2f}s. conflicts are genuine (shared "
        "partitions); store errs and untyped are failures that reached the writer"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 commits per writer")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--commits", type=int, default=None, help="commits per writer (default 40)")
    parser.add_argument(
        "--tries", type=int, default=5, help="failures (other than conflicts) before a commit is abandoned"
    )
    parser.add_argument("--rates", type=float, nargs="+", default=[0.0, 0.2, 0.4], help="first: the anchor")
    parser.add_argument("--seed", type=int, default=13)
    args = load.parse_args(parser, argv)
    commits = args.commits or (10 if args.quick else 40)
    # A checkpoint a fault prevented is only logged (the commit stands): not what is counted here.
    logging.getLogger("airflow_partitions.catalog").setLevel(logging.ERROR)
    print(f"catalog on S3 (moto) behind a fault proxy: {args.writers} writers x {commits} commits")
    results: list[RateResult] = []
    with moto_server() as upstream:
        for rate in args.rates:
            results.append(
                run_rate(
                    upstream, rate, writers=args.writers, commits=commits, tries=args.tries, seed=args.seed
                )
            )
    report(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
