"""Read statistics: one small JSON line per read, query or plan, in a bounded log beside the catalog.

Each record holds the filter's shape (columns and operators; the literal values only when asked for), the
partitions and files selected out of the version's, the bytes of the selected files, the rows returned
and the time taken. `airflow-partitions advise` replays the recorded filters against candidate layouts.

The log is `<accelerator_dir>/<dataset>/_read_stats/reads.jsonl`: beside a local catalog, and in the
worker's local scratch directory when the acceleration lives on S3 (each worker keeps its own). Every
record is one `write` of a newline and one line on an `O_APPEND` descriptor, so concurrent readers
interleave whole lines; a reader killed mid-write leaves at most one torn line, which `records()` skips
(the next record starts on a line of its own). When the file
passes `max_bytes` it is renamed to `reads.jsonl.1` (replacing the previous one): the log never holds
more than about twice `max_bytes`.

Switches: `AP_READ_STATS` (`0` / `false` / `off`: record nothing; `literals`: record literal values too;
`1`: shapes only) wins over `acceleration.params.read_stats` (`false`, `true` or `literals`); the default
records shapes. Sinks added with `add_metrics_sink` (the Airflow layer adds its Stats emitter) receive
every record too; the core imports no Airflow.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import SpecValidationError
from airflow_partitions.keys import value_from_json, value_to_json
from airflow_partitions.pruning.expressions import (
    AlwaysFalse,
    AlwaysNull,
    And,
    Comparison,
    InList,
    IsNull,
    Not,
    Op,
    Opaque,
    Or,
    Predicate,
    Range,
    TransformRef,
    sql_literal,
)
from airflow_partitions.quoting import quote_identifier

if TYPE_CHECKING:
    from airflow_partitions.pruning import PrunePlan

READ_STATS_ENV = "AP_READ_STATS"
READ_STATS_PARAM = "read_stats"
STATS_DIRECTORY = "_read_stats"
LOG_NAME = "reads.jsonl"
# One log file's bound; with its one rotated predecessor the log holds at most about twice this.
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
MAX_BYTES_ENV = "AP_READ_STATS_MAX_BYTES"
# Key paths of the selected partitions kept per record (beyond: only the count, `keys_truncated`).
MAX_RECORDED_KEYS = 64
# Appends between checks that the log file was not rotated away by another process.
REOPEN_CHECK = 64
# Values of an IN list kept per record when literals are recorded.
MAX_RECORDED_VALUES = 64


class ReadStatsMode(StrEnum):
    """What reads record: nothing, the filter's shape, or its shape and literal values."""

    OFF = "off"
    SHAPES = "shapes"
    LITERALS = "literals"


_ENV_MODES = {
    "0": ReadStatsMode.OFF,
    "false": ReadStatsMode.OFF,
    "off": ReadStatsMode.OFF,
    "no": ReadStatsMode.OFF,
    "1": ReadStatsMode.SHAPES,
    "true": ReadStatsMode.SHAPES,
    "on": ReadStatsMode.SHAPES,
    "yes": ReadStatsMode.SHAPES,
    "shapes": ReadStatsMode.SHAPES,
    "literals": ReadStatsMode.LITERALS,
}


def read_stats_mode(params: Mapping[str, Any] | None) -> ReadStatsMode:
    """The mode of a dataset: `AP_READ_STATS` when set, else `params.read_stats`, else shapes."""
    raw = os.environ.get(READ_STATS_ENV)
    if raw is not None and raw.strip():
        mode = _ENV_MODES.get(raw.strip().lower())
        if mode is None:
            raise SpecValidationError(
                [
                    f"{READ_STATS_ENV}={raw!r} is not understood; use 0 (record nothing), 1 (record filter "
                    "shapes) or literals (record filter values too)"
                ]
            )
        return mode
    value = (params or {}).get(READ_STATS_PARAM)
    if value is False:
        return ReadStatsMode.OFF
    if value == "literals":
        return ReadStatsMode.LITERALS
    return ReadStatsMode.SHAPES


def stats_directory(dataset_directory: Path) -> Path:
    """Where a dataset's read log lives, given `<accelerator_dir>/<dataset>` (local scratch on S3)."""
    return Path(dataset_directory) / STATS_DIRECTORY


# --- filter shapes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterShape:
    """A filter without (or with) its values: display text, columns, operators and a replayable tree.

    `tree` is JSON: `["and"|"or", [children]]`, `["not", child]`, `["cmp", term, op, value?]`,
    `["in", term, count, values?]`, `["null", term]`, `["range", term, lower?, lower_inclusive, upper?,
    upper_inclusive, span]`, `["opaque", [columns]]`, `["true"]`, `["false"]`. A term is a column name or
    `{"expr": canonical}` for a partition expression; a value (`?` when literals are not recorded) is in
    `keys.value_to_json` form. `span` is `upper - lower` of a range with both bounds (seconds for
    timestamps, days for dates), kept without literals: it says how wide the windows read are.
    """

    text: str
    columns: tuple[str, ...]
    ops: tuple[str, ...]
    tree: Any
    literals: bool

    @property
    def replayable(self) -> bool:
        """Whether the tree carries every value needed to rebuild the filter as it was run."""
        return self.literals and '"?"' not in json.dumps(self.tree)


def filter_shape(predicate: Predicate, *, literals: bool) -> FilterShape:
    """The shape of a bound filter (`PrunePlan.predicate`)."""
    ops: list[str] = []
    tree = _shape_tree(predicate, literals, ops)
    return FilterShape(
        text=_shape_text(tree),
        columns=tuple(sorted(predicate.columns())),
        ops=tuple(sorted(set(ops))),
        tree=tree,
        literals=literals,
    )


def _term(term: Any) -> Any:
    return {"expr": term.transform.canonical} if isinstance(term, TransformRef) else term.column


def _value(value: Any, literals: bool) -> Any:
    if not literals:
        return "?"
    try:
        return value_to_json(_plain(value))
    except Exception:
        return "?"


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return Decimal(repr(value)) if value == value and value not in (float("inf"), float("-inf")) else None
    return value


def _shape_tree(node: Predicate, literals: bool, ops: list[str]) -> Any:
    if isinstance(node, And):
        items = _with_ranges(node.items)
        if len(items) == 1:
            return _shape_tree(items[0], literals, ops)
        ops.append("AND")
        return ["and", [_shape_tree(c, literals, ops) for c in items]]
    if isinstance(node, Or):
        ops.append("OR")
        return ["or", [_shape_tree(c, literals, ops) for c in node.items]]
    if isinstance(node, Not):
        ops.append("NOT")
        return ["not", _shape_tree(node.child, literals, ops)]
    if isinstance(node, Comparison):
        ops.append(node.op.value)
        return ["cmp", _term(node.term), node.op.value, _value(node.value, literals)]
    if isinstance(node, InList):
        ops.append("IN")
        kept = node.values[:MAX_RECORDED_VALUES] if literals else ()
        values = [_value(v, literals) for v in kept] if literals and len(node.values) == len(kept) else None
        return ["in", _term(node.term), len(node.values), values]
    if isinstance(node, IsNull):
        ops.append("IS NULL")
        return ["null", _term(node.term)]
    if isinstance(node, Range):
        ops.extend(c.op.value for c in node.bounds())
        return [
            "range",
            _term(node.term),
            None if node.lower is None else _value(node.lower, literals),
            node.lower_inclusive,
            None if node.upper is None else _value(node.upper, literals),
            node.upper_inclusive,
            _span(node.lower, node.upper),
        ]
    if isinstance(node, Opaque):
        ops.append("OTHER")
        return ["opaque", sorted(node.referenced)]
    if isinstance(node, AlwaysFalse | AlwaysNull):
        return ["false"]
    return ["true"]


_LOWER = {Op.GT: False, Op.GE: True}
_UPPER = {Op.LT: False, Op.LE: True}


def _with_ranges(items: Sequence[Predicate]) -> list[Predicate]:
    """`c >= a AND c < b` among the conjuncts as one `Range` (so its width is known), the rest as is."""
    by_term: dict[str, list[Comparison]] = {}
    for item in items:
        if isinstance(item, Comparison) and (item.op in _LOWER or item.op in _UPPER):
            by_term.setdefault(item.term.key, []).append(item)
    merged: dict[str, Range] = {}
    for key, comparisons in by_term.items():
        lowers = [c for c in comparisons if c.op in _LOWER]
        uppers = [c for c in comparisons if c.op in _UPPER]
        if len(lowers) == 1 and len(uppers) == 1:
            low, high = lowers[0], uppers[0]
            merged[key] = Range(low.term, low.value, _LOWER[low.op], high.value, _UPPER[high.op])
    result: list[Predicate] = []
    for item in items:
        term_key = item.term.key if isinstance(item, Comparison) else None
        if term_key is not None and term_key in merged:
            if merged[term_key] not in result:
                result.append(merged[term_key])
            continue
        result.append(item)
    return result


def _span(lower: Any, upper: Any) -> float | None:
    """How wide a two-sided range is, in the column's units (seconds for timestamps, days for dates)."""
    if lower is None or upper is None:
        return None
    try:
        if isinstance(lower, dt.datetime) and isinstance(upper, dt.datetime):
            if (lower.tzinfo is None) != (upper.tzinfo is None):
                return None
            return (upper - lower).total_seconds()
        if isinstance(lower, dt.date) and isinstance(upper, dt.date):
            return float((upper - lower).days)
        if isinstance(lower, int | float | Decimal) and isinstance(upper, int | float | Decimal):
            if isinstance(lower, bool) or isinstance(upper, bool):
                return None
            return float(upper) - float(lower)
    except (TypeError, ValueError, OverflowError):
        return None
    return None


def _term_text(term: Any) -> str:
    return term["expr"] if isinstance(term, dict) else quote_identifier(term)


def _shape_text(tree: Any) -> str:
    """`country = ? AND ts >= ?`-style text of a shape tree (values shown when recorded)."""
    kind = tree[0]
    if kind in ("and", "or"):
        parts = [_shape_text(child) for child in tree[1]]
        joined = f" {kind.upper()} ".join(f"({p})" if " OR " in p or " AND " in p else p for p in parts)
        return joined
    if kind == "not":
        return f"NOT ({_shape_text(tree[1])})"
    if kind == "cmp":
        return f"{_term_text(tree[1])} {tree[2]} {_shown(tree[3])}"
    if kind == "in":
        values = tree[3]
        inside = ", ".join(_shown(v) for v in values) if values is not None else f"<{tree[2]} values>"
        return f"{_term_text(tree[1])} IN ({inside})"
    if kind == "null":
        return f"{_term_text(tree[1])} IS NULL"
    if kind == "range":
        term, lower, lower_inclusive, upper, upper_inclusive = tree[1:6]
        parts = []
        if lower is not None:
            parts.append(f"{_term_text(term)} {'>=' if lower_inclusive else '>'} {_shown(lower)}")
        if upper is not None:
            parts.append(f"{_term_text(term)} {'<=' if upper_inclusive else '<'} {_shown(upper)}")
        return " AND ".join(parts)
    if kind == "opaque":
        return f"<other condition on {', '.join(tree[1]) or 'no column'}>"
    return "FALSE" if kind == "false" else "TRUE"


def shape_text(tree: Any) -> str:
    """The display text of a recorded tree with its values masked (`"user_id" = ?`): one text per
    shape, however many values were recorded."""

    def masked(node: Any) -> Any:
        kind = node[0]
        if kind in ("and", "or"):
            return [kind, [masked(child) for child in node[1]]]
        if kind == "not":
            return ["not", masked(node[1])]
        if kind == "cmp":
            return [*node[:3], "?"]
        if kind == "in":
            return [*node[:3], None]
        if kind == "range":
            lower, upper = node[2], node[4]
            return [
                node[0],
                node[1],
                None if lower is None else "?",
                node[3],
                None if upper is None else "?",
                *node[5:],
            ]
        return node

    return _shape_text(masked(tree))


def _shown(value: Any) -> str:
    if value == "?":
        return "?"

    return sql_literal(value_from_json(value))


def filter_sql(tree: Any, value_of: Callable[[Any, Any], Any] | None = None) -> str | None:
    """The tree as a SQL filter `bind_filter` reads; None when a value is unknown and `value_of` is None.

    `value_of(term, recorded)` supplies a value for each comparison (a `?` to fill, or the recorded one).
    An opaque condition reads as TRUE: pruning could not use it either.
    """

    def literal(term: Any, recorded: Any) -> str:
        if value_of is not None:
            value = value_of(term, recorded)
        elif recorded == "?":
            raise _Unknown
        else:
            value = value_from_json(recorded)
        if value is None:
            raise _Unknown
        return sql_literal(value)

    def render(node: Any) -> str:
        kind = node[0]
        if kind in ("and", "or"):
            if not node[1]:
                return "TRUE" if kind == "and" else "FALSE"
            return "(" + f" {kind.upper()} ".join(render(child) for child in node[1]) + ")"
        if kind == "not":
            return f"(NOT {render(node[1])})"
        if kind == "cmp":
            op = "<>" if node[2] == "!=" else node[2]
            return f"({_term_text(node[1])} {op} {literal(node[1], node[3])})"
        if kind == "in":
            recorded = (
                node[3] if node[3] is not None else ["?"] * max(1, min(int(node[2]), MAX_RECORDED_VALUES))
            )
            values = sorted({literal(node[1], v) for v in recorded})
            return f"({_term_text(node[1])} IN ({', '.join(values)}))"
        if kind == "null":
            return f"({_term_text(node[1])} IS NULL)"
        if kind == "range":
            term, lower, lower_inclusive, upper, upper_inclusive, span = node[1:7]
            if value_of is not None and span is not None and lower is not None and upper is not None:
                start = value_of(term, lower)
                if start is None:
                    raise _Unknown
                end = _shifted(start, span) if lower == "?" or upper == "?" else value_from_json(upper)
                return (
                    f"({_term_text(term)} {'>=' if lower_inclusive else '>'} {sql_literal(start)} AND "
                    f"{_term_text(term)} {'<=' if upper_inclusive else '<'} {sql_literal(end)})"
                )
            parts = []
            if lower is not None:
                parts.append(f"{_term_text(term)} {'>=' if lower_inclusive else '>'} {literal(term, lower)}")
            if upper is not None:
                parts.append(f"{_term_text(term)} {'<=' if upper_inclusive else '<'} {literal(term, upper)}")
            return "(" + " AND ".join(parts) + ")"
        if kind == "false":
            return "FALSE"
        return "TRUE"

    try:
        return render(tree)
    except _Unknown:
        return None


def _shifted(start: Any, span: float) -> Any:
    if isinstance(start, dt.datetime):
        return start + dt.timedelta(seconds=span)
    if isinstance(start, dt.date):
        return start + dt.timedelta(days=span)
    if isinstance(start, int):
        return start + int(span)
    if isinstance(start, Decimal):
        return start + Decimal(repr(span))
    return start + span


class _Unknown(Exception):
    """A value the record does not hold."""


# --- records -----------------------------------------------------------------------------------


@dataclass
class ReadRecord:
    """One read, query or plan of a dataset, as the log and the metrics see it."""

    dataset: str
    kind: str
    version: int | None
    shape: FilterShape | None
    partitions: int
    partitions_total: int
    files: int
    files_total: int | None
    bytes: int
    rows: int | None
    elapsed_s: float
    keys: Sequence[str] = field(default_factory=tuple)
    keys_truncated: bool = False
    at: float = field(default_factory=time.time)

    @property
    def pruned_nothing(self) -> bool:
        """A filter that selected every partition of a version with several."""
        return (
            self.shape is not None and self.partitions_total > 1 and self.partitions >= self.partitions_total
        )

    def to_json(self) -> dict[str, Any]:
        shape = self.shape
        return {
            "at": round(self.at, 3),
            "dataset": self.dataset,
            "kind": self.kind,
            "version": self.version,
            "filter": shape.text if shape is not None else None,
            "columns": list(shape.columns) if shape is not None else [],
            "ops": list(shape.ops) if shape is not None else [],
            "tree": shape.tree if shape is not None else None,
            "literals": shape.literals if shape is not None else False,
            "partitions": self.partitions,
            "partitions_total": self.partitions_total,
            "files": self.files,
            "files_total": self.files_total,
            "bytes": self.bytes,
            "rows": self.rows,
            "ms": round(self.elapsed_s * 1000, 3),
            "keys": list(self.keys),
            "keys_truncated": self.keys_truncated,
        }


def plan_record(
    plan: PrunePlan,
    *,
    dataset: str,
    kind: str,
    mode: ReadStatsMode,
    rows: int | None,
    elapsed_s: float,
    files_total: int | None,
) -> ReadRecord:
    """The record of one call that ran `plan`; the filter's shape is computed once per plan (plans are
    cached per version and filter, so a repeated read pays nothing for it)."""
    literals = mode is ReadStatsMode.LITERALS
    shape: FilterShape | None = None
    if plan.has_filter:
        cache_name = "_read_shape_literals" if literals else "_read_shape"
        shape = plan.__dict__.get(cache_name)
        if shape is None:
            shape = filter_shape(plan.predicate, literals=literals)
            plan.__dict__[cache_name] = shape
    selected = plan.selected
    files = plan.files
    keys = [p.key_path for p in selected[:MAX_RECORDED_KEYS]]
    return ReadRecord(
        dataset=dataset,
        kind=kind,
        version=plan.version,
        shape=shape,
        partitions=len(selected),
        partitions_total=plan.total,
        files=len(files),
        files_total=files_total,
        bytes=sum(f.bytes for f in files),
        rows=rows,
        elapsed_s=elapsed_s,
        keys=keys,
        keys_truncated=len(selected) > MAX_RECORDED_KEYS,
    )


# --- metrics sinks -------------------------------------------------------------------------------

_SINKS: list[Callable[[ReadRecord], None]] = []
_SINKS_LOCK = threading.Lock()


def add_metrics_sink(sink: Callable[[ReadRecord], None]) -> None:
    """Send every later record to `sink` too (once per sink, however often it is added)."""
    with _SINKS_LOCK:
        if sink not in _SINKS:
            _SINKS.append(sink)


def remove_metrics_sink(sink: Callable[[ReadRecord], None]) -> None:
    with _SINKS_LOCK:
        if sink in _SINKS:
            _SINKS.remove(sink)


# --- the log -------------------------------------------------------------------------------------


class ReadStatsLog:
    """The bounded JSONL log of one dataset's reads (see the module docstring)."""

    def __init__(self, directory: Path, *, max_bytes: int | None = None) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOG_NAME
        self.rotated = self.directory / f"{LOG_NAME}.1"
        if max_bytes is None:
            raw = os.environ.get(MAX_BYTES_ENV)
            max_bytes = int(raw) if raw and raw.strip().isdigit() else DEFAULT_MAX_BYTES
        self.max_bytes = max(1024, int(max_bytes))
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid = os.getpid()
        self._writes = 0

    def append(self, record: ReadRecord | Mapping[str, Any]) -> None:
        """Add one record as one line; rotate past the bound (see `append_line`)."""
        data = record.to_json() if isinstance(record, ReadRecord) else dict(record)
        self.append_line(json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str))

    def append_line(self, text: str) -> None:
        """One `write` of a newline and `text` on the log's `O_APPEND` descriptor (kept open: opening
        costs more than the write); past `max_bytes` the file is renamed to `.1`. A descriptor whose file
        another process rotated away is reopened within `REOPEN_CHECK` writes.

        A log that cannot be written (read-only directory, full disk) never fails the read it describes.
        """
        # The newline goes first: a line torn by a writer that died stays apart from the next record.
        line = ("\n" + text).encode()
        with self._lock:
            try:
                fd = self._fd
                if fd is None or self._pid != os.getpid():
                    fd = self._fd = self._open()
                    self._pid = os.getpid()
                os.write(fd, line)
                self._writes += 1
                info = os.fstat(fd)
                if info.st_size > self.max_bytes:
                    # Several writers may pass the bound at once: one rename wins, the others find the
                    # new file small, or (their descriptor on the renamed file) reopen below.
                    current = os.stat(self.path)
                    if current.st_ino == info.st_ino:
                        os.replace(self.path, self.rotated)
                    self._reopen()
                elif self._writes % REOPEN_CHECK == 0 and os.stat(self.path).st_ino != info.st_ino:
                    self._reopen()
            except OSError:
                self._reopen()

    def _reopen(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self) -> None:
        """Close the descriptor (a later append opens it again)."""
        with self._lock:
            self._reopen()

    def _open(self) -> int:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        try:
            return os.open(self.path, flags, 0o644)
        except FileNotFoundError:
            self.directory.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, flags, 0o644)

    def records(self) -> list[dict[str, Any]]:
        """Every whole record, oldest first; torn or foreign lines are skipped."""
        return list(self._iter())

    def _iter(self) -> Iterator[dict[str, Any]]:
        for path in (self.rotated, self.path):
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            for line in data.split(b"\n"):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except ValueError:
                    continue  # a torn line (a writer died mid-write) or bytes that are not ours
                if isinstance(item, dict) and "partitions" in item:
                    yield item

    def clear(self) -> None:
        for path in (self.rotated, self.path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass


class ReadStatsRecorder:
    """What a reader uses: the dataset's mode, its log, and the sinks; `record` never raises."""

    def __init__(self, dataset: str, directory: Path | None, params: Mapping[str, Any] | None) -> None:
        self.dataset = dataset
        self.mode = read_stats_mode(params)
        self.log = ReadStatsLog(directory) if directory is not None else None

    @property
    def enabled(self) -> bool:
        return self.mode is not ReadStatsMode.OFF

    def record(
        self,
        plan: PrunePlan,
        *,
        kind: str,
        rows: int | None,
        elapsed_s: float,
        files_total: int | None,
    ) -> ReadRecord | None:
        if self.mode is ReadStatsMode.OFF:
            return None
        record: ReadRecord | None = None
        if self.log is not None:
            # What a plan makes of the record is the same on every call: its JSON is built once per plan
            # (plans are cached per version and filter) and only the call's own fields are formatted.
            cache_name = f"_read_line_{self.mode}"
            cached = plan.__dict__.get(cache_name)
            if cached is None or cached[0] != files_total:
                record = plan_record(
                    plan,
                    dataset=self.dataset,
                    kind=kind,
                    mode=self.mode,
                    rows=rows,
                    elapsed_s=elapsed_s,
                    files_total=files_total,
                )
                data = record.to_json()
                for name in ("at", "kind", "rows", "ms"):
                    data.pop(name)
                fragment = json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)[1:-1]
                cached = plan.__dict__[cache_name] = (files_total, fragment)
            self.log.append_line(
                f'{{"at":{time.time():.3f},"kind":"{kind}","rows":{"null" if rows is None else int(rows)},'
                f'"ms":{elapsed_s * 1000:.3f},{cached[1]}}}'
            )
        if _SINKS:
            if record is None:
                record = plan_record(
                    plan,
                    dataset=self.dataset,
                    kind=kind,
                    mode=self.mode,
                    rows=rows,
                    elapsed_s=elapsed_s,
                    files_total=files_total,
                )
            for sink in list(_SINKS):
                try:
                    sink(record)
                except Exception:  # a metrics backend never fails a read
                    pass
        return record

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
