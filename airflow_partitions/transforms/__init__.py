"""Partition transforms: parse a `partition_by` expression and evaluate it on Arrow, scalars and Spark.

`parse_transform(expr)` returns a `Transform`; `transform.bind(arrow_type)` checks it against the
column type. One definition per transform serves every engine: `apply` (vectorised over Arrow arrays),
`apply_scalar` (one Python value, e.g. a query literal while pruning), `to_spark` (a Spark column
expression) and, for DuckDB, `duckdb_functions.register_duckdb_functions`. For pruning, each transform
projects conditions on its column onto its partition values (`project`, `project_in`, `project_range`;
the vocabulary is in `projection.py`).

Partition value semantics (the same in every engine):

* NULL in gives NULL out; the NULL partition is distinct from every value, including "null".
* Naive timestamps are UTC wall time; tz-aware timestamps are converted to UTC before any calendar
  arithmetic. `date_trunc` over timestamps gives `timestamp[us]` (or `timestamp[us, UTC]` for
  tz-aware input); over dates it gives a date. `date_part` gives int32 calendar numbers (2026, 1..12,
  1..31, 0..23; ISO weeks starting on Monday).
* `bucket(N, col)` is Iceberg's bucket (Murmur3 x86_32, seed 0) with int64 values, or int32 for
  `bucket(N::int32, col)`. `truncate(W, col)` is Iceberg's truncate. `col % N` keeps the sign of the
  dividend (SQL), in the column's integer type.
* Column names are case-sensitive and taken exactly as written; quote names that are not plain
  identifiers.

Nothing here imports pyarrow, numpy or pyspark at import time (DAG files import the spec, which imports
this package); the evaluation modules load them on first use.
"""

from __future__ import annotations

from airflow_partitions.transforms.base import Interval, Transform
from airflow_partitions.transforms.bucket import MAX_BUCKETS, BucketTransform
from airflow_partitions.transforms.identity import IdentityTransform
from airflow_partitions.transforms.mod import ModTransform
from airflow_partitions.transforms.parse import parse_transform
from airflow_partitions.transforms.plain_sql import SUPPORTED_FORMS
from airflow_partitions.transforms.temporal import DATE_UNITS, DatePartTransform, DateTruncTransform
from airflow_partitions.transforms.truncate import TruncateTransform

__all__ = [
    "DATE_UNITS",
    "MAX_BUCKETS",
    "SUPPORTED_FORMS",
    "BucketTransform",
    "DatePartTransform",
    "DateTruncTransform",
    "IdentityTransform",
    "Interval",
    "ModTransform",
    "Transform",
    "TruncateTransform",
    "parse_transform",
]
