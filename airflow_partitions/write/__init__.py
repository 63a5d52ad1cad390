"""Writes routed by partition key: append, upsert on key columns and delete by filter, each one atomic
catalog commit.

`routing` and `merge` are the row-level primitives (also used by the refresh modes that apply changes);
`commit` plans, writes and publishes a write; `write_through` sends the rows to a Postgres source first.
Importing this package loads no pyarrow.
"""

from __future__ import annotations

from airflow_partitions.write.commit import (
    WriteOperation,
    WriteResult,
    WriteTarget,
    append,
    delete,
    open_write_target,
    upsert,
)
from airflow_partitions.write.rows import RowsFile
from airflow_partitions.write.write_through import write_through

__all__ = [
    "RowsFile",
    "WriteOperation",
    "WriteResult",
    "WriteTarget",
    "append",
    "delete",
    "open_write_target",
    "upsert",
    "write_through",
]
