"""The JSON documents passed between refresh steps: work items, the refresh plan, stage and partition results.

Each one is small and JSON-only so Airflow can hand it from task to task through XCom: `RefreshPlan.items`
is the list a mapped task `.expand()`s over, one `PartitionWorkItem` per partition to refresh, or, beyond
what one mapped task group may carry, one `WorkBatch` of contiguous items per mapped task (`mapped_work`).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from airflow_partitions.catalog.model import PartitionEntry, format_time
from airflow_partitions.exceptions import ConservationError, RefreshError
from airflow_partitions.keys import PartitionKey, names_of_path, partition_label, value_from_json
from airflow_partitions.storage.datafile import DataFile

if TYPE_CHECKING:
    import pyarrow as pa


class Reason(StrEnum):
    """Why a partition is in a plan."""

    NEW = "new"  # discovered in the source, not in the catalog
    CHANGED = "changed"  # its source fingerprint differs from the one the catalog recorded
    FORCED = "forced"  # unchanged, but refreshed on request (--full, --partitions, --where)
    RESPEC = "respec"  # partition_by changed: every partition is rewritten under the new spec


class DiscoveryKind(StrEnum):
    """How the partition keys were found."""

    STATIC = "static"  # every field is bucket(N, col): keys are 0..N-1, the source is not asked
    DYNAMIC = "dynamic"  # SELECT DISTINCT of the partition expressions (or a Hive directory listing)


def recorded_now() -> str:
    """The current time as every record of a refresh holds it (the catalog's `format_time`)."""
    return format_time(dt.datetime.now(dt.UTC))


def _require(data: Mapping[str, Any], name: str, what: str) -> Any:
    if name not in data:
        raise RefreshError(
            f"{what} is missing {name!r}; was it produced by this version of airflow-partitions?"
        )
    return data[name]


@dataclass(frozen=True, slots=True)
class PartitionWorkItem:
    """One partition to refresh: its key (typed JSON values), canonical key string, reason, fingerprint."""

    key: tuple[Any, ...]  # JSON form of each value (`keys.value_to_json`), in field order
    key_path: str
    reason: Reason
    fingerprint: str
    # refresh_mode append: read only the rows past `watermark` (JSON form of the partition's committed
    # maximum of the watermark column; None = every committed row has a NULL one, so rows with a value)
    # and add them to the partition's committed files. False: rewrite the partition from all its rows.
    append: bool = False
    watermark: Any = None
    # refresh_mode changes: upsert the rows changed in [watermark, upper] (JSON forms) into the partition's
    # committed `base_files` (rewritten as new files: kept rows + changed rows routed here).
    changes: bool = False
    upper: Any = None
    base_files: tuple[DataFile, ...] = ()

    @property
    def partition_key(self) -> PartitionKey:
        return PartitionKey.from_json(self.key)

    @property
    def watermark_value(self) -> Any:
        """The watermark as a Python value (`keys.value_from_json`)."""

        return value_from_json(self.watermark)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "key": list(self.key),
            "key_path": self.key_path,
            "reason": str(self.reason),
            "fp": self.fingerprint,
        }
        if self.append:
            data["append"] = True
            data["wm"] = self.watermark
        if self.changes:
            data["changes"] = True
            data["wm"] = self.watermark
            data["upper"] = self.upper
            data["base"] = [f.to_json() for f in self.base_files]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PartitionWorkItem:
        what = "a partition work item"
        return cls(
            key=tuple(_require(data, "key", what)),
            key_path=str(_require(data, "key_path", what)),
            reason=Reason(_require(data, "reason", what)),
            fingerprint=str(_require(data, "fp", what)),
            append=bool(data.get("append", False)),
            watermark=data.get("wm"),
            changes=bool(data.get("changes", False)),
            upper=data.get("upper"),
            base_files=tuple(DataFile.from_json(f) for f in data.get("base", ())),
        )


# A mapped task's label is stored in a 250-character column (Airflow's rendered map index).
BATCH_LABEL_LIMIT = 250


@dataclass(frozen=True)
class WorkBatch:
    """Contiguous work items one mapped refresh task refreshes in turn (`index`: its place in the map).

    Its JSON `{"batch": index, "label": ..., "items": [...]}` is one element of the mapped input when a plan
    holds more partitions than the refresh DAG may map (`mapped_work`).
    """

    index: int
    items: tuple[PartitionWorkItem, ...]

    @property
    def key_paths(self) -> tuple[str, ...]:
        return tuple(item.key_path for item in self.items)

    @property
    def label(self) -> str:
        """`<count> partitions: <first> .. <last>` (readable keys), at most `BATCH_LABEL_LIMIT` characters."""
        if not self.items:
            return "0 partitions"
        first, last = (item_label(self.items[0]), item_label(self.items[-1]))
        head = f"{len(self.items)} partition{'s' if len(self.items) != 1 else ''}: "
        if len(self.items) == 1:
            return _shorten(head + first, BATCH_LABEL_LIMIT)
        room = (BATCH_LABEL_LIMIT - len(head) - len(" .. ")) // 2
        return f"{head}{_shorten(first, room)} .. {_shorten(last, room)}"

    def to_json(self) -> dict[str, Any]:
        return {"batch": self.index, "label": self.label, "items": [item.to_json() for item in self.items]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkBatch:
        what = "a batch of work items"
        return cls(
            index=int(_require(data, "batch", what)),
            items=tuple(PartitionWorkItem.from_json(i) for i in _require(data, "items", what)),
        )


def item_label(item: PartitionWorkItem) -> str:
    """The readable key of one work item (`keys.partition_label`): a mapped task's label."""
    return partition_label(names_of_path(item.key_path), item.partition_key)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def is_batch_json(value: Any) -> bool:
    """True for a `WorkBatch` JSON (a mapped input element holding several work items)."""
    return isinstance(value, Mapping) and "batch" in value and "items" in value


def batch_bounds(count: int, batches: int) -> list[tuple[int, int]]:
    """`[start, stop)` of `batches` contiguous groups over `count` items, sizes differing by one at most."""
    if batches < 1:
        raise RefreshError(f"a plan needs at least one mapped task, got {batches}")
    batches = min(batches, count) or 1
    size, extra = divmod(count, batches)
    bounds: list[tuple[int, int]] = []
    start = 0
    for index in range(batches):
        stop = start + size + (1 if index < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def mapped_work(items: Sequence[PartitionWorkItem], max_tasks: int) -> list[dict[str, Any]]:
    """The mapped input of the refresh tasks: one work item per task while the items fit in `max_tasks`,
    else exactly `max_tasks` balanced batches of contiguous items (`WorkBatch` JSON)."""
    if max_tasks < 1:
        raise RefreshError(
            f"max_mapped_tasks must be at least 1, got {max_tasks}; set [airflow_partitions] "
            "max_mapped_tasks (and [core] max_map_length) to a positive number"
        )
    if len(items) <= max_tasks:
        return [item.to_json() for item in items]
    return [
        WorkBatch(index, tuple(items[start:stop])).to_json()
        for index, (start, stop) in enumerate(batch_bounds(len(items), max_tasks))
    ]


def unbatched_items_json(values: Sequence[Any]) -> list[Any]:
    """The work items of a mapped input, batches opened in order (the plan's own item order)."""
    flat: list[Any] = []
    for value in values:
        if is_batch_json(value):
            flat.extend(value["items"])
        else:
            flat.append(value)
    return flat


@dataclass(frozen=True)
class RefreshPlan:
    """The outcome of discovery + diff for one dataset: what to refresh, what to remove, on which base.

    `base_version` is the catalog version the diff was made against (None for an empty catalog); the commit
    uses it for optimistic concurrency. `replace_all` is set when the partition spec changed: the commit then
    replaces every partition instead of merging.
    """

    dataset: str
    spec_id: str
    partition_names: tuple[str, ...]
    base_version: int | None
    items: tuple[PartitionWorkItem, ...]
    removed: tuple[str, ...]
    unchanged: int
    discovered: int
    discovery: DiscoveryKind
    fingerprint_granularity: str  # "partition" or "source"
    replace_all: bool = False
    full: bool = False
    elapsed_s: float = 0.0
    created_at: str = field(default_factory=recorded_now)
    notes: tuple[str, ...] = ()
    # `acceleration.refresh_mode` the plan was made under, and its watermark column (append / changes).
    refresh_mode: str = "full"
    watermark_column: str | None = None
    # refresh_mode changes: the rows changed in the items' [watermark, upper] when planned (the stage
    # refuses a different count: the source changed in between).
    changed_rows: int | None = None
    changed_partitions: int | None = None  # the items of the whole changes plan
    # refresh_mode changes: the primary keys of those rows as planned, {"rows": count, "hash": the
    # order-independent row hash of the key columns} (`key_digest`). The partitions a plan touches (and
    # during a re-partitioning the old ones it moves) follow from the keys: the commit refuses a stage
    # whose changed keys differ (`refresh.commit.check_changed_keys`).
    changed_keys: Mapping[str, Any] | None = None
    # refresh.change_detection cdc: {"slot": replication slot, "upto": WAL position}. The plan holds the
    # changes committed before `upto` (or copies the table, read after `upto`); the commit records `upto`
    # and only then advances the slot to it.
    cdc: Mapping[str, str] | None = None
    # Append / changes on a watermark: per key path, the source rows the mode would not see (`late_rows`:
    # source minus acceleration at or below the partition's watermark; `modes.AppendAudit`), the rows with
    # a watermark past now + refresh.max_future_skew_s (`future_rows`), and the `refresh.late_rows` policy
    # applied. None: not audited (full mode).
    late_rows: Mapping[str, int] | None = None
    future_rows: Mapping[str, int] | None = None
    late_rows_policy: str | None = None
    # A selection refreshed during a re-partitioning: the old-layout partitions (key paths in the base
    # version) holding rows of the selected partitions. The refresh's commit moves them into the current
    # layout in the same atomic version (`write.repartition.moves_for_refresh`).
    migrate: tuple[str, ...] = ()
    # Key paths of the current layout the selection covers that the source no longer has, whose rows only
    # those old partitions hold: the commit drops them, as it removes a partition the source lost.
    vanished: tuple[str, ...] = ()
    # The first selection refreshed after a `partition_by` change: the base version is under another
    # spec; the plan was made on it seen with `spec_id` current (`Catalog.evolved`: old partitions under
    # qualified key paths, as `migrate` names them), and the refresh's commit makes that switch in the same
    # version (`CommitBuilder.fold_switch`), based on the newest version.
    switch_spec: bool = False
    # A selection refreshed during a re-partitioning that rewrites from the source the sibling partitions
    # of the old ones holding its rows (`write.refresh_siblings`: the siblings are among `items`): those
    # old partitions (key paths in the base), every row of which routes to a partition the plan rewrites
    # whole from the source. The refresh's commit removes them without reading them.
    replaced_old: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # replace_all drops every partition the commit does not write, so its items must be all of them.
        # (No items at all is the item-less copy the commit step receives beside the results.)
        if self.replace_all and self.items and len(self.items) != self.discovered:
            raise RefreshError(
                f"plan for {self.dataset!r} replaces every partition but holds {len(self.items)} of "
                f"{self.discovered}: publishing it would drop the others. Plan again without a selection "
                "(a plain or --full refresh rebuilds every partition)"
            )

    @property
    def is_empty(self) -> bool:
        """True when there is nothing to write and nothing to remove."""
        return (
            not self.items
            and not self.removed
            and not self.replace_all
            and not self.migrate
            and not self.replaced_old
            and not self.switch_spec
        )

    def counts(self) -> dict[str, int]:
        by_reason = {str(r): 0 for r in Reason}
        for item in self.items:
            by_reason[str(item.reason)] += 1
        return {
            **by_reason,
            "append": len(self.appending),
            "removed": len(self.removed),
            "unchanged": self.unchanged,
            "discovered": self.discovered,
        }

    def items_json(self) -> list[dict[str, Any]]:
        """The work items as plain JSON: the input of a mapped Airflow task."""
        return [item.to_json() for item in self.items]

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "spec_id": self.spec_id,
            "partition_names": list(self.partition_names),
            "base_version": self.base_version,
            "items": self.items_json(),
            "removed": list(self.removed),
            "unchanged": self.unchanged,
            "discovered": self.discovered,
            "discovery": str(self.discovery),
            "fingerprint_granularity": self.fingerprint_granularity,
            "replace_all": self.replace_all,
            "full": self.full,
            "elapsed_s": round(self.elapsed_s, 4),
            "created_at": self.created_at,
            "notes": list(self.notes),
            "refresh_mode": self.refresh_mode,
            "watermark_column": self.watermark_column,
            "changed_rows": self.changed_rows,
            "changed_partitions": self.changed_partitions,
            "changed_keys": dict(self.changed_keys) if self.changed_keys is not None else None,
            "cdc": dict(self.cdc) if self.cdc is not None else None,
            "late_rows": dict(self.late_rows) if self.late_rows is not None else None,
            "future_rows": dict(self.future_rows) if self.future_rows is not None else None,
            "late_rows_policy": self.late_rows_policy,
            "migrate": list(self.migrate),
            "vanished": list(self.vanished),
            "switch_spec": self.switch_spec,
            "replaced_old": list(self.replaced_old),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RefreshPlan:
        what = "a refresh plan"
        return cls(
            dataset=str(_require(data, "dataset", what)),
            spec_id=str(_require(data, "spec_id", what)),
            partition_names=tuple(_require(data, "partition_names", what)),
            base_version=data.get("base_version"),
            items=tuple(PartitionWorkItem.from_json(i) for i in _require(data, "items", what)),
            removed=tuple(data.get("removed", ())),
            unchanged=int(data.get("unchanged", 0)),
            discovered=int(data.get("discovered", 0)),
            discovery=DiscoveryKind(data.get("discovery", DiscoveryKind.DYNAMIC)),
            fingerprint_granularity=str(data.get("fingerprint_granularity", "source")),
            replace_all=bool(data.get("replace_all", False)),
            full=bool(data.get("full", False)),
            elapsed_s=float(data.get("elapsed_s", 0.0)),
            created_at=str(data.get("created_at", recorded_now())),
            notes=tuple(data.get("notes", ())),
            refresh_mode=str(data.get("refresh_mode", "full")),
            watermark_column=data.get("watermark_column"),
            changed_rows=_optional_int(data.get("changed_rows")),
            changed_partitions=_optional_int(data.get("changed_partitions")),
            changed_keys=dict(data["changed_keys"]) if data.get("changed_keys") else None,
            cdc={str(k): str(v) for k, v in data["cdc"].items()} if data.get("cdc") else None,
            late_rows=_optional_counts(data.get("late_rows")),
            future_rows=_optional_counts(data.get("future_rows")),
            late_rows_policy=data.get("late_rows_policy"),
            migrate=tuple(str(path) for path in data.get("migrate", ())),
            vanished=tuple(str(path) for path in data.get("vanished", ())),
            switch_spec=bool(data.get("switch_spec", False)),
            replaced_old=tuple(str(path) for path in data.get("replaced_old", ())),
        )

    @property
    def appending(self) -> tuple[PartitionWorkItem, ...]:
        """The items that add rows past their watermark to a committed partition."""
        return tuple(item for item in self.items if item.append)

    def with_fingerprints(self, fingerprints: Mapping[tuple[Any, ...], str]) -> RefreshPlan:
        """The plan with each item's source fingerprint taken from `fingerprints` (by partition key values;
        an item whose key is not there keeps its own)."""
        items = tuple(
            replace(item, fingerprint=fingerprints.get(item.partition_key.values, item.fingerprint))
            for item in self.items
        )
        return replace(self, items=items)

    def without_items(self) -> RefreshPlan:
        """The plan minus its item list (what the commit needs besides the partition results)."""
        return replace(self, items=())


class StageMode(StrEnum):
    """How finalize gets a partition's rows."""

    SPARK = "spark"  # one Spark job scanned the source once and wrote rows per partition to staging
    PUSHDOWN = "pushdown"  # each partition reads its own rows from the source (Hive files, Postgres WHERE)
    EMPTY = "empty"  # nothing to stage
    CHANGES = "changes"  # the rows changed since the watermark, read once into one staged file
    ARROW = "arrow"  # one in-process pyarrow read routed and written by refresh_dataset (no stage)
    # One Spark job scanned the source once and its executors wrote each partition's final files; the
    # manifest lists them per item and finalize only builds catalog entries from it (no data read).
    WRITTEN = "written"


@dataclass(frozen=True)
class StageResult:
    """Where the staged rows are and how to read them; `location` holds the stage manifest."""

    dataset: str
    location: str | None
    mode: StageMode
    partitions: int
    elapsed_s: float
    # Where the Spark work ran: "spark_connect" or the classic master (`local[2]`, `spark://...`, `yarn`).
    spark: str | None = None
    # Spark mode: rows the job read from the source and rows it routed to planned partitions (None in
    # pushdown mode, where each partition reads its own rows).
    source_rows: int | None = None
    routed_rows: int | None = None
    # How the Spark stage read the source, and why: Spark itself, or the executors with pyarrow.
    source_read: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "location": self.location,
            "mode": str(self.mode),
            "partitions": self.partitions,
            "elapsed_s": round(self.elapsed_s, 4),
            "spark": self.spark,
            "source_rows": self.source_rows,
            "routed_rows": self.routed_rows,
            "source_read": self.source_read,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StageResult:
        what = "a stage result"
        return cls(
            dataset=str(_require(data, "dataset", what)),
            location=data.get("location"),
            mode=StageMode(_require(data, "mode", what)),
            partitions=int(data.get("partitions", 0)),
            elapsed_s=float(data.get("elapsed_s", 0.0)),
            spark=data.get("spark"),
            source_rows=_optional_int(data.get("source_rows")),
            routed_rows=_optional_int(data.get("routed_rows")),
            source_read=data.get("source_read"),
        )


@dataclass(frozen=True)
class PartitionResult:
    """A finalised partition: the catalog entry the commit publishes (its files are written, not yet
    visible to readers), plus how finalize got there.

    Its JSON is the entry's own (`PartitionEntry.to_json()`) with `elapsed_s` and `routed` added: the XCom
    a refresh task returns and the commit task decodes.
    """

    entry: PartitionEntry
    elapsed_s: float = 0.0
    # Rows the stage routed to this partition (or the pushdown read returned): what `rows` must equal.
    # None only in results of older versions, which recorded no such count.
    routed: int | None = None
    # refresh_mode append: `entry` holds only the new rows' files; the commit adds them to the partition's
    # committed files (`entry.rows` is then the rows appended).
    appended: bool = False
    # refresh_mode changes: how many of the written rows are changed rows routed here (the rest were
    # committed before and kept); None in other modes.
    changed_rows: int | None = None

    @property
    def key_path(self) -> str:
        return self.entry.key_path

    @property
    def spec_id(self) -> str:
        return self.entry.spec_id

    @property
    def files(self) -> tuple[DataFile, ...]:
        return self.entry.files

    @property
    def rows(self) -> int:
        return self.entry.rows

    @property
    def bytes(self) -> int:
        return self.entry.bytes

    def to_json(self) -> dict[str, Any]:
        data = {**self.entry.to_json(), "elapsed_s": round(self.elapsed_s, 4), "routed": self.routed}
        if self.appended:
            data["appended"] = True
        if self.changed_rows is not None:
            data["changed_rows"] = self.changed_rows
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PartitionResult:
        what = "a partition result"
        for name in ("key", "key_path", "spec_id", "files", "rows", "bytes", "refreshed_at"):
            _require(data, name, what)
        entry = dict(data)
        if "source_fingerprint" not in entry:
            # Results of older versions name the source fingerprint `fp`.
            entry["source_fingerprint"] = str(_require(data, "fp", what))
        return cls(
            entry=PartitionEntry.from_json(entry),
            elapsed_s=float(data.get("elapsed_s", 0.0)),
            routed=_optional_int(data.get("routed")),
            appended=bool(data.get("appended", False)),
            changed_rows=_optional_int(data.get("changed_rows")),
        )


@dataclass(frozen=True)
class CommitResult:
    """What the commit published."""

    dataset: str
    version: int | None  # None when there was nothing to commit
    upserted: int
    removed: int
    rows: int
    bytes: int
    missing: tuple[str, ...] = ()  # planned partitions without a result (left at their old version)
    # The row counts the commit checked and recorded (`ConservationCounts.to_json()`); None when nothing
    # was committed.
    conservation: Mapping[str, Any] | None = None
    appended_partitions: int = 0  # partitions that kept their files and gained new ones (append)
    appended_rows: int = 0
    refresh_mode: str = "full"
    # Append: source rows whose watermark is NULL and that the committed version does not hold (an
    # append never reads them; a full refresh does). None when not counted (full mode, or uncountable).
    null_watermark_rows: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "version": self.version,
            "refresh_mode": self.refresh_mode,
            "appended_partitions": self.appended_partitions,
            "appended_rows": self.appended_rows,
            "null_watermark_rows": self.null_watermark_rows,
            "upserted": self.upserted,
            "removed": self.removed,
            "rows": self.rows,
            "bytes": self.bytes,
            "missing": list(self.missing),
            "conservation": dict(self.conservation) if self.conservation is not None else None,
        }


@dataclass(frozen=True)
class ConservationCounts:
    """The row counts a commit checked: what it records in the catalog and reports.

    `routed` = rows the stage (or the pushdown reads) delivered to the committed partitions, `written` =
    rows in their files (read back from the files at finalize), `source_rows` = rows the stage scanned when
    it scanned the whole source (None otherwise: then only per-partition counts can be compared).
    """

    partitions_checked: int
    routed: int
    written: int
    source_rows: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "partitions_checked": self.partitions_checked,
            "routed": self.routed,
            "written": self.written,
            "source_rows": self.source_rows,
        }


def key_digest(rows: pa.Table, keys: Sequence[str]) -> dict[str, Any]:
    """The count and order-independent hash of the key columns `keys` of `rows` (the row hash,
    `write.row_hash`: a key counted twice counts twice), as a plan records its changed keys."""
    from airflow_partitions.write.row_hash import tally_rows  # lazy: loads duckdb

    selected = rows.select(list(keys))
    tally = tally_rows(selected, selected.schema)
    return {"rows": tally.rows, "hash": tally.row_hash}


def check_changed_keys(plan: RefreshPlan, changed: pa.Table, keys: Sequence[str]) -> None:
    """The changed keys a changes stage read (`changed`) are the ones its plan found
    (`RefreshPlan.changed_keys`: count and row hash of the primary keys `keys`). The plan chose the
    partitions to merge into, and the old-layout ones to move, from its keys: a stage read with other keys
    (the source changed in between, though the count did not) would leave a changed key's old row where it
    was. A mismatch raises `ConservationError`: nothing is published, plan again."""
    if plan.changed_keys is None:
        return
    staged = key_digest(changed, keys)
    expected = dict(plan.changed_keys)
    if staged != expected:
        raise ConservationError(
            plan.dataset,
            {"[changed keys]": (int(expected["rows"]), int(staged["rows"]))},
            expected=f"changed keys planned (key hash {expected['hash']})",
            actual=f"changed keys staged (key hash {staged['hash']})",
            hint="The source changed between plan and stage: the stage read other changed rows than the "
            "plan found (same count or not), so the partitions it merges into and the old-layout partitions "
            "it moves may miss a changed key's old row. Plan the refresh again.",
        )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _optional_counts(value: Any) -> dict[str, int] | None:
    return None if value is None else {str(k): int(v) for k, v in dict(value).items()}
