"""Run filter parsing, binding and planning on a thread whose stack fits filters nested 1,000+ levels deep.

SQL parsing (sqlglot's recursive descent spends about twenty Python frames per level of parentheses) and
the predicate visitors recurse once per level of nesting, so `NOT NOT ... x`, forty-five nested `OR`s or a
thousand chained ones exceed Python's default limit of 1,000 frames. DuckDB accepts such filters, so a read
must too: such work runs again on a helper thread with a large stack and a raised recursion limit, and
whatever is still too deep becomes a `FilterError` that says so instead of a `RecursionError`.

Almost every filter is shallow, and starting a thread costs a third of a millisecond, a fifth of a cached
point read: the call runs inline first and moves to the deep-stack thread only when it raised a
`RecursionError` (or a `FilterError`, which a library may have made of one). The wrapped entry points
parse, plan and read: a failed first attempt leaves nothing behind that the second would not redo.
"""

from __future__ import annotations

import contextvars
import functools
import sys
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from airflow_partitions.exceptions import FilterError, QueryLimitError

P = ParamSpec("P")
R = TypeVar("R")

# The stack is reserved address space; only the pages a deep filter touches are committed.
DEEP_STACK_BYTES = 512 * 1024 * 1024
DEEP_RECURSION_LIMIT = 150_000

_state = threading.local()
_limit_lock = threading.Lock()
_active = 0
_saved_limit = 0


def _raise_limit() -> None:
    global _active, _saved_limit
    with _limit_lock:
        if _active == 0:
            _saved_limit = sys.getrecursionlimit()
            sys.setrecursionlimit(max(_saved_limit, DEEP_RECURSION_LIMIT))
        _active += 1


def _restore_limit() -> None:
    global _active
    with _limit_lock:
        _active -= 1
        if _active == 0:
            sys.setrecursionlimit(_saved_limit)


def call_with_deep_stack(function: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """`function(*args, **kwargs)`, inline, or on a deep-stack thread when inline it recursed too deep
    (at once when already on one); results and exceptions pass through, a `RecursionError` on the deep
    stack becomes a `FilterError`."""
    if getattr(_state, "deep", False):
        return function(*args, **kwargs)
    try:
        return function(*args, **kwargs)
    except QueryLimitError:
        raise  # the call's budget is spent (`limits`): running it again would spend it twice
    except (RecursionError, FilterError):
        pass  # too deep for this thread's stack, perhaps: the deep-stack thread decides
    return _on_deep_stack(function, *args, **kwargs)


def _on_deep_stack(function: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    outcome: dict[str, Any] = {}
    # The caller's context (its time and memory budget, `limits`) goes with the work to the worker.
    context = contextvars.copy_context()

    def run() -> None:
        _state.deep = True
        try:
            outcome["value"] = context.run(function, *args, **kwargs)
        except BaseException as err:  # handed to the calling thread as is
            outcome["error"] = err

    # The limit is raised before the worker starts: a worker that ran first would recurse under the
    # default limit and refuse a filter it can evaluate.
    _raise_limit()
    try:
        with _limit_lock:
            # threading.stack_size is process-wide for threads started after it: set it just for this one.
            previous = threading.stack_size(DEEP_STACK_BYTES)
            try:
                worker = threading.Thread(target=run, name="airflow-partitions-deep-filter", daemon=True)
                worker.start()
            finally:
                threading.stack_size(previous)
        worker.join()
    finally:
        _restore_limit()
    error = outcome.get("error")
    if isinstance(error, RecursionError):
        raise FilterError(
            "the filter nests too deeply to evaluate (thousands of levels of parentheses, NOT or chained "
            "AND/OR); flatten it, e.g. write `col IN (1, 2, 3)` instead of `col = 1 OR col = 2 OR col = 3`"
        ) from error
    if error is not None:
        raise error
    value: R = outcome["value"]
    return value


def deep_stack(function: Callable[P, R]) -> Callable[P, R]:
    """Decorator form of `call_with_deep_stack`, for the entry points that parse or walk user filters."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        return call_with_deep_stack(function, *args, **kwargs)

    return wrapper
