"""Cold starts: the first point read in a fresh process, against DuckDB in a fresh process, and `--help`.

    python -m benchmarks.bench_cold_start                    # 2,000,000 rows in bucket(10, ...)
    python -m benchmarks.bench_cold_start --rows 10000000 --buckets 50   # the issue's data set
    python -m benchmarks.bench_cold_start --quick            # 300,000 rows, 5 rounds

A CLI call or a new Airflow task reads once and exits: what it pays is interpreter start, imports,
opening DuckDB, parsing the spec and the read. Each contender is a fresh `python -c` process, run once
per round in shuffled order (`pairing.run_rounds`):

* `ours` — `PartitionedDatasetReader(spec, ds).read("PULocationID = <cold zone>")` over the sorted
  64k-row-group acceleration of bench_cold_reads;
* `anchor` — `duckdb.sql("SELECT * FROM read_parquet(<source>) WHERE ...")`, DuckDB's full scan of the
  source with its own pushdown (target anchor / ours >= 4, issue 34);
* `help` — `airflow-partitions --help` (target <= 0.3 s);
* `python` — `python -c pass`, the floor every fresh process pays;
* `pyarrow` — `python -c "import pyarrow"`: the floor of any read that returns an Arrow table, so
  anchor / pyarrow is the best ratio any such read could reach on this machine (printed as the ceiling).

Fair to both sides: every child runs with compiled bytecode, as an installed package has it. The
children write and reuse their `.pyc` files under a private `PYTHONPYCACHEPREFIX` (the warm-up round
compiles them), whatever `PYTHONDONTWRITEBYTECODE` says: otherwise the project's own modules (a source
checkout) would be compiled again in every process while DuckDB's come precompiled from site-packages.
The issue's goal is at 10M rows in 50 buckets (`--rows 10000000 --buckets 50`): at `--quick` sizes the
anchor's scan is far smaller and its ratio says little about the goal.

Printed: wall-clock medians and per-round ratios, and beside them the CPU seconds the child used
(`getrusage(RUSAGE_CHILDREN)`: user + system, far less sensitive to other load on the machine than wall
time) and the load average before and after. A round at load above `--max-load` stops the run
(`benchmarks.load`) unless `--allow-load`, and is then reported as such.
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from airflow_partitions.storage.parquet import ParquetStorage
from benchmarks import load
from benchmarks.bench_cold_reads import build
from benchmarks.bench_pruning import COLD_ZONE, make_trips
from benchmarks.pairing import Target, run_rounds

READ_TARGET = Target(">=", 4)  # anchor / ours, issue 34
HELP_TARGET_S = 0.3
LAYOUT = "sorted_64k"


def fresh(code: str, cpu: dict[str, list[float]], name: str, env: dict[str, str]) -> None:
    """Run `code` in a new interpreter; record the CPU seconds it used under `name`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True, env=env, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu.setdefault(name, []).append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))


def modules_after_read(spec: Path, where: str, env: dict[str, str]) -> str:
    code = textwrap.dedent(
        f"""
        import sys
        from airflow_partitions.read import PartitionedDatasetReader
        PartitionedDatasetReader({str(spec)!r}, {LAYOUT!r}).read({where!r})
        watched = ("pandas", "pyarrow.dataset", "sqlglot", "pyspark", "airflow")
        heavy = [m for m in watched if m in sys.modules]
        print(len(sys.modules), ",".join(heavy) or "none")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True, text=True)
    count, heavy = done.stdout.split()
    return f"{count} modules loaded; heavy: {heavy}"


def run(base: Path, rows: int, rounds: int, expression: str) -> None:
    print(f"generating {rows:,} trips ...", flush=True)
    table = make_trips(rows)
    source = base / "source.parquet"
    pq.write_table(table, source)
    build(
        base, LAYOUT, table, ParquetStorage(row_group_rows=64 * 1024, sort_by=("PULocationID",)), expression
    )
    del table
    spec = base / "datasets.yaml"
    spec.write_text(
        textwrap.dedent(
            f"""\
            accelerator_dir: {base}
            datasets:
              - name: {LAYOUT}
                from: file:{source}
                acceleration:
                  engine: parquet
                  partition_by:
                    - pu_bucket: "{expression}"
            """
        )
    )
    where = f"PULocationID = {COLD_ZONE}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # compiled once (warm-up round), like an installed package
    env["PYTHONPYCACHEPREFIX"] = str(base / "pycache")
    codes = {
        "ours": (
            "from airflow_partitions.read import PartitionedDatasetReader\n"
            f"PartitionedDatasetReader({str(spec)!r}, {LAYOUT!r}).read({where!r})"
        ),
        "anchor": (
            "import duckdb\n"
            f"duckdb.sql(\"SELECT * FROM read_parquet('{source}') WHERE {where}\").to_arrow_table()"
        ),
        "help": (
            "import contextlib, io\n"
            "from airflow_partitions.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "    main(['--help'])"
        ),
        "python": "pass",
        "pyarrow": "import pyarrow",
    }
    cpu: dict[str, list[float]] = {}
    load_before = os.getloadavg()
    contenders: dict[str, Callable[[], None]] = {
        name: functools.partial(fresh, code, cpu, name, env) for name, code in codes.items()
    }
    measured = run_rounds(contenders, rounds, seed=34)
    load_after = os.getloadavg()
    cpu = {name: values[-rounds:] for name, values in cpu.items()}  # the warm-up run is not a round
    loaded = f"{load_before[0]:.2f} before, {load_after[0]:.2f} after (1-minute load average)"
    print(f"\n{rounds} shuffled rounds of fresh processes, {os.cpu_count()} cores; load {loaded}")
    if max(load_before[0], load_after[0]) > load.LIMIT.maximum:  # only with --allow-load
        limit = load.LIMIT.describe()
        print(f"WARNING: load above {limit}: wall-clock figures below are not idle-machine figures")
    print(f"{'process':8} {'wall ms':>9} {'cpu ms':>9}")
    for name in codes:
        print(
            f"{name:8} {measured.median_seconds(name) * 1000:9.1f} {statistics.median(cpu[name]) * 1000:9.1f}"
        )
    print(f"\nfirst point read, anchor / ours (wall): {measured.ratio('anchor', 'ours').format(READ_TARGET)}")
    cpu_ratio = statistics.median(a / o for a, o in zip(cpu["anchor"], cpu["ours"], strict=True))
    print(f"first point read, anchor / ours (cpu):  {cpu_ratio:6.2f}")
    ceiling = measured.ratio("anchor", "pyarrow")
    print(f"ceiling, anchor / (python + import pyarrow) (wall): {ceiling.format(None)}")
    print(f"  (no read returning an Arrow table from a fresh process can score above this; {rows:,} rows)")
    help_s = measured.median_seconds("help")
    verdict = "met" if help_s <= HELP_TARGET_S else "not met"
    print(f"--help: {help_s:.3f} s wall, target <= {HELP_TARGET_S} s: {verdict}")
    print(f"ours: {modules_after_read(spec, where, env)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2_000_000, help="trips to generate (default 2,000,000)")
    parser.add_argument("--buckets", type=int, default=10, help="bucket count (default 10; issue: 50)")
    parser.add_argument("--rounds", type=int, default=11, help="shuffled rounds (default 11)")
    parser.add_argument("--quick", action="store_true", help="300,000 rows, 5 rounds")
    args = load.parse_args(parser, argv)
    rows, rounds = (300_000, 5) if args.quick else (args.rows, args.rounds)
    base = Path(tempfile.mkdtemp(prefix="bench-cold-start-"))
    try:
        run(base, rows, rounds, f"bucket({args.buckets}, PULocationID)")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
