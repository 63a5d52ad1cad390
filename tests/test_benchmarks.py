"""The benchmarks stay runnable: each parses its arguments, and `make bench` (run_all) knows all of them.

Running them is `make bench`'s job (minutes each, figures printed as ratios to an anchor); these checks
only keep an import error or a renamed option from going unnoticed until then.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import pairing, run_all

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


def test_rounds_shuffle_the_order_and_pair_ratios_within_a_round() -> None:
    """A fixed order (ours first) favoured one side; every round must draw a fresh order, and a ratio
    compares the two sides' times within the same round."""
    calls: list[str] = []
    rounds = pairing.run_rounds(
        {"ours": lambda: calls.append("ours") or 1, "anchor": lambda: calls.append("anchor") or 2},
        rounds=20,
        seed=3,
    )
    assert len(calls) == 2 * 21, "one warm-up and 20 rounds, each contender once per round"
    firsts = {calls[i] for i in range(0, len(calls), 2)}
    assert firsts == {"ours", "anchor"}, f"the order never changed across 21 rounds: {calls[:8]}"
    assert len(rounds.seconds["ours"]) == len(rounds.seconds["anchor"]) == 20
    assert rounds.results == {"ours": 1, "anchor": 2}, "each contender's last result is kept"

    fixed = pairing.Rounds(seconds={"ours": [1.0, 2.0, 4.0], "anchor": [2.0, 2.0, 2.0]})
    ratio = fixed.ratio("ours", "anchor")
    assert ratio.samples == (0.5, 1.0, 2.0), "per-round ratios, not a ratio of medians"
    assert (ratio.median, ratio.low, ratio.high) == (1.0, 0.5, 2.0)


def test_figures_print_median_range_and_the_target_verdict() -> None:
    ratio = pairing.Ratio((0.9, 1.2, 1.5))
    assert ratio.format(pairing.Target("<=", 1.0)) == "  1.20 [0.90–1.50]  target ≤ 1: not met"
    assert ratio.format(pairing.Target(">=", 1.2)) == "  1.20 [0.90–1.50]  target ≥ 1.2: met"
    assert ratio.format(None).endswith("(no target)")
    with pytest.raises(ValueError, match="'<=' or '>='"):
        pairing.Target("<", 1.0)
    with pytest.raises(ValueError, match="at least 1"):
        pairing.run_rounds({"ours": lambda: None}, rounds=0)
