"""Simulate candidate layouts against the recorded reads and recommend one (see the package docstring).

How a candidate is judged: its partition expressions are evaluated over the dataset's actual column
values (the transforms' Arrow evaluation); each candidate partition becomes one simulated file whose
statistics (`storage.compute_column_stats`) and size (the current files' bytes = overhead + rows x
bytes-per-row, fitted by least squares) are what a refresh would write. The recorded filters are then
planned over a `PartitionIndex` of those partitions by the read path's own planner (`plan_partitions`),
so partition pruning and min / max pruning count as they would. Filters recorded with their values are
replayed as they ran; filters recorded as shapes get values drawn from real rows (one row per replay, so
correlated columns stay consistent), and a range keeps its recorded width. The winner has the fewest
expected bytes read per query among candidates whose median partition is not tiny; ties go to fewer
files, then to the current layout.
"""

from __future__ import annotations

import collections
import json
import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from airflow_partitions.advisor.findings import (
    DEFAULT_TARGET_FILE_BYTES,
    TINY_DIVISOR,
    size_findings,
    snapshot_partitions,
)
from airflow_partitions.catalog.open import dataset_directory
from airflow_partitions.exceptions import FilterError, PartitionSpecError
from airflow_partitions.keys import PartitionKey, value_from_json
from airflow_partitions.pruning import PartitionIndex, bind_fields, plan_partitions
from airflow_partitions.quoting import quote_identifier
from airflow_partitions.read import PartitionedDatasetReader, open_project
from airflow_partitions.read.read_stats import (
    ReadStatsLog,
    ReadStatsMode,
    filter_sql,
    shape_text,
    stats_directory,
)
from airflow_partitions.storage.datafile import DataFile, compute_column_stats
from airflow_partitions.storage.parquet import ROW_GROUP_ROWS
from airflow_partitions.transforms import BucketTransform, DateTruncTransform, parse_transform
from airflow_partitions.transforms.base import canonical_identifier

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.read import PartitionedDatasetReader
    from airflow_partitions.spec.model import DatasetSpec, ProjectSpec

# Replays drawn per filter shape recorded without values.
SAMPLES_PER_SHAPE = 24
# Recorded records considered (the newest).
MAX_RECORDS = 5000
# Candidates within this fraction of the best bytes read tie (then fewer files win).
TIE = 0.01
FINER = {"year": "month", "quarter": "month", "month": "day", "week": "day", "day": "hour", "hour": "minute"}
COARSER = {
    "minute": "hour",
    "hour": "day",
    "day": "month",
    "week": "month",
    "month": "year",
    "quarter": "year",
}

Fields = tuple[tuple[str, str], ...]


@dataclass
class Candidate:
    """One layout simulated: its fields, what it costs the workload, and its partitions."""

    name: str
    fields: Fields
    partitions: int = 0
    files: int = 0
    median_partition_bytes: float = 0.0
    partitions_per_query: float = 0.0
    bytes_per_query: float = 0.0
    eligible: bool = True
    note: str = ""
    current: bool = False
    per_query: list[tuple[int, int]] = field(default_factory=list, repr=False)

    def partition_by_yaml(self) -> str:
        lines = ["partition_by:"]
        lines += [f"  - {name}: {json.dumps(expression)}" for name, expression in self.fields]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "partition_by": [{name: expression} for name, expression in self.fields],
            "current": self.current,
            "partitions": self.partitions,
            "files": self.files,
            "median_partition_bytes": round(self.median_partition_bytes),
            "partitions_per_query": round(self.partitions_per_query, 3),
            "bytes_per_query": round(self.bytes_per_query),
            "eligible": self.eligible,
            "note": self.note,
        }


@dataclass
class Advice:
    """Everything `advise` found; `to_json()` is `advise --json`, `render()` the text output."""

    dataset: str
    version: int | None
    findings: dict[str, Any]
    candidates: list[Candidate]
    winner: Candidate | None
    workload: dict[str, Any]
    sort_advice: list[dict[str, Any]]
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "version": self.version,
            "findings": self.findings,
            "workload": self.workload,
            "candidates": [c.to_json() for c in self.candidates],
            "winner": self.winner.to_json() if self.winner is not None else None,
            "partition_by_yaml": self.winner.partition_by_yaml() if self.winner is not None else None,
            "sort_advice": self.sort_advice,
            "notes": self.notes,
        }

    def render(self) -> str:
        f = self.findings
        out = [f"dataset {self.dataset}, catalog version {self.version}"]
        out.append(
            f"reads recorded: {self.workload['records']} ({self.workload['replayed']} replayed exactly, "
            f"{self.workload['sampled_shapes']} shape(s) replayed with values drawn from the data)"
        )
        out.append("findings:")
        if f.get("skewed"):
            out.append(
                f"  SKEW: {len(f['skewed'])} partition(s) hold over {f['skew_factor']}x the median "
                f"({f['median_rows']} rows):"
            )
            out += [
                f"    {s['key_path']}: {s['rows']} rows, {s['share']:.1%} of the rows, {s['times_median']}x"
                for s in f["skewed"][:10]
            ]
        else:
            out.append("  no skewed partition")
        out.append(
            "  top keys: " + ", ".join(f"{k['key_path']} {k['share']:.1%}" for k in f.get("top_keys", []))
        )
        out.append(
            f"  files: {f['files']}, tiny (< {f['tiny_file_bytes']} B): {f['tiny_files']}, huge "
            f"(> {f['huge_file_bytes']} B): {f['huge_files']}; tiny partitions: {f['tiny_partitions']}, "
            f"huge partitions: {f['huge_partitions']}"
        )
        never = f.get("never_read")
        if never is not None:
            out.append(f"  partitions never read by a recorded read: {never['count']} of {never['of']}")
        for item in f.get("prune_nothing", []):
            out.append(f"  PRUNES NOTHING: {item['filter']} ({item['reads']} read(s) opened every partition)")
        out.append("candidate layouts (per query: partitions, bytes read; file count):")
        for c in self.candidates:
            mark = "*" if c is self.winner else " "
            flags = " (current)" if c.current else ""
            flags += "" if c.eligible else f" [not eligible: {c.note}]"
            out.append(
                f" {mark} {c.name}{flags}: {c.partitions_per_query:.2f} partitions, "
                f"{_size(c.bytes_per_query)} per query; {c.files} file(s), {c.partitions} partition(s)"
            )
        if self.winner is not None:
            out.append(f"recommended: {self.winner.name}")
            out.append("paste under acceleration:")
            out += ["  " + line for line in self.winner.partition_by_yaml().splitlines()]
        for advice in self.sort_advice:
            out.append(advice["text"])
        out += [f"note: {note}" for note in self.notes]
        return "\n".join(out)


def _size(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


# --- the workload -----------------------------------------------------------------------------------


@dataclass
class Workload:
    """Filters to replay (SQL text or None for an unfiltered read) with weights summing to the reads."""

    queries: list[tuple[str | None, float]]
    records: int
    replayed: int
    sampled_shapes: int
    columns: collections.Counter[str]


def load_records(project: ProjectSpec, dataset: DatasetSpec) -> list[dict[str, Any]]:
    log = ReadStatsLog(stats_directory(dataset_directory(project, dataset)))
    records = [r for r in log.records() if r.get("dataset") == dataset.name]
    return records[-MAX_RECORDS:]


def build_workload(records: Sequence[Mapping[str, Any]], table: pa.Table, *, seed: int = 0) -> Workload:
    """The replays of the recorded reads: exact where values were recorded, sampled otherwise."""
    exact: collections.Counter[str | None] = collections.Counter()
    shapes: dict[str, tuple[Any, int]] = {}
    columns: collections.Counter[str] = collections.Counter()
    for record in records:
        tree = record.get("tree")
        for column in record.get("columns") or ():
            columns[column] += 1
        if tree is None:
            exact[None] += 1
            continue
        sql = filter_sql(tree)
        if sql is not None:
            exact[sql] += 1
            continue
        text = str(record.get("filter"))
        held = shapes.get(text)
        shapes[text] = (tree, (held[1] if held else 0) + 1)
    queries: list[tuple[str | None, float]] = list(exact.items())
    rng = random.Random(seed)
    rows = table.num_rows
    for tree, count in shapes.values():
        made: list[str] = []
        for _ in range(SAMPLES_PER_SHAPE * 4):
            if len(made) >= SAMPLES_PER_SHAPE or rows == 0:
                break
            row = rng.randrange(rows)
            sql = filter_sql(tree, _row_values(table, row))
            if sql is not None:
                made.append(sql)
        queries += [(sql, count / len(made)) for sql in made]
    return Workload(queries, len(records), sum(v for k, v in exact.items()), len(shapes), columns)


def _row_values(table: pa.Table, row: int) -> Callable[[Any, Any], Any]:
    """`value_of(term, recorded)` for `filter_sql`: the recorded value, else the row's value."""

    def value_of(term: Any, recorded: Any) -> Any:
        if recorded != "?":
            return value_from_json(recorded)
        if isinstance(term, dict):
            transform = parse_transform(term["expr"])
            columns = transform.source_columns
            if not all(column in table.column_names for column in columns):
                return None
            bound = transform.bind_columns([table.schema.field(column).type for column in columns])
            values = [table.column(column)[row].as_py() for column in columns]
            return bound.apply_row(values)
        if term not in table.column_names:
            return None
        return table.column(term)[row].as_py()

    return value_of


# --- candidates ------------------------------------------------------------------------------------


def candidate_layouts(
    dataset: DatasetSpec, schema: pa.Schema, filtered: collections.Counter[str], table: pa.Table
) -> list[tuple[str, Fields]]:
    """The current layout and its neighbours: bucket counts halved and doubled, date grains finer and
    coarser, the fields in reverse order, and the most filtered non-partition columns added."""
    import pyarrow as pa
    import pyarrow.compute as pc

    current: Fields = tuple((f.name, f.expression) for f in dataset.acceleration.partition_by)
    found: list[tuple[str, Fields]] = [("current", current)]

    def add(name: str, fields: Fields) -> None:
        if fields and all(fields != existing for _n, existing in found):
            found.append((name, fields))

    for position, (name, expression) in enumerate(current):
        transform = parse_transform(expression)
        if len(transform.source_columns) != 1:
            continue  # multi_bucket: no single-column neighbours to propose
        column = canonical_identifier(transform.source_column)
        if isinstance(transform, BucketTransform):
            n = transform.num_buckets
            for other in (n // 4, n // 2, n * 2, n * 4):
                if 2 <= other <= 4096:
                    changed = _replace(current, position, (name, f"bucket({other}, {column})"))
                    add(f"{name}: bucket {n} -> {other}", changed)
        if isinstance(transform, DateTruncTransform):
            for grain in (FINER.get(transform.unit), COARSER.get(transform.unit)):
                if grain:
                    changed = _replace(current, position, (name, f"date_trunc('{grain}', {column})"))
                    add(f"{name}: {transform.unit} -> {grain}", changed)
    if len(current) > 1:
        add("fields in reverse order", tuple(reversed(current)))
    partition_columns = {c for _n, e in current for c in parse_transform(e).source_columns}
    taken = {n for n, _e in current}
    for column, _count in filtered.most_common(3):
        if column in partition_columns or schema.get_field_index(column) < 0:
            continue
        kind = schema.field(column).type
        sql = canonical_identifier(column)
        base = _field_name(column, taken)
        options: list[str]
        if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
            options = [f"date_trunc('day', {sql})", f"date_trunc('month', {sql})"]
        else:
            distinct = len(pc.unique(table.column(column))) if column in table.column_names else 1000
            options = [sql] if distinct <= 64 else []
            options += [f"bucket({n}, {sql})" for n in (8, 32)]
        for expression in options:
            added = (base, expression)
            add(f"add {expression}", (*current, added))
            add(f"{expression} alone", (added,))
    return found


def _replace(fields: Fields, position: int, item: tuple[str, str]) -> Fields:
    return tuple(item if i == position else f for i, f in enumerate(fields))


def _field_name(column: str, taken: set[str]) -> str:
    import re

    base = re.sub(r"[^A-Za-z0-9_]", "_", column) or "field"
    if base[0].isdigit():
        base = "f_" + base
    name, n = f"{base}_part", 2
    while name in taken:
        name, n = f"{base}_part{n}", n + 1
    return name


# --- simulation -------------------------------------------------------------------------------------


@dataclass
class SizeModel:
    """Bytes of a file of `rows` rows: `overhead + per_row * rows` (fitted on the current files)."""

    overhead: float
    per_row: float

    def bytes(self, rows: int) -> int:
        return round(self.overhead + self.per_row * rows)

    @classmethod
    def fit(cls, files: Sequence[tuple[int, int]]) -> SizeModel:
        usable = [(rows, size) for rows, size in files if rows > 0]
        if not usable:
            return cls(0.0, 1.0)
        rows = np.array([r for r, _ in usable], dtype=float)
        sizes = np.array([s for _, s in usable], dtype=float)
        if len(usable) >= 2 and rows.std() > 0:
            slope, intercept = np.polyfit(rows, sizes, 1)
            if slope > 0 and intercept >= 0:
                return cls(float(intercept), float(slope))
        return cls(0.0, float(sizes.sum() / rows.sum()))


def simulate(
    fields: Fields,
    table: pa.Table,
    schema: pa.Schema,
    queries: Sequence[tuple[str | None, float]],
    model: SizeModel,
    *,
    target_file_bytes: int,
    stats_columns: Sequence[str],
) -> tuple[list[tuple[str, int, int, int]], list[tuple[int, int]]]:
    """Partitions `(key_path, rows, bytes, files)` of `fields` over `table`, and per query the partitions
    and bytes its plan reads."""
    index, sizes = candidate_index(fields, table, schema, model, target_file_bytes, stats_columns)
    per_query: list[tuple[int, int]] = []
    for sql, _weight in queries:
        plan = plan_partitions(index, sql)
        per_query.append((len(plan.selected), sum(f.bytes for f in plan.files)))
    return sizes, per_query


def candidate_index(
    fields: Fields,
    table: pa.Table,
    schema: pa.Schema,
    model: SizeModel,
    target_file_bytes: int,
    stats_columns: Sequence[str],
) -> tuple[PartitionIndex, list[tuple[str, int, int, int]]]:
    """A `PartitionIndex` of the partitions `fields` make of `table`, one simulated file each (its
    statistics over `stats_columns`, its size from `model`)."""
    import pyarrow as pa

    bound = bind_fields(fields, schema)
    key_columns = []
    for item in bound:
        key_columns.append(item.transform.apply_table(table))
    names = [name for name, _ in fields]
    keyed = pa.table(
        {
            **{f"k{i}": column for i, column in enumerate(key_columns)},
            "__row": pa.array(range(table.num_rows)),
        }
    )
    groups = keyed.group_by([f"k{i}" for i in range(len(fields))], use_threads=False).aggregate(
        [("__row", "list")]
    )
    stats_table = table.select([c for c in stats_columns if c in table.column_names])
    keys: list[Sequence[Any]] = []
    files: list[tuple[DataFile, ...]] = []
    sizes: list[tuple[str, int, int, int]] = []
    key_lists = [groups.column(f"k{i}").to_pylist() for i in range(len(fields))]
    row_lists = groups.column("__row_list").to_pylist()
    for position, rows in enumerate(row_lists):
        key = tuple(values[position] for values in key_lists)
        key_path = PartitionKey(key).path(names)
        count = len(rows)
        size = model.bytes(count)
        stats = compute_column_stats(stats_table.take(pa.array(rows))) if stats_table.num_columns else {}
        keys.append(key)
        files.append((DataFile(f"{key_path}/simulated", "parquet", count, size, "", stats),))
        sizes.append((key_path, count, size, max(1, math.ceil(size / target_file_bytes))))
    index = PartitionIndex(
        schema=schema,
        fields=bound,
        names=names,
        key_paths=[s[0] for s in sizes],
        keys=keys,
        rows=np.array([s[1] for s in sizes], dtype=np.int64),
        version=None,
        origin="a simulated layout",
        files=files,
    )
    return index, sizes


# --- sort order -------------------------------------------------------------------------------------


def sort_advice(
    dataset: DatasetSpec,
    table: pa.Table,
    schema: pa.Schema,
    queries: Sequence[tuple[str | None, float]],
    filtered: collections.Counter[str],
    *,
    row_group_rows: int,
) -> list[dict[str, Any]]:
    """For the most filtered non-partition columns: row groups a query reads inside the large partitions
    (over two row groups of rows) in the files' current order and sorted by the column."""
    import pyarrow as pa

    acceleration = dataset.acceleration
    current: Fields = tuple((f.name, f.expression) for f in acceleration.partition_by)
    partition_columns = {c for f in acceleration.partition_by for c in f.source_columns}
    bound = bind_fields(current, schema)
    keys = [item.transform.apply_table(table) for item in bound]
    keyed = pa.table({**{f"k{i}": k for i, k in enumerate(keys)}, "__row": pa.array(range(table.num_rows))})
    groups = keyed.group_by([f"k{i}" for i in range(len(keys))], use_threads=False).aggregate(
        [("__row", "list")]
    )
    large = [rows for rows in groups.column("__row_list").to_pylist() if len(rows) > 2 * row_group_rows]
    advice: list[dict[str, Any]] = []
    declared = acceleration.sort_columns
    for column, _count in filtered.most_common(3):
        if column in partition_columns or column not in table.column_names:
            continue
        relevant = [(sql, w) for sql, w in queries if sql is not None and _mentions(sql, column)]
        if not relevant or not large:
            continue
        now = _row_groups_read(table, large, None, row_group_rows, schema, relevant, column)
        sorted_ = _row_groups_read(table, large, column, row_group_rows, schema, relevant, column)
        total = sum(math.ceil(len(rows) / row_group_rows) for rows in large)
        supported = str(acceleration.engine) == "parquet"
        text = (
            f"sort advice: filters on {column} read {now:.1f} of {total} row groups per query in the "
            f"{len(large)} large partition(s) now; sorted by {column}: {sorted_:.1f} "
            f"(skips {total - sorted_:.1f})."
        )
        if declared and declared[0] == column:
            text += f" The files are already sorted by {column}."
        elif supported:
            text += f" Add under acceleration.params: sort_by: [{column}]"
        else:
            text += (
                f" sort_by applies to engine parquet only (this dataset uses {acceleration.engine}); "
                "with engine parquet, params.sort_by would let row-group min / max skip them"
            )
        advice.append(
            {
                "column": column,
                "large_partitions": len(large),
                "row_groups": total,
                "row_groups_read_now": round(now, 3),
                "row_groups_read_sorted": round(sorted_, 3),
                "sort_by": [column],
                "supported": supported,
                "already_sorted": bool(declared and declared[0] == column),
                "text": text,
            }
        )
    return advice


def _mentions(sql: str, column: str) -> bool:
    return quote_identifier(column) in sql


def _row_groups_read(
    table: pa.Table,
    partitions: Sequence[Sequence[int]],
    order_by: str | None,
    row_group_rows: int,
    schema: pa.Schema,
    queries: Sequence[tuple[str, float]],
    column: str,
) -> float:
    """Row groups of `partitions` (rows of `table`) a query reads on average: one simulated file per row
    group, planned by the read path's planner (min / max pruning)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    part = table.select([column])
    keys: list[Sequence[Any]] = []
    files: list[tuple[DataFile, ...]] = []
    for number, rows in enumerate(partitions):
        chunk = part.take(pa.array(rows))
        if order_by is not None:
            chunk = chunk.take(pc.sort_indices(chunk, sort_keys=[(order_by, "ascending")]))
        groups = []
        for start in range(0, chunk.num_rows, row_group_rows):
            piece = chunk.slice(start, row_group_rows)
            groups.append(
                DataFile(
                    f"p{number}/rg{start}", "parquet", piece.num_rows, 1, "", compute_column_stats(piece)
                )
            )
        keys.append((number,))
        files.append(tuple(groups))
    index = PartitionIndex(
        schema=schema,
        fields=(),
        names=(),
        key_paths=[f"p{number}" for number in range(len(partitions))],
        keys=keys,
        rows=np.array([len(rows) for rows in partitions], dtype=np.int64),
        version=None,
        origin="simulated row groups",
        files=files,
    )
    weight = sum(w for _sql, w in queries)
    read = 0.0
    for sql, w in queries:
        read += w * len(plan_partitions(index, sql).files)
    return read / weight if weight else 0.0


# --- advise ------------------------------------------------------------------------------------------


def advise(
    project: ProjectSpec | str | Path,
    dataset_name: str,
    *,
    target_file_bytes: int | None = None,
    row_group_rows: int | None = None,
    reader: PartitionedDatasetReader | None = None,
    seed: int = 0,
) -> Advice:
    """Findings, simulated candidate layouts and sort advice for one dataset (see the module docstring)."""

    spec = open_project(project)
    dataset = spec.dataset(dataset_name)
    own = reader is None
    if reader is None:
        reader = PartitionedDatasetReader(spec, dataset_name)
    # The advisor's own reads are not part of the workload.
    reader.read_stats.mode = ReadStatsMode.OFF
    target = _positive(
        "target_file_bytes", DEFAULT_TARGET_FILE_BYTES if target_file_bytes is None else target_file_bytes
    )
    group_rows = _group_rows(dataset, row_group_rows)
    try:
        snapshot = reader.snapshot()
        partitions = snapshot_partitions(snapshot)
        findings = size_findings(partitions, target_file_bytes=target)
        skewed_keys = {item["key_path"] for item in findings["skewed"]}
        for item in findings["top_keys"]:
            item["skewed"] = item["key_path"] in skewed_keys
        records = load_records(spec, dataset)
        findings.update(_read_findings(records, partitions, snapshot.version))
        schema = reader.schema()
        current = tuple((f.name, f.expression) for f in dataset.acceleration.partition_by)
        filtered = collections.Counter(c for r in records for c in (r.get("columns") or ()))
        columns = sorted(
            {c for _n, e in current for c in parse_transform(e).source_columns}
            | {c for c in filtered if schema.get_field_index(c) >= 0}
        )
        table = reader.read(columns=columns) if snapshot.partition_count else None
    finally:
        if own:
            reader.close()
    notes = [
        "bytes per query are the simulated files' sizes (fitted on the current files) the planner selects; "
        "every layout is simulated the same way, the current one included"
    ]
    if table is None or table.num_rows == 0:
        return Advice(dataset.name, snapshot.version, findings, [], None, _workload_json(None), [], notes)
    workload = build_workload(records, table, seed=seed)
    if not workload.queries:
        notes.append(
            "no read is recorded yet: the layouts are compared on an unfiltered read only; read the dataset "
            "(read statistics on: AP_READ_STATS unset or 1) and advise again"
        )
        workload.queries = [(None, 1.0)]
    model = SizeModel.fit([(f.rows, f.bytes) for e in snapshot.partitions.values() for f in e.files])
    stats_columns = sorted({c for c in filtered if c in table.column_names})
    candidates: list[Candidate] = []
    for name, fields in candidate_layouts(dataset, schema, filtered, table):
        candidate = Candidate(name, fields, current=fields == current)
        _assess_candidate(
            candidate, candidates, dataset, table, schema, workload.queries, model, target, stats_columns
        )
        candidates.append(candidate)
    winner = choose_winner(candidates)
    sorting = sort_advice(
        dataset,
        table,
        schema,
        [(q, w) for q, w in workload.queries if q is not None],
        filtered,
        row_group_rows=group_rows,
    )
    return Advice(
        dataset.name, snapshot.version, findings, candidates, winner, _workload_json(workload), sorting, notes
    )


def _group_rows(dataset: DatasetSpec, row_group_rows: int | None) -> int:
    """The row group size sort advice assumes: the argument, else the dataset's `row_group_rows` param, else
    the writer's default."""
    params_rows = dataset.acceleration.params.get("row_group_rows")
    return _positive(
        "row_group_rows",
        row_group_rows
        if row_group_rows is not None
        else params_rows
        if params_rows is not None
        else ROW_GROUP_ROWS,
    )


def _assess_candidate(
    candidate: Candidate,
    earlier: Sequence[Candidate],
    dataset: DatasetSpec,
    table: pa.Table,
    schema: pa.Schema,
    queries: Sequence[tuple[str | None, float]],
    model: SizeModel,
    target: int,
    stats_columns: Sequence[str],
) -> None:
    """Simulate `candidate`'s layout and fill in its figures; mark it ineligible when it cannot be simulated,
    its median partition is tiny (and it has more partitions than the current layout, among `earlier`), or
    it has more partitions than `refresh.max_partitions`."""
    try:
        sizes, per_query = simulate(
            candidate.fields,
            table,
            schema,
            queries,
            model,
            target_file_bytes=target,
            stats_columns=stats_columns,
        )
    except (PartitionSpecError, FilterError, ValueError) as err:
        candidate.eligible, candidate.note = False, f"cannot be simulated: {err}"
        return
    weight = sum(w for _q, w in queries)
    candidate.partitions = len(sizes)
    candidate.files = sum(s[3] for s in sizes)
    candidate.median_partition_bytes = statistics.median(s[2] for s in sizes) if sizes else 0
    candidate.per_query = per_query
    candidate.partitions_per_query = sum(w * p for (_q, w), (p, _b) in zip(queries, per_query)) / weight
    candidate.bytes_per_query = sum(w * b for (_q, w), (_p, b) in zip(queries, per_query)) / weight
    current_partitions = next((c.partitions for c in earlier if c.current), None)
    tiny = candidate.median_partition_bytes < target / TINY_DIVISOR
    if (
        tiny
        and not candidate.current
        and (current_partitions is None or candidate.partitions > current_partitions)
    ):
        candidate.eligible = False
        candidate.note = "its median partition is tiny against the target file size"
    if candidate.partitions > dataset.acceleration.refresh.max_partitions:
        candidate.eligible = False
        candidate.note = (
            f"more partitions than refresh.max_partitions ({dataset.acceleration.refresh.max_partitions})"
        )


def choose_winner(candidates: Sequence[Candidate]) -> Candidate | None:
    """Fewest bytes read per query among eligible candidates; within `TIE`, fewer files, then current."""
    eligible = [c for c in candidates if c.eligible]
    if not eligible:
        return None
    best = min(c.bytes_per_query for c in eligible)
    close = [c for c in eligible if c.bytes_per_query <= best * (1 + TIE) + 1]
    return min(close, key=lambda c: (not c.current, c.files, c.bytes_per_query))


def _workload_json(workload: Workload | None) -> dict[str, Any]:
    if workload is None:
        return {"records": 0, "replayed": 0, "sampled_shapes": 0, "queries": 0}
    return {
        "records": workload.records,
        "replayed": workload.replayed,
        "sampled_shapes": workload.sampled_shapes,
        "queries": len(workload.queries),
        "filtered_columns": dict(workload.columns.most_common()),
    }


def _read_findings(
    records: Sequence[Mapping[str, Any]],
    partitions: Sequence[tuple[str, int, int, Sequence[int]]],
    version: int,
) -> dict[str, Any]:
    """Partitions no recorded read opened, and filters that opened every partition."""
    seen: set[str] = set()
    unknown = 0
    for record in records:
        if record.get("keys_truncated"):
            unknown += 1
        seen.update(record.get("keys") or ())
    keys = [key for key, rows, _b, _f in partitions if rows > 0]
    never = [key for key in keys if key not in seen]
    prune_nothing: collections.Counter[str] = collections.Counter()
    for record in records:
        total = int(record.get("partitions_total") or 0)
        if record.get("tree") is not None and total > 1 and int(record.get("partitions") or 0) >= total:
            prune_nothing[shape_text(record["tree"])] += 1
    return {
        "never_read": {
            "count": len(never),
            "of": len(keys),
            "examples": never[:10],
            "records_with_too_many_keys": unknown,
        }
        if records
        else None,
        "prune_nothing": [{"filter": text, "reads": n} for text, n in prune_nothing.most_common(10)],
    }


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PartitionSpecError(f"{name} must be a positive integer, got {value!r}")
    return value
