"""Write-through for a Postgres source: the rows go to the source table in one transaction first, then to
the acceleration in one catalog commit.

The order is the safe one: the source is the truth the acceleration is rebuilt from. The acceleration's
changes are planned first (so a bad input or an unusable key is refused before anything is written), the
source transaction is committed, and only then are the partition files written and the catalog committed.
If that last step fails, the source keeps its committed rows and `WriteThroughError` names the partitions
to refresh (`refresh --partitions ...`): a refresh of those partitions reads the source and catches the
acceleration up. A committed write-through records no source fingerprint on the partitions it changed, so
the next refresh rebuilds them from the source as well.

Rows reach Postgres through `COPY` into a temporary table shaped `LIKE` the target (the source's own
column types convert the values), then one `INSERT ... SELECT` (append) or `INSERT ... ON CONFLICT (keys)
DO UPDATE` (upsert; the key columns need a unique index or primary key in Postgres). The rows the INSERT
reports must be the rows given, else the transaction is rolled back (`ConservationError`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import ConservationError, WriteError, WriteThroughError
from airflow_partitions.quoting import quote_identifier
from airflow_partitions.sources import open_dataset_source
from airflow_partitions.sources.postgres import PostgresSource
from airflow_partitions.spec.model import SourceScheme
from airflow_partitions.write.commit import (
    KeyClaim,
    PartitionChange,
    WriteOperation,
    WriteResult,
    WriteTarget,
    append_changes,
    commit_changes,
    committed_earlier,
    open_write_target,
    prepare_rows,
    resolve_keys,
    upsert_changes,
)
from airflow_partitions.write.merge import check_unique_keys

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.catalog import Catalog
    from airflow_partitions.table import DatasetHandle


def write_through(
    handle: DatasetHandle,
    data: Any,
    *,
    operation: WriteOperation | str = WriteOperation.APPEND,
    keys: Sequence[str] | None = None,
    catalog: Catalog | None = None,
    commit_id: str | None = None,
    source_url: str | None = None,
) -> WriteResult:
    """Append or upsert `data` into the dataset's Postgres table (one transaction), then its acceleration.

    `source_url` overrides the source's connection (the Airflow layer resolves `connection_id` itself).
    Raises `WriteThroughError` when the source committed but the acceleration did not.
    """
    import time

    started = time.monotonic()
    dataset = handle.dataset
    operation = WriteOperation(operation)
    if operation is WriteOperation.DELETE:
        raise WriteError(
            "write-through covers append and upsert; to delete, delete the rows in the source and refresh "
            "the partitions they were in (or delete from the acceleration only, without write_through)"
        )
    if dataset.source.scheme is not SourceScheme.POSTGRES:
        raise WriteError(
            f"dataset {dataset.name!r}: write_through needs a Postgres source, not {dataset.source.uri}; "
            "write to the acceleration only (without write_through), or to the source and refresh"
        )
    target = open_write_target(handle, catalog=catalog)
    earlier = committed_earlier(target, operation, commit_id, started)
    if earlier is not None:
        return earlier  # a retry of a write-through that went through: the source has the rows already
    rows = prepare_rows(target, data)
    key_columns: tuple[str, ...] = ()
    if operation is WriteOperation.UPSERT:
        key_columns = resolve_keys(target, keys, what="upsert")
        check_unique_keys(rows, key_columns)
        changes = upsert_changes(target, rows, key_columns)
    else:
        changes = append_changes(target, rows)
    written = write_source_rows(target, rows, key_columns, source_url=source_url)
    partitions = tuple(sorted(c.key_path for c in changes if c.changes_anything))
    try:
        return commit_changes(
            target,
            operation,
            changes,
            rows_in=rows.num_rows,
            commit_id=commit_id,
            keep_fingerprints=False,
            started=started,
            claim=KeyClaim(rows.select(list(key_columns)), key_columns) if key_columns else None,
        )
    except Exception as err:
        raise through_failed(target, operation, written, partitions, err) from err


def through_failed(
    target: WriteTarget,
    operation: WriteOperation,
    written: int,
    partitions: tuple[str, ...],
    err: BaseException,
) -> WriteThroughError:
    shown = " ".join(f"'{p}'" for p in partitions[:20]) + (" ..." if len(partitions) > 20 else "")
    return WriteThroughError(
        f"dataset {target.dataset.name!r}: the {operation} of {written} row(s) is committed in the source "
        f"{target.dataset.source.uri}, but not in the acceleration ({type(err).__name__}: {err}). The source "
        "keeps the rows; refresh the partitions they touch to catch the acceleration up: "
        f"`airflow-partitions refresh SPEC {target.dataset.name} --partitions {shown}` (or a full refresh). "
        "Do not write the rows again: they are already in the source.",
        source_rows=written,
        partitions=partitions,
    )


def write_source_rows(
    target: WriteTarget, rows: pa.Table, keys: Sequence[str], *, source_url: str | None = None
) -> int:
    """Insert (or upsert on `keys`) `rows` into the source table in one committed transaction; the count."""
    import psycopg

    source = open_dataset_source(target.dataset)
    if not isinstance(source, PostgresSource):  # the spec said postgres: the connector must agree
        raise WriteError(f"write_through needs a Postgres source, got {source.describe()}")
    table_sql = source.table.sql
    names = rows.column_names
    columns = ", ".join(quote_identifier(n) for n in names)
    insert = f"INSERT INTO {table_sql} ({columns}) SELECT {columns} FROM ap_write_rows"
    if keys:
        conflict = ", ".join(quote_identifier(k) for k in keys)
        # Every key column a key too: update one to itself, so the row counts as written.
        changed = [n for n in names if n not in keys] or [keys[0]]
        updates = ", ".join(f"{quote_identifier(n)} = EXCLUDED.{quote_identifier(n)}" for n in changed)
        insert += f" ON CONFLICT ({conflict}) DO UPDATE SET {updates}"
    try:
        with psycopg.connect(source_url or source.url) as conn:
            with conn.cursor() as cur:
                cur.execute("SET TIME ZONE 'UTC'")
                cur.execute(f"CREATE TEMP TABLE ap_write_rows (LIKE {table_sql}) ON COMMIT DROP")
                with cur.copy(f"COPY ap_write_rows ({columns}) FROM STDIN") as copy:
                    for batch in rows.to_batches(max_chunksize=10_000):
                        values = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
                        for row in zip(*values, strict=True):
                            copy.write_row(row)
                cur.execute(insert)
                inserted = cur.rowcount
                if inserted != rows.num_rows:
                    conn.rollback()
                    raise ConservationError(
                        target.dataset.name,
                        {f"[source {source.table}]": (rows.num_rows, inserted)},
                        expected="rows given to the write",
                        actual="rows the source INSERT wrote",
                        hint="The source transaction was rolled back; nothing was written anywhere.",
                    )
            conn.commit()
    except ConservationError:
        raise
    except psycopg.Error as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        hint = ""
        if keys and "no unique or exclusion constraint" in str(err):
            hint = f" (upsert needs a primary key or unique index on {list(keys)} in {source.table})"
        raise WriteError(
            f"dataset {target.dataset.name!r}: the source {source.table} refused the rows: {detail}{hint}; "
            "its transaction was rolled back and nothing was written anywhere"
        ) from err
    return int(inserted)


__all__ = ["PartitionChange", "write_source_rows", "write_through"]
