"""The commit step: publish every finalised partition and every removal in one atomic catalog version.

Until this runs nothing of the refresh is visible. Partitions whose finalize failed are either a reason to
refuse the commit (the default: the catalog stays untouched, retry the failed partitions and commit again)
or, with `require_all=False`, left at their previous version while the others are published.

Row conservation is checked once more, over everything committed: each partition's routed count must be
the rows its files hold, and after a full-source stage the routed rows must add up to the rows scanned.
The counts are recorded in the commit record (`VersionInfo.conservation`); a mismatch raises
`ConservationError` before the catalog is touched.

During a re-partitioning, a plan of selected partitions names the old-layout partitions holding their rows
(`RefreshPlan.migrate`): the same commit moves them into the current layout (`write.refresh_moves`), rows
for the refreshed partitions superseded by the refresh, the others appended to their partitions, checked
across the two layouts and recorded under `migrated`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.catalog.model import files_digest
from airflow_partitions.catalog.open import partition_spec_info as catalog_partition_spec_info
from airflow_partitions.catalog.open import value_kind_of as catalog_value_kind_of
from airflow_partitions.exceptions import (
    CommitConflictError,
    ConservationError,
    RefreshError,
    SourceError,
    VersionNotFoundError,
)
from airflow_partitions.objectstore import LocalStore
from airflow_partitions.objectstore.open import store_from_url
from airflow_partitions.refresh.cdc import after_commit
from airflow_partitions.refresh.failures import FailureStore
from airflow_partitions.refresh.plan import (
    CommitResult,
    ConservationCounts,
    PartitionResult,
    RefreshPlan,
    StageResult,
)
from airflow_partitions.refresh.plan import check_changed_keys as check_planned_keys
from airflow_partitions.refresh.stage_layout import (
    CHANGES_FILE,
    read_stage_manifest,
    remove_stage,
    stage_location,
)
from airflow_partitions.sources import open_dataset_source
from airflow_partitions.table.partition_writer import PartitionWriter
from airflow_partitions.table.publish import CommitBuilder
from airflow_partitions.write.refresh_moves import RefreshMoves, moves_for_refresh
from airflow_partitions.write.row_hash import bind_certificate

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.catalog import Catalog, PartitionEntry, PartitionSpecInfo, Snapshot
    from airflow_partitions.objectstore import ObjectStore, SettingsLike
    from airflow_partitions.sources import Source
    from airflow_partitions.spec.model import DatasetSpec
    from airflow_partitions.storage import DataFile
    from airflow_partitions.table import DatasetHandle


def value_kind_of(arrow_type: pa.DataType) -> str:
    """The `keys.value_kind` name of partition values of `arrow_type` (to decode key paths)."""

    return catalog_value_kind_of(arrow_type)


def partition_spec_info(dataset: DatasetSpec) -> PartitionSpecInfo:
    """The catalog's record of the dataset's partition spec (field names, canonical transforms, kinds);
    it lives with the catalog, which writes use too."""

    return catalog_partition_spec_info(dataset)


def commit_refresh(
    handle: DatasetHandle,
    plan: RefreshPlan,
    results: Sequence[PartitionResult],
    *,
    stage: StageResult | str | os.PathLike[str] | None = None,
    require_all: bool = True,
    cleanup: bool = True,
    commit_id: str | None = None,
    source: Source | None = None,
) -> CommitResult:
    """One atomic catalog commit of the finalised partitions plus the plan's removals.

    Raises `RefreshError` (catalog untouched) when a planned partition has no result and `require_all`,
    or when a result was not planned. The stage location is deleted after a successful commit.

    A retried commit is idempotent: it returns the version an earlier attempt committed (nothing is
    moved or written again). The attempts are recognised by `commit_id`, by default the stage's name, or
    without a stage (each partition staged itself) a digest of the plan, which a new discovery changes.

    A commit since the plan's base version that touched a partition this one publishes or removes (a
    write, another refresh, a re-partitioning batch moving an old partition the plan moves or appending
    to a partition it changes) refuses it with `CommitConflictError`, nothing published: plan again.

    When the files live on S3, every file is checked to exist there before the catalog references it, and
    a stage on S3 is deleted there; S3 is reached with the handle's settings.
    """
    dataset, settings = handle.dataset, handle.settings
    finished = list(results)
    planned = {item.key_path: item for item in plan.items}
    by_path, missing = _check_results(dataset, plan, finished, require_all)
    counts = check_conservation(
        dataset.name, plan, [by_path[p] for p in planned if p in by_path], stage, missing, settings
    )
    recorded = {**counts.to_json(), **watermark_audit_record(plan)}
    if plan.cdc is not None:
        # refresh.change_detection cdc: the stream position this version holds the changes up to.
        recorded["cdc_lsn"] = plan.cdc["upto"]
    catalog = handle.catalog
    storage = catalog.storage or handle.storage
    root = catalog.data_root or handle.local_root
    # The partition files' store: the catalog's data store on S3, else the local data root.
    writer = PartitionWriter(storage, catalog.data_store or LocalStore(root), Path(root), dataset.name)
    ordered = [by_path[p] for p in planned if p in by_path]
    stored, base = switched_base(catalog, dataset, plan) if plan.switch_spec else (None, None)
    entries, appended_rows = published_entries(writer, catalog, plan, ordered, base=base)
    location = stage_location(stage)
    commit_id = commit_id or (Path(location).name if location else plan_commit_id(plan))
    # A retry of a commit that moves old partitions or switches the layout finds its first attempt
    # before moving them again.
    layouts = plan.migrate or plan.replaced_old or plan.switch_spec
    version = published_earlier(catalog, plan, commit_id) if layouts else None
    if version is None:
        changed = check_changed_keys(handle, plan, stage)
        moves = _moves(handle, plan, ordered, entries, changed, base=base)
        if moves is not None:
            recorded["migrated"] = moves.counts
        if plan.replaced_old:
            recorded["replaced_from_source"] = replaced_old_counts(handle, plan, entries, base=base)
        if entries or plan.removed or plan.replace_all or layouts:
            builder = CommitBuilder(
                catalog,
                "refresh",
                plan.base_version,
                partition_spec_info(dataset),
                commit_id,
                conservation=recorded,
            )
            version = _publish(builder, plan, entries, moves, stored)
    if version is not None:
        # Published (or removed) partitions no longer count as failed, for runs, the CLI and the UI.
        FailureStore.for_catalog(catalog).clear([e.key_path for e in entries] + list(plan.removed))
    if plan.cdc is not None and not missing:
        after_commit(plan, dataset, source, committed=version is not None)
    if cleanup:
        remove_stage(stage, settings)
    unread_nulls = None
    if plan.refresh_mode in ("append", "changes") and plan.watermark_column is not None:
        unread_nulls = unread_null_watermarks(catalog, dataset, plan.watermark_column, version, source=source)
    return CommitResult(
        dataset=dataset.name,
        version=version,
        upserted=len(entries),
        removed=len(plan.removed),
        rows=sum(e.rows for e in entries),
        bytes=sum(e.bytes for e in entries),
        missing=missing,
        conservation=recorded if version is not None else None,
        appended_partitions=sum(1 for r in finished if r.appended) if version is not None else 0,
        appended_rows=appended_rows if version is not None else 0,
        refresh_mode=plan.refresh_mode,
        null_watermark_rows=unread_nulls,
    )


def _publish(
    builder: CommitBuilder,
    plan: RefreshPlan,
    entries: Sequence[PartitionEntry],
    moves: RefreshMoves | None,
    stored: Snapshot | None = None,
) -> int:
    """Commit the refreshed entries, the plan's removals and the moves of old-layout partitions in one
    version, with the switch of the current spec when the plan makes it (`stored`: its base version as
    stored); a conflicting commit since the plan's base raises `CommitConflictError` saying to plan again."""
    merged = {e.key_path for e in moves.upserts} if moves is not None else set()
    builder.add([e for e in entries if e.key_path not in merged])
    builder.remove(plan.removed)
    if moves is not None:
        # The old-layout partitions holding rows of the selection leave in the same version.
        builder.add(moves.upserts)
        builder.remove(moves.removes)
    # Old-layout partitions whose rows the refreshed partitions (the selection and its siblings) hold as
    # the source has them: they leave unread.
    builder.remove(plan.replaced_old)
    if plan.switch_spec:
        # The first refresh after a partition_by change: the switch joins this version.
        assert stored is not None
        builder.fold_switch(stored)
    try:
        return builder.commit(replace_all=plan.replace_all, evolve=plan.switch_spec)
    except CommitConflictError as err:
        raise plan_again(str(err), plan, err.partitions, err.version) from err


def plan_again(
    reason: str, plan: RefreshPlan, partitions: tuple[str, ...], version: int | None
) -> CommitConflictError:
    """The `CommitConflictError` of a refresh whose plan a later commit made stale: nothing of it is
    published, and it must be planned again."""
    moving = f", moving {len(plan.migrate)} old-layout partition(s)," if plan.migrate else ""
    return CommitConflictError(
        f"{reason} The refresh planned from version {plan.base_version}{moving} was not published, nothing "
        "of it is; its written files are left for vacuum. Plan the refresh again (run it again): the new "
        "plan starts from the newest version",
        partitions=partitions,
        version=version,
    )


def check_moves_current(catalog: Catalog, plan: RefreshPlan) -> None:
    """Each old-layout partition the plan moves is in the newest version as in the plan's base; a batch
    or a write since moved or changed one: `CommitConflictError` at once, before its files are read (a
    vacuum may have deleted them since) and its rows written again."""
    latest = catalog.latest()
    if latest is None or plan.base_version is None or latest.version == plan.base_version:
        return
    if plan.switch_spec:
        # Planned on its base as the switch of the current spec would make it: any commit since refuses it.
        raise plan_again(
            f"dataset {plan.dataset!r}: version {latest.version} was committed after base version "
            f"{plan.base_version}; a refresh that switches the current partition spec must be based on the "
            "newest version.",
            plan,
            tuple(plan.migrate),
            latest.version,
        )
    try:
        base = catalog.snapshot(plan.base_version)
    except VersionNotFoundError as err:
        raise plan_again(f"{err}.", plan, tuple(plan.migrate), latest.version) from err
    stale = []
    for path in (*plan.migrate, *plan.replaced_old):
        now, then = latest.partitions.get(path), base.partitions.get(path)
        if now is None or then is None or now.files != then.files:
            stale.append(path)
    if stale:
        raise plan_again(
            f"dataset {plan.dataset!r}: old-layout partition(s) {', '.join(stale[:10])} the refresh moves "
            f"were moved or changed after base version {plan.base_version} (newest: {latest.version}).",
            plan,
            tuple(stale),
            latest.version,
        )


def published_earlier(catalog: Catalog, plan: RefreshPlan, commit_id: str) -> int | None:
    """The version an earlier attempt of this commit published (`commit_id` among the newest commits'
    ids, after the plan's base), so a retry publishes nothing twice and moves nothing again; None when
    it must commit (the catalog still recognises an older attempt when it rebases)."""
    latest = catalog.latest()
    version = latest.commit_ids.get(commit_id) if latest is not None else None
    return version if version is not None and version > (plan.base_version or 0) else None


def _moves(
    handle: DatasetHandle,
    plan: RefreshPlan,
    results: Sequence[PartitionResult],
    entries: list[PartitionEntry],
    changed: pa.Table | None = None,
    *,
    base: Snapshot | None = None,
) -> RefreshMoves | None:
    """The moves of the old-layout partitions the plan migrates (`RefreshPlan.migrate`), for this commit:
    rows routing to a partition the refresh rewrites whole (or removes) are superseded by it; the others
    join their current-layout partitions (a partition the refresh appends to, or merges changes into: its
    new entry). A changes refresh drops the moved rows of the keys it changed or deleted (`changed`: the
    staged change table's keys, the ones every merge removed, `check_changed_keys`): the merged rows
    replace them."""
    if not plan.migrate:
        return None
    check_moves_current(handle.catalog, plan)
    merging = {item.key_path for item in plan.items if item.changes}
    rewritten = {r.key_path for r in results if not r.appended and r.key_path not in merging}
    joined = {
        e.key_path: e for r, e in zip(results, entries, strict=True) if r.appended or r.key_path in merging
    }
    return moves_for_refresh(
        handle,
        handle.catalog,
        plan.base_version,
        plan.migrate,
        superseded=rewritten | set(plan.removed) | set(plan.vanished),
        appended=joined,
        changed_keys=changed,
        base=base,
    )


def replaced_old_counts(
    handle: DatasetHandle,
    plan: RefreshPlan,
    entries: Sequence[PartitionEntry],
    *,
    base: Snapshot | None = None,
) -> dict[str, Any]:
    """For a plan removing old-layout partitions whose siblings it rewrites from the source
    (`RefreshPlan.replaced_old`): checked before anything is published (`RefreshError`, plan again), each is
    in the base version, of an older spec and still holds only rows a refresh wrote whole from the source;
    the commit records their count and rows, and the partitions written in their place."""
    check_moves_current(handle.catalog, plan)
    snapshot = base if base is not None else handle.catalog.snapshot(plan.base_version)
    spec_id = plan.spec_id
    wrong = [
        path
        for path in plan.replaced_old
        if (entry := snapshot.partitions.get(path)) is None
        or entry.spec_id == spec_id
        or not entry.whole_from_source
    ]
    if wrong:
        raise RefreshError(
            f"dataset {plan.dataset!r}: the plan removes old-layout partitions {wrong[:5]} that version "
            f"{plan.base_version} does not hold as partitions written whole from the source; plan again"
        )
    return {
        "partitions": len(plan.replaced_old),
        "rows": sum(snapshot.partitions[path].rows for path in plan.replaced_old),
        "read": 0,
        "refreshed_partitions": len(entries),
        "refreshed_rows": sum(entry.rows for entry in entries),
    }


def check_changed_keys(
    handle: DatasetHandle, plan: RefreshPlan, stage: StageResult | str | os.PathLike[str] | None
) -> pa.Table | None:
    """A changes refresh moving old-layout partitions: its staged changed keys (`staged_change_keys`),
    checked again against the keys the plan found (`plan.check_changed_keys`; the stage checked them
    before writing anything) as the moves drop them. None for other refreshes: the commit reads no data."""
    if plan.refresh_mode != "changes" or not plan.migrate:
        return None
    changed = staged_change_keys(handle, stage)
    check_planned_keys(plan, changed, handle.dataset.acceleration.primary_key)
    return changed


def staged_change_keys(handle: DatasetHandle, stage: StageResult | str | os.PathLike[str] | None) -> pa.Table:
    """The primary-key columns of a changes stage's change table (rows to upsert and keys to delete);
    `RefreshError` without a stage, or a stage without the table."""
    import io

    import pyarrow.parquet as pq

    location = stage_location(stage)
    if not location:
        raise RefreshError(
            f"dataset {handle.dataset.name!r}: a changes refresh moving old-layout partitions needs its "
            "stage (the changed keys) at commit; commit with the stage the plan was staged to"
        )
    store = store_from_url(location, settings=handle.settings, what="stage location")
    data = store.get(CHANGES_FILE)
    if data is None:
        raise RefreshError(f"the stage at {location} holds no {CHANGES_FILE}; stage again")
    keys = list(handle.dataset.acceleration.primary_key)
    return pq.read_table(io.BytesIO(data), columns=keys)


def _check_results(
    dataset: DatasetSpec, plan: RefreshPlan, finished: Sequence[PartitionResult], require_all: bool
) -> tuple[dict[str, PartitionResult], tuple[str, ...]]:
    """The results by key path and the planned partitions without one; `RefreshError` (catalog
    untouched) for a result of another plan or spec, or a missing one when every one is required."""
    if plan.dataset != dataset.name or plan.spec_id != dataset.acceleration.partition_spec_id:
        raise RefreshError(
            f"plan for {plan.dataset!r} (spec {plan.spec_id}) does not match dataset {dataset.name!r}; "
            "plan again"
        )
    planned = {item.key_path: item for item in plan.items}
    unexpected = sorted({r.key_path for r in finished} - set(planned))
    if unexpected:
        raise RefreshError(
            f"results for partitions the plan does not contain: {unexpected[:5]}; not committed"
        )
    mismatched = sorted(r.key_path for r in finished if r.spec_id != plan.spec_id)
    if mismatched:
        raise RefreshError(f"results written under another partition spec: {mismatched[:5]}; not committed")
    by_path = {r.key_path: r for r in finished}
    missing = tuple(path for path in planned if path not in by_path)
    if missing and plan.replaced_old:
        raise RefreshError(
            f"{len(missing)} of {len(planned)} planned partition(s) of {dataset.name!r} have no result, e.g. "
            f"{', '.join(missing[:5])}, and the refresh removes old-layout partitions whose rows they hold "
            "(rewritten from the source in their place); the catalog is untouched. Retry the refresh: it "
            "publishes all of them or none"
        )
    if missing and require_all:
        raise RefreshError(
            f"{len(missing)} of {len(planned)} planned partition(s) have no result (failed or not run), e.g. "
            f"{', '.join(missing[:5])}; the catalog is untouched. Retry those partitions, or commit the "
            "others "
            "with require_all=False"
        )
    if plan.replace_all and missing:
        raise RefreshError(
            f"re-partitioning {dataset.name!r} replaces every partition, but {len(missing)} have no result; "
            "retry them before committing"
        )
    return by_path, missing


def switched_base(catalog: Catalog, dataset: DatasetSpec, plan: RefreshPlan) -> tuple[Snapshot, Snapshot]:
    """For a plan that switches the current spec (`RefreshPlan.switch_spec`): its base version as stored,
    and as the plan saw it, with the dataset's spec current (`Catalog.evolved`)."""
    if plan.base_version is None:
        raise RefreshError(
            f"the plan for {dataset.name!r} switches the partition spec but has no base version; plan again"
        )
    stored = catalog.snapshot(plan.base_version)
    return stored, catalog.evolved(stored, partition_spec_info(dataset))


def published_entries(
    writer: PartitionWriter,
    catalog: Catalog,
    plan: RefreshPlan,
    results: Sequence[PartitionResult],
    *,
    base: Snapshot | None = None,
) -> tuple[list[PartitionEntry], int]:
    """The catalog entries of `results` (in plan order) with their files published, and the rows
    appended: an appended result's files join the partition's committed ones (rows checked, certificates
    summed); any other result's files replace them. Files on S3 must be there (uploaded by finalize).
    `base`: the plan's base version as it saw it (`switched_base`), else it is read."""
    if writer.uploads:
        _check_uploaded(writer.store, [f for r in results for f in r.files])
    extended = appended_to(catalog, writer.dataset, plan, results, snapshot=base)
    merged = {item.key_path for item in plan.items if item.changes or item.append}
    entries = []
    appended_rows = 0
    for result in results:
        published = writer.publish(result.files)
        if result.appended:
            # The committed files stay; the new ones join them in the same atomic commit.
            before = extended[result.key_path]
            entry = result.entry.with_files([*before.files, *published])
            # The certificate of old rows plus new ones is the sum of both (None if either has none).
            added = result.entry.certificate
            entry = replace(entry, certificate=added.plus(before.certificate) if added is not None else None)
            entry = replace(entry, certificate=bind_certificate(entry.certificate, entry.files))
            check_appended_rows(writer.dataset, result.key_path, before.rows, result.rows, entry.rows)
            appended_rows += result.rows
            entries.append(entry)
        else:
            entry = result.entry.with_files(published)
            entry = replace(entry, certificate=bind_certificate(entry.certificate, entry.files))
            if result.key_path not in merged:
                # Its rows are the source's rows of its key, nothing kept: a refresh during a
                # re-partitioning may rewrite it from the source instead of moving it
                # (`write.refresh_siblings`).
                entry = replace(entry, from_source=files_digest(entry.files))
            entries.append(entry)
    return entries, appended_rows


def watermark_audit_record(plan: RefreshPlan) -> dict[str, Any]:
    """What a watermark mode's plan found it could not see (`RefreshPlan.late_rows` / `future_rows`), as
    the commit record keeps it beside the row counts, so `status` can say it later. Empty in full mode."""
    record: dict[str, Any] = {}
    if plan.late_rows is not None:
        record["late_rows"] = dict(plan.late_rows)
        record["late_rows_policy"] = plan.late_rows_policy
    if plan.future_rows:
        record["future_rows"] = dict(plan.future_rows)
    return record


def unread_null_watermarks(
    catalog: Catalog,
    dataset: DatasetSpec,
    column: str,
    version: int | None,
    *,
    source: Source | None = None,
) -> int | None:
    """Source rows with a NULL watermark minus those the newest version holds (from file statistics).

    An append reads a NULL-watermark row only with a partition it writes whole, so these rows wait for a
    full refresh; they are counted so that is said, not silent. None when the source cannot be asked.
    """

    snapshot = catalog.snapshot(version) if version is not None else catalog.latest()
    held = 0
    if snapshot is not None:
        for entry in snapshot.partitions.values():
            for data_file in entry.files:
                stats = data_file.stats.get(column)
                held += stats.null_count if stats is not None else 0
    try:
        in_source = (source or open_dataset_source(dataset)).count_null_rows(column)
    except (SourceError, OSError):
        return None
    return max(0, in_source - held)


def appended_to(
    catalog: Catalog,
    dataset: str,
    plan: RefreshPlan,
    results: Sequence[PartitionResult],
    *,
    snapshot: Snapshot | None = None,
) -> dict[str, PartitionEntry]:
    """The committed entries (at the plan's base version) that appended results extend.

    The commit is made on that base version: a concurrent commit that touched one of these partitions
    since then is a conflict (`CommitConflictError`), so files are never added to an entry that moved.
    """
    wanted = [r.key_path for r in results if r.appended]
    if not wanted:
        return {}
    if plan.base_version is None:
        raise RefreshError(
            f"results append to partitions of {dataset!r}, but the plan has no base version; plan again"
        )
    if snapshot is None:
        snapshot = catalog.snapshot(plan.base_version)
    entries: dict[str, PartitionEntry] = {}
    for key_path in wanted:
        entry = snapshot.partitions.get(key_path)
        if entry is None:
            raise RefreshError(
                f"partition {key_path} of {dataset!r} was planned as an append to version "
                f"{plan.base_version}, which does not hold it; plan again"
            )
        entries[key_path] = entry
    return entries


def check_appended_rows(dataset: str, key_path: str, before: int, appended: int, after: int) -> None:
    """Rows after an append = rows before + rows appended, or nothing is committed."""
    if after != before + appended:
        raise ConservationError(
            dataset,
            {key_path: (before + appended, after)},
            expected="rows before the append + rows appended",
            actual="rows in the partition's files after it",
            hint="The committed entry and the new files disagree; run the refresh again.",
        )


def check_conservation(
    dataset: str,
    plan: RefreshPlan,
    results: Sequence[PartitionResult],
    stage: StageResult | str | os.PathLike[str] | None,
    missing: Sequence[str],
    s3_settings: SettingsLike | None = None,
) -> ConservationCounts:
    """Every result's routed rows = the rows its files hold; after a full-source stage, routed = scanned.

    Raises `ConservationError` naming every partition that differs (nothing is committed); returns the
    counts the commit records. A result of an older version without a routed count is checked against
    its own row count only.
    """
    differing: dict[str, tuple[int | None, int]] = {}
    routed_total = 0
    written_total = 0
    for result in results:
        in_files = sum(f.rows for f in result.files)
        routed = result.routed if result.routed is not None else result.rows
        routed_total += routed
        written_total += in_files
        if in_files != routed or result.rows != in_files:
            differing[result.key_path] = (routed, in_files)
    if differing:
        raise ConservationError(
            dataset,
            differing,
            expected="rows routed",
            actual="rows in the partition's files",
            hint="Finalize those partitions again (their files were written short or changed), then commit.",
        )
    changes = [r.changed_rows for r in results if r.changed_rows is not None]
    staged_changes = _staged_changes(stage, s3_settings)
    if staged_changes is not None and not missing and sum(changes) != staged_changes:
        raise ConservationError(
            dataset,
            {"[changed rows]": (staged_changes, sum(changes))},
            expected="rows changed in the source (staged)",
            actual="changed rows upserted into the committed partitions",
            hint="A changed row found no partition (or two); stage and finalize again.",
        )
    source_rows = _full_scan_source_rows(stage, s3_settings)
    if source_rows is not None and not missing and source_rows != routed_total:
        raise ConservationError(
            dataset,
            {"[all planned partitions]": (source_rows, routed_total)},
            expected="rows in the source (scanned by the stage)",
            actual="rows routed to the committed partitions",
            hint="The partition results do not belong to this stage, or some were lost; stage and finalize "
            "again.",
        )
    return ConservationCounts(
        partitions_checked=len(results),
        routed=routed_total,
        written=written_total,
        source_rows=source_rows,
    )


def _check_uploaded(store: ObjectStore, files: Sequence[DataFile]) -> None:
    """Refuse to reference a file that is not on S3 (a finalize that returned without its upload)."""
    absent = [f.path for f in files if not store.exists(f.path)]
    if absent:
        raise RefreshError(
            f"{len(absent)} partition file(s) are not on {store.describe()}, e.g. {absent[:3]}; the catalog "
            "is untouched. Finalize those partitions again, then commit"
        )


def _stage_record(
    stage: StageResult | str | os.PathLike[str] | None, settings: SettingsLike | None = None
) -> dict[str, Any] | None:
    """The stage's manifest as JSON, wherever the stage lives (a local directory or `s3://`); None when
    there is no stage or it has no manifest."""
    import json

    raw = read_stage_manifest(stage, settings)
    if raw is None:
        return None
    record: dict[str, Any] = json.loads(raw)
    return record


def _full_scan_source_rows(
    stage: StageResult | str | os.PathLike[str] | None, settings: SettingsLike | None = None
) -> int | None:
    """Rows the stage scanned, when it scanned the whole source (else None: nothing to compare with)."""
    record = _stage_record(stage, settings) or {}
    return record.get("source_rows") if record.get("full_scan") else None


def _staged_changes(
    stage: StageResult | str | os.PathLike[str] | None, settings: SettingsLike | None = None
) -> int | None:
    """Rows a changes stage read (None for other stages), from its manifest on S3 or on local disk."""
    record = _stage_record(stage, settings) or {}
    return record.get("source_rows") if str(record.get("mode")) == "changes" else None


def plan_commit_id(plan: RefreshPlan) -> str:
    """`plan-<digest>` of a plan (items, fingerprints, base version, creation time): one id per discovery."""
    import hashlib
    import json

    text = json.dumps(plan.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "plan-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]
