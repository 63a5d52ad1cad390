"""The benchmarks stay runnable: each parses its arguments, and `make bench` (run_all) knows all of them.

Running them is `make bench`'s job (minutes each, figures printed as ratios to an anchor); these checks
only keep an import error or a renamed option from going unnoticed until then.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import load, pairing, run_all

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
    assert "--max-load" in completed.stdout, "every benchmark parses through benchmarks.load.parse_args"
    assert "--allow-load" in completed.stdout


@pytest.fixture
def allow_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test machine is busy (parallel tests): these checks are about pairing, not about load."""
    monkeypatch.setattr(load, "LIMIT", load.Limit(load.DEFAULT_MAX_LOAD_PER_CORE, allow=True))


@pytest.mark.usefixtures("allow_load")
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
    assert len(rounds.cpu["ours"]) == 20, "CPU seconds beside wall seconds, one per round"
    assert all(cpu >= 0 for cpu in rounds.cpu["anchor"])
    assert " ms wall, " in rounds.describe("ours")
    assert rounds.describe("ours").endswith(" s CPU")

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


@pytest.fixture
def machine_load(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A settable 1-minute load average, a fresh limit of 1.5 per core on 2 cores, no exit hook."""
    now = [0.5]
    monkeypatch.setattr(os, "getloadavg", lambda: (now[0], 0.0, 0.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(load, "LIMIT", load.Limit(load.DEFAULT_MAX_LOAD_PER_CORE, allow=False))
    monkeypatch.setattr(load.atexit, "register", lambda function: function)
    return now


def test_rounds_on_a_busy_machine_are_refused_unless_allowed(machine_load: list[float]) -> None:
    calls: list[int] = []

    def busy() -> None:
        calls.append(1)
        machine_load[0] = 3.5  # above 1.5 x 2 cores once the first round has run

    with pytest.raises(load.LoadTooHigh, match=r"3\.50 during round 1 .*--allow-load") as refused:
        pairing.run_rounds({"ours": busy, "anchor": lambda: None}, rounds=3, warmup=False)
    assert refused.value.code != 0, "the benchmark exits with a failure, no figures printed"
    assert len(calls) == 1, "no round runs after the one that ran above the limit"

    load.configure(allow=True)
    rounds = pairing.run_rounds({"ours": lambda: None, "anchor": lambda: None}, rounds=2, warmup=False)
    assert rounds.loads == [3.5, 3.5]
    assert rounds.ratio("ours", "anchor").format(None).endswith("(no target)  load 3.50 (ABOVE LIMIT)")


def test_every_ratio_from_rounds_prints_its_load(machine_load: list[float]) -> None:
    machine_load[0] = 0.25
    rounds = pairing.run_rounds({"ours": lambda: None, "anchor": lambda: None}, rounds=2, seed=1)
    assert rounds.loads == [0.25, 0.25]
    line = pairing.figure_line("ours / anchor", rounds.ratio("ours", "anchor"), pairing.Target("<=", 1e9))
    assert line.endswith("met  load 0.25")


def test_parse_args_refuses_to_start_on_a_busy_machine(
    machine_load: list[float], capsys: pytest.CaptureFixture[str]
) -> None:
    machine_load[0] = 3.01
    with pytest.raises(load.LoadTooHigh, match=r"3\.01 at the start is above 3\.00 \(1\.5 per core x 2"):
        load.parse_args(argparse.ArgumentParser(), [])
    args = load.parse_args(argparse.ArgumentParser(), ["--max-load", "2"])
    assert args.max_load == 2.0
    assert "load average 3.01 at the start on 2 cores; limit 4.00" in capsys.readouterr().out
    load.parse_args(argparse.ArgumentParser(), ["--max-load", "1", "--allow-load"])
    assert "figures under load are reported, marked" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="per core >= 0"):
        load.configure(per_core=-1)


def test_environment_sets_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(load.ENV_MAX_LOAD, "2.5")
    monkeypatch.setenv(load.ENV_ALLOW_LOAD, "1")
    assert load._env_limit() == load.Limit(2.5, allow=True)
    monkeypatch.setenv(load.ENV_ALLOW_LOAD, "0")
    monkeypatch.delenv(load.ENV_MAX_LOAD)
    assert load._env_limit() == load.Limit(load.DEFAULT_MAX_LOAD_PER_CORE, allow=False)
    monkeypatch.setenv(load.ENV_MAX_LOAD, "busy")
    with pytest.raises(SystemExit, match="not a load average per core"):
        load._env_limit()
