"""Source connectors: files (local or S3; parquet, CSV, JSON lines) and Postgres tables.

`open_source(ref)` turns a spec's `SourceRef` into a `Source`; nothing connects until a method needs it.
Importing this package is cheap (no pyarrow, boto3 or driver imports).
"""

from __future__ import annotations

from typing import Any

from airflow_partitions.exceptions import SourceError
from airflow_partitions.sources.base import (
    EMPTY_FINGERPRINT,
    ConnectionResolver,
    Deadline,
    KeyTuple,
    RowsSince,
    Source,
    SourceSurvey,
    connection_resolver,
    set_connection_resolver,
)
from airflow_partitions.sources.file_facts import STATE_FILE
from airflow_partitions.sources.files import FileSource
from airflow_partitions.sources.postgres import PostgresSource
from airflow_partitions.sources.renamed import RenamedSource
from airflow_partitions.spec.renames import renames_of

__all__ = [
    "EMPTY_FINGERPRINT",
    "ConnectionResolver",
    "Deadline",
    "KeyTuple",
    "RowsSince",
    "Source",
    "SourceSurvey",
    "connection_resolver",
    "keep_file_facts",
    "open_dataset_source",
    "open_source",
    "set_connection_resolver",
]


def open_source(ref: Any, *, declared_schema: Any = None, schema: Any = None) -> Source:
    """The connector for a spec `SourceRef` (`scheme`, `location`, `params`, `file_format`).

    `declared_schema` (the dataset's `schema:` block as Arrow) wins over the types the source reports:
    every read parses or casts the declared columns to them. Open a dataset's source with
    `open_dataset_source(dataset)`, which passes it. `schema` (the Arrow schema recorded when the source
    was first read, e.g. by the stage) spares the source from asking for it again.
    """
    scheme = str(getattr(ref.scheme, "value", ref.scheme))
    params = dict(ref.params or {})
    if scheme in ("file", "s3"):
        file_format = getattr(ref, "file_format", None)
        if file_format is not None:
            params.setdefault("file_format", str(getattr(file_format, "value", file_format)))
        return FileSource(
            ref.location, params=params, scheme=scheme, schema=schema, declared_schema=declared_schema
        )
    if scheme == "postgres":
        return PostgresSource(
            ref.table_schema,
            ref.table_name,
            url=ref.url,
            connection_id=ref.connection_id,
            params=params,
            schema=schema,
            declared_schema=declared_schema,
        )
    raise SourceError(f"no connector for source scheme {scheme!r}; use file:, s3:// or postgres:")


def open_dataset_source(dataset: Any, *, schema: Any = None) -> Source:
    """The connector for a spec `DatasetSpec`'s source, with the types its `schema:` block declares.

    A dataset with `renamed_columns` gets its source under the stored names (`sources.renamed`)."""
    renames = renames_of(dataset)
    if not renames:
        return open_source(dataset.source, declared_schema=dataset.declared_schema(), schema=schema)
    declared = dataset.declared_schema()
    inner = open_source(
        dataset.source,
        declared_schema=renames.to_current(declared) if declared is not None else None,
        schema=renames.to_current(schema) if schema is not None else None,
    )
    return RenamedSource(inner, renames)


def keep_file_facts(source: Source, directory: Any) -> Source:
    """Let a file source keep its per-file facts in `directory` (the dataset's directory, where its
    partition files live), so each refresh learns only new or changed files; other sources keep none."""
    use = getattr(source, "use_file_facts", None)
    if use is not None:
        from pathlib import Path

        use(Path(directory) / STATE_FILE)
    return source
