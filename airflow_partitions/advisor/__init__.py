"""The partition advisor: what a dataset's layout costs its recorded reads, and which layout costs less.

`advise(project, dataset)` returns an `Advice`: findings over the newest catalog version (skewed
partitions and their top keys, tiny and huge files and partitions against the target file size, partitions
no recorded read opened, filters that prune nothing), candidate layouts simulated against the recorded
filters (`read.read_stats`) and the data itself, the winner with the `partition_by` to paste, and
`sort_by` advice with the row groups it would skip. `size_findings(entries)` is the cheap part (catalog
only) the Partitions page shows.
"""

from __future__ import annotations

from airflow_partitions.advisor.findings import SKEW_FACTOR, size_findings
from airflow_partitions.advisor.layout import Advice, Candidate, advise

__all__ = ["SKEW_FACTOR", "Advice", "Candidate", "advise", "size_findings"]
