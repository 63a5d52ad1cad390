"""`strategy="auto"`: per run, the in-process Arrow path when this machine can run the work, Spark otherwise.

Both paths are exact (tests/test_conservation_matrix.py runs every case through both), so the choice
changes only where the work runs and how long it takes. Arrow streams the source through this process in
batches, routes them and writes the partitions here (`refresh/arrow_stream.py`): its memory is bounded by
the spill budget whatever the source's size (partitions past it wait on local scratch disk), so it wins
whenever this worker can reach the source. Spark is chosen when

* a Spark session, a Spark Connect server or a Spark connection is given (the operator asked for a
  cluster);
* the plan is one the Arrow path does not run (refresh_mode append / changes, an `s3://` accelerator_dir);
* the source's size cannot be told (a Postgres view, another kind of source) or the source cannot be
  reached from here (then the Spark stage reports why);
* the Arrow memory budget is 0: `AP_ARROW_MEMORY_BUDGET` or `[airflow_partitions] arrow_memory_budget`
  (env `AIRFLOW__AIRFLOW_PARTITIONS__ARROW_MEMORY_BUDGET`), bytes with an optional unit (`2GiB`,
  `512MB`), default a quarter of the machine's memory; `0` never picks Arrow;
* the estimated in-memory size exceeds the budget and the rows to spill do not fit the free space of the
  spill directory (`AP_ARROW_SPILL_DIR`, default `<accelerator_dir>/_scratch`).

Under the budget the rows are held in memory; past it they are streamed and spilled (the reason says
which). The estimate is deliberately rough and errs high: file sources from the listing's sizes, Postgres
from `pg_total_relation_size` and `pg_class.reltuples`, times how much larger the Arrow path's peak is
than the stored bytes (`PEAK_PER_STORED_BYTE`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import RefreshError, SourceError
from airflow_partitions.refresh.arrow_budget import (
    arrow_memory_budget,
    arrow_spill_budget,
    spill_base,
)
from airflow_partitions.refresh.arrow_refresh import check_arrow_supported
from airflow_partitions.refresh.arrow_stream import streams
from airflow_partitions.sources.files import FileSource
from airflow_partitions.sources.postgres import PostgresSource

if TYPE_CHECKING:
    from airflow_partitions.refresh.plan import RefreshPlan
    from airflow_partitions.sources.base import Source
    from airflow_partitions.spec.model import ProjectSpec

ARROW = "arrow"
# What `auto` hands the Spark stage: it then reads partitions straight from a source that can prune
# (Hive files, indexed Postgres) and scans the rest once with Spark (`stage.choose_mode`).
STAGE_AUTO = "auto"
# Peak memory of the Arrow path per byte the source stores, erring high: the table read (Parquet
# decompresses and decodes to several times its file size; text and Postgres heap pages hold about as
# much as Arrow), one routed copy of it, and the writers' buffers.
PEAK_PER_STORED_BYTE = {"parquet": 8.0, "csv": 3.0, "json": 3.0, "postgres": 3.0}
# The estimated peak holds the rows about twice (read and routed); spilled, they are on disk once.
SPILL_PER_PEAK_BYTE = 2


@dataclass(frozen=True)
class StrategyChoice:
    """The strategy a run uses and why, for the summary, `--json`, the logs and the stage task."""

    strategy: str  # "arrow", or the stage strategy handed to Spark ("auto", "spark", "pushdown")
    reason: str
    estimated_bytes: int | None = None  # the Arrow path's estimated peak, when the source was sized
    budget_bytes: int | None = None

    @property
    def uses_arrow(self) -> bool:
        return self.strategy == ARROW

    @property
    def engine(self) -> str:
        """ "arrow" or "spark": which engine runs the refresh."""
        return ARROW if self.uses_arrow else "spark"


@dataclass(frozen=True)
class SourceSize:
    """What the source stores: bytes, and rows when the source keeps an estimate."""

    stored_bytes: int
    rows: int | None
    kind: str  # a key of PEAK_PER_STORED_BYTE
    what: str  # e.g. "3 parquet file(s)", "Postgres table public.trips"

    @property
    def peak_bytes(self) -> int:
        return int(self.stored_bytes * PEAK_PER_STORED_BYTE[self.kind])


def source_size(source: Source) -> SourceSize | None:
    """What `source` stores, from its listing or catalog; None when it cannot be told (a view, another
    kind of source). Raises `SourceError` when the source cannot be reached."""

    if isinstance(source, FileSource):
        files = source.list_files()
        kind = source.file_format
        return SourceSize(sum(f.size for f in files), None, kind, f"{len(files)} {kind} file(s)")
    if isinstance(source, PostgresSource):
        if source.relation_kind not in ("r", "p", "m"):
            return None  # a view or foreign table: its size is the size of what it reads, unknown here
        table = source.query_arrow(
            "SELECT pg_total_relation_size(c.oid)::int8 AS bytes, c.reltuples::float8 AS tuples "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = $1 AND c.relname = $2",
            (source.table.schema, source.table.name),
        )
        row = table.to_pylist()[0]
        tuples = row["tuples"]
        rows = int(tuples) if tuples is not None and tuples >= 0 else None  # -1: never analysed
        return SourceSize(int(row["bytes"]), rows, "postgres", f"Postgres table {source.table}")
    return None


def choose_strategy(
    project: ProjectSpec,
    plan: RefreshPlan,
    source: Source,
    *,
    strategy: str = STAGE_AUTO,
    spark_given: str | None = None,
    budget: int | None = None,
) -> StrategyChoice:
    """The strategy of this run: `strategy` itself unless it is "auto", then Arrow or the Spark stage.

    `spark_given` names the Spark the caller configured (a session, a Spark Connect URL, a connection):
    then Spark runs. `budget` overrides `arrow_memory_budget()`.
    """
    if strategy != STAGE_AUTO:
        return StrategyChoice(strategy, f"strategy {strategy!r} was set explicitly")
    if spark_given:
        return StrategyChoice(STAGE_AUTO, f"Spark is configured for this refresh ({spark_given})")

    try:
        check_arrow_supported(project, plan)
    except RefreshError as err:
        return StrategyChoice(STAGE_AUTO, f"the in-process Arrow path cannot run this plan: {_first(err)}")
    limit = arrow_memory_budget() if budget is None else budget
    if limit <= 0:
        return StrategyChoice(STAGE_AUTO, "the Arrow memory budget is 0 (never in-process)", None, limit)
    try:
        size = source_size(source)
    except SourceError as err:
        return StrategyChoice(STAGE_AUTO, f"the source is not reachable from this worker: {_first(err)}")
    if size is None:
        return StrategyChoice(
            STAGE_AUTO, f"the size of {source.describe()} cannot be estimated before reading it"
        )
    rows = f", ~{size.rows:,} rows" if size.rows is not None else ""
    sized = f"{size.what}: {_human(size.stored_bytes)} stored{rows}, ~{_human(size.peak_bytes)} in memory"
    if size.peak_bytes <= limit:
        return StrategyChoice(
            ARROW, f"{sized} <= Arrow memory budget {_human(limit)}", size.peak_bytes, limit
        )

    over = f"{sized} > Arrow memory budget {_human(limit)}"
    if not streams(source):
        return StrategyChoice(STAGE_AUTO, over, size.peak_bytes, limit)
    base = spill_base(Path(project.accelerator_dir))
    free = free_bytes(base)
    spilled = size.peak_bytes // SPILL_PER_PEAK_BYTE
    if free is not None and spilled > free:
        return StrategyChoice(
            STAGE_AUTO,
            f"{over}, and its ~{_human(spilled)} of spilled rows exceed the {_human(free)} free under {base}",
            size.peak_bytes,
            limit,
        )
    return StrategyChoice(
        ARROW,
        f"{over}: streamed in batches, partitions spilled to {base} past {_human(arrow_spill_budget())}",
        size.peak_bytes,
        limit,
    )


def free_bytes(directory: Path) -> int | None:
    """Free bytes on the disk of `directory` (or of its nearest existing parent); None if unknown."""
    for candidate in (directory, *directory.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def describe_spark(*, spark: Any = None, remote: str | None = None) -> str | None:
    """What Spark a `refresh_dataset` caller gave, in words (never a URL's credentials); None for none."""
    if remote:
        return "a Spark Connect server"
    if spark is not None:
        return "a Spark session was given"
    return None


def _first(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _human(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
