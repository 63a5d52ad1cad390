"""How much memory and local disk the in-process Arrow refresh may use: the memory budget that decides
`strategy: auto` (`AP_ARROW_MEMORY_BUDGET`), the spill budget of the streaming path
(`AP_ARROW_SPILL_BUDGET`) and where spill files go (`AP_ARROW_SPILL_DIR`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from airflow_partitions.exceptions import RefreshError

BUDGET_ENV = "AP_ARROW_MEMORY_BUDGET"
BUDGET_CONFIG_ENV = "AIRFLOW__AIRFLOW_PARTITIONS__ARROW_MEMORY_BUDGET"
SPILL_ENV = "AP_ARROW_SPILL_BUDGET"
SPILL_CONFIG_ENV = "AIRFLOW__AIRFLOW_PARTITIONS__ARROW_SPILL_BUDGET"
SPILL_DIR_ENV = "AP_ARROW_SPILL_DIR"
# The default spill budget: half the Arrow memory budget, at most this.
MAX_DEFAULT_SPILL_BUDGET = 1 << 30
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}


def parse_bytes(text: str, *, setting: str = BUDGET_ENV) -> int:
    """Bytes from `2GiB`, `512 MB`, `1e9` or a plain integer; `RefreshError` naming `setting` otherwise."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if match is None or match.group(2) not in _UNITS:
        raise RefreshError(
            f"{setting} is {text!r}; give bytes with an optional unit, e.g. 4GiB, 512MB or 1000000000 "
            "(0: never pick the in-process Arrow path)"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def machine_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def arrow_memory_budget() -> int:
    """The memory the Arrow path may use: the configured budget, else a quarter of the machine's memory."""
    for setting in (BUDGET_ENV, BUDGET_CONFIG_ENV):
        raw = os.environ.get(setting)
        if raw is not None and raw.strip():
            return parse_bytes(raw, setting=setting)
    memory = machine_memory()
    return memory // 4 if memory else 1024**3


def positive_bytes(raw: str, setting: str, hint: str) -> int:
    """`raw` (bytes with an optional unit) from `setting`, which must be positive; else `RefreshError`
    quoting it, followed by `hint` (what the setting means, with an example)."""
    budget = parse_bytes(raw, setting=setting)
    if budget <= 0:
        raise RefreshError(f"{setting} is {raw!r}; {hint}")
    return budget


def arrow_spill_budget() -> int:
    """The bytes the streaming router may buffer before it spills: the configured budget, else half the
    Arrow memory budget (`arrow_memory_budget`), at most `MAX_DEFAULT_SPILL_BUDGET`."""
    for setting in (SPILL_ENV, SPILL_CONFIG_ENV):
        raw = os.environ.get(setting)
        if raw is not None and raw.strip():
            return positive_bytes(
                raw,
                setting,
                "the spill budget must be positive (bytes the Arrow refresh may buffer in memory before it "
                "spills to local disk), e.g. 512MiB",
            )
    memory = arrow_memory_budget()
    return min(MAX_DEFAULT_SPILL_BUDGET, memory // 2) if memory > 0 else MAX_DEFAULT_SPILL_BUDGET


def spill_base(accelerator_dir: Path) -> Path:
    """Where spill directories are made: `AP_ARROW_SPILL_DIR`, else `<accelerator_dir>/_scratch`."""
    configured = os.environ.get(SPILL_DIR_ENV)
    return Path(configured) if configured and configured.strip() else Path(accelerator_dir) / "_scratch"
