"""The Spark stage over source files the executors read themselves (`StageMode.WRITTEN`, Parquet sources).

When the executors write the partition files, Spark's own read of the source ends in a hand-off of every
routed row from the JVM to the Python writers (Arrow batches through `mapInArrow`), about half the time of
a plain Spark `partitionBy` job. For a source the executors can read with pyarrow, the stage distributes
the source files instead: the driver cuts them into splits (a large file by runs of row groups) and packs
them into tasks of about Spark's own split size (`sources/files/splits.py`); one Spark task per group
(`spark.range(tasks)` + `mapInArrow`) reads its splits with pyarrow under the source schema (drifting
files unified, as the Arrow strategy reads them), routes the rows with the dataset's transforms
(`write/routing.py`, the code the Arrow strategy routes with), drops the rows of partitions the plan does
not hold, and writes each planned partition's rows with `written.write_item`. Each task returns the same
per-item metadata rows as the routed path, plus one summary row (`SUMMARY_ITEM`): the rows it read, the
rows it routed to planned partitions, or why a file could not be read (then it writes nothing and the
stage fails, naming the file; what other tasks wrote is removed). Each partition gets up to one file per
task, as when the routed path skips its shuffle.

Spark keeps reading (`split_read_refusal` says why, in the stage result and the log): sources that are
not Parquet files (Postgres, CSV, JSON), Hive layouts (values from the directories), renamed columns,
appends (per-partition watermark filters), Spark Connect (its task count is not known here), a requested
shuffle by item, and splits that would write too many small files (more tasks than the routed path
writes unshuffled: Spark then shuffles by item).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import RefreshError, SourceError
from airflow_partitions.refresh.written import (
    RESULT_SCHEMA_DDL,
    ItemWriteJob,
    WrittenItem,
    merge_item_rows,
    result_schema,
    write_item,
)
from airflow_partitions.sources.files import FileSource
from airflow_partitions.sources.files.splits import Split, SplitReader, group_splits
from airflow_partitions.sources.renamed import RenamedSource
from airflow_partitions.write.routing import route_rows

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.sources import Source
    from airflow_partitions.sources.base import KeyTuple, RowsSince
    from airflow_partitions.transforms import Transform

# The item number of a task's summary row: `routed` holds the rows the task read, `written` the rows it
# routed to planned partitions, `error` why a split could not be read.
SUMMARY_ITEM = -1
BATCH_ROWS = 256 * 1024
# Spark's defaults for `spark.sql.files.maxPartitionBytes` and `spark.sql.files.openCostInBytes`.
_MAX_SPLIT_BYTES = 128 * 1024 * 1024
_OPEN_COST_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class SplitReadJob:
    """Everything an executor needs to read, route and write its splits (pickled into the Spark job)."""

    write: ItemWriteJob
    reader: SplitReader
    partition_names: tuple[str, ...]
    tasks: tuple[tuple[Split, ...], ...]


@dataclass(frozen=True)
class SplitReadChoice:
    """How the stage reads the source: `tasks` (None: Spark reads it) and the note saying why."""

    tasks: tuple[tuple[Split, ...], ...] | None
    note: str


def split_read_refusal(
    source: Source, sinces: Sequence[RowsSince | None], shuffle_items: bool | None, spark: Any
) -> str | None:
    """Why Spark reads the source in this stage (None: the executors can read its files with pyarrow)."""
    if isinstance(source, RenamedSource):
        return "renamed columns: Spark reads the source under its stored names"
    if not isinstance(source, FileSource):
        return f"{source.describe()}: Spark reads this source kind"
    if source.file_format != "parquet":
        return f"{source.file_format} files: Spark parses them"
    if source.hive_columns:
        return "Hive directory columns: Spark reads their values from the paths"
    if any(since is not None for since in sinces):
        return "an append keeps rows past each partition's watermark: Spark filters them"
    if shuffle_items:
        return "a shuffle by item was asked for (one file per partition)"
    if _parallelism(spark) is None:
        return "Spark Connect: the executors' parallelism is not known here"
    return None


def choose_split_read(
    spark: Any,
    source: Source,
    transforms: Sequence[Transform],
    keys: Sequence[KeyTuple] | None,
    items: int,
    *,
    sinces: Sequence[RowsSince | None],
    shuffle_items: bool | None,
    requested: bool | None,
    max_tasks: int,
    max_files: int,
) -> SplitReadChoice:
    """Whether the executors read the source files themselves (`requested`: True insists, False keeps
    Spark's read, None decides): the splits per task, or None with the reason Spark reads. More than
    `max_tasks` tasks, or `max_files` files in all, keep Spark's read (which then shuffles by item)."""

    refusal = "not asked for" if requested is False else None
    refusal = refusal or split_read_refusal(source, sinces, shuffle_items, spark)
    tasks: list[tuple[Split, ...]] = []
    if refusal is None:
        assert isinstance(source, FileSource)
        files = source.files_for_keys(transforms, keys)
        total = sum(f.size for f in files)
        parallel = _parallelism(spark) or 1
        open_cost = _conf_bytes(spark, "spark.sql.files.openCostInBytes", _OPEN_COST_BYTES)
        target = min(
            _conf_bytes(spark, "spark.sql.files.maxPartitionBytes", _MAX_SPLIT_BYTES),
            max(open_cost, (total + len(files) * open_cost) // parallel),
        )
        tasks = group_splits(source.splits(files, target), target, open_cost)
        if not tasks:
            refusal = "no source file can hold the planned partitions' rows"
        elif len(tasks) > max_tasks or len(tasks) * items > max_files:
            refusal = (
                f"{len(tasks)} read tasks x {items} partitions would write too many small files: "
                "Spark shuffles by item"
            )
        else:
            files_read = len({split.path for task in tasks for split in task})
            note = f"pyarrow on the executors: {files_read} parquet file(s) in {len(tasks)} task(s)"
            return SplitReadChoice(tuple(tasks), note)
    if requested:
        raise RefreshError(f"the executors cannot read {source.describe()} themselves: {refusal}")
    return SplitReadChoice(None, f"Spark reads the source: {refusal}")


def _parallelism(spark: Any) -> int | None:
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return None
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:
        return None


def _conf_bytes(spark: Any, key: str, default: int) -> int:
    """A Spark size setting in bytes (`134217728b`, `128m`, `128MB`: binary units as Spark reads them)."""
    import re

    try:
        text = str(spark.conf.get(key) or "")
    except Exception:
        return default
    match = re.fullmatch(r"\s*([0-9]+)\s*([kmgt]?)b?\s*", text.lower())
    if match is None:
        return default
    return int(match.group(1)) * 1024 ** "_kmgt".index(match.group(2) or "_")


def run_split_read(spark: Any, job: SplitReadJob) -> tuple[int, int, dict[int, WrittenItem], list[str]]:
    """One Spark task per group of splits reads, routes and writes them: (rows read, rows routed to
    planned partitions, the written items, the reads that failed)."""
    from functools import partial

    count = len(job.tasks)
    frame = spark.range(0, count, 1, count).mapInArrow(partial(read_route_write, job), RESULT_SCHEMA_DDL)
    try:
        rows = frame.toArrow().to_pylist()
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RefreshError(
            f"the Spark stage job reading {job.reader.describe} on the executors failed: {first[:800]}"
        ) from err
    summaries = [row for row in rows if row["item"] == SUMMARY_ITEM]
    written = merge_item_rows([row for row in rows if row["item"] != SUMMARY_ITEM])
    errors = [str(row["error"]) for row in summaries if row["error"]]
    read = sum(int(row["routed"]) for row in summaries)
    routed = sum(int(row["written"]) for row in summaries)
    return read, routed, written, errors


def read_route_write(job: SplitReadJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The executor side (`mapInArrow` over task numbers): read the task's splits, route their rows, write
    each planned partition's rows; one metadata row per item written and one summary row."""
    import pyarrow as pa

    tasks = [int(task) for batch in batches for task in batch.column(0).to_pylist()]
    if not tasks:
        return
    schema = job.write.arrow_schema()
    planned = {path: index for index, path in enumerate(job.write.key_paths)}
    parts: dict[int, list[pa.Table]] = {}
    read = routed = 0
    try:
        for split in (split for task in tasks for split in job.tasks[task]):
            for table in job.reader.batches(split, schema, batch_rows=BATCH_ROWS):
                read += table.num_rows
                for key, rows in route_rows(table, job.write.transforms, dataset=job.write.dataset).items():
                    index = planned.get(key.path(job.partition_names))
                    if index is not None:  # a partition the plan does not refresh: not written
                        parts.setdefault(index, []).append(rows)
                        routed += rows.num_rows
    except SourceError as err:  # nothing written by this task; the driver fails the stage with this
        yield pa.RecordBatch.from_pylist([_summary(read, routed, str(err))], schema=result_schema())
        return
    results = [
        write_item(job.write, schema, index, pa.concat_tables(parts[index])) for index in sorted(parts)
    ]
    results.append(_summary(read, routed, None))
    yield pa.RecordBatch.from_pylist(results, schema=result_schema())


def _summary(read: int, routed: int, error: str | None) -> dict[str, Any]:
    return {
        "item": SUMMARY_ITEM,
        "routed": read,
        "written": routed,
        "files": json.dumps([]),
        "error": error[:2000] if error else None,
        "changed": None,
        "certificate": None,
    }
