"""File sources: parquet, CSV and JSON-lines files on a local disk or S3, as paths, directories or globs.

Hive-style directories (`col=value/`) are detected: when a partition expression reads a Hive column, each
file maps to one partition value without being opened, so fingerprints are per partition, discovery can
list instead of scan, and a partition can be read from its own files (pushdown). Without such a layout,
per-file facts learnt once per file (`sources/file_facts.py`: its distinct keys, else its column ranges)
map each file to the partitions it can feed, so fingerprints are per partition there too.

`FileSource` (`source.py`) is the connector; each of its jobs lives in its own module: `place` (where the
files are, local or S3, and their listing), `formats` (per-format parsing rules), `schemas` (one schema
from every file's own), `arrow_reads` (pyarrow reads and their errors), `partitions` (which partitions each
file feeds) and `spark_read` (the rows as a Spark frame).
"""

from __future__ import annotations

from airflow_partitions.sources.base import EMPTY_FINGERPRINT
from airflow_partitions.sources.files.arrow_reads import filter_to_key
from airflow_partitions.sources.files.formats import FORMAT_ALIASES, csv_convert_options
from airflow_partitions.sources.files.partitions import STATIC_MAPPING_LIMIT
from airflow_partitions.sources.files.place import SourceFile, glob_to_regex
from airflow_partitions.sources.files.source import FileSource
from airflow_partitions.sources.schema import unify_types

__all__ = [
    "EMPTY_FINGERPRINT",
    "FORMAT_ALIASES",
    "STATIC_MAPPING_LIMIT",
    "FileSource",
    "SourceFile",
    "csv_convert_options",
    "filter_to_key",
    "glob_to_regex",
    "unify_types",
]
