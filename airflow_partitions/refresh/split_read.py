"""The Spark stage over source files the executors read themselves (`StageMode.WRITTEN`, Parquet sources).

When the executors write the partition files, Spark's own read of the source ends in a hand-off of every
routed row from the JVM to the Python writers (Arrow batches through `mapInArrow`), about half the time of
a plain Spark `partitionBy` job. For a source the executors can read with pyarrow, the stage distributes
the source files instead: the driver cuts them into splits of at most Spark's own split size (a large
file by runs of row groups) and packs them, in order, into one task per executor core of about equal
bytes (`sources/files/splits.py`); one Spark task per group (`spark.range(tasks)` + `mapInArrow`) reads
its splits in sequence with pyarrow under the source schema (drifting files unified, as the Arrow
strategy reads them), routes the rows with the dataset's transforms (`write/routing.py`, the code the
Arrow strategy routes with), drops the rows of partitions the plan does not hold, and holds each planned
partition's rows. When the rows a task holds pass its memory budget (`AP_SPARK_TASK_BUDGET`, default
`DEFAULT_TASK_BUDGET`), it writes every partition it holds with `written.write_item` (sorted, counted
back) and lets them go, so a task's memory stays about the budget at any source size; the rest is
written at its end. A partition therefore gets one file per task and flush (the metadata-only finalize
lists them all; compaction merges them later), as when the routed path skips its shuffle.

Each task returns the same per-item metadata rows as the routed path (one per item and flush; the driver
adds them up per item), plus one summary row (`SUMMARY_ITEM`): the rows it read, the rows it routed to
planned partitions, or why a file could not be read. A task whose read fails stops there and reports the
files it already wrote; the stage then fails naming the file, and every file the tasks wrote is removed.
Conservation is the routed path's: per item, rows routed = rows counted back from its files = rows its
files declare, and in all, rows the tasks routed = rows the items received.

Spark keeps reading (`split_read_refusal` says why, in the stage result and the log): sources that are
not Parquet files (Postgres, CSV, JSON), Hive layouts (values from the directories), renamed columns,
appends (per-partition watermark filters), Spark Connect (its task count is not known here), a requested
shuffle by item, and more tasks x planned partitions than `max_files` (Spark then shuffles by item, one
task per partition).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import RefreshError, SourceError
from airflow_partitions.refresh.arrow_budget import positive_bytes
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
from airflow_partitions.storage import DataFile
from airflow_partitions.storage.base import BackgroundSync
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
# The bytes of routed rows a read task holds before it writes them (`AP_SPARK_TASK_BUDGET` overrides).
TASK_BUDGET_ENV = "AP_SPARK_TASK_BUDGET"
DEFAULT_TASK_BUDGET = 1 << 30


@dataclass(frozen=True)
class SplitReadJob:
    """Everything an executor needs to read, route and write its splits (pickled into the Spark job)."""

    write: ItemWriteJob
    reader: SplitReader
    partition_names: tuple[str, ...]
    tasks: tuple[tuple[Split, ...], ...]
    budget: int = DEFAULT_TASK_BUDGET  # bytes of routed rows a task holds before it writes them


def task_budget() -> int:
    """The bytes of routed rows each read task may hold before it writes them: `AP_SPARK_TASK_BUDGET`
    (bytes with an optional unit), else `DEFAULT_TASK_BUDGET`."""
    import os

    raw = os.environ.get(TASK_BUDGET_ENV, "")
    if not raw.strip():
        return DEFAULT_TASK_BUDGET
    return positive_bytes(
        raw,
        TASK_BUDGET_ENV,
        "give the bytes of rows a Spark read task may hold before it writes them, e.g. 512MiB",
    )


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
    max_files: int,
) -> SplitReadChoice:
    """Whether the executors read the source files themselves (`requested`: True insists, False keeps
    Spark's read, None decides): the splits per task (one task per executor core), or None with the
    reason Spark reads. More tasks x `items` than `max_files` keep Spark's read (which then shuffles by
    item)."""

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
        splits = source.splits(files, target)
        tasks = group_splits(splits, parallel, open_cost)
        if not tasks:
            refusal = "no source file can hold the planned partitions' rows"
        elif len(tasks) * items > max_files:
            refusal = (
                f"{len(tasks)} read tasks x {items} partitions would write too many small files: "
                "Spark shuffles by item"
            )
        else:
            files_read = len({split.path for split in splits})
            note = (
                f"pyarrow on the executors: {files_read} parquet file(s), {len(splits)} split(s) "
                f"in {len(tasks)} task(s)"
            )
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
    rows = task_rows(spark, job)
    summaries = [row for row in rows if row["item"] == SUMMARY_ITEM]
    written = merge_item_rows([row for row in rows if row["item"] != SUMMARY_ITEM])
    errors = [str(row["error"]) for row in summaries if row["error"]]
    read = sum(int(row["routed"]) for row in summaries)
    routed = sum(int(row["written"]) for row in summaries)
    return read, routed, written, errors


def task_rows(spark: Any, job: SplitReadJob) -> list[dict[str, Any]]:
    """The Spark job: every task's metadata rows (`read_route_write`)."""
    from functools import partial

    count = len(job.tasks)
    frame = spark.range(0, count, 1, count).mapInArrow(partial(read_route_write, job), RESULT_SCHEMA_DDL)
    try:
        rows: list[dict[str, Any]] = frame.toArrow().to_pylist()
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RefreshError(
            f"the Spark stage job reading {job.reader.describe} on the executors failed: {first[:800]}"
        ) from err
    return rows


class _HeldRows:
    """A read task's routed rows per planned item, written (and let go) whenever they pass the budget;
    `results` holds the metadata row of every write so far. Local files are fsynced in the background
    (`syncs`) while the task reads on, and all made durable by `finish` before they are reported."""

    def __init__(self, job: SplitReadJob, schema: pa.Schema, syncs: BackgroundSync | None) -> None:
        self.job = job
        self.schema = schema
        self.syncs = syncs
        self.parts: dict[int, list[pa.Table]] = {}
        self.held = 0
        self.results: list[dict[str, Any]] = []
        self.files: list[DataFile] = []

    def add(self, table: pa.Table, parts: list[tuple[int, pa.Table]]) -> None:
        """Hold one batch's routed rows; `table` is the batch the parts share buffers with (what they keep
        alive is counted, whatever share of it is kept)."""
        for index, rows in parts:
            self.parts.setdefault(index, []).append(rows)
        if parts:
            self.held += table.nbytes
        if self.held > self.job.budget:
            self.write()

    def write(self) -> None:
        """Write every held item's rows as new files of it, then let them go."""
        import pyarrow as pa

        for index in sorted(self.parts):
            rows = pa.concat_tables(self.parts.pop(index))
            result = write_item(self.job.write, self.schema, index, rows, sync=self.syncs is None)
            self.results.append(result)
            if self.syncs is not None:
                files = [DataFile.from_json(found) for found in json.loads(result["files"])]
                self.files.extend(files)
                self.syncs.start(files)  # the disk flushes these while the task reads on
        self.held = 0

    def finish(self) -> None:
        """Every file written durable (then each directory once), or `StorageError`."""
        if self.syncs is not None:
            self.syncs.finish(self.files)


def read_route_write(job: SplitReadJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The executor side (`mapInArrow` over task numbers): read the task's splits in sequence, route their
    rows, write each planned partition's rows whenever the held rows pass the budget and at the end; one
    metadata row per item and write, and one summary row."""
    tasks = [int(task) for batch in batches for task in batch.column(0).to_pylist()]
    if not tasks:
        return
    root = job.write.data_root
    with BackgroundSync(Path(root)) if root is not None else nullcontext() as syncs:
        held = _HeldRows(job, job.write.arrow_schema(), syncs)
        yield _read_route_write(job, tasks, held)


def _read_route_write(job: SplitReadJob, tasks: list[int], held: _HeldRows) -> pa.RecordBatch:
    import pyarrow as pa

    planned = {path: index for index, path in enumerate(job.write.key_paths)}
    read = routed = 0
    try:
        for split in (split for task in tasks for split in job.tasks[task]):
            for table in job.reader.batches(split, held.schema, batch_rows=BATCH_ROWS):
                read += table.num_rows
                parts = []
                for key, rows in route_rows(table, job.write.transforms, dataset=job.write.dataset).items():
                    index = planned.get(key.path(job.partition_names))
                    if index is not None:  # a partition the plan does not refresh: not written
                        parts.append((index, rows))
                        routed += rows.num_rows
                held.add(table, parts)
    except SourceError as err:
        # Nothing more is written; the files written so far are reported, and removed by the driver.
        results = [*held.results, _summary(read, routed, str(err))]
        return pa.RecordBatch.from_pylist(results, schema=result_schema())
    held.write()
    held.finish()
    return pa.RecordBatch.from_pylist([*held.results, _summary(read, routed, None)], schema=result_schema())


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
