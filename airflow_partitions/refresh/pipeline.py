"""The refresh pipeline end to end: plan (discover + diff), stage, finalize each partition, commit.

The Airflow operators call the four steps as separate tasks; `refresh_dataset` composes them in one process
for the command line and tests, finalising partitions on a small thread pool.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import (
    ConservationError,
    FilterError,
    PartitionsFailedError,
    SpecValidationError,
)
from airflow_partitions.refresh.commit import (
    commit_refresh,
    dataset_data_root,
    open_dataset_catalog,
    remove_stage,
)
from airflow_partitions.refresh.discovery import KeySelector, discover
from airflow_partitions.refresh.finalize import finalize_partition
from airflow_partitions.refresh.plan import CommitResult, PartitionResult, RefreshPlan, StageResult
from airflow_partitions.refresh.stage import stage_refresh
from airflow_partitions.sources import Source, open_dataset_source

if TYPE_CHECKING:
    from airflow_partitions.spec.model import DatasetSpec, ProjectSpec
    from airflow_partitions.storage import PartitionStorage


def load_project(project: ProjectSpec | str | os.PathLike[str]) -> ProjectSpec:
    if isinstance(project, str | os.PathLike):
        from airflow_partitions.spec import load_spec

        return load_spec(Path(project))
    return project


def resolve_dataset(project: ProjectSpec, dataset: DatasetSpec | str) -> DatasetSpec:
    return project.dataset(dataset) if isinstance(dataset, str) else dataset


def bind_dataset(dataset: DatasetSpec, source: Source) -> DatasetSpec:
    """`dataset` bound to the source's schema, raising every problem (e.g. an unknown column) at once."""
    from airflow_partitions.spec.model import validate_against_schema

    schema = source.schema()
    problems = validate_against_schema(dataset, schema)
    if problems:
        raise SpecValidationError(problems, path=f"dataset {dataset.name!r} against {source.describe()}")
    return dataset.bind(schema)


def where_selector(dataset: DatasetSpec, where: str) -> KeySelector:
    """Select the discovered keys whose partitions may hold rows matching `where`.

    `where` is SQL over source columns (and partition expressions such as `bucket(50, id) = 7`), judged by
    the pruning module exactly as a read would prune: `ts >= '2026-01-02'` selects the day partitions
    from 2026-01-02 on. Conditions on partition field names (`day >= '2026-01-02'`) are accepted too and
    evaluated directly on the partition values.
    """
    from airflow_partitions.pruning import bind_filter

    schema = dataset.bound_schema
    if schema is None:
        raise FilterError(
            f"dataset {dataset.name!r} must be bound to its source before selecting with --where"
        )
    try:
        bind_filter(where, schema)
    except FilterError as source_error:
        try:
            return _partition_value_selector(dataset, where)
        except FilterError:
            raise source_error from None
    return _pruning_selector(dataset, where)


def _pruning_selector(dataset: DatasetSpec, where: str) -> KeySelector:
    """Prune the discovered keys with the read path's pruning, over a catalog-shaped view of them."""

    def select(keys: Sequence[tuple[Any, ...]]) -> list[bool]:
        import datetime as dt

        from airflow_partitions.catalog import PartitionMap, Snapshot
        from airflow_partitions.catalog.model import format_time
        from airflow_partitions.catalog.state import entries_to_table
        from airflow_partitions.keys import PartitionKey
        from airflow_partitions.pruning import plan_partitions
        from airflow_partitions.refresh.commit import partition_spec_info

        if not keys:
            return []
        spec = partition_spec_info(dataset)
        names = dataset.acceleration.partition_names
        now = format_time(dt.datetime.now(dt.UTC))
        paths = [PartitionKey(key).path(names) for key in keys]
        # One placeholder file without statistics per key: only the partition values can rule a key out.
        entries = [
            {
                "key_path": path,
                "key": PartitionKey(key).to_json(),
                "spec_id": spec.spec_id,
                "rows": 1,
                "bytes": 0,
                "refreshed_at": now,
                "source_fingerprint": None,
                "files": [
                    {"path": f"{path}/candidate", "format": "none", "rows": 1, "bytes": 0, "checksum": ""}
                ],
            }
            for key, path in zip(keys, paths, strict=True)
        ]
        snapshot = Snapshot(
            version=0,
            partition_spec=spec,
            committed_at=dt.datetime.now(dt.UTC),
            partitions=PartitionMap(entries_to_table(entries)),
        )
        assert dataset.bound_schema is not None
        chosen = {
            selected.key_path for selected in plan_partitions(snapshot, dataset.bound_schema, where).selected
        }
        return [path in chosen for path in paths]

    return select


def _partition_value_selector(dataset: DatasetSpec, where: str) -> KeySelector:
    """Evaluate `where` over partition field names (and identity source columns) in DuckDB."""
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(where, dialect="duckdb")
    except sqlglot.errors.ParseError as err:
        raise FilterError(f"cannot parse --where {where!r}: {str(err).splitlines()[0]}") from err
    if isinstance(tree, exp.Query) or tree.find(exp.Subquery, exp.Select) is not None:
        raise FilterError(f"--where {where!r} must be a condition, not a query")
    fields = dataset.acceleration.partition_by
    aliases: dict[str, int] = {f.name: i for i, f in enumerate(fields)}
    for i, f in enumerate(fields):
        if getattr(f.transform, "name", "") == "identity":
            aliases.setdefault(f.source_column, i)
    unknown = sorted({c.name for c in tree.find_all(exp.Column)} - set(aliases))
    if unknown:
        raise FilterError(f"--where names {unknown}, which are neither source columns nor partition fields")
    condition = tree.sql(dialect="duckdb")

    def select(keys: Sequence[tuple[Any, ...]]) -> list[bool]:
        import duckdb
        import pyarrow as pa

        if not keys:
            return []
        columns = {
            name: pa.array([key[i] for key in keys], type=fields[i].transform.result_type)
            for name, i in aliases.items()
        }
        columns["__ap_row"] = pa.array(range(len(keys)), type=pa.int64())
        connection = duckdb.connect()
        try:
            connection.register("ap_partition_keys", pa.table(columns))
            rows = connection.execute(f"SELECT __ap_row FROM ap_partition_keys WHERE {condition}").fetchall()
        except duckdb.Error as err:
            raise FilterError(f"cannot evaluate --where {where!r} on partition values: {err}") from err
        finally:
            connection.close()
        chosen = {row[0] for row in rows}
        return [index in chosen for index in range(len(keys))]

    return select


def plan_refresh(
    project: ProjectSpec | str | os.PathLike[str],
    dataset: DatasetSpec | str,
    *,
    partitions: Sequence[str] | None = None,
    where: str | None = None,
    full: bool = False,
    source: Source | None = None,
    timeout_s: float | None = None,
) -> RefreshPlan:
    """Discover the dataset's partitions and diff them against its catalog: the refresh plan."""
    project = load_project(project)
    spec = resolve_dataset(project, dataset)
    source = source or open_dataset_source(spec)
    bound = bind_dataset(spec, source)
    snapshot = open_dataset_catalog(project, spec).latest()
    selector = where_selector(bound, where) if where else None
    return discover(
        bound,
        source,
        snapshot,
        partitions=partitions,
        where_selector=selector,
        full=full,
        timeout_s=timeout_s,
    )


@dataclass(frozen=True)
class RefreshProgress:
    """One progress tick of `refresh_dataset`."""

    phase: str  # "discover" | "stage" | "finalize" | "commit" | "done"
    done: int
    total: int
    rows: int
    elapsed_s: float


@dataclass
class RefreshSummary:
    """What `refresh_dataset` did, JSON-ready for `--json`."""

    dataset: str
    version: int | None
    plan: dict[str, int]
    stage_mode: str
    refreshed: int
    removed: int
    rows: int
    bytes: int
    failed: dict[str, str] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # The row counts the commit checked and recorded (`CommitResult.conservation`); on a refused commit,
    # the differing partitions as {key path: {"expected", "actual"}} under "differing".
    conservation: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "version": self.version,
            "plan": self.plan,
            "stage_mode": self.stage_mode,
            "refreshed": self.refreshed,
            "removed": self.removed,
            "rows": self.rows,
            "bytes": self.bytes,
            "failed": self.failed,
            "timings_s": {k: round(v, 3) for k, v in self.timings_s.items()},
            "notes": list(self.notes),
            "conservation": self.conservation,
        }


ProgressCallback = Callable[[RefreshProgress], None]


def refresh_dataset(
    project: ProjectSpec | str | os.PathLike[str],
    dataset: DatasetSpec | str,
    partitions: Sequence[str] | None = None,
    where: str | None = None,
    full: bool = False,
    progress: ProgressCallback | None = None,
    *,
    spark: Any = None,
    remote: str | None = None,
    strategy: str = "auto",
    repartition: bool = False,
    workers: int | None = None,
    allow_partial: bool = False,
    source: Source | None = None,
    storage: PartitionStorage | None = None,
) -> RefreshSummary:
    """Plan, stage, finalize every planned partition and commit, in this process.

    A partition that fails to finalize is reported in `failed`; then nothing is committed unless
    `allow_partial`, which publishes the others and leaves the failed ones at their previous version.
    Lost or extra rows (`ConservationError`, from any step) always refuse the whole commit, partial or
    not: the error names every differing partition. `storage` replaces the dataset's storage engine for
    the partition writes (the engine must publish like the dataset's own).
    """
    started = time.monotonic()
    timings: dict[str, float] = {}
    project = load_project(project)
    spec = resolve_dataset(project, dataset)
    source = source or open_dataset_source(spec)

    def tick(phase: str, done: int, total: int, rows: int) -> None:
        if progress is not None:
            progress(RefreshProgress(phase, done, total, rows, time.monotonic() - started))

    tick("discover", 0, 0, 0)
    plan = plan_refresh(project, spec, partitions=partitions, where=where, full=full, source=source)
    timings["discover"] = time.monotonic() - started
    total = len(plan.items)
    tick("stage", 0, total, 0)
    mark = time.monotonic()
    try:
        stage = stage_refresh(
            project,
            spec,
            plan,
            spark=spark,
            remote=remote,
            strategy=strategy,
            repartition=repartition,
            source=source,
        )
    except ConservationError as err:
        timings["stage"] = time.monotonic() - mark
        err.summary = _summary(spec, plan, None, None, {}, timings, started, refused=err)
        raise
    timings["stage"] = time.monotonic() - mark

    mark = time.monotonic()
    results: list[PartitionResult] = []
    failed: dict[str, str] = {}
    lost: list[ConservationError] = []
    rows = 0
    if stage.location is not None:
        tick("finalize", 0, total, 0)
        data_root = dataset_data_root(project, spec)
        pool_size = workers or min(4, os.cpu_count() or 2)
        with ThreadPoolExecutor(max_workers=max(1, pool_size)) as pool:
            futures = {
                pool.submit(
                    finalize_partition, project, spec, stage, item, data_root=data_root, storage=storage
                ): item
                for item in plan.items
            }
            for future in as_completed(futures):
                item = futures[future]
                try:
                    result = future.result()
                except Exception as err:
                    if isinstance(err, ConservationError):
                        lost.append(err)
                    failed[item.key_path] = f"{type(err).__name__}: {err}"
                else:
                    results.append(result)
                    rows += result.rows
                tick("finalize", len(results) + len(failed), total, rows)
    timings["finalize"] = time.monotonic() - mark

    mark = time.monotonic()
    commit: CommitResult | None = None
    if lost:
        remove_stage(stage)
        refused = merge_conservation_errors(spec.name, lost)
        refused.summary = _summary(spec, plan, stage, None, failed, timings, started, refused=refused)
        raise refused
    if failed and not allow_partial:
        remove_stage(stage)
        summary = _summary(spec, plan, stage, None, failed, timings, started)
        raise PartitionsFailedError(
            f"{len(failed)} of {total} partition(s) of {spec.name!r} failed; nothing was committed: "
            + "; ".join(f"{path}: {message}" for path, message in list(failed.items())[:5]),
            failed,
            summary,
        )
    tick("commit", total, total, rows)
    try:
        commit = commit_refresh(project, spec, plan, results, stage=stage, require_all=not allow_partial)
    except ConservationError as err:
        remove_stage(stage)
        timings["commit"] = time.monotonic() - mark
        err.summary = _summary(spec, plan, stage, None, failed, timings, started, refused=err)
        raise
    timings["commit"] = time.monotonic() - mark
    tick("done", total, total, rows)
    return _summary(spec, plan, stage, commit, failed, timings, started)


def merge_conservation_errors(dataset: str, errors: Sequence[ConservationError]) -> ConservationError:
    """One error naming every partition the finalize step refused (the first one's wording if only one)."""
    if len(errors) == 1:
        return errors[0]
    partitions: dict[str, tuple[int | None, int]] = {}
    for error in errors:
        partitions.update(error.partitions)
    kinds = sorted({f"{e.expected} vs {e.actual}" for e in errors})
    return ConservationError(
        dataset,
        partitions,
        expected="expected rows",
        actual="rows found",
        hint=f"Compared: {'; '.join(kinds)}. " + errors[0].hint,
    )


def _summary(
    spec: DatasetSpec,
    plan: RefreshPlan,
    stage: StageResult | None,
    commit: CommitResult | None,
    failed: dict[str, str],
    timings: dict[str, float],
    started: float,
    *,
    refused: ConservationError | None = None,
) -> RefreshSummary:
    timings = {**timings, "total": time.monotonic() - started}
    conservation: dict[str, Any] | None = None
    if commit is not None and commit.conservation is not None:
        conservation = dict(commit.conservation)
    elif refused is not None:
        conservation = {
            "refused": True,
            "expected": refused.expected,
            "actual": refused.actual,
            "differing": {
                path: {"expected": want, "actual": got} for path, (want, got) in refused.partitions.items()
            },
        }
    return RefreshSummary(
        dataset=spec.name,
        version=commit.version if commit else None,
        plan=plan.counts(),
        stage_mode=str(stage.mode) if stage is not None else "failed",
        refreshed=commit.upserted if commit else 0,
        removed=commit.removed if commit else 0,
        rows=commit.rows if commit else 0,
        bytes=commit.bytes if commit else 0,
        failed=failed,
        timings_s=timings,
        notes=plan.notes,
        conservation=conservation,
    )
