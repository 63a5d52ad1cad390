"""Partition discovery and change detection: which partitions exist, and which need a refresh.

Discovery is static when every field is `bucket(N, col)`: the keys are the product of 0..N-1 plus NULL
per field (the bucket of a NULL value is NULL, and NULL rows are rows like any other) and the source is not
asked for them. Otherwise it is dynamic: one `SELECT DISTINCT` of all partition expressions (bucket ones
included) against the source, or a listing when Hive directories decide every field. For a composite of
buckets and dynamic fields only the combinations that actually have rows become partitions: the product of
N buckets with every dynamic value would mostly be empty partitions, each one a file and a task.

The diff compares each discovered key's source fingerprint with the one the catalog recorded: files give
per-partition fingerprints where their Hive layout maps files to partitions (else one for the whole
source, which then refreshes everything when anything changed); Postgres gives per-partition row count and
max of `refresh.check_column` (or of the row version `xmin`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import (
    DiscoveryError,
    PartitionSpecChangedError,
    SchemaMixedRefreshError,
    TooManyPartitionsError,
)
from airflow_partitions.keys import (
    PartitionKey,
    Scalar,
    comma_form_as_label,
    composite_key,
    key_text_problem,
    partition_label,
    value_to_text,
)
from airflow_partitions.refresh.plan import DiscoveryKind, PartitionWorkItem, Reason, RefreshPlan
from airflow_partitions.sources.base import Deadline, KeyTuple, Source, SourceSurvey, fingerprint_schema_tag
from airflow_partitions.spec.model import bucket_count, static_partition_count

if TYPE_CHECKING:
    from airflow_partitions.catalog import Snapshot
    from airflow_partitions.spec.model import DatasetSpec
    from airflow_partitions.transforms import Transform

KeySelector = Callable[[Sequence[KeyTuple]], Sequence[bool]]


def bucket_counts(transforms: Sequence[Transform]) -> list[int] | None:
    """N of every field when all fields are `bucket(N, col)` (static discovery), else None."""
    counts: list[int] = []
    for transform in transforms:
        count = bucket_count(transform)
        if count is None:
            return None
        counts.append(count)
    return counts


def static_keys(counts: Sequence[int], max_partitions: int) -> list[KeyTuple]:
    """The product of (0..N-1, NULL) over the bucket fields, refused beyond `max_partitions`.

    NULL is planned even when no row has it (like an empty bucket): a static layout never looks at the
    rows, and leaving NULL out would silently drop every row whose column is NULL.
    """
    total = static_partition_count(counts)
    if total > max_partitions:
        raise TooManyPartitionsError(
            f"bucket fields {list(counts)} make {total} partitions (each field's buckets plus its NULL "
            f"partition), more than refresh.max_partitions ({max_partitions}); use fewer buckets or raise "
            "max_partitions"
        )
    choices: list[list[Scalar]] = [[*range(n), None] for n in counts]
    return [tuple(key) for key in itertools.product(*choices)]


def key_text(names: Sequence[str], key: Sequence[Scalar]) -> str:
    """`name=value/...` with unescaped values: how people type a partition on the command line."""
    return "/".join(
        f"{name}={'NULL' if value is None else value_to_text(value)}"
        for name, value in zip(names, key, strict=True)
    )


def select_keys(
    names: Sequence[str], keys: Sequence[KeyTuple], requested: Sequence[str]
) -> tuple[list[KeyTuple], list[str]]:
    """The discovered keys named in `requested`, and the requested strings that name no discovered partition.

    A partition is named by its canonical key string (`region=Z%C3%BCrich`), its readable label as a
    mapped task shows it (`region=Zürich`, `keys.partition_label`), its Airflow partition key as asset
    events and partitioned runs carry it (`Zürich|2026-01-01T00:00:00`, `keys.composite_key`), or
    `name=value/...` with unescaped values, or the comma form of logs (`region=Zürich, day=2026-01-01`,
    `PartitionKey.describe`). Where two forms collide, that order decides.
    """
    by_text: dict[str, KeyTuple] = {}
    for key in keys:
        by_text[PartitionKey(key).path(names)] = key
    for key in keys:
        by_text.setdefault(partition_label(names, PartitionKey(key)), key)
    for key in keys:
        by_text.setdefault(composite_key(PartitionKey(key)), key)
    for key in keys:
        by_text.setdefault(key_text(names, key), key)
    for key in keys:
        by_text.setdefault(PartitionKey(key).describe(names), key)
    chosen: dict[KeyTuple, None] = {}
    unknown: list[str] = []
    for text in requested:
        found = by_text.get(text)
        if found is None:
            found = by_text.get(text.strip().strip("/"))
        if found is None:
            found = by_text.get(comma_form_as_label(text, names).strip().strip("/"))
        if found is None:
            unknown.append(text)
        else:
            chosen[found] = None
    return list(chosen), unknown


def partition_by_text(fields: Sequence[tuple[str, str]]) -> str:
    """`name: canonical, ...` of partition fields, as messages and `status` show a partition_by."""
    return ", ".join(f"{name}: {canonical}" for name, canonical in fields) or "(no partition fields)"


def respec_advice(dataset: str) -> str:
    """How to re-partition after a partition_by change: the one answer discovery and `status` give."""
    return (
        f"run a plain `airflow-partitions refresh SPEC {dataset}` (or with --full; in Airflow, trigger its "
        "refresh DAG without `partitions` or `where`), which rebuilds every partition under the new "
        "partition_by in one atomic commit, or move the partitions over batch by batch while reads, "
        f"writes and refreshes go on (`airflow-partitions repartition SPEC {dataset}` until `status` shows "
        "none left), or revert partition_by"
    )


def partial_respec_error(
    dataset: str, old_fields: Sequence[tuple[str, str]], new_fields: Sequence[tuple[str, str]], selection: str
) -> PartitionSpecChangedError:
    """Refusal of a partial refresh after a partition_by change: it would publish a subset as the whole."""
    return PartitionSpecChangedError(
        f"dataset {dataset!r}: partition_by changed from ({partition_by_text(old_fields)}) in the catalog "
        f"to ({partition_by_text(new_fields)}) in the spec, and a refresh of selected partitions "
        f"({selection}) cannot re-partition: every partition must be rewritten under the new "
        "partition_by, and committing only the selected ones would drop the rest. To re-partition, "
        f"{respec_advice(dataset)}; selective refreshes work again once that rebuild is committed"
    )


def discover(
    dataset: DatasetSpec,
    source: Source,
    snapshot: Snapshot | None,
    *,
    partitions: Sequence[str] | None = None,
    where_selector: KeySelector | None = None,
    full: bool = False,
    timeout_s: float | None = None,
    max_partitions: int | None = None,
    layouts_checked: bool = False,
    widen: Callable[[Sequence[KeyTuple]], Sequence[KeyTuple]] | None = None,
) -> RefreshPlan:
    """Discover the partitions of a bound `dataset` in `source` and diff them against `snapshot`.

    `partitions` (key strings) and `where_selector` narrow what is refreshed, and force those partitions
    even when unchanged; `full` forces every partition. Removed partitions are those in the catalog that
    discovery no longer finds (within the selection when one is given); `widen` adds keys (`_widened`)."""
    started = time.monotonic()
    acceleration = dataset.acceleration
    transforms = [f.transform for f in acceleration.partition_by]
    if not all(t.is_bound for t in transforms):
        raise DiscoveryError(f"dataset {dataset.name!r} must be bound to its source schema before discovery")
    names = acceleration.partition_names
    if partitions is not None:
        # Before the survey, which may scan the whole source: a key of the wrong shape names nothing.
        _check_key_texts(dataset, names, partitions)
    spec_id = acceleration.partition_spec_id
    refresh = acceleration.refresh
    limit = max_partitions if max_partitions is not None else refresh.max_partitions
    deadline = Deadline(timeout_s if timeout_s is not None else refresh.discovery_timeout_s)

    existing = _catalog_state(snapshot)
    respec = snapshot is not None and bool(existing) and _snapshot_spec_id(snapshot) not in (None, spec_id)
    # A re-partitioning in progress (partitions of an older spec left): a refresh of every partition
    # rebuilds them all under the current spec and ends it; a selection is refused like after a change.
    migrating = (
        snapshot is not None and not respec and bool(existing) and bool(snapshot.other_layout(spec_id)[0])
    )
    if migrating and layouts_checked:
        # `pipeline.old_partitions_of_selection` found every old partition holding rows of the selection;
        # the refresh's commit moves them (`RefreshPlan.migrate`): the selected partitions are refreshed
        # in the current layout, the other old ones left as they are.
        existing = {path: state for path, state in existing.items() if state[0] == spec_id}
        migrating = False
    respec = respec or migrating
    selecting = partitions is not None or where_selector is not None
    if respec and selecting:
        # Checked before the (possibly long) survey. A re-partition replaces every partition: a selection
        # of them committed with replace_all would be published as the whole dataset.
        assert snapshot is not None
        raise partial_respec_error(
            dataset.name,
            [(field.name, field.canonical) for field in snapshot.partition_spec.fields],
            [(field.name, field.transform.canonical) for field in acceleration.partition_by],
            _selection_text(partitions, where_selector),
        )

    counts = bucket_counts(transforms)
    kind = DiscoveryKind.STATIC if counts is not None else DiscoveryKind.DYNAMIC
    keys: list[KeyTuple] = static_keys(counts, limit) if counts is not None else []
    survey = source.survey(
        transforms, need_keys=counts is None, check_column=refresh.check_column, deadline=deadline
    )
    if counts is None:
        keys = _surveyed_keys(dataset, source, survey, limit)

    key_paths = {key: PartitionKey(key).path(names) for key in keys}

    selected, unknown = _selected_keys(names, keys, partitions, where_selector)
    selected = _widened(dataset.name, keys, selected, widen(selected)) if widen and selected else selected

    items, unchanged = _work_items(
        selected, key_paths, survey, existing, spec_id, respec=respec, forced=full or selecting
    )

    discovered_paths = set(key_paths.values())
    removed = _removed_paths(snapshot, existing, discovered_paths, partitions, where_selector, respec=respec)
    if selecting and not respec:
        refuse_mixed_schema_refresh(dataset.name, existing, survey.schema_tag, items, removed)
    unknown = [text for text in unknown if text not in removed]
    if unknown:
        _refuse_unknown(dataset, names, keys, unknown)
    return RefreshPlan(
        dataset=dataset.name,
        spec_id=spec_id,
        partition_names=names,
        base_version=snapshot.version if snapshot is not None else None,
        items=tuple(items),
        removed=tuple(removed),
        unchanged=unchanged,
        discovered=len(keys),
        discovery=kind,
        fingerprint_granularity=survey.granularity,
        replace_all=respec,
        full=full,
        elapsed_s=time.monotonic() - started,
        notes=survey.notes,
    )


def _selected_keys(
    names: Sequence[str],
    keys: list[KeyTuple],
    partitions: Sequence[str] | None,
    where_selector: KeySelector | None,
) -> tuple[list[KeyTuple], list[str]]:
    """The discovered keys the selection names (all without one), and the named texts not found."""
    selected: list[KeyTuple] = keys
    unknown: list[str] = []
    if partitions is not None:
        selected, unknown = select_keys(names, keys, partitions)
    if where_selector is not None:
        mask = where_selector(selected)
        selected = [key for key, keep in zip(selected, mask, strict=True) if keep]
    return selected, unknown


def _widened(
    dataset: str, keys: Sequence[KeyTuple], selected: Sequence[KeyTuple], extra: Sequence[KeyTuple]
) -> list[KeyTuple]:
    """`selected`, then the keys of `extra` (`discover(widen=...)`: more keys the selection takes along,
    forced too, as a refresh during a re-partitioning takes the siblings it rewrites from the source,
    `write.refresh_siblings`) it lacks, in discovery order; a key discovery did not find is refused."""
    known = set(keys)
    strange = [key for key in extra if key not in known]
    if strange:
        raise DiscoveryError(
            f"dataset {dataset!r}: the selection was widened to keys discovery did not find: {strange[:5]}"
        )
    taken, wanted = set(selected), set(extra)
    return [*selected, *(key for key in keys if key in wanted and key not in taken)]


def _check_key_texts(dataset: DatasetSpec, names: Sequence[str], partitions: Sequence[str]) -> None:
    problems = [problem for text in partitions if (problem := key_text_problem(text, names))]
    if problems:
        raise DiscoveryError(f"dataset {dataset.name!r}: {'; '.join(problems)}")


def _surveyed_keys(dataset: DatasetSpec, source: Source, survey: SourceSurvey, limit: int) -> list[KeyTuple]:
    """The keys the survey found, sorted; refused beyond `limit`."""
    assert survey.keys is not None
    keys = sorted(survey.keys, key=_sort_key)
    if len(keys) > limit:
        raise TooManyPartitionsError(
            f"dataset {dataset.name!r}: discovery found {len(keys)} partitions in {source.describe()}, "
            f"more than refresh.max_partitions ({limit}); use coarser partition expressions (e.g. "
            "bucket(N, col) or date_trunc('month', ts)) or raise max_partitions"
        )
    return keys


def _work_items(
    selected: Sequence[KeyTuple],
    key_paths: Mapping[KeyTuple, str],
    survey: SourceSurvey,
    existing: Mapping[str, tuple[str, str | None]],
    spec_id: str,
    *,
    respec: bool,
    forced: bool,
) -> tuple[list[PartitionWorkItem], int]:
    """The selected partitions to refresh, each with its reason, and how many are left unchanged."""
    items: list[PartitionWorkItem] = []
    unchanged = 0
    for key in selected:
        key_path = key_paths[key]
        fingerprint = survey.fingerprint(key)
        recorded = existing.get(key_path)
        if respec:
            reason: Reason | None = Reason.RESPEC
        elif recorded is None:
            reason = Reason.NEW
        elif recorded != (spec_id, fingerprint):
            reason = Reason.CHANGED
        elif forced:
            reason = Reason.FORCED
        else:
            reason = None
        if reason is None:
            unchanged += 1
            continue
        items.append(
            PartitionWorkItem(
                key=tuple(PartitionKey(key).to_json()),
                key_path=key_path,
                reason=reason,
                fingerprint=fingerprint,
            )
        )
    return items, unchanged


def _removed_paths(
    snapshot: Snapshot | None,
    existing: Mapping[str, tuple[str, str | None]],
    discovered_paths: set[str],
    partitions: Sequence[str] | None,
    where_selector: KeySelector | None,
    *,
    respec: bool,
) -> list[str]:
    """Catalog partitions that discovery no longer finds (within the selection when one is given)."""
    if respec:
        removed: list[str] = []  # replace_all drops every old partition
    elif partitions is not None:
        removed = [p for p in partitions if p in existing and p not in discovered_paths]
    elif where_selector is not None:
        gone = [path for path in existing if path not in discovered_paths]
        recorded_keys = snapshot.keys() if snapshot is not None else {}
        gone_keys = [recorded_keys[path].values for path in gone]
        mask = where_selector(gone_keys) if gone_keys else []
        removed = [path for path, keep in zip(gone, mask, strict=True) if keep]
    else:
        removed = sorted(path for path in existing if path not in discovered_paths)
    return removed


def _refuse_unknown(
    dataset: DatasetSpec, names: Sequence[str], keys: Sequence[KeyTuple], unknown: list[str]
) -> None:
    sample = ", ".join(partition_label(names, PartitionKey(k)) for k in keys[:5])
    example = f" or Airflow partition keys such as {composite_key(PartitionKey(keys[0]))}" if keys else ""
    raise DiscoveryError(
        f"dataset {dataset.name!r} has no partition {', '.join(repr(u) for u in unknown)} in the source; "
        f"name partitions as their refresh tasks are labelled, such as {sample or '(none discovered)'}"
        f"{example}"
    )


def refuse_mixed_schema_refresh(
    dataset_name: str,
    existing: Mapping[str, tuple[str, str | None]],
    current_tag: str,
    items: Sequence[PartitionWorkItem],
    removed: Sequence[str],
) -> None:
    """Refuse a partial refresh that would leave catalogued partitions written under another source
    schema next to the ones it rewrites: one version must have one schema."""
    if not current_tag:
        return
    rewritten = {item.key_path for item in items} | set(removed)
    stale = sorted(
        path
        for path, (_, fingerprint) in existing.items()
        if path not in rewritten and fingerprint_schema_tag(fingerprint) not in (None, current_tag)
    )
    if stale:
        raise SchemaMixedRefreshError(
            f"dataset {dataset_name!r}: the source schema changed since {len(stale)} catalogued "
            f"partition(s) were written (e.g. {', '.join(stale[:3])}), and this refresh selects only some "
            "partitions, which would publish one version with two schemas; run a plain refresh (no "
            "partitions / where) or a full refresh, which rewrites every partition under the new schema"
        )


def _catalog_state(snapshot: Snapshot | None) -> dict[str, tuple[str, str | None]]:
    """Key path -> (spec id, source fingerprint) of every catalogued partition, read column-wise."""
    if snapshot is None or not len(snapshot.partitions):
        return {}
    table = snapshot.table
    return dict(
        zip(
            table.column("key_path").to_pylist(),
            zip(
                table.column("spec_id").to_pylist(),
                table.column("source_fingerprint").to_pylist(),
                strict=True,
            ),
            strict=True,
        )
    )


def _selection_text(partitions: Sequence[str] | None, where_selector: KeySelector | None) -> str:
    named = f"--partitions / `partitions`: {', '.join(partitions[:3])}" if partitions is not None else ""
    if partitions is not None and len(partitions) > 3:
        named += f" and {len(partitions) - 3} more"
    where = "--where / `where`" if where_selector is not None else ""
    return "; ".join(part for part in (named, where) if part)


def _snapshot_spec_id(snapshot: Snapshot) -> str | None:
    spec = getattr(snapshot, "partition_spec", None)
    return getattr(spec, "spec_id", None) if spec is not None else None


def _sort_key(key: KeyTuple) -> tuple[Any, ...]:
    # NULLs first, then by type name and value, so mixed or NULL keys sort without TypeError.
    return tuple(
        (value is not None, type(value).__name__, value if value is not None else 0) for value in key
    )


def fingerprints_by_path(plan: RefreshPlan) -> Mapping[str, str]:
    return {item.key_path: item.fingerprint for item in plan.items}
