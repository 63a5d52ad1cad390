"""Online re-partitioning: moving every row in batches against rebuilding them in one full refresh.

    python -m benchmarks.bench_repartition            # 1,000,000 rows, bucket(8, id) -> bucket(16, id)
    python -m benchmarks.bench_repartition --quick    # 20,000 rows

Both contenders start from a copy of the same acceleration written under `bucket(8, id)` (parquet engine)
with `partition_by` changed to `bucket(16, id)`:

* migrate: `write.repartition.repartition` batch after batch (2 old partitions per batch) until none is
  left: read the old files, route, append to the new partitions, one commit per batch;
* anchor: a full refresh with the in-process Arrow strategy (read the source once, write every partition
  under the new spec, one commit).

Figures: migrate time / anchor time (goal <= 1.2); and a refresh of one partition (`partitions=["p=3"]`,
Arrow strategy) during a migration (right after the change: it first switches the layout and moves the old
partition holding that partition's rows) / the same refresh of an acceleration already under the new
`partition_by` (goal <= 1.3).
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    args = load.parse_args(parser)
    rows = args.rows or (20_000 if args.quick else 1_000_000)
    rounds = args.rounds or (1 if args.quick else 3)
    with tempfile.TemporaryDirectory(prefix="bench-repartition-") as scratch:
        base = Path(scratch) / "base"
        base.mkdir()
        make_source(base / "src", rows)
        refresh_dataset(str(write_spec(base / "spec.yaml", "bucket(8, id)")), "events", strategy="arrow")
        write_spec(base / "spec.yaml", "bucket(16, id)")
        migrate: list[float] = []
        rebuild: list[float] = []
        batches = 0
        for number in range(rounds):
            for name in ("migrate", "anchor") if number % 2 == 0 else ("anchor", "migrate"):
                work = Path(scratch) / f"{name}-{number}"
                shutil.copytree(base, work)
                spec = str(work / "spec.yaml")
                started = time.perf_counter()
                if name == "migrate":
                    project = load_spec(spec)
                    batches = 0
                    while not repartition(
                        open_handle(project, project.dataset("events")), max_partitions=2
                    ).done:
                        batches += 1
                    migrate.append(time.perf_counter() - started)
                else:
                    refresh_dataset(spec, "events", strategy="arrow")
                    rebuild.append(time.perf_counter() - started)
                shutil.rmtree(work)
        during: list[float] = []
        without: list[float] = []
        rebuilt = Path(scratch) / "rebuilt"
        shutil.copytree(base, rebuilt)
        refresh_dataset(str(rebuilt / "spec.yaml"), "events", strategy="arrow")
        for number in range(rounds):
            for name in ("during", "without") if number % 2 == 0 else ("without", "during"):
                work = Path(scratch) / f"{name}-{number}"
                shutil.copytree(base if name == "during" else rebuilt, work)
                started = time.perf_counter()
                refresh_dataset(str(work / "spec.yaml"), "events", partitions=["p=3"], strategy="arrow")
                (during if name == "during" else without).append(time.perf_counter() - started)
                shutil.rmtree(work)
    best_migrate, best_rebuild = min(migrate), min(rebuild)
    print(f"rows {rows:,}, bucket(8, id) -> bucket(16, id), {rounds} round(s), best of each")
    print(f"  anchor  full rebuild (arrow refresh): {best_rebuild:.3f} s")
    print(f"  migrate {batches + 1} batches of 2 old partitions: {best_migrate:.3f} s")
    ratio = best_migrate / best_rebuild
    print(f"  migrate / rebuild = {ratio:.2f}x (goal <= 1.2: {'met' if ratio <= 1.2 else 'NOT met'})")
    best_during, best_without = min(during), min(without)
    print(f"  refresh of p=3 without a migration: {best_without:.3f} s; during one: {best_during:.3f} s")
    second = best_during / best_without
    print(f"  during / without = {second:.2f}x (goal <= 1.3: {'met' if second <= 1.3 else 'NOT met'})")


if __name__ == "__main__":
    main()
