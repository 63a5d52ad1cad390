"""Online re-partitioning: moving every row in batches against rebuilding them in one full refresh.

    python -m benchmarks.bench_repartition            # 1,000,000 rows, bucket(8, id) -> bucket(16, id)
    python -m benchmarks.bench_repartition --quick    # 20,000 rows
    python -m benchmarks.bench_repartition --rows 10000000 --rounds 2

Both contenders start from a copy of the same acceleration written under `bucket(8, id)` (parquet engine)
with `partition_by` changed to `bucket(16, id)`:

* migrate: `write.repartition.repartition` batch after batch (2 old partitions per batch) until none is
  left: read the old files, route, append to the new partitions, one commit per batch;
* anchor: a full refresh with the in-process Arrow strategy (read the source once, write every partition
  under the new spec, one commit).

Figures, wall and CPU seconds (CPU: every thread of the process), best of the rounds by wall time:
migrate / anchor (goal <= 1.2); and a refresh of one partition (`partitions=["p=3"]`, Arrow strategy)
during a migration / the same refresh of an acceleration already under the new `partition_by` (goal <=
1.3). During: one batch was moved and another partition refreshed since the change (the source's survey
under the new `partition_by` is behind it, as the rebuild is behind the anchor); the refresh finds the old
partition holding p=3's rows and, every row there written whole by a refresh in full mode, rewrites its
sibling p=11 from the source with p=3 and removes it unread in its commit (`write.refresh_siblings`;
else the commit moves it). The first refresh right after the change is printed
beside it (first / without, goal <= 1.3): its one commit also makes the new `partition_by` current, and the
source's files are learnt again under it (their keys and ranges), by its own streamed read of the source
as it routes the rows (one read, not a survey read before it).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_partitions.refresh.pipeline import refresh_dataset
from airflow_partitions.spec import load_spec
from airflow_partitions.table import open_handle
from airflow_partitions.write.repartition import repartition
from benchmarks import load

SEED = 32


def write_spec(path: Path, expression: str) -> Path:
    path.write_text(
        "accelerator_dir: acc\ndatasets:\n  - name: events\n    from: file:src\n"
        "    params: {file_format: parquet}\n    acceleration:\n      engine: parquet\n"
        f'      partition_by:\n        - {{p: "{expression}"}}\n',
        encoding="utf-8",
    )
    return path


def make_source(directory: Path, rows: int) -> None:
    rng = np.random.default_rng(SEED)
    directory.mkdir(parents=True)
    regions = np.array(["EU", "US", "APAC", "a/b", "k=v"], dtype=object)[rng.integers(0, 5, rows)]
    table = pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "region": pa.array(regions, pa.string(), mask=rng.random(rows) < 0.1),
            "amount": pa.array(rng.random(rows) * 1000, pa.float64()),
        }
    )
    pq.write_table(table, directory / "part-0.parquet")


class Clock:
    """Wall and CPU seconds (every thread of this process) of one timed run."""

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def best(runs: list[tuple[float, float]]) -> tuple[float, float]:
    """The (wall, cpu) run with the lowest wall time."""
    return min(runs)


def ratio_line(name: str, top: tuple[float, float], bottom: tuple[float, float], goal: float) -> str:
    wall, cpu = top[0] / bottom[0], top[1] / bottom[1]
    verdict = "met" if wall <= goal else "NOT met"
    return f"  {name} = {wall:.2f}x wall, {cpu:.2f}x CPU (goal <= {goal}: {verdict} on wall)"


def migrate_all(spec: str, batch_partitions: int) -> int:
    """Run batches until no old partition is left; the number of batches."""
    project = load_spec(spec)
    batches = 0
    while True:
        batches += 1
        report = repartition(open_handle(project, project.dataset("events")), max_partitions=batch_partitions)
        if report.done:
            return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--batch-partitions", type=int, default=2, help="old partitions per batch (2)")
    args = load.parse_args(parser)
    rows = args.rows or (20_000 if args.quick else 1_000_000)
    rounds = args.rounds or (1 if args.quick else 3)
    migrate: list[tuple[float, float]] = []
    rebuild: list[tuple[float, float]] = []
    during: list[tuple[float, float]] = []
    without: list[tuple[float, float]] = []
    loads: list[float] = []
    batches = 0
    with tempfile.TemporaryDirectory(prefix="bench-repartition-") as scratch:
        base = Path(scratch) / "base"
        base.mkdir()
        make_source(base / "src", rows)
        refresh_dataset(str(write_spec(base / "spec.yaml", "bucket(8, id)")), "events", strategy="arrow")
        write_spec(base / "spec.yaml", "bucket(16, id)")
        for number in range(rounds):
            for name in ("migrate", "anchor") if number % 2 == 0 else ("anchor", "migrate"):
                work = Path(scratch) / f"{name}-{number}"
                shutil.copytree(base, work)
                spec = str(work / "spec.yaml")
                with Clock() as clock:
                    if name == "migrate":
                        batches = migrate_all(spec, args.batch_partitions)
                    else:
                        refresh_dataset(spec, "events", strategy="arrow")
                (migrate if name == "migrate" else rebuild).append((clock.wall, clock.cpu))
                loads.append(load.current())
                shutil.rmtree(work)
        rebuilt = Path(scratch) / "rebuilt"
        shutil.copytree(base, rebuilt)
        refresh_dataset(str(rebuilt / "spec.yaml"), "events", strategy="arrow")
        # Mid-migration: one batch moved (its commit switched the layout), and a refresh of another
        # partition ran since the change (it surveyed the source under the new partition_by, as the
        # rebuild did for the anchor). The old partition holding p=3's rows is still there.
        midway = Path(scratch) / "midway"
        shutil.copytree(base, midway)
        project = load_spec(str(midway / "spec.yaml"))
        repartition(open_handle(project, project.dataset("events")), max_partitions=1)
        refresh_dataset(str(midway / "spec.yaml"), "events", partitions=["p=0"], strategy="arrow")
        refresh_dataset(str(rebuilt / "spec.yaml"), "events", partitions=["p=0"], strategy="arrow")
        first: list[tuple[float, float]] = []
        for number in range(rounds):
            for name in ("during", "without", "first") if number % 2 == 0 else ("first", "without", "during"):
                origin = {"during": midway, "without": rebuilt, "first": base}[name]
                work = Path(scratch) / f"{name}-{number}"
                shutil.copytree(origin, work)
                with Clock() as clock:
                    refresh_dataset(str(work / "spec.yaml"), "events", partitions=["p=3"], strategy="arrow")
                {"during": during, "without": without, "first": first}[name].append((clock.wall, clock.cpu))
                loads.append(load.current())
                shutil.rmtree(work)
    top = max(loads)
    print(
        f"rows {rows:,}, bucket(8, id) -> bucket(16, id), {rounds} round(s), best of each, {load.note(top)}"
    )
    anchor, moved = best(rebuild), best(migrate)
    print(f"  anchor  full rebuild (arrow refresh): {anchor[0]:.3f} s wall, {anchor[1]:.3f} s CPU")
    print(
        f"  migrate {batches} batches of {args.batch_partitions} old partitions: "
        f"{moved[0]:.3f} s wall, {moved[1]:.3f} s CPU"
    )
    print(ratio_line("migrate / rebuild", moved, anchor, 1.2))
    plain, mixed, after = best(without), best(during), best(first)
    print(f"  refresh of p=3 without a migration: {plain[0]:.3f} s wall, {plain[1]:.3f} s CPU")
    print(
        f"  refresh of p=3 during one (the old partition holding its rows leaves in its commit): "
        f"{mixed[0]:.3f} s wall, {mixed[1]:.3f} s CPU"
    )
    print(ratio_line("during / without", mixed, plain, 1.3))
    print(
        f"  first refresh of p=3 right after the change (its commit also switches the layout; its read "
        f"learns the source's files under the new partition_by): {after[0]:.3f} s wall, {after[1]:.3f} s CPU"
    )
    print(ratio_line("first / without", after, plain, 1.3))


if __name__ == "__main__":
    main()
