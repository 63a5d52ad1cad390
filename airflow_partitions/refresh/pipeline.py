"""The refresh pipeline end to end: plan (discover + diff), stage, finalize each partition, commit.

The Airflow operators call the four steps as separate tasks; `refresh_dataset` composes them in one process
for the command line and tests, finalising partitions on a small thread pool.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.catalog.open import dataset_directory, partition_spec_info
from airflow_partitions.exceptions import (
    ConservationError,
    FilterError,
    PartitionsFailedError,
    SpecValidationError,
)
from airflow_partitions.keys import PartitionKey
from airflow_partitions.refresh.arrow_refresh import arrow_refresh, check_arrow_supported
from airflow_partitions.refresh.arrow_stream import learn_facts_in_read, settled_plan, streams
from airflow_partitions.refresh.arrow_write import remove_written
from airflow_partitions.refresh.cdc import change_stream, kill_point, plan_cdc, uses_cdc
from airflow_partitions.refresh.commit import commit_refresh, remove_stage
from airflow_partitions.refresh.discovery import KeySelector, discover
from airflow_partitions.refresh.failures import FailureStore, PartitionFailure
from airflow_partitions.refresh.finalize import finalize_partition
from airflow_partitions.refresh.layouts import (
    ChangesLayouts,
    append_across_layouts,
    changes_layouts,
    holders_of,
    key_holder,
    migration_in_progress,
    old_holdings,
    settle_append_layouts,
    without_partitions,
)
from airflow_partitions.refresh.modes import apply_refresh_mode, changes_fallback, plan_changes
from airflow_partitions.refresh.plan import CommitResult, PartitionResult, RefreshPlan, StageMode, StageResult
from airflow_partitions.refresh.stage import bind_to_source, stage_refresh
from airflow_partitions.refresh.stage_layout import merge_conservation_errors
from airflow_partitions.refresh.strategy import StrategyChoice, choose_strategy, describe_spark
from airflow_partitions.sources import Source, keep_file_facts, open_dataset_source
from airflow_partitions.sources.pg_cdc import release_snapshot
from airflow_partitions.spec import load_spec
from airflow_partitions.spec.model import RefreshMode, validate_against_schema
from airflow_partitions.table import DatasetHandle, open_handle
from airflow_partitions.write.refresh_moves import old_partitions_holding, old_rows_the_source_lost
from airflow_partitions.write.refresh_siblings import SiblingPlan, plan_siblings
from airflow_partitions.write.repartition import open_stored

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from airflow_partitions.catalog import Catalog, Snapshot
    from airflow_partitions.spec.model import DatasetSpec, ProjectSpec
    from airflow_partitions.storage import PartitionStorage


def load_project(project: ProjectSpec | str | os.PathLike[str]) -> ProjectSpec:
    if isinstance(project, str | os.PathLike):
        return load_spec(Path(project))
    return project


def resolve_dataset(project: ProjectSpec, dataset: DatasetSpec | str) -> DatasetSpec:
    return project.dataset(dataset) if isinstance(dataset, str) else dataset


def bind_dataset(dataset: DatasetSpec, source: Source) -> DatasetSpec:
    """`dataset` bound to the source's schema, raising every problem (e.g. an unknown column) at once."""

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
    judged on the partition values. A filter that cannot bind raises `FilterError` here, before discovery.
    """
    from airflow_partitions.pruning import (  # lazy: pyarrow; Airflow tasks import refresh/ light
        PartitionIndex,
        plan_partitions,
    )

    schema = dataset.bound_schema
    if schema is None:
        raise FilterError(
            f"dataset {dataset.name!r} must be bound to its source before selecting with --where"
        )
    fields = [(field.name, field.canonical) for field in dataset.acceleration.partition_by]
    plan_partitions(PartitionIndex.from_keys(fields, schema, []), where)

    def select(keys: Sequence[tuple[Any, ...]]) -> list[bool]:
        if not keys:
            return []
        plan = plan_partitions(PartitionIndex.from_keys(fields, schema, keys), where, dataset=dataset.name)
        mask = [False] * len(keys)
        for selected in plan.selected:
            mask[selected.position] = True
        return mask

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
    catalog: Catalog | None = None,
    hold_snapshot: bool = False,
    read_committed: bool = False,
    siblings: bool = True,
) -> RefreshPlan:
    """Discover the dataset's partitions and diff them against its catalog: the refresh plan.

    `catalog`: the dataset's catalog when the caller opened it (an Airflow task opens a catalog on S3
    with its AWS connection); by default it is opened from the spec and the AWS environment.
    `hold_snapshot`: a change-capture plan that created its slot keeps the slot's exported snapshot open
    for the copy this process reads next (`refresh_dataset`, which ends it); by default it ends here.
    `read_committed`: changes on a watermark may read the key columns of the partitions the changes touch
    (local accelerator_dir), to audit them too; by default (a DAG's discover task reads no partition data)
    they are named as not audited.
    `siblings`: a selection during a re-partitioning may take along the partitions it rewrites from the
    source instead of moving old ones (`SelectionSiblings`); False plans exactly the selection (`verify`).
    """
    project = load_project(project)
    spec = resolve_dataset(project, dataset)
    source = keep_file_facts(source or open_dataset_source(spec), dataset_directory(project, spec))
    bound = bind_dataset(spec, source)
    catalog = catalog or open_handle(project, spec).catalog
    snapshot = catalog.latest()
    selecting = partitions is not None or where is not None
    if not selecting and uses_cdc(bound, source):  # a selection copies partitions; the stream waits

        def copy() -> RefreshPlan:
            plan = discover(bound, source, snapshot, full=True, timeout_s=timeout_s)
            return apply_refresh_mode(plan, bound, snapshot)

        stream = change_stream(project, bound, source)
        migrating = migration_in_progress(snapshot, bound)
        holds = key_holder(open_handle(project, bound), catalog) if migrating else None
        try:
            return plan_cdc(bound, source, snapshot, catalog, stream, full=full, copy=copy, old_holds=holds)
        finally:
            if not hold_snapshot:
                release_snapshot(stream.slot)
    if changes_fallback(bound, source, snapshot, selecting=selecting, full=full, migration=True) is None:
        assert snapshot is not None
        held = held_reader(project, bound) if read_committed else None
        layouts = None
        notes: tuple[str, ...] = ()
        if migration_in_progress(snapshot, bound):
            layouts = changes_layouts(open_handle(project, bound), catalog, snapshot)
        changes = plan_changes(bound, source, snapshot, held=held, layouts=layouts)
        if layouts is not None:
            notes = (
                f"re-partitioning in progress: {len(changes.migrate)} old partition(s) holding a changed "
                "key move into the current layout in the refresh's commit; "
                f"{len(layouts.old_rows)} partition(s) have rows in older layouts",
            )
        changes = replace(changes, notes=(*notes, *changes.notes))
        return rewrite_late_partitions(
            changes, bound, source, snapshot, timeout_s, project, catalog, layouts=layouts
        )
    if (
        not selecting
        and not full
        and bound.acceleration.refresh.mode is RefreshMode.APPEND
        and migration_in_progress(snapshot, bound)
    ):
        assert snapshot is not None
        return plan_append_during_migration(project, bound, source, catalog, snapshot, timeout_s)
    selector = where_selector(bound, where) if where else None
    layouts_checked = switching = False
    split: frozenset[str] = frozenset()
    if selecting and snapshot is not None and layouts_differ(snapshot, bound):
        snapshot, switching = switched_view(project, bound, catalog, snapshot)
        layouts_checked = True
        if bound.acceleration.refresh.mode is RefreshMode.APPEND and migration_in_progress(snapshot, bound):
            # The append audit leaves partitions with rows still in both layouts (counted in one alone,
            # they would look late and be rewritten whole, next to their rows in old partitions).
            split = frozenset(old_holdings(open_handle(project, bound), catalog))
    taking = SelectionSiblings(open_handle(project, bound), catalog, snapshot) if layouts_checked else None
    plan = discover(
        bound,
        source,
        snapshot,
        partitions=partitions,
        where_selector=selector,
        full=full,
        timeout_s=timeout_s,
        layouts_checked=layouts_checked,
        widen=taking.widen if taking is not None and siblings else None,
    )
    if taking is not None and snapshot is not None:
        plan = with_old_layouts(project, bound, catalog, plan, snapshot, taking, switching, where, selector)
    return apply_refresh_mode(plan, bound, snapshot, source, leave=split)


def with_old_layouts(
    project: ProjectSpec,
    dataset: DatasetSpec,
    catalog: Catalog,
    plan: RefreshPlan,
    snapshot: Snapshot,
    siblings: SelectionSiblings,
    switching: bool,
    where: str | None,
    selector: KeySelector | None,
) -> RefreshPlan:
    """A selection's plan during a re-partitioning with what it does about the old partitions holding its
    rows: removed unread when their siblings were taken into it (`SelectionSiblings`,
    `RefreshPlan.replaced_old`), else moved in its commit (`old_partitions_of_selection`,
    `RefreshPlan.migrate`); and the switch of the current spec when the plan makes it."""
    if plan.removed:
        # Their old rows are found by the move's search (siblings taken along are rewritten all the same,
        # superseding their moved rows).
        siblings.decline("the selection also removes partitions")
    chosen = siblings.chosen
    migrate: tuple[str, ...] = ()
    vanished: tuple[str, ...] = ()
    if chosen is None:
        migrate, vanished = old_partitions_of_selection(
            project, dataset, catalog, plan, snapshot, where=where, selector=selector
        )
    # With the siblings taken every key is planned without the source (bucket fields only): a key the
    # selection covers is never one the source lost, and no old row is left for `vanished`.
    note = ("partition_by changed: this refresh's commit makes it current (one version with its moves)",)
    said = siblings.note(dataset.acceleration.partition_names)
    notes = (*plan.notes, *(note if switching else ()), *((said,) if said else ()))
    return replace(
        plan,
        migrate=migrate,
        vanished=vanished,
        switch_spec=switching,
        notes=notes,
        replaced_old=chosen.old if chosen is not None else (),
    )


class SelectionSiblings:
    """The `widen` of a selection's discovery during a re-partitioning: asks `write.refresh_siblings`
    whether the refresh may rewrite the siblings of the old partitions holding the selection's rows from
    the source instead of moving those (and which), and remembers the verdict for the plan."""

    def __init__(self, handle: DatasetHandle, catalog: Catalog, snapshot: Snapshot | None) -> None:
        self.handle, self.catalog, self.snapshot = handle, catalog, snapshot
        self.verdict: SiblingPlan | None = None

    def widen(self, selected: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        keys = [PartitionKey(tuple(key)) for key in selected]
        self.verdict = plan_siblings(self.handle, keys, catalog=self.catalog, snapshot=self.snapshot)
        verdict, name = self.verdict, self.handle.dataset.name
        if verdict.taken:
            log.info(
                "%s: %d old-layout partition(s) (%d rows) may hold rows of the selection; %d sibling "
                "partition(s) are refreshed from the source with it and the old ones removed unread (%s)",
                name,
                len(verdict.old),
                verdict.old_rows,
                len(verdict.siblings),
                verdict.reason,
            )
        else:
            log.info("%s: old partitions holding rows of the selection are moved: %s", name, verdict.reason)
        return [key.values for key in verdict.siblings] if verdict.taken else []

    def decline(self, reason: str) -> None:
        if self.verdict is not None and self.verdict.taken:
            self.verdict = replace(self.verdict, taken=False, reason=reason)

    @property
    def chosen(self) -> SiblingPlan | None:
        """The verdict when the refresh rewrites the siblings (None: it moves the old partitions)."""
        return self.verdict if self.verdict is not None and self.verdict.taken else None

    def note(self, names: Sequence[str]) -> str | None:
        """What the plan says about the old partitions (None: nothing was selected)."""
        return self.verdict.note(names) if self.verdict is not None else None


def plan_append_during_migration(
    project: ProjectSpec,
    dataset: DatasetSpec,
    source: Source,
    catalog: Catalog,
    snapshot: Snapshot,
    timeout_s: float | None,
) -> RefreshPlan:
    """An append refresh while partitions of older specs are left: which current partitions with rows in
    old partitions it changes is judged across both layouts (`layouts.settle_append_layouts`); the
    ordinary append plan runs over the others, and the refresh's commit moves the old partitions holding
    rows of the changed ones (`RefreshPlan.migrate`), so the refresh is one catalog version."""
    handle = open_handle(project, dataset)
    layouts = settle_append_layouts(handle, source, catalog, snapshot)
    held = set(layouts.holdings)
    found = discover(dataset, source, snapshot, timeout_s=timeout_s, layouts_checked=True)
    plan = apply_refresh_mode(without_partitions(found, held), dataset, snapshot, source, leave=held)
    return append_across_layouts(plan, found, dataset, snapshot, layouts)


def layouts_differ(snapshot: Snapshot, dataset: DatasetSpec) -> bool:
    """Whether partitions of the version are written under another partition_by than the dataset's."""
    spec_id = dataset.acceleration.partition_spec_id
    return snapshot.partition_spec.spec_id != spec_id or bool(snapshot.other_layout(spec_id)[0])


def switched_view(
    project: ProjectSpec, dataset: DatasetSpec, catalog: Catalog, snapshot: Snapshot
) -> tuple[Snapshot, bool]:
    """The version a selective refresh plans on during a re-partitioning, and whether its commit switches
    the current spec. The first one after a `partition_by` change plans on the newest version seen with
    the new spec current (`Catalog.evolved`, nothing committed); its own commit makes the switch, so the
    refresh is one catalog version, and one that fails publishes nothing. A change the stored rows cannot
    be moved under (a source column renamed without `renamed_columns`) is refused first, with
    `PartitionSpecChangedError` naming the rebuild (`write.repartition.open_stored`)."""
    if snapshot.partition_spec.spec_id == dataset.acceleration.partition_spec_id:
        return snapshot, False
    open_stored(open_handle(project, dataset), catalog)
    log.info(
        "%s: partition_by changed; this refresh's commit makes it current, its partitions older layouts",
        dataset.name,
    )
    return catalog.evolved(snapshot, partition_spec_info(dataset)), True


def old_partitions_of_selection(
    project: ProjectSpec,
    dataset: DatasetSpec,
    catalog: Catalog,
    plan: RefreshPlan,
    snapshot: Snapshot,
    *,
    where: str | None = None,
    selector: KeySelector | None = None,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """For a refresh of selected partitions during a re-partitioning: the old-layout partitions of
    `snapshot` (the plan's base) holding rows of the partitions the plan writes or removes, and, for a
    selection by `where`, of the keys it covers that the source no longer has (those keys' paths too).
    The refresh's commit moves them into the current layout in the same atomic version
    (`RefreshPlan.migrate`, rows of the vanished keys dropped), so no row is ever in two layouts or in
    none, nor kept after the source lost it."""

    keys = [PartitionKey.from_json(item.key) for item in plan.items]
    keys += [snapshot.partitions[path].key for path in plan.removed if path in snapshot.partitions]
    handle = open_handle(project, dataset)
    search = old_partitions_holding(handle, keys, catalog=catalog, snapshot=snapshot)
    migrate = dict.fromkeys(search.key_paths)
    vanished: tuple[str, ...] = ()
    if where is not None and selector is not None:
        known = {item.key_path for item in plan.items} | set(plan.removed)
        lost, vanished = old_rows_the_source_lost(
            handle, where, selector, known, catalog=catalog, snapshot=snapshot
        )
        migrate.update(dict.fromkeys(lost.key_paths))
    log.info(
        "%s: %d of %d old-layout partition(s) read, %d hold rows of the selection%s; the refresh moves them",
        dataset.name,
        search.read,
        search.old_partitions,
        len(migrate),
        f" ({len(vanished)} key(s) the source no longer has)" if vanished else "",
    )
    return tuple(migrate), vanished


def held_reader(project: ProjectSpec, dataset: DatasetSpec) -> Callable[..., Any] | None:
    """Reads columns of a committed partition's files, for the changes audit (None: they are remote)."""
    handle = open_handle(project, dataset)
    if not handle.local_data:
        return None
    storage = handle.storage
    root = handle.local_root

    def read(entry: Any, columns: Sequence[str]) -> Any:
        return storage.read(root, list(entry.files), columns=list(columns))

    return read


def rewrite_late_partitions(
    plan: RefreshPlan,
    dataset: DatasetSpec,
    source: Source,
    snapshot: Any,
    timeout_s: float | None,
    project: ProjectSpec | None = None,
    catalog: Catalog | None = None,
    *,
    layouts: ChangesLayouts | None = None,
) -> RefreshPlan:
    """A changes plan whose audit found partitions differing from the source, under `refresh.late_rows:
    rewrite`: those partitions and the changed ones are rewritten whole from the source in one commit
    (the changes are in the rows read), as a selection refresh rewrites them. During a re-partitioning
    (`layouts`) the key paths the moved rows of changed keys route to are rewritten too, and the same
    commit moves the old partitions holding rows of any of them (`RefreshPlan.migrate`), superseded by
    the rewrite; selected key paths the source no longer has are `vanished` (their old rows dropped)."""
    if not plan.late_rows or plan.late_rows_policy != "rewrite":
        return plan
    selected = sorted({item.key_path for item in plan.items} | set(plan.late_rows))
    if layouts is not None and migration_in_progress(snapshot, dataset) and project is not None:
        assert catalog is not None
        selected = sorted(set(selected) | set(layouts.leaving))
        holders = holders_of(old_holdings(open_handle(project, dataset), catalog), selected)
        chosen = set(selected)
        names = dataset.acceleration.partition_names

        def select(keys: Sequence[tuple[Any, ...]]) -> list[bool]:
            return [PartitionKey(tuple(key)).path(names) in chosen for key in keys]

        found = discover(
            dataset, source, snapshot, where_selector=select, timeout_s=timeout_s, layouts_checked=True
        )
        known = {item.key_path for item in found.items} | set(found.removed)
        whole = replace(
            apply_refresh_mode(found, dataset, snapshot),
            migrate=tuple(sorted(holders | set(plan.migrate))),
            vanished=tuple(path for path in selected if path not in known),
        )
    else:
        whole = apply_refresh_mode(
            discover(dataset, source, snapshot, partitions=selected, timeout_s=timeout_s), dataset, snapshot
        )
    return replace(
        whole,
        notes=(*plan.notes, *whole.notes),
        late_rows=dict(plan.late_rows),
        late_rows_policy=plan.late_rows_policy,
        future_rows=plan.future_rows,
        changed_rows=plan.changed_rows,
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
    # The refresh mode the plan ran under ("full" for --full and re-partitioning), the partitions and rows
    # an append added to committed partitions, the rows written to new files (appended + rewritten), and
    # the source rows with a NULL watermark an append left for a full refresh.
    refresh_mode: str = "full"
    appended_partitions: int = 0
    appended_rows: int = 0
    rows_written: int = 0
    null_watermark_rows: int | None = None
    changed_rows: int | None = None  # refresh_mode changes: rows changed since the watermark, upserted
    # Watermark modes: per key path, source rows the mode would not see at or below the watermark (source
    # minus acceleration; `RefreshPlan.late_rows`), rows with a watermark in the future, and the policy.
    late_rows: dict[str, int] | None = None
    future_rows: dict[str, int] | None = None
    late_rows_policy: str | None = None
    # The engine that ran ("arrow" or "spark") and why (`refresh.strategy.choose_strategy`).
    strategy: str | None = None
    strategy_reason: str | None = None

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
            "refresh_mode": self.refresh_mode,
            "appended_partitions": self.appended_partitions,
            "appended_rows": self.appended_rows,
            "rows_written": self.rows_written,
            "null_watermark_rows": self.null_watermark_rows,
            "changed_rows": self.changed_rows,
            "late_rows": self.late_rows,
            "future_rows": self.future_rows,
            "late_rows_policy": self.late_rows_policy,
            "strategy": self.strategy,
            "strategy_reason": self.strategy_reason,
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
    arrow_memory_budget: int | None = None,
) -> RefreshSummary:
    """Plan, stage, finalize every planned partition and commit, in this process.

    A partition that fails to finalize is reported in `failed`; then nothing is committed unless
    `allow_partial`, which publishes the others and leaves the failed ones at their previous version.
    Lost or extra rows (`ConservationError`, from any step) always refuse the whole commit, partial or
    not: the error names every differing partition. `storage` replaces the dataset's storage engine for
    the partition writes (the engine must publish like the dataset's own).

    `strategy`: "auto" (default) runs the in-process Arrow path when the source fits this machine's memory
    budget (`arrow_memory_budget` bytes, else `AP_ARROW_MEMORY_BUDGET`, else a quarter of the memory) and
    no Spark was given, else the Spark stage (`refresh.strategy`); "arrow", "spark" and "pushdown" force
    theirs. The summary's `strategy` and `strategy_reason` say which ran and why.
    """
    project = load_project(project)
    spec = resolve_dataset(project, dataset)
    handle = open_handle(project, spec)  # outside Airflow: S3 is reached with the AWS environment
    opened = source or open_dataset_source(spec)
    choice: StrategyChoice | None = None
    try:
        started = time.monotonic()
        timings: dict[str, float] = {}
        source = keep_file_facts(opened, handle.local_root)

        def tick(phase: str, done: int, total: int, rows: int) -> None:
            if progress is not None:
                progress(RefreshProgress(phase, done, total, rows, time.monotonic() - started))

        tick("discover", 0, 0, 0)
        if strategy in ("auto", "arrow") and (partitions is not None or where is not None or full):
            # Every file is read whole by a streamed refresh: it learns new files' facts as it routes them.
            learn_facts_in_read(source)
        try:
            plan = _plan_for_refresh(handle, source, partitions, where, full)
        finally:
            learn_facts_in_read(source, False)  # a later plan with this source is not forced
        timings["discover"] = time.monotonic() - started
        choice = _choose_and_log(project, spec, plan, source, strategy, spark, remote, arrow_memory_budget)
        if choice.strategy != "arrow" or not streams(source):
            plan = settled_plan(plan, source, None)  # no streamed read: the facts are read as surveyed
        if choice.strategy == "arrow":
            summary = _refresh_with_arrow(
                handle,
                plan,
                source,
                selecting=partitions is not None or where is not None,
                storage=storage,
                workers=workers,
                allow_partial=allow_partial,
                timings=timings,
                started=started,
                tick=tick,
            )
        else:
            summary = _refresh_with_stage(
                handle,
                plan,
                source,
                spark=spark,
                remote=remote,
                strategy=choice.strategy,
                repartition=repartition,
                storage=storage,
                workers=workers,
                allow_partial=allow_partial,
                timings=timings,
                started=started,
                tick=tick,
            )
    except (ConservationError, PartitionsFailedError) as err:
        refused: RefreshSummary | None = getattr(err, "summary", None)
        if refused is not None and choice is not None:
            refused.strategy, refused.strategy_reason = choice.engine, choice.reason
        raise
    finally:
        if getattr(opened, "snapshot", None) is not None:  # a first change-capture copy held its slot's
            release_snapshot(source=opened)
    summary.strategy, summary.strategy_reason = choice.engine, choice.reason
    return summary


def _plan_for_refresh(
    handle: DatasetHandle,
    source: Source,
    partitions: Sequence[str] | None,
    where: str | None,
    full: bool,
) -> RefreshPlan:
    return plan_refresh(
        handle.project,
        handle.dataset,
        partitions=partitions,
        where=where,
        full=full,
        source=source,
        hold_snapshot=True,
        read_committed=True,
        catalog=handle.catalog,
    )


def _choose_and_log(
    project: ProjectSpec,
    spec: DatasetSpec,
    plan: RefreshPlan,
    source: Source,
    strategy: str,
    spark: Any,
    remote: str | None,
    budget: int | None,
) -> StrategyChoice:
    choice = choose_strategy(
        project,
        plan,
        source,
        strategy=strategy,
        spark_given=describe_spark(spark=spark, remote=remote),
        budget=budget,
    )
    log.info("%s: refreshing with %s: %s", spec.name, choice.engine, choice.reason)
    return choice


def _refresh_with_stage(
    handle: DatasetHandle,
    plan: RefreshPlan,
    source: Source,
    *,
    spark: Any,
    remote: str | None,
    strategy: str,
    repartition: bool,
    storage: PartitionStorage | None,
    workers: int | None,
    allow_partial: bool,
    timings: dict[str, float],
    started: float,
    tick: Callable[[str, int, int, int], None],
) -> RefreshSummary:
    """Stage the planned partitions, finalize each in a thread pool, then commit."""
    spec = handle.dataset
    total = len(plan.items)
    tick("stage", 0, total, 0)
    kill_point("cdc-before-apply")
    mark = time.monotonic()
    try:
        stage = stage_refresh(
            handle,
            plan,
            spark=spark,
            remote=remote,
            strategy=strategy,
            repartition=repartition,
            source=source,
            storage=storage,
        )
    except ConservationError as err:
        timings["stage"] = time.monotonic() - mark
        err.summary = _summary(spec, plan, None, None, {}, timings, started, refused=err)
        raise
    timings["stage"] = time.monotonic() - mark

    mark = time.monotonic()
    results, failed, lost, rows = _finalize_all(handle, plan, stage, storage, workers, tick)
    timings["finalize"] = time.monotonic() - mark

    mark = time.monotonic()
    commit: CommitResult | None = None
    if lost:
        remove_stage(stage)
        refused = merge_conservation_errors(spec.name, lost)
        refused.summary = _summary(spec, plan, stage, None, failed, timings, started, refused=refused)
        raise refused
    if failed:
        record_failures(handle, failed)
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
        commit = commit_refresh(
            handle, plan, results, stage=stage, require_all=not allow_partial, source=source
        )
    except ConservationError as err:
        remove_stage(stage)
        timings["commit"] = time.monotonic() - mark
        err.summary = _summary(spec, plan, stage, None, failed, timings, started, refused=err)
        raise
    timings["commit"] = time.monotonic() - mark
    tick("done", total, total, rows)
    return _summary(spec, plan, stage, commit, failed, timings, started)


def _finalize_all(
    handle: DatasetHandle,
    plan: RefreshPlan,
    stage: StageResult,
    storage: PartitionStorage | None,
    workers: int | None,
    tick: Callable[[str, int, int, int], None],
) -> tuple[list[PartitionResult], dict[str, str], list[ConservationError], int]:
    """Finalize every staged partition: the results, the failures (path -> message), the lost rows."""
    total = len(plan.items)
    results: list[PartitionResult] = []
    failed: dict[str, str] = {}
    lost: list[ConservationError] = []
    rows = 0
    if stage.location is not None:
        tick("finalize", 0, total, 0)
        # Files on S3: finalize writes in scratch and uploads (no local data root).
        data_root = handle.local_root if handle.local_data else None
        pool_size = workers or min(4, os.cpu_count() or 2)
        with ThreadPoolExecutor(max_workers=max(1, pool_size)) as pool:
            futures = {
                pool.submit(
                    finalize_partition, handle, stage, item, data_root=data_root, storage=storage
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
    return results, failed, lost, rows


def _refresh_with_arrow(
    handle: DatasetHandle,
    plan: RefreshPlan,
    source: Source,
    *,
    selecting: bool,
    storage: PartitionStorage | None,
    workers: int | None,
    allow_partial: bool,
    timings: dict[str, float],
    started: float,
    tick: Callable[[str, int, int, int], None],
) -> RefreshSummary:
    """`refresh_dataset` with `strategy="arrow"`: one in-process pyarrow read, route, write, commit."""

    spec = handle.dataset
    check_arrow_supported(handle.project, plan)
    total = len(plan.items)
    tick("finalize", 0, total, 0)
    mark = time.monotonic()
    try:
        written = arrow_refresh(
            bind_to_source(spec, source),
            plan,
            source,
            handle.local_root,
            selecting=selecting,
            storage=storage,
            workers=workers,
            keep_going=True,
        )
    except ConservationError as err:
        timings["finalize"] = time.monotonic() - mark
        err.summary = _summary(spec, plan, None, None, {}, timings, started, refused=err)
        raise
    timings["finalize"] = time.monotonic() - mark
    failed = dict(written.failed)
    stage = StageResult(
        spec.name,
        None,
        StageMode.ARROW if plan.items else StageMode.EMPTY,
        total,
        written.elapsed_s,
        source_rows=written.source_rows,
        routed_rows=written.routed_rows,
    )
    rows = sum(r.rows for r in written.results)
    if failed:
        # As the Spark path: each failure remembered (`refresh --failed`, `status`, the Partitions page).
        record_failures(handle, failed)
    if failed and not allow_partial:
        for result in written.results:
            remove_written(storage or handle.storage, handle.local_root, result.entry.files)
        raise PartitionsFailedError(
            f"{len(failed)} of {total} partition(s) of {spec.name!r} failed; nothing was committed: "
            + "; ".join(f"{path}: {message}" for path, message in list(failed.items())[:5]),
            failed,
            _summary(spec, plan, stage, None, failed, timings, started),
        )
    tick("commit", total, total, rows)
    mark = time.monotonic()
    try:
        commit = commit_refresh(
            handle, plan, list(written.results), require_all=not allow_partial, source=source
        )
    except ConservationError as err:
        timings["commit"] = time.monotonic() - mark
        err.summary = _summary(spec, plan, stage, None, failed, timings, started, refused=err)
        raise
    timings["commit"] = time.monotonic() - mark
    tick("done", total, total, rows)
    return _summary(spec, plan, stage, commit, failed, timings, started)


def record_failures(handle: DatasetHandle, failed: Mapping[str, str]) -> None:
    """Remember partitions this process failed to refresh (`refresh --failed`, `status`, the UI page)."""

    store = FailureStore.for_catalog(handle.catalog)
    now = dt.datetime.now(dt.UTC)
    for key_path, message in failed.items():
        store.record(PartitionFailure(key_path=key_path, error=message, failed_at=now))


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
        # How the stage read the source (Spark, or the executors with pyarrow) and why.
        notes=plan.notes + ((f"stage: {stage.source_read}",) if stage and stage.source_read else ()),
        conservation=conservation,
        refresh_mode=plan.refresh_mode,
        appended_partitions=commit.appended_partitions if commit else 0,
        appended_rows=commit.appended_rows if commit else 0,
        rows_written=int(commit.conservation["written"]) if commit and commit.conservation else 0,
        null_watermark_rows=commit.null_watermark_rows if commit else None,
        changed_rows=plan.changed_rows,
        late_rows=dict(plan.late_rows) if plan.late_rows is not None else None,
        future_rows=dict(plan.future_rows) if plan.future_rows is not None else None,
        late_rows_policy=plan.late_rows_policy,
    )
