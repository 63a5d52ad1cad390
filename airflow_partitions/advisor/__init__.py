"""The partition advisor: what a dataset's layout costs its recorded reads, and which layout costs less.

`advise(project, dataset)` (`advisor.layout`) returns an `Advice`: findings over the newest catalog version
(skewed partitions and their top keys, tiny and huge files and partitions against the target file size,
partitions no recorded read opened, filters that prune nothing), candidate layouts simulated against the
recorded filters (`read.read_stats`) and the data itself, the winner with the `partition_by` to paste, and
`sort_by` advice with the row groups it would skip. `size_findings` (`advisor.findings`) is the cheap part
(catalog only) that `status --partitions` and the Partitions page show; importing it loads no numpy,
pyarrow or DuckDB.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_partitions.advisor.findings import DEFAULT_TARGET_FILE_BYTES, SKEW_FACTOR, size_findings

if TYPE_CHECKING:
    from airflow_partitions.advisor.layout import Advice


def advise(*args: Any, **kwargs: Any) -> Advice:
    """`advisor.layout.advise` (imported on first use: it needs pyarrow and numpy)."""
    from airflow_partitions.advisor.layout import advise as run  # lazy: loads numpy and pyarrow

    return run(*args, **kwargs)


__all__ = ["DEFAULT_TARGET_FILE_BYTES", "SKEW_FACTOR", "advise", "size_findings"]
