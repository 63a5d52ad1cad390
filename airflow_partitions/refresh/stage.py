"""The stage step: read the source once and route rows to the partitions being refreshed.

Two ways, chosen per refresh:

* `spark`: one Spark job reads the source (pruned to the needed files or rows where the source allows),
  computes every partition value with `Transform.to_spark`, keeps the rows of the planned partitions (a
  broadcast join on the key values, NULL-safe) and writes them once as a dataset partitioned by a small
  integer item id: `<location>/data/__ap_item=<i>/`. N partitions cost one scan, like
  `df.write.partitionBy(...)`; finalize then reads only its own directory.
* `pushdown`: when the source can read one partition without scanning the rest (every field decided by
  Hive directories, or Postgres ranges on an indexed column), nothing is staged: the manifest records each
  partition's read hint and finalize reads straight from the source.

Either way the stage writes `_stage.json` last; a location without it is an unfinished stage.

Rows are conserved, and checked: the Spark job observes how many rows it read and how many it routed
(metrics of the one write job, no second scan); the staged files' footers must hold exactly the routed
rows, and when the whole source was scanned every row must have been routed (a row whose partition no
planned key matches would silently vanish). Each item's staged row count goes into the manifest, where
finalize checks what it reads against it. Any mismatch is a `ConservationError` and no stage is left.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.catalog.catalog import DEFAULT_GRACE
from airflow_partitions.exceptions import ConservationError, RefreshError, SourceError
from airflow_partitions.keys import PartitionKey, value_from_json
from airflow_partitions.refresh import remote
from airflow_partitions.refresh.arrow_refresh import arrow_refresh, check_arrow_supported
from airflow_partitions.refresh.arrow_write import remove_written
from airflow_partitions.refresh.cdc import stage_cdc_changes
from airflow_partitions.refresh.leftovers import sweep_stale_stages
from airflow_partitions.refresh.modes import lowest_since, rows_since
from airflow_partitions.refresh.plan import (
    DiscoveryKind,
    RefreshPlan,
    StageMode,
    StageResult,
    check_changed_keys,
    recorded_now,
)
from airflow_partitions.refresh.spark_session import (
    build_connect_session,
    build_local_session,
    describe_session,
)
from airflow_partitions.refresh.split_read import SplitReadJob, choose_split_read, run_split_read, task_budget
from airflow_partitions.refresh.stage_layout import (
    CHANGES_FILE,
    ITEM_COLUMN,
    STAGE_DATA,
    STAGE_MANIFEST,
    StageManifest,
    discovered_but_empty,
    staging_root,
)
from airflow_partitions.refresh.written import (
    RESULT_SCHEMA_DDL,
    ItemMergeJob,
    ItemWriteJob,
    WrittenItem,
    check_merged_changes,
    check_written_items,
    merge_item_rows,
    merge_items,
    remove_written_files,
    storage_for,
    write_items,
    written_mode_refusal,
)
from airflow_partitions.sources import Source, keep_file_facts, open_dataset_source
from airflow_partitions.sources.base import RowsSince
from airflow_partitions.sources.files import FileSource
from airflow_partitions.sources.pg_cdc import upserted_rows
from airflow_partitions.sources.spark import explain_spark_read_error, quote_column
from airflow_partitions.storage import get_storage

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.objectstore import S3Settings
    from airflow_partitions.refresh.written import ItemMergeJob, ItemWriteJob, WrittenItem
    from airflow_partitions.sources.files.splits import Split
    from airflow_partitions.spec.model import DatasetSpec, ProjectSpec
    from airflow_partitions.storage import PartitionStorage
    from airflow_partitions.table import DatasetHandle
    from airflow_partitions.transforms import Transform

log = logging.getLogger(__name__)

_PARTITION_PREFIX = "__ap_p"
_KEY_PREFIX = "__ap_k"
_WATERMARK_COLUMN = "__ap_wm"
_APPEND_COLUMN = "__ap_append"
STRATEGIES = ("auto", "spark", "pushdown")
# Without the shuffle by item, each scan task writes one file for every item it read: skipped only while
# that stays at most this many files per partition and this many files in all (`shuffle_by_item`).
UNSHUFFLED_MAX_TASKS = 8
UNSHUFFLED_MAX_FILES = 4096


def bind_to_source(dataset: DatasetSpec, source: Source) -> DatasetSpec:
    """`dataset` bound to the source's real schema; every problem (unknown column, ...) raised at once."""
    return dataset.bind(source.schema())


def choose_written(dataset: DatasetSpec, write_files: bool | None) -> bool:
    """Whether the Spark executors write the final partition files (`StageMode.WRITTEN`), for a full,
    partial or append refresh, and merge a changes refresh's partitions.

    `write_files=None` (default): whenever the engine allows it (parquet, arrow, duckdb `files`); an
    append's executors write the new files that the commit adds to the committed ones; a changes merge
    reads the committed files from the local accelerator_dir or fetches them from an `s3://` one.
    """

    refusal = written_mode_refusal(dataset)
    if write_files and refusal:
        raise RefreshError(
            f"dataset {dataset.name!r}: the Spark executors cannot write the partition files: {refusal}; "
            "leave write_files unset to stage (or merge) the rows in the partition tasks instead"
        )
    return refusal is None if write_files is None else write_files


def choose_mode(source: Source, transforms: Sequence[Transform], strategy: str) -> StageMode:
    if strategy == "arrow":
        raise RefreshError(
            "strategy 'arrow' reads, routes and writes in one process without a stage: run it with "
            "refresh_dataset(..., strategy='arrow') or `refresh --strategy arrow`; to stage, use one of "
            f"{', '.join(STRATEGIES)}"
        )
    if strategy not in STRATEGIES:
        raise RefreshError(f"unknown stage strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    can_push = source.can_read_partition(transforms)
    if strategy == "pushdown" and not can_push:
        raise RefreshError(
            f"{source.describe()} cannot read one partition without scanning the rest (no Hive layout on "
            "every partition column, or no index for Postgres ranges); use strategy 'auto' or 'spark'"
        )
    if strategy == "spark" or not can_push:
        return StageMode.SPARK
    return StageMode.PUSHDOWN


@dataclass
class _StageWork:
    """One stage: what it reads and where it goes, and what it has done so far (read by the manifest,
    and by the cleanup when the stage fails)."""

    handle: DatasetHandle
    bound: DatasetSpec
    source: Source
    transforms: list[Transform]
    plan: RefreshPlan
    keys: list[tuple[Any, ...]]
    target: Path
    storage: PartitionStorage | None
    mode: StageMode
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    ran_on: str | None = None
    counts: SparkStageCounts | None = None
    job: ItemWriteJob | None = None
    merge: ItemMergeJob | None = None
    written: dict[int, WrittenItem] = field(default_factory=dict)
    source_read: str | None = None  # how the source was read, and why (`split_read.choose_split_read`)

    @property
    def dataset(self) -> DatasetSpec:
        return self.handle.dataset


def stage_refresh(
    handle: DatasetHandle,
    plan: RefreshPlan,
    *,
    spark: Any = None,
    remote: str | None = None,
    location: str | os.PathLike[str] | None = None,
    strategy: str = "auto",
    repartition: bool = False,
    source: Source | None = None,
    sweep_grace: dt.timedelta = DEFAULT_GRACE,
    write_files: bool | None = None,
    storage: PartitionStorage | None = None,
    shuffle_items: bool | None = None,
    executors_read: bool | None = None,
) -> StageResult:
    """Stage the rows of every planned partition (one source scan at most); returns where they are.

    `spark` is a ready session; without one a local session is built, or a Spark Connect one for `remote`
    (`sc://host:15002`). `repartition=True` shuffles so each partition is one staged file (fewer, larger
    files for finalize, at the price of a shuffle). First, stages that killed runs left in the staging
    root and that were last active more than `sweep_grace` ago (default: vacuum's 1 h) are removed.

    `write_files` (default: when the engine allows, see `choose_written`): the Spark executors write each
    partition's final files themselves (`StageMode.WRITTEN`, with `storage` or the dataset's engine; when
    the files live on S3 they upload them with the handle's settings); the manifest lists them per item and
    finalize reads no data. An append's executors write only rows past each item's watermark; a changes
    refresh given a session (`spark` or `remote`) merges each item on an executor (`choose_written`).
    `shuffle_items` (executor writes only): True shuffles the routed rows by item, so one task writes each
    partition (one file, or `max_rows_per_file` slices); False skips the shuffle: each source task writes
    the items it read (up to one file per scan task per partition, each sorted; compaction merges them).
    None (default) skips it when the scan has few tasks (`shuffle_by_item`): the plain `partitionBy` job
    pays no shuffle either, and the shuffle was the stage's largest cost beyond it.
    `executors_read` (executor writes only): True has the executors read the Parquet source files with
    pyarrow (`refresh/split_read.py`; refused with the reason otherwise), False keeps Spark's read, None
    (default) the former whenever the source allows; the result's `source_read` says which ran and why.
    """

    project, dataset = handle.project, handle.dataset
    started = time.monotonic()
    sweep_stale_stages(
        staging_root(project, dataset),
        grace=sweep_grace,
        keep=[location] if location is not None else [],
    )
    _check_plan_matches(dataset, plan)
    if not plan.items:
        return StageResult(plan.dataset, None, StageMode.EMPTY, 0, time.monotonic() - started)
    source = keep_file_facts(source or open_dataset_source(dataset), handle.local_root)
    bound = bind_to_source(dataset, source)
    if strategy == "arrow":
        target = Path(location) if location is not None else staging_root(project, dataset) / _stage_name()
        return _stage_with_arrow(handle, bound, plan, source, target, storage, started)
    transforms = [f.transform for f in bound.acceleration.partition_by]
    changes = any(item.changes for item in plan.items)
    mode = StageMode.CHANGES if changes else choose_mode(source, transforms, strategy)
    # Executors reach an s3:// accelerator_dir with the caller's settings; without them (a spark-submit
    # job, whose executors know no Airflow connection) the rows are staged (or merged) as before.
    local_data = handle.local_data
    executors_reach_data = local_data or handle.settings is not None or write_files is True
    if mode is StageMode.SPARK and executors_reach_data and choose_written(dataset, write_files):
        mode = StageMode.WRITTEN
    target = _new_stage_target(project, dataset, location)
    keys = [PartitionKey.from_json(item.key).values for item in plan.items]
    work = _StageWork(handle, bound, source, transforms, plan, keys, target, storage, mode)
    # Every discovered key planned: the source read is not narrowed, so every source row must be routed.
    # An append reads only rows past watermarks: rows at or below them are not routed, by design.
    full_scan = len(keys) >= plan.discovered and not plan.appending
    sinces = [rows_since(dataset, item) for item in plan.items]
    try:
        if work.mode is StageMode.CHANGES:
            _stage_changed_rows(
                work,
                spark=spark,
                remote=remote,
                executors_reach_data=executors_reach_data,
                write_files=write_files,
                local_data=local_data,
            )
        elif work.mode is StageMode.PUSHDOWN:
            for index, (item, key) in enumerate(zip(plan.items, keys, strict=True)):
                work.entries[item.key_path] = {
                    "index": index,
                    "hint": source.partition_read_hint(transforms, key),
                }
        else:
            _stage_on_spark(
                work,
                session=spark if spark is not None else _session(remote),
                sinces=sinces,
                full_scan=full_scan,
                repartition=repartition,
                shuffle_items=shuffle_items,
                executors_read=executors_read,
            )
        _write_manifest(work, full_scan=full_scan, changes=changes)
    except BaseException:
        _discard_stage(work)
        raise
    return _stage_result(work, started)


def _stage_result(work: _StageWork, started: float) -> StageResult:
    dataset, plan, target, counts = work.dataset, work.plan, work.target, work.counts
    return StageResult(
        dataset.name,
        str(target),
        work.mode,
        len(plan.items),
        time.monotonic() - started,
        spark=work.ran_on,
        source_rows=counts.source_rows if counts is not None else None,
        routed_rows=counts.routed_rows if counts is not None else None,
        source_read=work.source_read,
    )


def _check_plan_matches(dataset: DatasetSpec, plan: RefreshPlan) -> None:
    if plan.dataset != dataset.name or plan.spec_id != dataset.acceleration.partition_spec_id:
        raise RefreshError(
            f"plan for {plan.dataset!r} (spec {plan.spec_id}) does not match dataset {dataset.name!r} "
            f"(spec {dataset.acceleration.partition_spec_id}); plan again"
        )


def _new_stage_target(
    project: ProjectSpec, dataset: DatasetSpec, location: str | os.PathLike[str] | None
) -> Path:
    """The stage directory, created; refused when it already holds a finished stage."""
    target = Path(location) if location is not None else staging_root(project, dataset) / _stage_name()
    if (target / STAGE_MANIFEST).exists():
        raise RefreshError(f"stage location {target} already holds a finished stage; use a new location")
    # The directory follows the umask: Spark executors, possibly another user on a cluster, write into it.
    # Nothing secret is staged; the manifest is written 0600 all the same.
    target.mkdir(parents=True, exist_ok=True)
    return target


def _stage_changed_rows(
    work: _StageWork,
    *,
    spark: Any,
    remote: str | None,
    executors_reach_data: bool,
    write_files: bool | None,
    local_data: bool,
) -> None:
    """A changes refresh: the captured rows staged for the partition tasks, or, given a session whose
    executors can write the partitions, merged by those executors."""
    dataset, bound, source, plan = work.dataset, work.bound, work.source, work.plan
    transforms, storage = work.transforms, work.storage
    changed, landing = stage_changes(dataset, source, transforms, plan)
    # Refused before anything is merged or written when the source changed other keys since the plan.
    check_changed_keys(plan, changed, dataset.acceleration.primary_key)
    upserted = upserted_rows(changed)  # change capture stages keys to delete too
    work.counts = SparkStageCounts(source_rows=upserted, routed_rows=upserted)
    session = spark if spark is not None else _session(remote) if remote else None
    if session is not None and executors_reach_data and choose_written(dataset, write_files):
        # Spark is at hand: its executors merge and write the partitions, not the partition tasks.

        work.ran_on = describe_session(session)
        work.merge = _item_merge_job(work.handle, bound, source, transforms, plan, storage, changed)
        work.written = _merge_on_executors(session, work.merge)
        key_paths = [item.key_path for item in plan.items]
        merged_rows = sum(found.routed for found in work.written.values())
        check_written_items(dataset.name, key_paths, work.written, merged_rows)
        check_merged_changes(dataset.name, key_paths, work.written, landing)
        work.mode = StageMode.WRITTEN
        work.entries.update(written_entries(plan, work.written))
    else:
        for index, item in enumerate(plan.items):
            work.entries[item.key_path] = {"index": index}
    if work.mode is StageMode.CHANGES or local_data:
        # Partition tasks merge these rows (locally also the retry of an item an executor
        # could not write); on an object store the executors' merge needs nothing staged.
        import pyarrow.parquet as pq

        pq.write_table(changed, work.target / CHANGES_FILE)


def _stage_on_spark(
    work: _StageWork,
    *,
    session: Any,
    sinces: list[RowsSince | None],
    full_scan: bool,
    repartition: bool,
    shuffle_items: bool | None,
    executors_read: bool | None = None,
) -> None:
    """One Spark job routes the planned partitions' rows: staged, or written as final files (`WRITTEN`),
    read by Spark or (`split_read.py`) by the executors themselves."""
    dataset, bound, source, plan = work.dataset, work.bound, work.source, work.plan
    transforms, keys, target, storage = work.transforms, work.keys, work.target, work.storage
    work.ran_on = describe_session(session)
    subset = None if full_scan else keys
    choice = None
    if work.mode is StageMode.WRITTEN:
        work.job = _item_write_job(work.handle, bound, source, transforms, plan, keys, storage, sinces)
        choice = choose_split_read(
            session,
            source,
            transforms,
            subset,
            len(keys),
            sinces=sinces,
            shuffle_items=shuffle_items,
            requested=executors_read,
            max_files=UNSHUFFLED_MAX_FILES,
        )
        work.source_read = choice.note
        log.info("stage of dataset %r: %s", dataset.name, choice.note)
    if choice is not None and choice.tasks is not None:
        work.counts = _read_on_executors(work, session, choice.tasks)
    else:
        work.counts, work.written = _run_spark_stage(
            session,
            source,
            transforms,
            keys,
            subset,
            target,
            repartition=repartition,
            sinces=sinces,
            shared_since=lowest_since(dataset, plan.items),
            job=work.job,
            shuffle_items=shuffle_items,
        )
    if work.job is None:
        staged = staged_item_rows(target, len(keys))
        for index, item in enumerate(plan.items):
            work.entries[item.key_path] = {"index": index, "rows": staged.get(index, 0)}
    else:
        check_written_items(dataset.name, work.job.key_paths, work.written, work.counts.routed_rows)
        staged = {index: found.routed for index, found in work.written.items()}
        work.entries.update(written_entries(plan, work.written))
    check_stage_conservation(
        dataset.name,
        plan,
        work.counts,
        staged,
        full_scan=full_scan,
        unrouted=lambda: _unrouted_partitions(session, source, transforms, keys, target, plan),
    )


def _read_on_executors(
    work: _StageWork, session: Any, tasks: tuple[tuple[Split, ...], ...]
) -> SparkStageCounts:
    """The executors read the source's splits, route and write them (`split_read.py`); `work.written`
    holds what they wrote (removed by the caller's cleanup if the stage fails). A split that could not be
    read fails the stage with the reader's error (naming the file)."""
    assert work.job is not None
    assert isinstance(work.source, FileSource)
    reader = work.source.split_reader()
    job = SplitReadJob(work.job, reader, tuple(work.plan.partition_names), tasks, task_budget())
    read, routed, work.written, errors = run_split_read(session, job)
    if errors:
        more = f" ({len(errors)} read tasks failed)" if len(errors) > 1 else ""
        raise SourceError(f"{errors[0]}{more}; nothing was published")
    return SparkStageCounts(source_rows=read, routed_rows=routed)


def _write_manifest(
    work: _StageWork,
    *,
    full_scan: bool,
    changes: bool,
) -> None:
    """`_stage.json`, written last: a location without it is an unfinished stage."""
    dataset, bound, source, plan, counts = work.dataset, work.bound, work.source, work.plan, work.counts
    StageManifest(
        dataset=dataset.name,
        spec_id=bound.acceleration.partition_spec_id,
        mode=work.mode,
        source=source.to_json(),
        schema=source.schema(),
        items=work.entries,
        created_at=recorded_now(),
        discovery=plan.discovery,
        source_rows=counts.source_rows if counts is not None else None,
        routed_rows=counts.routed_rows if counts is not None else None,
        full_scan=full_scan and not changes and work.mode in (StageMode.SPARK, StageMode.WRITTEN),
        counted_by=None if counts is None or changes else "observed" if counts.observed else "recounted",
    ).write(work.target)


def _discard_stage(work: _StageWork) -> None:
    """A failed stage leaves nothing: files the executors wrote are removed, then the stage directory."""
    writer = work.job if work.job is not None else work.merge
    if work.written and writer is not None:
        remove_written_files(work.written, writer.data_root, writer.upload_url, writer.s3_settings)
    shutil.rmtree(work.target, ignore_errors=True)


def _stage_with_arrow(
    handle: DatasetHandle,
    bound: DatasetSpec,
    plan: RefreshPlan,
    source: Source,
    target: Path,
    storage: PartitionStorage | None,
    started: float,
) -> StageResult:
    """The in-process Arrow path as a stage (a DAG's stage task under `strategy="auto"`): the source read,
    routed and written here, the files listed in a WRITTEN manifest, so the partition tasks read no data
    and only build their entries from it, as after a Spark stage whose executors wrote the files."""

    check_arrow_supported(handle.project, plan)
    if (target / STAGE_MANIFEST).exists():
        raise RefreshError(f"stage location {target} already holds a finished stage; use a new location")
    full_scan = len(plan.items) >= plan.discovered and not plan.appending
    data_root = handle.local_root
    done = arrow_refresh(bound, plan, source, data_root, selecting=not full_scan, storage=storage)
    by_path = {result.entry.key_path: result for result in done.results}
    written = {
        index: WrittenItem(
            # The Arrow path records what it routed to every partition it writes.
            routed=by_path[item.key_path].routed or 0,
            written=by_path[item.key_path].entry.rows,
            files=by_path[item.key_path].entry.files,
            certificate=by_path[item.key_path].entry.certificate,
        )
        for index, item in enumerate(plan.items)
        if item.key_path in by_path
    }
    try:
        target.mkdir(parents=True, exist_ok=True)
        StageManifest(
            dataset=bound.name,
            spec_id=bound.acceleration.partition_spec_id,
            mode=StageMode.WRITTEN,
            source=source.to_json(),
            schema=source.schema(),
            items=written_entries(plan, written),
            created_at=recorded_now(),
            discovery=plan.discovery,
            source_rows=done.source_rows,
            routed_rows=done.routed_rows,
            full_scan=full_scan,
            counted_by="observed",
        ).write(target)
    except BaseException:
        engine = storage or get_storage(bound.acceleration)
        remove_written(engine, data_root, [f for result in done.results for f in result.entry.files])
        shutil.rmtree(target, ignore_errors=True)
        raise
    return StageResult(
        bound.name,
        str(target),
        StageMode.WRITTEN,
        len(plan.items),
        time.monotonic() - started,
        spark="in-process arrow",
        source_rows=done.source_rows,
        routed_rows=done.routed_rows,
    )


def stage_changes(
    dataset: DatasetSpec, source: Source, transforms: Sequence[Transform], plan: RefreshPlan
) -> tuple[pa.Table, dict[int, int]]:
    """refresh_mode changes: read the changed rows once (the range the plan saw); the caller stages them.

    Returns the changed rows and, per planned item, how many of them land in it.

    Refused when the rows are not the ones planned (another count, or, when the stage serves the whole
    plan, a row landing in a partition the plan does not hold): the source changed between plan and
    stage, and the plan's partitions might miss where a changed row's old version lives. (A partition
    task staging itself holds one item: it checks the count only.)
    """

    if plan.cdc is not None:  # refresh.change_detection: cdc
        return stage_cdc_changes(dataset, source, transforms, plan)
    first = plan.items[0]
    column = dataset.acceleration.refresh.watermark_column
    read_changed = getattr(source, "read_changed", None)
    if column is None or read_changed is None:
        raise RefreshError(f"{source.describe()} cannot read changed rows; plan again")
    changed = read_changed(
        source.schema().names, column, value_from_json(first.watermark), value_from_json(first.upper)
    )
    planned = {tuple(PartitionKey.from_json(item.key).values): i for i, item in enumerate(plan.items)}
    if changed.num_rows:
        values = [t.apply_table(changed).to_pylist() for t in transforms]
        per_key = collections.Counter(zip(*values, strict=True))
    else:
        per_key = collections.Counter()
    whole_plan = plan.changed_partitions is None or len(plan.items) == plan.changed_partitions
    if (plan.changed_rows is not None and changed.num_rows != plan.changed_rows) or (
        whole_plan and not per_key.keys() <= planned.keys()
    ):
        raise RefreshError(
            f"the rows of {source.describe()} changed between the plan ({plan.changed_rows} changed rows) "
            f"and the stage ({changed.num_rows}); nothing was written: run the refresh again"
        )
    return changed, {planned[key]: rows for key, rows in per_key.items() if key in planned}


@dataclass(frozen=True)
class SparkStageCounts:
    """What the Spark stage job observed: rows read from the source and rows routed to planned keys."""

    source_rows: int
    routed_rows: int
    observed: bool = True  # False when metrics were unavailable and the counts came from a fallback


def staged_item_rows(location: str | os.PathLike[str], items: int) -> dict[int, int]:
    """Rows staged per item index, from the staged Parquet footers (no data is read).

    Counts exactly the files finalize reads: names starting with `.` or `_` (Spark's `_SUCCESS`, `.crc`
    files) are skipped, as `pyarrow.dataset` skips them.
    """
    import pyarrow.parquet as pq

    data = Path(location) / STAGE_DATA
    prefix = f"{ITEM_COLUMN}="
    files: list[tuple[int, Path]] = []
    if data.is_dir():
        for entry in os.scandir(data):
            if not entry.is_dir() or not entry.name.startswith(prefix):
                continue
            suffix = entry.name[len(prefix) :]
            index = int(suffix) if suffix.isdigit() else -1
            if not 0 <= index < items:
                raise RefreshError(f"the stage at {location} holds an unplanned item directory {entry.name}")
            files.extend(
                (index, Path(entry.path, name))
                for name in os.listdir(entry.path)
                if not name.startswith((".", "_"))
            )

    def footer_rows(path: Path) -> int:
        try:
            return int(pq.read_metadata(str(path)).num_rows)
        except (OSError, ValueError) as err:
            raise RefreshError(f"cannot read the footer of staged file {path}: {err}") from err

    rows: dict[int, int] = {}
    if len(files) > 16:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=8) as pool:
            counted = list(pool.map(footer_rows, [path for _, path in files]))
    else:
        counted = [footer_rows(path) for _, path in files]
    for (index, _), count in zip(files, counted, strict=True):
        rows[index] = rows.get(index, 0) + count
    return rows


def check_stage_conservation(
    dataset: str,
    plan: RefreshPlan,
    counts: SparkStageCounts,
    staged: Mapping[int, int],
    *,
    full_scan: bool,
    unrouted: Callable[[], dict[str, int]],
) -> None:
    """Refuse a stage that lost or invented rows: routed = staged, and (full scan) read = routed.

    Also refuses a dynamically discovered partition that received no row: discovery saw rows for it.
    `unrouted` names the partitions of rows no planned key matched (it runs a second job, only on error).
    """
    staged_total = sum(staged.values())
    if staged_total != counts.routed_rows:
        raise ConservationError(
            dataset,
            {"[all staged partitions]": (counts.routed_rows, staged_total)},
            expected="rows routed by the Spark stage job",
            actual="rows in the staged files",
            hint="The staged files are incomplete (a lost Spark task output or a concurrent cleanup of "
            "the staging directory); run the refresh again.",
        )
    if full_scan and counts.source_rows != counts.routed_rows:
        missing = unrouted() if counts.source_rows > counts.routed_rows else {}
        partitions: dict[str, tuple[int | None, int]] = {
            path: (rows, 0) for path, rows in missing.items()
        } or {"[whole source]": (counts.source_rows, counts.routed_rows)}
        raise ConservationError(
            dataset,
            partitions,
            expected="rows in the source",
            actual="rows routed to a planned partition",
            hint=f"The refresh scanned the whole source ({counts.source_rows} rows) but only "
            f"{counts.routed_rows} belong to the {len(plan.items)} planned partition(s): the rows of the "
            "partitions listed were not discovered (a partition discovery missed, e.g. a NULL value), or "
            "the source changed during the refresh. Run the refresh again; if it fails again, discovery "
            "misses these partitions.",
        )
    if plan.discovery is DiscoveryKind.DYNAMIC:
        # An appended partition may have no row past its watermark; a written-whole one must have rows.
        empty = [
            item.key_path
            for index, item in enumerate(plan.items)
            if not staged.get(index) and not item.append
        ]
        if empty:
            raise discovered_but_empty(dataset, empty, actual="rows staged")


def _stage_name() -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return f"{stamp}-{uuid.uuid4().hex[:10]}"


def _session(remote: str | None) -> Any:

    return build_connect_session(remote) if remote else build_local_session()


def keys_table(transforms: Sequence[Transform], keys: Sequence[tuple[Any, ...]]) -> pa.Table:
    """The planned keys as Arrow columns of the partition value types, plus their item id."""
    import pyarrow as pa

    columns: dict[str, pa.Array] = {}
    for position, transform in enumerate(transforms):
        values = [key[position] for key in keys]
        columns[f"{_KEY_PREFIX}{position}"] = pa.array(values, type=transform.result_type)
    columns[ITEM_COLUMN] = pa.array(range(len(keys)), type=pa.int32())
    return pa.table(columns)


def _run_spark_stage(
    spark: Any,
    source: Source,
    transforms: Sequence[Transform],
    keys: Sequence[tuple[Any, ...]],
    subset: Sequence[tuple[Any, ...]] | None,
    target: Path,
    *,
    repartition: bool,
    sinces: Sequence[RowsSince | None] = (),
    shared_since: RowsSince | None = None,
    job: ItemWriteJob | None = None,
    shuffle_items: bool | None = None,
) -> tuple[SparkStageCounts, dict[int, WrittenItem]]:
    """Run the stage job: rows staged under `<target>/data` or, with `job`, final files written by the
    executors (returned per item)."""
    from functools import reduce

    from pyspark.sql import functions as F

    # Partition values must match the Arrow evaluation: UTC session, microsecond timestamps in parquet.
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    if shared_since is not None:
        frame = source.spark_frame(spark, transforms, subset, work_dir=str(target), since=shared_since)
        # Also filtered here: Spark pushes it into a Parquet scan (row-group statistics) or a JDBC query.
        frame = frame.filter(_spark_since(frame, shared_since))
    else:
        frame = source.spark_frame(spark, transforms, subset, work_dir=str(target))
    columns = list(frame.columns)
    clashes = [c for c in columns if c.startswith(("__ap_",))]
    if clashes:
        raise SourceError(
            f"source columns {clashes} use the reserved prefix __ap_; rename them in the source"
        )
    source_observation = _observation(spark, "ap_source")
    routed_observation = _observation(spark, "ap_routed")
    counted = frame
    frame = frame.observe(source_observation, F.count(F.lit(1)).alias("rows"))
    for position, transform in enumerate(transforms):
        frame = frame.withColumn(f"{_PARTITION_PREFIX}{position}", transform.spark_value())
    key_frame = _key_frame(spark, transforms, keys, frame, sinces=sinces)
    condition = reduce(
        lambda left, right: left & right,
        [
            frame[f"{_PARTITION_PREFIX}{position}"].eqNullSafe(key_frame[f"{_KEY_PREFIX}{position}"])
            for position in range(len(transforms))
        ],
    )
    if any(since is not None for since in sinces):
        # Each appended partition keeps only its rows past its own watermark; the others keep all.
        column = frame[quote_column(next(s for s in sinces if s is not None).column)]
        mark = key_frame[_WATERMARK_COLUMN]
        condition = condition & (
            ~key_frame[_APPEND_COLUMN]
            | (mark.isNull() & column.isNotNull())
            | (mark.isNotNull() & (column > mark))
        )
    routed = frame.join(F.broadcast(key_frame), condition, "inner").select(
        *[frame[quote_column(c)] for c in columns], key_frame[ITEM_COLUMN]
    )
    routed = routed.observe(routed_observation, F.count(F.lit(1)).alias("rows"))
    written: dict[int, WrittenItem] = {}
    try:
        if job is not None:
            shuffle = shuffle_by_item(_scan_tasks(counted), len(keys), shuffle_items)
            written = _write_items_on_executors(spark, routed, job, len(keys), shuffle_items=shuffle)
        else:
            if repartition:
                routed = routed.repartition(ITEM_COLUMN)
            # Staged files live minutes and are read once: skip compression (about 13% faster to write).
            writer = routed.write.mode("overwrite").option("compression", "none").partitionBy(ITEM_COLUMN)
            writer.parquet(str(target / STAGE_DATA))
    except Exception as err:
        if isinstance(err, SourceError):
            raise
        explained = explain_spark_read_error(err, source.describe())
        if explained is not None:
            raise explained from err
        raise RefreshError(f"the Spark stage job for {source.describe()} failed: {_first_line(err)}") from err
    source_rows = _observed_rows(source_observation)
    routed_rows = _observed_rows(routed_observation)
    if source_rows is not None and routed_rows is not None:
        return SparkStageCounts(source_rows=source_rows, routed_rows=routed_rows), written
    # No metrics came back (a Spark server without observation support, or a plan the optimizer reduced):
    # count the source in a second job and take the staged footers as the routed count. Correct, at the
    # price of a second scan.
    try:
        recounted = int(counted.count())
    except Exception as err:
        raise RefreshError(f"counting the rows of {source.describe()} failed: {_first_line(err)}") from err
    routed_total = (
        sum(item.routed for item in written.values())
        if job is not None
        else sum(staged_item_rows(target, len(keys)).values())
    )
    return SparkStageCounts(source_rows=recounted, routed_rows=routed_total, observed=False), written


def written_entries(plan: RefreshPlan, written: Mapping[int, WrittenItem]) -> dict[str, dict[str, Any]]:
    """The stage manifest's items of a WRITTEN stage: what the executors wrote for each planned item."""
    entries: dict[str, dict[str, Any]] = {}
    for index, item in enumerate(plan.items):
        found = written.get(index)
        entry: dict[str, Any] = {
            "index": index,
            "rows": found.routed if found else 0,
            "written": found.written if found else 0,
            "files": [f.to_json() for f in found.files] if found else [],
        }
        if found is not None and found.error is not None:
            entry["error"] = found.error
        if found is not None and found.changed is not None:
            entry["changed"] = found.changed
        if found is not None and found.certificate is not None:
            entry["certificate"] = found.certificate.to_json()
        entries[item.key_path] = entry
    return entries


def _item_merge_job(
    handle: DatasetHandle,
    bound: DatasetSpec,
    source: Source,
    transforms: Sequence[Transform],
    plan: RefreshPlan,
    storage: PartitionStorage | None,
    changed: pa.Table,
) -> ItemMergeJob:
    """What the executors need to merge the changed rows into the planned items (the changed rows ride
    in the job: the stage holds them in memory already, and executors need no path to the stage)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, changed.schema) as writer:
        writer.write_table(changed)
    data_root, upload_url, settings = _data_destination(handle, bound)
    return ItemMergeJob(
        dataset=bound.name,
        primary_key=tuple(bound.acceleration.primary_key),
        schema=source.schema().serialize().to_pybytes(),
        transforms=tuple(transforms),
        items=tuple(plan.items),
        storage=storage_for(bound.acceleration, storage),
        changes=sink.getvalue().to_pybytes(),
        data_root=data_root,
        upload_url=upload_url,
        s3_settings=settings,
    )


def _data_destination(
    handle: DatasetHandle, bound: DatasetSpec
) -> tuple[str | None, str | None, S3Settings | None]:
    """Where executors write partition files: (local dataset root, None, None), or, when the files live on
    S3, (None, the dataset's URL, the handle's settings that reach it)."""
    if handle.local_data:
        return str(handle.local_root), None, None

    remote.check_remote_engine(bound)
    return None, handle.data_location, handle.settings


def _item_tasks(spark: Any, items: int) -> int:
    """Spark tasks for a job with one task per item, up to the session's shuffle partitions."""
    try:
        limit = int(spark.conf.get("spark.sql.shuffle.partitions") or 200)
    except Exception:
        limit = 200
    return max(1, min(items, limit))


def _merge_on_executors(spark: Any, job: ItemMergeJob) -> dict[int, WrittenItem]:
    """One Spark task per planned item (up to the shuffle partitions) merges and writes it."""
    from functools import partial

    count = len(job.items)
    items = spark.createDataFrame([(i,) for i in range(count)], "item INT").repartition(
        _item_tasks(spark, count), "item"
    )
    try:
        rows = items.mapInArrow(partial(merge_items, job), RESULT_SCHEMA_DDL).toArrow().to_pylist()
    except Exception as err:
        raise RefreshError(
            f"the Spark merge job of dataset {job.dataset!r} failed: {_first_line(err)}"
        ) from err
    return merge_item_rows(rows)


def _item_write_job(
    handle: DatasetHandle,
    bound: DatasetSpec,
    source: Source,
    transforms: Sequence[Transform],
    plan: RefreshPlan,
    keys: Sequence[tuple[Any, ...]],
    storage: PartitionStorage | None,
    sinces: Sequence[RowsSince | None] = (),
) -> ItemWriteJob:
    """What the executors need to write the planned items' final files (local root, or S3 upload)."""

    data_root, upload_url, settings = _data_destination(handle, bound)
    return ItemWriteJob(
        dataset=bound.name,
        schema=source.schema().serialize().to_pybytes(),
        transforms=tuple(transforms),
        keys=tuple(tuple(key) for key in keys),
        key_paths=tuple(item.key_path for item in plan.items),
        storage=storage_for(bound.acceleration, storage),
        data_root=data_root,
        upload_url=upload_url,
        s3_settings=settings,
        sinces=tuple(sinces),
    )


def _write_items_on_executors(
    spark: Any, routed: Any, job: ItemWriteJob, items: int, *, shuffle_items: bool
) -> dict[int, WrittenItem]:
    """Shuffle the routed rows by item (one task owns an item) and let each task write its items' final
    files (`mapInArrow`); collects the small per-item metadata rows on the driver."""
    from functools import partial

    if shuffle_items:
        # An explicit count: adaptive execution would coalesce a by-column shuffle into a few tasks, and
        # each task writes its items one after the other.
        routed = routed.repartition(_item_tasks(spark, items), ITEM_COLUMN)
    result = routed.mapInArrow(partial(write_items, job), RESULT_SCHEMA_DDL)
    return merge_item_rows(result.toArrow().to_pylist())


def shuffle_by_item(scan_tasks: int | None, items: int, requested: bool | None = None) -> bool:
    """Whether the executors' writes shuffle the routed rows by item first (`requested`, when given).

    Without the shuffle every scan task writes a file per item it read, so it is skipped only when the
    scan's task count is known (a classic session; Spark Connect does not say) and at most
    `UNSHUFFLED_MAX_TASKS`, with at most `UNSHUFFLED_MAX_FILES` files in all: a large scan or many
    partitions keep the shuffle (one task per partition), so a partition never gets many small files.
    """
    if requested is not None:
        return requested
    if scan_tasks is None:
        return True
    return scan_tasks > UNSHUFFLED_MAX_TASKS or scan_tasks * items > UNSHUFFLED_MAX_FILES


def _scan_tasks(frame: Any) -> int | None:
    """How many tasks scan the source frame (planning only, no job); None on Spark Connect."""
    if type(frame).__module__.startswith("pyspark.sql.connect"):
        return None
    try:
        return int(frame.rdd.getNumPartitions())
    except Exception:  # a source that cannot tell: keep the shuffle
        return None


def _observation(spark: Any, name: str) -> Any:
    """An `Observation` of the session's kind (classic or Spark Connect), uniquely named per job."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        from pyspark.sql.connect.observation import Observation as ConnectObservation

        return ConnectObservation(f"{name}_{uuid.uuid4().hex[:12]}")
    from pyspark.sql import Observation

    return Observation(f"{name}_{uuid.uuid4().hex[:12]}")


def _observed_rows(observation: Any) -> int | None:
    """The observed count, or None when the job delivered no metrics (then the caller counts instead)."""
    try:
        value = observation.get.get("rows")
    except Exception:  # e.g. the optimizer removed the observed subtree: no metrics, not a failed job
        return None
    return None if value is None else int(value)


def _unrouted_partitions(
    spark: Any,
    source: Source,
    transforms: Sequence[Transform],
    keys: Sequence[tuple[Any, ...]],
    target: Path,
    plan: RefreshPlan,
    *,
    limit: int = 20,
) -> dict[str, int]:
    """Key path -> row count of source rows that no planned key matched (a second job: error path only)."""
    from functools import reduce

    from pyspark.sql import functions as F

    try:
        frame = source.spark_frame(spark, transforms, None, work_dir=str(target / "_unrouted"))
        names = [f"{_PARTITION_PREFIX}{position}" for position in range(len(transforms))]
        for position, transform in enumerate(transforms):
            frame = frame.withColumn(names[position], transform.spark_value())
        key_frame = _key_frame(spark, transforms, keys, frame)
        condition = reduce(
            lambda left, right: left & right,
            [frame[name].eqNullSafe(key_frame[f"{_KEY_PREFIX}{p}"]) for p, name in enumerate(names)],
        )
        grouped = (
            frame.join(F.broadcast(key_frame), condition, "left_anti")
            .groupBy(*names)
            .count()
            .orderBy(F.col("count").desc())
            .limit(limit)
            .toArrow()
        )
        return {
            PartitionKey(tuple(row[name] for name in names)).path(plan.partition_names): int(row["count"])
            for row in grouped.to_pylist()
        }
    except Exception:  # the counts already prove the loss; naming the partitions is a courtesy
        return {}


def _key_frame(
    spark: Any,
    transforms: Sequence[Transform],
    keys: Sequence[tuple[Any, ...]],
    frame: Any,
    *,
    sinces: Sequence[RowsSince | None] = (),
) -> Any:
    """The planned keys as a Spark frame, each key column cast to its partition column's Spark type;
    with `sinces` (append), each key's watermark and whether it appends, the watermark cast to the
    watermark column's Spark type."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    table = keys_table(transforms, keys)
    since = next((s for s in sinces if s is not None), None)
    if since is not None:
        # Text, cast by Spark in the UTC session: no Python-side time zone reaches the values.
        marks = [None if s is None or s.after is None else _spark_literal_text(s.after) for s in sinces]
        table = table.append_column(_WATERMARK_COLUMN, pa.array(marks, type=pa.string()))
        table = table.append_column(
            _APPEND_COLUMN, pa.array([s is not None for s in sinces], type=pa.bool_())
        )
    key_frame = spark.createDataFrame(table)
    for position in range(len(transforms)):
        name = f"{_KEY_PREFIX}{position}"
        data_type = frame.schema[f"{_PARTITION_PREFIX}{position}"].dataType
        key_frame = key_frame.withColumn(name, F.col(name).cast(data_type))
    if since is not None:
        data_type = frame.schema[since.column].dataType
        key_frame = key_frame.withColumn(_WATERMARK_COLUMN, F.col(_WATERMARK_COLUMN).cast(data_type))
    return key_frame


def _spark_literal_text(value: Any) -> str:
    """A watermark as text Spark casts back exactly: ISO wall time in UTC for instants."""
    import datetime as dt

    if isinstance(value, dt.datetime):
        if value.tzinfo is not None and value.utcoffset() is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date):
        return value.isoformat()
    return str(value)


def _spark_since(frame: Any, since: RowsSince) -> Any:
    """`since` as a Spark condition on `frame` (the literal cast to the column's own type)."""
    from pyspark.sql import functions as F

    column = frame[quote_column(since.column)]
    if since.after is None:
        return column.isNotNull()
    data_type = frame.schema[since.column].dataType
    return column > F.lit(_spark_literal_text(since.after)).cast(data_type)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:800]
