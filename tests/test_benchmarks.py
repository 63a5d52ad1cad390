"""The benchmarks stay runnable: each parses its arguments, and `make bench` (run_all) knows all of them.

Running them is `make bench`'s job (minutes each, figures printed as ratios to an anchor); these checks
only keep an import error or a renamed option from going unnoticed until then.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import run_all

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = sorted(path.stem for path in (ROOT / "benchmarks").glob("bench_*.py"))


def test_run_all_runs_every_benchmark() -> None:
    assert sorted(run_all.BENCHMARKS) == BENCHMARKS


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_parses_its_arguments(name: str) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "--quick" in completed.stdout, "every benchmark offers a quick size"
