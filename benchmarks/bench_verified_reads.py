"""What checking partition files against the catalog's SHA-256 costs a read: verification on vs off.

    python -m benchmarks.bench_verified_reads           # 2,000,000 trips in bucket(10, PULocationID)
    python -m benchmarks.bench_verified_reads --quick   # 300,000 trips, 5 rounds

Data: bench_pruning's taxi-like trips, written once per engine (parquet, arrow, duckdb files) in
`bucket(N, PULocationID)` and committed to the real catalog (page cache warm).

Figures, each a paired ratio verified / unverified (`storage.integrity.VERIFY_ON_READ` switched off is the
anchor: the read as it was before files were checked), shuffled order each round (`pairing.run_rounds`):

* `first point read` — a fresh process opens a reader and reads `PULocationID = <cold zone>`: the first
  open of the one matching bucket file hashes it (target ≤ 1.2);
* `first full read` — a fresh process reads every row: every file is hashed once (no target; the cost of
  reading all bytes twice);
* `hot point read` — the same point read again in this process: a verified file costs one `stat`
  (target ≤ 1.05, "unchanged"); printed too: that check alone, timed apart, as a share of the hot read.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from benchmarks import load
from benchmarks.bench_cold_reads import build
from benchmarks.bench_pruning import COLD_ZONE, make_trips
from benchmarks.pairing import REPEAT_CALLS, Rounds, Target, repeated, run_rounds

FIRST_READ_TARGET = Target("<=", 1.2)  # issue 27: first read at most 1.2x the unverified read
HOT_READ_TARGET = Target("<=", 1.05)  # issue 27: a hot cached point read unchanged
ENGINES = ("parquet", "arrow", "duckdb")
REPO_ROOT = Path(__file__).resolve().parent.parent
CHECK_CALLS = 1000


def child(spec: str, dataset: str, where: str | None, verify: bool) -> None:
    """One fresh process's first read: reader opened, one read; prints the seconds it took."""
    from airflow_partitions.read import PartitionedDatasetReader
    from airflow_partitions.storage import integrity

    integrity.VERIFY_ON_READ = verify
    started = time.perf_counter()
    with PartitionedDatasetReader(spec, dataset) as reader:
        rows = reader.read(where).num_rows
    print(json.dumps({"seconds": time.perf_counter() - started, "rows": rows}))


def first_read(spec: Path, dataset: str, where: str | None, verify: bool) -> Any:
    """A fresh interpreter's first read; the seconds it measured inside (start-up and imports excluded)."""
    command = [sys.executable, "-m", "benchmarks.bench_verified_reads", "--child", str(spec), dataset]
    command += [where or "", "1" if verify else "0"]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_spec(base: Path, source: Path, expression: str) -> Path:
    datasets = "".join(
        f"""
          - name: {engine}
            from: file:{source}
            acceleration:
              engine: {engine}
              partition_by:
                - pu_bucket: "{expression}"
        """
        for engine in ENGINES
    )
    path = base / "datasets.yaml"
    path.write_text(textwrap.dedent(f"accelerator_dir: {base}\ndatasets:") + textwrap.dedent(datasets))
    return path


def run(base: Path, rows: int, rounds: int, expression: str) -> None:
    from airflow_partitions.read import PartitionedDatasetReader
    from airflow_partitions.storage import get_storage, integrity

    print(f"generating {rows:,} trips ...", flush=True)
    table = make_trips(rows)
    source = base / "source.parquet"
    pq.write_table(table, source)
    for engine in ENGINES:
        _, seconds = build(base, engine, table, get_storage(engine), expression)  # type: ignore[arg-type]
        size = sum(p.stat().st_size for p in (base / engine).rglob("part-*"))
        print(f"{engine:8} written in {seconds:.2f} s, {size / 1e6:.1f} MB", flush=True)
    spec = write_spec(base, source, expression)
    where = f"PULocationID = {COLD_ZONE}"
    del table

    # First reads: one fresh interpreter each, timed inside (its start-up and imports are the same
    # either way), every round in a fresh shuffled order.
    shuffler = random.Random(27)
    firsts = [(e, kind, v) for e in ENGINES for kind in ("first point", "first full") for v in (True, False)]
    first = Rounds(seconds={_name(e, kind, v): [] for e, kind, v in firsts})
    for _ in range(rounds):
        shuffler.shuffle(firsts)
        for engine, kind, verify in firsts:
            outcome = first_read(spec, engine, where if kind == "first point" else None, verify)
            first.seconds[_name(engine, kind, verify)].append(outcome["seconds"])

    readers = {engine: PartitionedDatasetReader(spec, engine) for engine in ENGINES}

    def hot(reader: PartitionedDatasetReader, verify: bool) -> Any:
        def read() -> int:
            integrity.VERIFY_ON_READ = verify
            return int(reader.read(where).num_rows)

        return repeated(read)

    cases = {
        _name(engine, "hot point", verify): hot(readers[engine], verify)
        for engine in ENGINES
        for verify in (True, False)
    }
    hot_rounds = run_rounds(cases, rounds * 3, seed=27)
    integrity.VERIFY_ON_READ = True
    # The check a hot read adds, alone: one `stat` and a set lookup per file the read opens. Timed apart
    # from the read, it is a figure the machine's load barely moves.
    check_seconds, hash_seconds = {}, {}
    for engine in ENGINES:
        files = [*readers[engine].plan(where).exact_files, *readers[engine].plan(where).inexact_files]
        root = base / engine
        integrity.verify_files(root, files)
        started = time.perf_counter()
        for _ in range(CHECK_CALLS):
            integrity.verify_files(root, files)
        check_seconds[engine] = (time.perf_counter() - started) / CHECK_CALLS
        # What a first point read adds: hashing the files it opens (best of a few, page cache warm).
        samples = []
        for _ in range(5):
            integrity.forget_verified()
            started = time.perf_counter()
            integrity.verify_files(root, files)
            samples.append(time.perf_counter() - started)
        hash_seconds[engine] = min(samples)
    for reader in readers.values():
        reader.close()

    print(
        f"\n{rounds} shuffled rounds of first reads, {rounds * 3} of hot reads ({REPEAT_CALLS} calls a "
        "sample); ratio verified / unverified per round (anchor: the same read with VERIFY_ON_READ off); "
        "first reads timed inside a fresh process (its start-up and imports excluded)"
    )
    print(f"{'case':24} {'verified ms':>12} {'unverified ms':>14}  verified/unverified median [min-max]")
    for engine in ENGINES:
        for kind, target, measured in (
            ("first point", FIRST_READ_TARGET, first),
            ("first full", None, first),
            ("hot point", HOT_READ_TARGET, hot_rounds),
        ):
            on, off = _name(engine, kind, True), _name(engine, kind, False)
            calls = REPEAT_CALLS if kind == "hot point" else 1
            ratio = measured.ratio(on, off)
            print(
                f"{engine + ' ' + kind:24} {measured.median_seconds(on) * 1000 / calls:12.2f} "
                f"{measured.median_seconds(off) * 1000 / calls:14.2f}  {ratio.format(target)}"
            )

    print(
        "\nthe checks alone, timed apart from the reads (load barely moves them), as a share of the "
        "unverified read:"
    )
    for engine in ENGINES:
        hot_read = hot_rounds.median_seconds(_name(engine, "hot point", False)) / REPEAT_CALLS
        first_point = first.median_seconds(_name(engine, "first point", False))
        print(
            f"  {engine:8} hot: a stat per file {check_seconds[engine] * 1e6:7.1f} µs of "
            f"{hot_read * 1000:.2f} ms ({check_seconds[engine] / hot_read:.2%}); first point: hashing "
            f"its file(s) {hash_seconds[engine] * 1000:.2f} ms of {first_point * 1000:.0f} ms "
            f"({hash_seconds[engine] / first_point:.2%})"
        )


def _name(engine: str, kind: str, verify: bool) -> str:
    return f"{engine} {kind} {'verified' if verify else 'unverified'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2_000_000, help="trips to generate (default 2,000,000)")
    parser.add_argument("--quick", action="store_true", help="300,000 rows, 5 rounds")
    parser.add_argument("--buckets", type=int, default=10, help="bucket count (default 10)")
    parser.add_argument("--rounds", type=int, default=11, help="shuffled rounds (default 11)")
    parser.add_argument(
        "--child", nargs=4, metavar=("SPEC", "DATASET", "WHERE", "VERIFY"), help=argparse.SUPPRESS
    )
    args = load.parse_args(parser, argv)
    if args.child:
        spec, dataset, where, verify = args.child
        child(spec, dataset, where or None, verify == "1")
        return 0
    rows, rounds = (300_000, 5) if args.quick else (args.rows, args.rounds)
    base = Path(tempfile.mkdtemp(prefix="bench-verified-reads-"))
    try:
        run(base, rows, rounds, f"bucket({args.buckets}, PULocationID)")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
