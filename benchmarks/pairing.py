"""Paired measurements: the contenders of one figure run in shuffled order each round, compared per round.

A fixed order (ours, then the anchor) lets caches, JIT warm-up and load drift favour one side: in
`bench_pruning` it moved a ratio from 1.04-1.11 (shuffled) to 1.43-1.68. Here every round runs each
contender once, in a fresh random order, and a figure is the ratio of two contenders' times *within the
same round*; the median and min-max of those per-round ratios are what a benchmark prints, next to its
target, with the highest load average of those rounds (`benchmarks.load`: a round run above the limit
stops the benchmark unless `--allow-load`).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from benchmarks import load as machine_load


@dataclass(frozen=True)
class Target:
    """A bound a ratio must meet: `Target("<=", 1.0)` or `Target(">=", 4)`."""

    op: str
    bound: float

    def __post_init__(self) -> None:
        if self.op not in ("<=", ">="):
            raise ValueError(f"a target's op is '<=' or '>=', not {self.op!r}")

    def met(self, ratio: float) -> bool:
        return ratio <= self.bound if self.op == "<=" else ratio >= self.bound

    def __str__(self) -> str:
        return f"target {'≤' if self.op == '<=' else '≥'} {self.bound:g}"


@dataclass(frozen=True)
class Ratio:
    """Per-round ratios of one contender's time to another's."""

    samples: tuple[float, ...]
    loads: tuple[float, ...] = ()  # 1-minute load average around each round, when measured

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def low(self) -> float:
        return min(self.samples)

    @property
    def high(self) -> float:
        return max(self.samples)

    def format(self, target: Target | None = None) -> str:
        """`1.23 [1.10–1.40]  target ≤ 1: met` (judged on the median), or without a target."""
        text = f"{self.median:6.2f} [{self.low:.2f}–{self.high:.2f}]"
        if target is None:
            verdict = "(no target)"
        else:
            verdict = f"{target}: {'met' if target.met(self.median) else 'not met'}"
        load = f"  {machine_load.note(max(self.loads))}" if self.loads else ""
        return f"{text}  {verdict}{load}"


@dataclass
class Rounds:
    """Seconds per round of each contender, and each contender's last result."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    # CPU seconds of this process (every thread) per round of each contender, beside its wall time.
    cpu: dict[str, list[float]] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    loads: list[float] = field(default_factory=list)  # the higher of the load before and after each round

    def ratio(self, numerator: str, denominator: str) -> Ratio:
        """`numerator`'s time / `denominator`'s time, one value per round."""
        return Ratio(
            tuple(
                top / bottom if bottom else float("inf")
                for top, bottom in zip(self.seconds[numerator], self.seconds[denominator], strict=True)
            ),
            tuple(self.loads),
        )

    def median_seconds(self, name: str) -> float:
        return statistics.median(self.seconds[name])

    def median_cpu(self, name: str) -> float:
        return statistics.median(self.cpu[name])

    def describe(self, name: str) -> str:
        """`name: 123.4 ms wall, 0.081 s CPU` (medians over the rounds)."""
        return f"{name}: {1000 * self.median_seconds(name):.1f} ms wall, {self.median_cpu(name):.3f} s CPU"


def run_rounds(
    contenders: Mapping[str, Callable[[], Any]],
    rounds: int,
    *,
    warmup: bool = True,
    seed: int = 0,
) -> Rounds:
    """Run every contender once per round, in a freshly shuffled order each round.

    With `warmup`, each contender runs once (also shuffled) before the timed rounds, so first-call costs
    (imports, JIT, footer caches) are not counted for either side. The load average is read before and
    after every round (`benchmarks.load.check`): above the limit, and not allowed, the run stops there.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    order = list(contenders)
    shuffler = random.Random(seed)
    measured = Rounds(seconds={name: [] for name in order}, cpu={name: [] for name in order})
    machine_load.check("before the rounds")
    if warmup:
        shuffler.shuffle(order)
        for name in order:
            measured.results[name] = contenders[name]()
    for number in range(1, rounds + 1):
        before = machine_load.check(f"before round {number}")
        shuffler.shuffle(order)
        for name in order:
            started, cpu_started = time.perf_counter(), time.process_time()
            measured.results[name] = contenders[name]()
            measured.seconds[name].append(time.perf_counter() - started)
            measured.cpu[name].append(time.process_time() - cpu_started)
        measured.loads.append(max(before, machine_load.check(f"during round {number}")))
    return measured


# A cached read takes a millisecond or two: a sample of repeat reads times this many back to back (the
# same on both sides), so one sample is not one timer tick after whatever the other contender left running.
REPEAT_CALLS = 10


def repeated(read: Callable[[], Any], calls: int = REPEAT_CALLS) -> Callable[[], Any]:
    """`read` `calls` times in a row (the last result returned): one sample of repeat reads."""

    def sample() -> Any:
        for _ in range(calls - 1):
            read()
        return read()

    return sample


def figure_line(figure: str, ratio: Ratio, target: Target | None, width: int = 62) -> str:
    """One printed line per figure, the same in every benchmark."""
    return f"  {figure:{width}} {ratio.format(target)}"
