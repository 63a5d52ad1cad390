"""The machine's load beside every figure, and no figures from rounds run on a busy machine.

Wall-clock ratios measured while other work shares the cores are not what an idle machine gives: a ratio's
two sides slow down unevenly. Every benchmark parses its arguments through `parse_args`, which adds

    --max-load X    refuse at a 1-minute load average above X per core (default 1.5, or $BENCH_MAX_LOAD)
    --allow-load    report anyway, marked as measured under load (or BENCH_ALLOW_LOAD=1)

prints the load when the benchmark starts and ends, and refuses to start above the limit.
`pairing.run_rounds` checks the load before and after every round and refuses to go on (so no figure is
printed) once a round ran above it; every ratio printed from rounds carries the highest load of its
rounds (`load 0.42`). With `--allow-load`, figures are printed with a warning instead.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
from dataclasses import dataclass

ENV_MAX_LOAD = "BENCH_MAX_LOAD"
ENV_ALLOW_LOAD = "BENCH_ALLOW_LOAD"
DEFAULT_MAX_LOAD_PER_CORE = 1.5


class LoadTooHigh(SystemExit):
    """The machine was too busy for trustworthy figures (exits with this message, status 1)."""


@dataclass
class Limit:
    per_core: float
    allow: bool

    @property
    def cores(self) -> int:
        return os.cpu_count() or 1

    @property
    def maximum(self) -> float:
        return self.per_core * self.cores

    def describe(self) -> str:
        return f"{self.maximum:.2f} ({self.per_core:g} per core x {self.cores} cores)"


def _env_limit() -> Limit:
    raw = os.environ.get(ENV_MAX_LOAD, "")
    try:
        per_core = float(raw) if raw else DEFAULT_MAX_LOAD_PER_CORE
    except ValueError:
        raise SystemExit(f"{ENV_MAX_LOAD}={raw!r} is not a load average per core (e.g. 1.5)") from None
    allow = os.environ.get(ENV_ALLOW_LOAD, "").strip().lower() not in ("", "0", "false", "no")
    return Limit(per_core, allow)


LIMIT = _env_limit()


def current() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def configure(per_core: float | None = None, allow: bool | None = None) -> Limit:
    if per_core is not None:
        if per_core < 0:
            raise SystemExit(f"--max-load must be a load average per core >= 0, not {per_core:g}")
        LIMIT.per_core = per_core
    if allow is not None:
        LIMIT.allow = allow
    return LIMIT


def check(when: str) -> float:
    """The load now; above the limit and not allowed, refuse (`LoadTooHigh`) saying how to proceed."""
    load = current()
    if load > LIMIT.maximum and not LIMIT.allow:
        raise LoadTooHigh(
            f"refusing to report: 1-minute load average {load:.2f} {when} is above {LIMIT.describe()}; "
            f"rerun on an idle machine, raise --max-load / {ENV_MAX_LOAD}, or pass --allow-load / "
            f"{ENV_ALLOW_LOAD}=1 to print figures measured under load"
        )
    return load


def note(load: float) -> str:
    """`load 0.42`, flagged when above the limit (only reachable with --allow-load)."""
    return f"load {load:.2f}" + (" (ABOVE LIMIT)" if load > LIMIT.maximum else "")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-load",
        type=float,
        default=None,
        help=f"refuse to report when the 1-minute load average per core exceeds this "
        f"(default {LIMIT.per_core:g}; ${ENV_MAX_LOAD})",
    )
    parser.add_argument(
        "--allow-load",
        action="store_true",
        default=None,
        help=f"report figures measured under load anyway, marked as such (${ENV_ALLOW_LOAD}=1)",
    )


def _at_end() -> None:
    load = current()
    line = f"load average at the end: {load:.2f} (limit {LIMIT.describe()})"
    if load > LIMIT.maximum:
        line += ": the figures above were measured under load, not on an idle machine"
    print(line, flush=True)


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """`parser.parse_args(argv)` with `--max-load` / `--allow-load`; prints the load and refuses to
    start above the limit unless allowed."""
    add_arguments(parser)
    args = parser.parse_args(argv)
    configure(args.max_load, args.allow_load)
    load = check("at the start")
    mode = "figures under load are reported, marked" if LIMIT.allow else "refusing figures above it"
    print(f"load average {load:.2f} at the start on {LIMIT.cores} cores; limit {LIMIT.describe()}, {mode}")
    sys.stdout.flush()
    atexit.register(_at_end)
    return args


__all__ = ["LIMIT", "LoadTooHigh", "add_arguments", "check", "configure", "current", "note", "parse_args"]
