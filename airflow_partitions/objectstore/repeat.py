"""The repeat rule for transient S3 faults, shared by every client stack (boto3 store, pyarrow reads,
the transfer manager): an idempotent request that failed transiently is sent again after a growing,
jittered pause, `REQUEST_ATTEMPTS` times in all."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from airflow_partitions.objectstore.errors import is_transient

# Attempts of an idempotent request whose failures are transient (each one already retried by botocore).
# botocore's retry quota runs dry under a burst of faults, and then it sends each request once.
REQUEST_ATTEMPTS = 8
_BACKOFF_SECONDS = 0.05
_MAX_BACKOFF_SECONDS = 1.0
_T = TypeVar("_T")


def repeat_transient(call: Callable[[], _T], attempts: int = REQUEST_ATTEMPTS) -> _T:
    """`call()`, repeated after a growing, jittered pause while it fails transiently; the last error else."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except Exception as err:
            if attempt == attempts or not is_transient(err):
                raise
            time.sleep(transient_backoff(attempt))
    raise AssertionError("unreachable")


def transient_backoff(attempt: int) -> float:
    """Seconds to wait before sending a request again after its `attempt`-th transient failure."""
    return random.uniform(0.5, 1.0) * min(_MAX_BACKOFF_SECONDS, _BACKOFF_SECONDS * 2**attempt)
