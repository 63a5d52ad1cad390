"""Run one blocking S3 or file action over many items on a small thread pool, failing as a whole."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

_T = TypeVar("_T")
_R = TypeVar("_R")


def run_all(action: Callable[[_T], _R], items: Sequence[_T], max_concurrency: int) -> list[_R]:
    """`action` over `items` in order, in parallel when several; waits for all, then raises the first error.

    Waiting for every item before raising keeps a failure from leaving work running in the background.
    """
    if len(items) <= 1 or max_concurrency <= 1:
        return [action(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(max_concurrency, len(items))) as pool:
        futures = [pool.submit(action, item) for item in items]
        wait(futures)
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error
    return [future.result() for future in futures]
