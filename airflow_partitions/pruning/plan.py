"""Plan a pruned read: which partitions and files of an index to open, and which need the residual.

`plan_partitions` binds the filter to the dataset schema, rewrites it (`rewrite.prepare`), and judges it in
two vectorised passes: first every partition on its partition values alone, then only the surviving
partitions' files on partition values plus per-file statistics. The result, a `PrunePlan`, lists the
selected partitions with the files to read and whether each is exact (every row satisfies the filter,
so the residual filter is skipped), and explains every decision on demand. An index of bare keys has no
files: only the first pass runs, and its selected partitions carry no files.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import numpy.typing as npt

from airflow_partitions.keys import PartitionKey
from airflow_partitions.pruning.deep import deep_stack
from airflow_partitions.pruning.evaluator import (
    MAX_RANGE_ENUMERATION,
    ROWS_CANNOT_MATCH,
    ROWS_MIGHT_MATCH,
    ROWS_MUST_MATCH,
    Evaluator,
    Outcome,
    pinned_rows,
)
from airflow_partitions.pruning.expressions import (
    AlwaysTrue,
    ColumnRef,
    Comparison,
    InList,
    Op,
    Or,
    Predicate,
    conjuncts,
    display_literal,
    renamed_columns,
)
from airflow_partitions.pruning.filters import FilterInput, bind_filter
from airflow_partitions.pruning.index import (
    BoundField,
    FileFrame,
    PartitionFrame,
    PartitionIndex,
)
from airflow_partitions.pruning.index_skip import index_columns_used, index_excluded
from airflow_partitions.pruning.rewrite import prepare
from airflow_partitions.storage.datafile import DataFile
from airflow_partitions.transforms.base import renamed_transform

if TYPE_CHECKING:
    pass


class SelectedPartition(NamedTuple):
    """A partition to read: its files that may hold matching rows, and whether all of them are exact.

    A named tuple (cheap to build: a plan may select tens of thousands); `key` is decoded on demand.
    """

    key_path: str
    files: tuple[DataFile, ...]
    exact: bool
    exact_files: tuple[bool, ...]
    pruning_index: PartitionIndex
    position: int

    @property
    def key(self) -> PartitionKey:
        """The partition's key values (decoded on demand: a plan may select many partitions)."""
        return PartitionKey(tuple(self.pruning_index.key_values(self.position)))

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)


CAUSE_KEY = "partition key"
CAUSE_STATISTICS = "file statistics"
CAUSE_EMPTY = "empty partition"
CAUSE_INDEX = "side index"


@dataclass(frozen=True, slots=True)
class PartitionDecision:
    """Why one partition is read or skipped; `verdict` is one of the `ROWS_*` constants.

    `cause` says what ruled a skipped partition out: `CAUSE_KEY` (its partition values),
    `CAUSE_STATISTICS` (its files' min / max / NULL counts), `CAUSE_INDEX` (its files' side indexes prove
    the filter's values absent) or `CAUSE_EMPTY` (no rows); None when read.
    """

    key_path: str
    selected: bool
    exact: bool
    verdict: str
    reason: str
    files_selected: int
    files_total: int
    cause: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "key_path": self.key_path,
            "selected": self.selected,
            "exact": self.exact,
            "verdict": self.verdict,
            "reason": self.reason,
            "files_selected": self.files_selected,
            "files_total": self.files_total,
            "cause": self.cause,
        }


class PrunePlan:
    """The outcome of pruning one index (a catalog version, a manifest, or keys) with one filter."""

    def __init__(
        self,
        *,
        index: PartitionIndex,
        predicate: Predicate,
        prepared: Predicate,
        filter_text: str | None,
        dataset: str | None,
        partition_outcome: Outcome,
        file_frame: FileFrame | None,
        file_outcome: Outcome | None,
        max_enumeration: int,
        planning_seconds: float,
        index_skipped: npt.NDArray[np.bool_] | None = None,
        column_names: Callable[[str], str] | None = None,
    ) -> None:
        self.index = index
        self.predicate = predicate
        self.prepared = prepared
        self.filter_text = filter_text
        self.dataset = dataset
        self.version = index.version
        self.total: int = index.size
        self.planning_seconds = planning_seconds
        self._partition_outcome = partition_outcome
        self._file_frame = file_frame
        self._file_outcome = file_outcome
        self._max_enumeration = max_enumeration
        # Per file-frame row: statistics kept the file, its side index proved the filter's values absent.
        self._index_skipped = index_skipped
        # The name users see for a column the index stores (a renamed column's current name); pruning
        # keeps to the stored names, only what the plan prints goes through this.
        self._column_names = column_names
        self.selected: tuple[SelectedPartition, ...] = self._select()

    # --- selection ----------------------------------------------------------------------------

    def _select(self) -> tuple[SelectedPartition, ...]:
        if not self.index.has_files:
            return self._select_keys()
        frame, outcome = self._file_frame, self._file_outcome
        if frame is None or outcome is None or frame.size == 0:
            return ()
        chosen = np.flatnonzero(outcome.true)
        if chosen.size == 0:
            return ()
        exact = outcome.exact[chosen].tolist()
        partitions = frame.partition_of_row[chosen]
        # Frame rows are grouped by partition: split the chosen rows where the partition changes.
        starts = np.flatnonzero(np.r_[True, partitions[1:] != partitions[:-1]]).tolist()
        ends = [*starts[1:], len(chosen)]
        rows = chosen.tolist()
        key_paths = self.index.key_paths
        selected = []
        for start, end in zip(starts, ends, strict=True):
            partition = int(partitions[start])
            exact_files = tuple(exact[start:end])
            files = tuple([frame.files[row] for row in rows[start:end]])
            selected.append(
                SelectedPartition(
                    key_paths[partition], files, all(exact_files), exact_files, self.index, partition
                )
            )
        selected.sort(key=lambda s: s.key_path)
        return tuple(selected)

    def _select_keys(self) -> tuple[SelectedPartition, ...]:
        """The partitions of a file-less index (keys alone) that may hold matching rows, judged on keys."""
        outcome = self._partition_outcome
        chosen = np.flatnonzero(outcome.true & (self.index.rows != 0)).tolist()
        exact = outcome.exact
        key_paths = self.index.key_paths
        selected = [SelectedPartition(key_paths[p], (), bool(exact[p]), (), self.index, p) for p in chosen]
        selected.sort(key=lambda s: s.key_path)
        return tuple(selected)

    @property
    def files(self) -> list[DataFile]:
        """Every file to read."""
        return [f for partition in self.selected for f in partition.files]

    @property
    def exact_files(self) -> list[DataFile]:
        """Files whose every row satisfies the filter: read without the residual."""
        return [f for p in self.selected for f, e in zip(p.files, p.exact_files, strict=True) if e]

    @property
    def inexact_files(self) -> list[DataFile]:
        """Files that may hold non-matching rows: the residual filter applies."""
        return [f for p in self.selected for f, e in zip(p.files, p.exact_files, strict=True) if not e]

    @property
    def files_skipped_by_index(self) -> int:
        """Files that partition values and statistics kept but a side index proved hold no match."""
        return 0 if self._index_skipped is None else int(self._index_skipped.sum())

    @cached_property
    def partitions_skipped_by_index(self) -> int:
        """Partitions read but for their side indexes: every file statistics kept was ruled out by one."""
        frame, skipped, outcome = self._file_frame, self._index_skipped, self._file_outcome
        if frame is None or skipped is None or outcome is None or not skipped.any():
            return 0
        touched = np.unique(frame.partition_of_row[skipped])
        still_read = np.unique(frame.partition_of_row[outcome.true])
        return int(np.setdiff1d(touched, still_read).size)

    @property
    def rows_selected(self) -> int:
        return sum(p.rows for p in self.selected)

    @property
    def has_filter(self) -> bool:
        return not isinstance(self.predicate, AlwaysTrue)

    @property
    def residual(self) -> Predicate | None:
        """The filter to re-apply to inexact files (None when every selected file is exact)."""
        if not self.has_filter or not self.inexact_files:
            return None
        return self.predicate

    @property
    def residual_sql(self) -> str | None:
        residual = self.residual
        return None if residual is None else residual.sql()

    # --- names shown ----------------------------------------------------------------------------

    def shown_column(self, name: str) -> str:
        """The name users see for the stored column `name` (its current name when renamed)."""
        return name if self._column_names is None else self._column_names(name)

    def shown(self, predicate: Predicate) -> Predicate:
        """`predicate` (over stored columns) reading the columns under the names users see."""
        return predicate if self._column_names is None else renamed_columns(predicate, self._column_names)

    def shown_field(self, partition_field: BoundField) -> str:
        """A partition field's canonical expression over the columns under the names users see."""
        if self._column_names is None:
            return partition_field.canonical
        return str(renamed_transform(partition_field.transform, self._column_names).canonical)

    @property
    def predicate_text(self) -> str | None:
        """The bound filter as text, under the names users see (None without a filter)."""
        return str(self.shown(self.predicate)) if self.has_filter else None

    @property
    def shown_residual_sql(self) -> str | None:
        """`residual_sql` under the names users see."""
        residual = self.residual
        return None if residual is None else self.shown(residual).sql()

    # --- explanations ---------------------------------------------------------------------------

    @cached_property
    def decisions(self) -> tuple[PartitionDecision, ...]:
        """One decision per partition of the version, in key order, with a reason."""
        explainer = _Explainer(self)
        return tuple(sorted(explainer.decisions(), key=lambda d: d.key_path))

    @deep_stack
    def summary(self) -> str:
        files = self.files
        exact = sum(1 for p in self.selected if p.exact)
        text = (
            f"selected {len(self.selected)} of {self.total} partitions ({len(files)} file(s), "
            f"{self.rows_selected} rows); exact: {exact}"
        )
        if self.files_skipped_by_index:
            text += (
                f"; skipped by index: {self.files_skipped_by_index} file(s), "
                f"{self.partitions_skipped_by_index} partition(s)"
            )
        residual = self.shown_residual_sql
        text += f"; residual: {residual}" if residual else "; no residual filter"
        return "".join([text, *(f"; {note}" for note in self.notes)])

    @cached_property
    def notes(self) -> tuple[str, ...]:
        """What the filter could not prune and why (a multi_bucket field whose columns are not all pinned)."""
        if not self.has_filter:
            return ()
        return tuple(multi_bucket_notes(self.index.fields, self.prepared, self))

    @deep_stack
    def explain(self, *, max_skipped: int | None = None) -> str:
        """Human-readable plan: the filter, the counts, then one line per partition (kept first)."""
        where = self.filter_text if self.filter_text is not None else str(self.shown(self.predicate))
        head = f"dataset {self.dataset}, " if self.dataset else ""
        lines = [f"{head}{self.index.origin}; filter: {where if self.has_filter else '(none)'}"]
        lines.append(self.summary())
        decisions = self.decisions
        kept = [d for d in decisions if d.selected]
        skipped = [d for d in decisions if not d.selected]
        for decision in kept:
            tag = "KEEP exact" if decision.exact else "KEEP      "
            lines.append(f"  {tag} {decision.key_path or '(root)'}: {decision.reason}")
        shown = skipped if max_skipped is None else skipped[:max_skipped]
        for decision in shown:
            lines.append(f"  SKIP       {decision.key_path or '(root)'}: {decision.reason}")
        if len(shown) < len(skipped):
            lines.append(f"  ... {len(skipped) - len(shown)} more skipped partition(s)")
        return "\n".join(lines)

    @deep_stack
    def to_json(self, *, include_decisions: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "dataset": self.dataset,
            "version": self.version,
            "filter": self.filter_text,
            "predicate": self.predicate_text,
            "total": self.total,
            "selected": len(self.selected),
            "exact": sum(1 for p in self.selected if p.exact),
            "files_selected": len(self.files),
            "rows_selected": self.rows_selected,
            "skipped_by_index": {
                "files": self.files_skipped_by_index,
                "partitions": self.partitions_skipped_by_index,
            },
            "residual": self.shown_residual_sql,
            "notes": list(self.notes),
            "planning_ms": round(self.planning_seconds * 1000, 3),
            "selected_partitions": [
                {
                    "key_path": p.key_path,
                    **({"spec_id": spec_id} if (spec_id := self.index.spec_id(p.position)) else {}),
                    "exact": p.exact,
                    "files": [f.path for f in p.files],
                    "rows": p.rows,
                }
                for p in self.selected
            ],
        }
        if include_decisions:
            data["partitions"] = [d.to_json() for d in self.decisions]
        return data

    def __repr__(self) -> str:
        return f"PrunePlan(version={self.version}, selected={len(self.selected)}/{self.total})"


class _Explainer:
    """Builds per-partition reasons, re-evaluating top-level conjuncts to name the one that ruled out."""

    def __init__(self, plan: PrunePlan) -> None:
        self.plan = plan
        self.index = plan.index
        self.items = conjuncts(plan.prepared)

    def decisions(self) -> list[PartitionDecision]:
        plan, index = self.plan, self.index
        selected = {p.key_path: p for p in plan.selected}
        frame = plan._file_frame
        files_selected: dict[int, int] = {}
        files_seen: dict[int, int] = {}
        self.by_index: dict[int, int] = {}
        if frame is not None and plan._file_outcome is not None:
            skipped = plan._index_skipped
            for row, partition in enumerate(frame.partition_of_row.tolist()):
                files_seen[partition] = files_seen.get(partition, 0) + 1
                if plan._file_outcome.true[row]:
                    files_selected[partition] = files_selected.get(partition, 0) + 1
                elif skipped is not None and skipped[row]:
                    self.by_index[partition] = self.by_index.get(partition, 0) + 1
        key_only = [self._partition_masks(item) for item in self.items]
        by_stats = [self._file_masks(item) for item in self.items]
        decisions = []
        for partition in range(index.size):
            key_path = index.key_paths[partition]
            chosen = selected.get(key_path)
            total_files = files_seen.get(partition)
            if chosen is not None:
                kept = files_selected.get(partition, 0)
                by_index = self.by_index.get(partition, 0)
                reason = self._kept_reason(chosen, kept, total_files or 0, by_index)
                decisions.append(
                    PartitionDecision(
                        key_path,
                        True,
                        chosen.exact,
                        ROWS_MUST_MATCH if chosen.exact else ROWS_MIGHT_MATCH,
                        reason,
                        len(chosen.files),
                        total_files or len(chosen.files),
                    )
                )
                continue
            cause, reason = self._skipped_reason(partition, key_only, by_stats)
            count = total_files if total_files is not None else len(index.files(partition))
            decisions.append(
                PartitionDecision(key_path, False, False, ROWS_CANNOT_MATCH, reason, 0, count, cause)
            )
        return decisions

    def _partition_masks(self, item: Predicate) -> npt.NDArray[np.bool_]:
        return evaluate_frame(
            self.index, PartitionFrame(self.index), item, max_enumeration=self.plan._max_enumeration
        ).true

    def _file_masks(self, item: Predicate) -> npt.NDArray[np.bool_] | None:
        frame = self.plan._file_frame
        if frame is None:
            return None
        return evaluate_frame(self.index, frame, item, max_enumeration=self.plan._max_enumeration).true

    def _kept_reason(
        self, chosen: SelectedPartition, kept_files: int, total_files: int, by_index: int
    ) -> str:
        if not self.plan.has_filter:
            return "no filter: every row is read"
        by_stats = total_files - kept_files - by_index
        files_note = f"; {by_stats} of {total_files} file(s) skipped by statistics" if by_stats > 0 else ""
        if by_index:
            files_note += f"; {by_index} of {total_files} file(s) skipped by index"
        if chosen.exact:
            return "exact: every row satisfies the filter, so no residual filter is applied" + files_note
        return "may hold matching rows; the residual filter is applied" + files_note

    def _skipped_reason(
        self,
        partition: int,
        key_only: list[npt.NDArray[np.bool_]],
        by_stats: list[npt.NDArray[np.bool_] | None],
    ) -> tuple[str, str]:
        index = self.index
        if index.rows[partition] == 0:
            return CAUSE_EMPTY, "empty partition (0 rows): nothing to read"
        key = index.describe_key(partition)
        if not self.plan._partition_outcome.true[partition]:
            for item, mask in zip(self.items, key_only, strict=True):
                if not mask[partition]:
                    shown = self.plan.shown(item)
                    return CAUSE_KEY, f"partition {key} cannot hold rows where {shown}{self._hint(item)}"
            pinned = self._multi_bucket_hint()
            return CAUSE_KEY, f"partition {key} cannot hold rows matching the filter{pinned}"
        frame = self.plan._file_frame
        rows = np.flatnonzero(frame.partition_of_row == partition) if frame is not None else np.zeros(0, int)
        if self.by_index.get(partition):
            used = index_columns_used(self.plan.prepared)
            columns = ", ".join(self.plan.shown_column(c) for c in used) or "the index columns"
            count = self.by_index[partition]
            rest = "" if count >= rows.size else "; file statistics rule out the rest"
            return (
                CAUSE_INDEX,
                f"skipped by index: the side index of {columns} proves {count} of {rows.size} file(s) "
                f"hold no matching value{rest}",
            )
        for item, stats_mask in zip(self.items, by_stats, strict=True):
            if stats_mask is not None and rows.size and not stats_mask[rows].any():
                shown = self.plan.shown(item)
                return CAUSE_STATISTICS, f"file statistics rule out {shown}: {self._stats_text(item, rows)}"
        return CAUSE_STATISTICS, f"file statistics rule out the filter for all {rows.size} file(s)"

    def _hint(self, item: Predicate) -> str:
        """For `col = v` / `col IN (...)` against a hashed or non-monotonic field: the value's image."""
        if not isinstance(item, Comparison | InList) or not isinstance(item.term, ColumnRef):
            return ""
        if isinstance(item, Comparison) and item.op is not Op.EQ:
            return ""
        values = [item.value] if isinstance(item, Comparison) else list(item.values)
        if not values or len(values) > 5:
            return ""
        hints = []
        for partition_field in _fields_on(self.index.fields, item.term.name):
            if partition_field.transform.one_to_one:
                continue
            try:
                images = [partition_field.transform.apply_scalar(v) for v in values]
            except Exception:
                continue
            pairs = ", ".join(
                f"{display_literal(v)} -> {display_literal(i)}" for v, i in zip(values, images, strict=True)
            )
            hints.append(f"{self.plan.shown_field(partition_field)}: {pairs}")
        return f" ({'; '.join(hints)})" if hints else ""

    def _multi_bucket_hint(self) -> str:
        """` (multi_bucket(8, a, b): (1, 'x') -> 3)` when the filter pins every column of such a field."""
        hints = []
        for partition_field in self.index.fields:
            if len(partition_field.columns) < 2:
                continue
            rows = pinned_rows(self.plan.prepared, partition_field.columns, 5)
            if not rows:
                continue
            try:
                images = [partition_field.transform.apply_row(row) for row in rows]
            except Exception:
                continue
            pairs = ", ".join(
                f"({', '.join(display_literal(v) for v in row)}) -> {display_literal(image)}"
                for row, image in zip(rows, images, strict=True)
            )
            hints.append(f"{self.plan.shown_field(partition_field)}: {pairs}")
        return f" ({'; '.join(hints)})" if hints else ""

    def _stats_text(self, item: Predicate, rows: npt.NDArray[np.int64]) -> str:
        frame = self.plan._file_frame
        assert frame is not None
        parts = []
        for column in sorted(item.columns()):
            stats = frame.stats(column)
            if stats is None:
                continue
            row = int(rows[0])
            low, high = stats.minimum[row].as_py(), stats.maximum[row].as_py()
            nulls = int(stats.null_count[row])
            parts.append(
                f"{self.plan.shown_column(column)} in [{display_literal(low)}, {display_literal(high)}]"
                f"{'' if nulls < 0 else f', {nulls} NULL(s)'}"
            )
        return "; ".join(parts) if parts else "no row can match"


def evaluate_frame(
    index: PartitionIndex,
    frame: PartitionFrame | FileFrame,
    predicate: Predicate,
    *,
    max_enumeration: int,
) -> Outcome:
    """Judge `predicate` on every row of `frame`; each partition with the fields of its own layout."""
    if index.layouts is None or index.layout_of is None:
        return Evaluator(index.fields, frame, max_enumeration=max_enumeration).evaluate(predicate)
    if isinstance(frame, FileFrame):
        layout_of_row = index.layout_of[frame.partition_of_row]
    else:
        layout_of_row = index.layout_of
    size = frame.size
    true, false, null = np.zeros(size, bool), np.zeros(size, bool), np.zeros(size, bool)
    for number, layout in enumerate(index.layouts):
        rows = layout_of_row == number
        if not rows.any():
            continue
        outcome = Evaluator(layout.fields, frame, max_enumeration=max_enumeration).evaluate(predicate)
        true[rows] = np.asarray(outcome.true)[rows]
        false[rows] = np.asarray(outcome.false)[rows]
        null[rows] = np.asarray(outcome.null)[rows]
    return Outcome(true, false, null)


def _fields_on(fields: Sequence[BoundField], column: str) -> list[BoundField]:
    """The single-column fields over `column` (multi_bucket fields are judged on conjunctions)."""
    return [f for f in fields if f.columns == (column,)]


def multi_bucket_notes(
    fields: Sequence[BoundField], predicate: Predicate, plan: PrunePlan | None = None
) -> list[str]:
    """For each field over several columns that the filter touches without pinning them all: a note
    that the filter reads all of its buckets (only `=` / `IN` on every column, ANDed, prune it); with
    `plan`, the field and its columns are named as that plan shows them."""
    touched = predicate.columns()
    notes = []
    for field in fields:
        if len(field.columns) < 2 or not touched & set(field.columns):
            continue
        # Pruned only when every branch of a top-level OR pins all the columns.
        if all(
            pinned_rows(item, field.columns, MAX_RANGE_ENUMERATION) is not None
            for item in _disjuncts(predicate)
        ):
            continue
        canonical = field.canonical if plan is None else plan.shown_field(field)
        columns = field.columns if plan is None else tuple(plan.shown_column(c) for c in field.columns)
        notes.append(
            f"{canonical} prunes only on = or IN of every one of its columns "
            f"({', '.join(columns)}) together; this filter reads all of its buckets"
        )
    return notes


def _disjuncts(predicate: Predicate) -> list[Predicate]:
    if isinstance(predicate, Or):
        return [leaf for item in predicate.items for leaf in _disjuncts(item)]
    return [predicate]


@deep_stack
def plan_partitions(
    index: PartitionIndex,
    where: FilterInput = None,
    *,
    dataset: str | None = None,
    max_enumeration: int = MAX_RANGE_ENUMERATION,
    filter_text: str | None = None,
    column_names: Callable[[str], str] | None = None,
) -> PrunePlan:
    """Prune the partitions of `index` with `where` (SQL string, DNF list, bound predicate or None).

    Build the index once (`PartitionIndex.from_snapshot` for a catalog version, which a
    reader caches; `from_entries` for a manifest; `from_keys` for discovered keys) and plan many filters
    over it. An index without files (keys alone) selects on partition values only.

    `filter_text`: the filter as the user wrote it, when `where` is what it became (bound, or renamed to
    the stored columns); `column_names`: the name users see for each stored column, which the plan's
    explanations print (a dataset's `renamed_columns`); pruning never uses either.
    """
    started = time.perf_counter()
    predicate = bind_filter(where, index.filter_schema)
    prepared = prepare(predicate)
    no_filter = isinstance(prepared, AlwaysTrue)
    partition_frame = PartitionFrame(index)
    if no_filter:
        size = index.size
        partition_outcome = Outcome(np.ones(size, bool), np.zeros(size, bool), np.zeros(size, bool))
    else:
        partition_outcome = evaluate_frame(index, partition_frame, prepared, max_enumeration=max_enumeration)
    file_frame: FileFrame | None = None
    file_outcome: Outcome | None = None
    index_skipped: npt.NDArray[np.bool_] | None = None
    if index.has_files:
        survivors = np.flatnonzero(partition_outcome.true & (index.rows > 0))
        file_frame = index.file_frame(survivors.astype(np.int64))
        if no_filter:
            size = file_frame.size
            file_outcome = Outcome(np.ones(size, bool), np.zeros(size, bool), np.zeros(size, bool))
        else:
            file_outcome = evaluate_frame(index, file_frame, prepared, max_enumeration=max_enumeration)
            # Zero-row files hold nothing to read, whatever the filter says.
            file_outcome = Outcome(
                file_outcome.true & (file_frame.rows > 0), file_outcome.false, file_outcome.null
            )
            excluded = index_excluded(prepared, file_frame.files)
            if excluded is not None:
                index_skipped = excluded & file_outcome.true
                file_outcome = Outcome(
                    file_outcome.true & ~index_skipped, file_outcome.false, file_outcome.null
                )
    return PrunePlan(
        index=index,
        predicate=predicate,
        prepared=prepared,
        filter_text=_filter_text(where, predicate, filter_text, column_names),
        dataset=dataset,
        partition_outcome=partition_outcome,
        file_frame=file_frame,
        file_outcome=file_outcome,
        max_enumeration=max_enumeration,
        planning_seconds=time.perf_counter() - started,
        index_skipped=index_skipped,
        column_names=column_names,
    )


def _filter_text(
    where: FilterInput,
    predicate: Predicate,
    text: str | None,
    column_names: Callable[[str], str] | None,
) -> str | None:
    """The filter as a plan prints it: as written when known, else the bound predicate (shown names)."""
    if text is not None:
        return text
    if where is None or isinstance(where, str):
        return where
    return str(predicate if column_names is None else renamed_columns(predicate, column_names))
