"""Time and memory budgets that bound a whole read, plan or query, from its first parse to its last row.

A `Budget` starts when a call begins (`budget(...)`), not when DuckDB starts: parsing, checking and
pruning a 30,000-term OR spend their share of it, checked between steps and inside the loops that grow
with the filter (`check_budget`). DuckDB work runs under `run_bounded`: a timer interrupts the
connection when the budget's time is spent, DuckDB's own `memory_limit` bounds its buffers, and
`address_space_guard` bounds everything else the process allocates meanwhile (a list built by
`generate_series`, a string built by `repeat`, which DuckDB's limit does not count): while bounded work
runs, the process's soft `RLIMIT_AS` is its address space at the start plus the memory of every bounded
call running, plus `ADDRESS_SPACE_HEADROOM`, so an allocation past it fails (DuckDB raises
`OutOfMemoryException`, Python `MemoryError`) instead of taking the machine's memory. The guard is
process-wide: other threads of the process share the cap while a bounded call runs. Where `RLIMIT_AS` is
not enforced (not Linux), DuckDB's memory limit is the only bound.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from airflow_partitions.exceptions import QueryLimitError

T = TypeVar("T")

# Address space a bounded call may take beyond its memory limit: thread stacks and allocator arenas
# reserved (not used) by the threads DuckDB and Arrow start, the result's conversion to Arrow.
ADDRESS_SPACE_HEADROOM = 512 * 1024**2
# How often the watchdog looks for spent budgets: a time limit holds to within this.
WATCHDOG_TICK = 0.02
_UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?i?B)", re.IGNORECASE)


def size_in_bytes(size: str | int) -> int:
    """Bytes of a DuckDB size ('512MB', '1.5 GiB') or of a number of bytes."""
    if isinstance(size, int):
        return size
    match = _SIZE.fullmatch(size.strip())
    if match is None:
        raise QueryLimitError(f"memory_limit must be a size such as '512MB' or '4GB', not {size!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


@dataclass
class Budget:
    """What one call may still spend: `seconds` from `started`, `memory_bytes` at a time."""

    seconds: float
    memory_bytes: int | None
    hint: str
    started: float

    def remaining(self) -> float:
        return max(0.0, self.seconds - (time.monotonic() - self.started))

    def check(self) -> None:
        if time.monotonic() - self.started > self.seconds:
            raise self.timeout_error()

    def timeout_error(self) -> QueryLimitError:
        return QueryLimitError(
            f"the query ran past its {self.seconds:g} s time limit (parsing and pruning included) and was "
            f"stopped; read fewer partitions (a WHERE on the partition columns opens fewer files), use a "
            f"shorter filter, or raise the limit: {self.hint}",
            limit="timeout",
        )

    def memory_error(self, memory: str) -> QueryLimitError:
        return QueryLimitError(
            f"the query needed more than its {memory} memory limit; read fewer partitions or columns, or "
            f"raise the limit: {self.hint}",
            limit="memory",
        )


_current: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("airflow_partitions_budget")


@contextlib.contextmanager
def budget(seconds: float, memory_bytes: int | None, hint: str) -> Iterator[Budget]:
    """Run the block under a budget starting now; an enclosing budget that ends sooner stays in force."""
    outer = _current.get(None)
    if outer is not None and outer.remaining() <= seconds:
        yield outer
        return
    started = Budget(seconds, memory_bytes, hint, time.monotonic())
    token = _current.set(started)
    try:
        yield started
    finally:
        _current.reset(token)


def current_budget() -> Budget | None:
    return _current.get(None)


def check_budget() -> None:
    """`QueryLimitError` when the running call's budget is spent (cheap: call it inside loops)."""
    current = _current.get(None)
    if current is not None:
        current.check()


def run_bounded(connection: Any, call: Callable[[], T], *, memory: str | None = None) -> T:
    """`call()` (DuckDB work on `connection`) under the current budget: interrupted when its time is
    spent, its allocations capped (`address_space_guard`). Without a budget, `call()` as it is.

    `memory`: the DuckDB memory limit as the connection has it, for the message.
    """
    import duckdb

    current = _current.get(None)
    if current is None:
        return call()
    current.check()
    timed_out = threading.Event()

    def interrupt() -> None:
        timed_out.set()
        connection.interrupt()

    alarm = _WATCHDOG.arm(current.remaining(), interrupt)
    shown = memory or f"{(current.memory_bytes or 0) / 1024**2:g}MiB"
    try:
        with address_space_guard(current.memory_bytes):
            return call()
    except duckdb.InterruptException as err:
        if not timed_out.is_set():
            raise
        raise current.timeout_error() from err
    except (duckdb.OutOfMemoryException, MemoryError) as err:
        raise current.memory_error(shown) from err
    except duckdb.Error as err:
        # An interrupt can surface as another DuckDB error when it lands while DuckDB binds.
        if timed_out.is_set():
            raise current.timeout_error() from err
        if "bad allocation" in str(err) or "Out of Memory" in str(err):
            raise current.memory_error(shown) from err
        raise
    finally:
        _WATCHDOG.disarm(alarm)


class _Watchdog:
    """One daemon thread that calls each armed function once its time has come, checking every
    `WATCHDOG_TICK` seconds (a timer thread per call, or waking this one per call, cost ~0.1 ms: a tenth
    of a cached point read). It ends after a second with nothing armed and starts again when needed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._alarms: dict[int, tuple[float, Callable[[], None]]] = {}
        self._next = 0
        self._running = False

    def arm(self, seconds: float, function: Callable[[], None]) -> int:
        with self._lock:
            ticket = self._next
            self._next += 1
            self._alarms[ticket] = (time.monotonic() + seconds, function)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="airflow-partitions-limits", daemon=True).start()
            return ticket

    def disarm(self, ticket: int) -> None:
        with self._lock:
            self._alarms.pop(ticket, None)

    def _run(self) -> None:
        idle_since = time.monotonic()
        while True:
            time.sleep(WATCHDOG_TICK)
            now = time.monotonic()
            with self._lock:
                due = [ticket for ticket, (at, _) in self._alarms.items() if at <= now]
                functions = [self._alarms.pop(ticket)[1] for ticket in due]
                if self._alarms or functions:
                    idle_since = now
                elif now - idle_since > 1.0:
                    self._running = False
                    return
            for function in functions:
                function()


_WATCHDOG = _Watchdog()


class _AddressSpace:
    """The process's soft `RLIMIT_AS` while bounded calls run (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: dict[int, int] = {}
        self._next = 0
        self._base = 0
        self._original: tuple[int, int] | None = None

    @contextlib.contextmanager
    def guard(self, memory_bytes: int | None) -> Iterator[None]:
        if memory_bytes is None or not _enforced():
            yield
            return
        with self._lock:
            ticket = self._next
            self._next += 1
            if not self._active:
                import resource

                self._original = resource.getrlimit(resource.RLIMIT_AS)
                self._base = _address_space()
            self._active[ticket] = memory_bytes
            self._apply()
        try:
            yield
        finally:
            with self._lock:
                del self._active[ticket]
                self._apply()

    def _apply(self) -> None:
        import resource

        assert self._original is not None
        soft, hard = self._original
        if self._active:
            cap = self._base + sum(self._active.values()) + ADDRESS_SPACE_HEADROOM
            if hard != resource.RLIM_INFINITY:
                cap = min(cap, hard)
            if soft != resource.RLIM_INFINITY:
                cap = min(cap, soft)
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
        else:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _enforced() -> bool:
    """Whether the kernel enforces `RLIMIT_AS` here and the process's address space can be read."""
    return os.path.exists("/proc/self/statm")


_statm: tuple[int, int] | None = None  # (pid, descriptor): re-read in place, a fresh open costs 45 us


def _address_space() -> int:
    """The process's virtual memory size in bytes (`/proc/self/statm`); called under the guard's lock."""
    global _statm
    if _statm is None or _statm[0] != os.getpid():
        _statm = (os.getpid(), os.open(f"/proc/{os.getpid()}/statm", os.O_RDONLY))
    pages = int(os.pread(_statm[1], 256, 0).split()[0])
    return pages * os.sysconf("SC_PAGE_SIZE")


_ADDRESS_SPACE = _AddressSpace()


def address_space_guard(memory_bytes: int | None) -> contextlib.AbstractContextManager[None]:
    """Cap the process's address space at its size now plus `memory_bytes` (and the headroom) for the
    block; concurrent blocks add up. None: no cap."""
    return _ADDRESS_SPACE.guard(memory_bytes)
