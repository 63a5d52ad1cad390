"""The in-process Arrow refresh (`strategy="arrow"`): one pyarrow read of the source, routed and written
in this process, for sources that fit one machine.

It replaces the stage and finalize steps with the project's own pieces: the source read once as Arrow
(`Source.read_all`), conformed to the source schema, routed by the dataset's transforms (`route_rows`,
the NULL partition included), each planned partition written by the dataset's storage engine on a small
thread pool and counted back from its files (`PartitionWriter`). The results are the
`PartitionResult`s finalize returns, for `commit_refresh`.

Rows are conserved: the rows read are the rows routed (a full plan routes every row to a planned
partition; a selection or an incremental plan drops the rows of partitions it does not refresh), and
each partition's written rows are its routed rows. On a mismatch nothing is published: the files
written so far are removed and `ConservationError` names the partitions and both counts.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_partitions.exceptions import RefreshError
from airflow_partitions.refresh import arrow_stream
from airflow_partitions.refresh.arrow_write import (
    ArrowRefreshResult,
    check_routed_counts,
    write_partition,
    write_planned,
)
from airflow_partitions.refresh.finalize import conform_to_schema
from airflow_partitions.refresh.plan import PartitionResult
from airflow_partitions.storage import get_storage
from airflow_partitions.table import open_handle
from airflow_partitions.write.routing import route_rows
from airflow_partitions.write.row_hash import tally_table_by_partition

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.refresh.plan import PartitionWorkItem, RefreshPlan
    from airflow_partitions.sources import Source
    from airflow_partitions.spec.model import DatasetSpec, ProjectSpec
    from airflow_partitions.storage import DataFile, PartitionStorage


def check_arrow_supported(project: ProjectSpec, plan: RefreshPlan) -> None:
    """Refuse plans the Arrow path does not handle, saying what to use instead."""
    appending = any(item.append for item in plan.items)
    changing = any(item.changes for item in plan.items)
    if plan.refresh_mode in ("append", "changes") or appending or changing:
        mode = "changes" if changing or plan.refresh_mode == "changes" else "append"
        raise RefreshError(
            f"strategy 'arrow' does not support refresh_mode {mode!r} (it rewrites whole partitions from "
            "one read of the source); use strategy 'auto' or 'spark' for this refresh, or refresh with "
            "--full to rewrite every partition with strategy 'arrow'"
        )
    if not open_handle(project, plan.dataset).local_data:
        raise RefreshError(
            "strategy 'arrow' writes partitions to a local accelerator_dir only; this project's "
            "accelerator_dir is on S3: use strategy 'auto' or 'spark'"
        )


def arrow_refresh(
    dataset: DatasetSpec,
    plan: RefreshPlan,
    source: Source,
    data_root: Path,
    *,
    selecting: bool,
    storage: PartitionStorage | None = None,
    workers: int | None = None,
    keep_going: bool = False,
    streaming: bool | None = None,
    spill_budget: int | None = None,
) -> ArrowRefreshResult:
    """Read `source` once, route its rows, write every planned partition under `data_root`.

    `dataset` is bound to the source schema. `selecting`: the plan came from a `partitions=` / `where=`
    selection (rows of other partitions are dropped, not refused). Returns the unpublished results; on
    any error the files written are removed first. `keep_going`: a partition whose write fails (other than
    by losing rows) is removed and named in `failed`, and the others are returned, as finalize tasks fail
    one by one; lost or extra rows in any partition still remove everything and raise. `streaming`: read
    the source in batches and spill per partition past `spill_budget` bytes (`arrow_stream.py`); None:
    whenever the source reads in batches (files, Postgres), False: one whole read.
    """

    started = time.monotonic()
    if plan.dataset != dataset.name or plan.spec_id != dataset.acceleration.partition_spec_id:
        raise RefreshError(
            f"plan for {plan.dataset!r} (spec {plan.spec_id}) does not match dataset {dataset.name!r} "
            f"(spec {dataset.acceleration.partition_spec_id}); plan again"
        )
    engine = storage or get_storage(dataset.acceleration)
    if not plan.items:
        return ArrowRefreshResult((), 0, 0, 0, time.monotonic() - started)
    if streaming is True or (streaming is None and arrow_stream.streams(source)):
        return arrow_stream.streamed_refresh(
            dataset,
            plan,
            source,
            data_root,
            selecting=selecting,
            engine=engine,
            workers=workers,
            keep_going=keep_going,
            budget=spill_budget,
            started=started,
        )
    schema = source.schema()
    table = conform_to_schema(source.read_all(), schema)
    transforms = [f.transform for f in dataset.acceleration.partition_by]
    names = plan.partition_names
    routed, routed_total, dropped = route_checked(dataset, plan, table, selecting)
    written: dict[str, list[DataFile]] = {}
    # Every partition's certificate from one DuckDB aggregate over the rows in memory: a query per
    # partition cost more than the hashing itself. A partition the aggregate counts otherwise than the
    # routing is certified from its own rows.
    try:
        tallies = {
            key.path(names): tally
            for key, tally in tally_table_by_partition(table, table.schema, transforms).items()
        }
    except Exception:  # a transform the aggregate cannot group by: each partition certifies its rows
        tallies = {}

    def write_one(item: PartitionWorkItem) -> PartitionResult:
        rows = routed.get(item.key_path, schema.empty_table())
        files = written.setdefault(item.key_path, [])
        return write_partition(dataset, item, rows, engine, data_root, files, tallies)

    results, failures = write_planned(
        dataset.name,
        plan.items,
        write_one,
        engine,
        data_root,
        written,
        workers=workers,
        keep_going=keep_going,
        rows={path: rows.num_rows for path, rows in routed.items()},
    )
    return ArrowRefreshResult(
        tuple(results),
        table.num_rows,
        routed_total,
        dropped,
        time.monotonic() - started,
        failed={path: f"{type(err).__name__}: {err}" for path, err in failures.items()},
    )


def route_checked(
    dataset: DatasetSpec, plan: RefreshPlan, table: pa.Table, selecting: bool
) -> tuple[dict[str, pa.Table], int, int]:
    """`table`'s rows by partition key path, the rows routed to planned partitions and the rows dropped
    (of partitions a selection leaves out). `ConservationError` when a row goes to a partition a full
    plan lacks, routing lost or duplicated rows, or a discovered partition got none."""

    transforms = [f.transform for f in dataset.acceleration.partition_by]
    names = plan.partition_names
    routed = {
        key.path(names): rows for key, rows in route_rows(table, transforms, dataset=dataset.name).items()
    }
    planned = {item.key_path: item for item in plan.items}
    routed_total = sum(routed[path].num_rows for path in planned if path in routed)
    dropped = check_routed_counts(
        dataset.name,
        plan,
        selecting=selecting,
        scanned=table.num_rows,
        routed_total=routed_total,
        unplanned={path: rows.num_rows for path, rows in routed.items() if path not in planned},
        has_rows=lambda path: path in routed,
    )
    return routed, routed_total, dropped
