"""The join planner of multi-dataset queries: which equi-joins of two datasets run partition-wise.

A join `a JOIN b ON a.k = b.k` of two datasets partitioned on the join key by compatible transforms can
run as many small joins, one per group of matching partitions, whose results are then unioned: a row of
`a` can only match rows of `b` whose key falls in the same group. Compatible (`partition_groups`):

* the same transform over columns of the same type (identity vs identity, bucket(N) vs bucket(N),
  truncate(W) vs truncate(W), ...): a group is one partition value;
* `bucket(N1)` and `bucket(N2)` where one divides the other: coarse bucket `b` holds the fine buckets
  `b + k * N_coarse`, since `(h mod N_fine) mod N_coarse = h mod N_coarse`;
* `date_trunc` units nested in each other (day under month, hour under day, month under year, ...): a
  group is one coarse period.

Only shapes where the split is exactly the plain join are split (`find_joins`): a SELECT whose FROM is
one dataset joined to one other dataset, inner / left / right / full, with an `ON` conjunction holding an
equality of the two key columns (any other conjuncts stay inside each small join) or `USING`. NULL never
satisfies the equality, so the NULL partitions form a group of their own, where an outer join emits
their rows once, NULL-extended. Anything else (another shape, incompatible layouts, float keys, keys of
different types, a column the rewrite could not qualify) runs as one plain join, and the plan says why.

The rewrite (`JoinSplit.rewrite`) replaces the join in the statement by a view of the union of the small
joins, each row holding the columns of the two sides the statement reads (`o.amount` becomes the view's
column for it; `o.*` every column of `o` under its own name): the rest of the statement, aggregates and
windows included, is unchanged and runs once over the union, and its select items keep their names. The
small joins stream into the outer query inside one DuckDB statement (DuckDB schedules their pipelines
on its threads under the query's memory limit); nothing is materialised.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from sqlglot import exp

from airflow_partitions.exceptions import AirflowPartitionsError
from airflow_partitions.pruning.query import column_key, same_key_type, scope_tables

if TYPE_CHECKING:
    from airflow_partitions.pruning import PrunePlan
    from airflow_partitions.pruning.index import BoundField
    from airflow_partitions.storage import DataFile

# Groups beyond this many are batched (a batch of groups joined together is still exact: keys of
# different groups never match), so a join over thousands of partitions is not thousands of branches.
MAX_JOIN_BRANCHES = 64
NULL_GROUP = "NULL"
# date_trunc units and the coarser units each one nests in (weeks straddle months and years).
_COARSER_UNITS: dict[str, frozenset[str]] = {
    "minute": frozenset({"hour", "day", "week", "month", "quarter", "year"}),
    "hour": frozenset({"day", "week", "month", "quarter", "year"}),
    "day": frozenset({"week", "month", "quarter", "year"}),
    "week": frozenset(),
    "month": frozenset({"quarter", "year"}),
    "quarter": frozenset({"year"}),
    "year": frozenset(),
}
_KINDS = {None: "INNER", "": "INNER", "INNER": "INNER", "OUTER": None}
_SIDES = {None: None, "": None, "LEFT": "LEFT", "RIGHT": "RIGHT", "FULL": "FULL"}


@dataclass(frozen=True)
class JoinSide:
    """One side of a join: the dataset, the name the statement qualifies its columns with."""

    dataset: str  # the dataset's name as the spec spells it
    qualifier: str  # alias, or the table name as written


@dataclass
class JoinCandidate:
    """A join between two datasets found in the statement, and whether its shape can be split."""

    left: JoinSide
    right: JoinSide
    kind: str  # INNER, LEFT, RIGHT, FULL, or the join as written when not splittable
    keys: list[tuple[str, str]]  # (left column, right column) pairs of the equality conjuncts
    reason: str | None  # why the shape cannot be split; None when it can
    select: exp.Select | None = None
    on_sql: str = ""
    qualified: dict[int, exp.Expr] = field(default_factory=dict)
    # The columns the rewritten statement reads: (qualifier as written, column) -> the view's column.
    flat: dict[tuple[str, str], str] = field(default_factory=dict)
    schemas: dict[str, pa.Schema] = field(default_factory=dict)


@dataclass(frozen=True)
class PairGroup:
    """One small join: the partitions of each side whose keys fall in the group(s) `groups`."""

    groups: tuple[str, ...]
    left_partitions: tuple[str, ...]
    right_partitions: tuple[str, ...]
    left_files: tuple[DataFile, ...] = ()
    right_files: tuple[DataFile, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "groups": list(self.groups),
            "left_partitions": list(self.left_partitions),
            "right_partitions": list(self.right_partitions),
        }


@dataclass
class JoinDecision:
    """Whether one join runs partition-wise, why, and its pair groups."""

    left: JoinSide
    right: JoinSide
    kind: str
    keys: list[tuple[str, str]]
    split: bool
    reason: str
    pairs: list[PairGroup] = field(default_factory=list)
    candidate: JoinCandidate | None = None

    def describe(self) -> str:
        on = " AND ".join(f"{self.left.qualifier}.{a} = {self.right.qualifier}.{b}" for a, b in self.keys)
        head = f"{self.kind} JOIN {self.left.dataset} AS {self.left.qualifier}, {self.right.dataset} AS "
        head += f"{self.right.qualifier}" + (f" ON {on}" if on else "")
        verdict = f"split into {len(self.pairs)} pair group(s)" if self.split else "not split"
        return f"{head}: {verdict}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {
            "left": {"dataset": self.left.dataset, "as": self.left.qualifier},
            "right": {"dataset": self.right.dataset, "as": self.right.qualifier},
            "kind": self.kind,
            "keys": [list(pair) for pair in self.keys],
            "split": self.split,
            "reason": self.reason,
            "pairs": [pair.to_json() for pair in self.pairs],
        }


# --- finding joins -------------------------------------------------------------------------------------


def find_joins(
    tree: exp.Expr, schemas: Mapping[str, pa.Schema], names: Mapping[str, str]
) -> list[JoinCandidate]:
    """Every join of two datasets in `tree` (`schemas` and `names` keyed by lower-cased dataset name;
    `names` gives the spec's spelling), each with the reason its shape cannot be split, if any."""
    shadowed = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    qualifiers: dict[str, int] = {}
    for table in tree.find_all(exp.Table):
        qualifier = (table.alias or table.name).lower()
        qualifiers[qualifier] = qualifiers.get(qualifier, 0) + 1
    candidates = []
    for select in tree.find_all(exp.Select):
        from_item = select.args.get("from_")
        joins = select.args.get("joins") or []
        tables = [from_item.this if from_item is not None else None, *(join.this for join in joins)]
        datasets = [
            t
            for t in tables
            if isinstance(t, exp.Table) and t.name.lower() in schemas and not t.args.get("db")
        ]
        if len(datasets) < 2:
            continue
        left_table, right_table = datasets[0], datasets[1]
        left = JoinSide(names[left_table.name.lower()], left_table.alias or left_table.name)
        right = JoinSide(names[right_table.name.lower()], right_table.alias or right_table.name)
        candidate = JoinCandidate(left, right, "JOIN", [], None, select)
        candidates.append(candidate)
        if len(joins) != 1 or tables[0] is not left_table or joins[0].this is not right_table:
            candidate.reason = "only a SELECT joining exactly two datasets (FROM a JOIN b) is split"
            continue
        if shadowed & {left_table.name.lower(), right_table.name.lower()}:
            candidate.reason = "a CTE of the query has a dataset's name"
            continue
        repeated = [q for q in (left.qualifier, right.qualifier) if qualifiers.get(q.lower(), 0) > 1]
        if repeated or left.qualifier.lower() == right.qualifier.lower():
            candidate.reason = f"the name {repeated[0] if repeated else left.qualifier!r} names two tables"
            continue
        _check_join_shape(candidate, joins[0], left_table, right_table, schemas)
    return candidates


def _check_join_shape(
    candidate: JoinCandidate,
    join: exp.Join,
    left_table: exp.Table,
    right_table: exp.Table,
    schemas: Mapping[str, pa.Schema],
) -> None:
    side = join.args.get("side")
    kind = join.args.get("kind")
    method = join.args.get("method")
    side_name = _SIDES.get(str(side).upper() if side else None, "?")
    kind_name = str(kind).upper() if kind else None
    if method or side_name == "?" or (kind_name not in _KINDS) or (kind_name == "OUTER" and not side_name):
        written = " ".join(str(part).upper() for part in (method, side, kind) if part) or "JOIN"
        candidate.kind = written
        candidate.reason = f"a {written} join is not an inner or outer equi-join"
        return
    candidate.kind = side_name or "INNER"
    for table in (left_table, right_table):
        alias = table.args.get("alias")
        if (alias is not None and alias.columns) or table.args.get("pivots") or table.args.get("joins"):
            candidate.reason = "a table renames its columns or is pivoted"
            return
    select = candidate.select
    assert select is not None
    tables = scope_tables(select, schemas)
    left_q, right_q = candidate.left.qualifier.lower(), candidate.right.qualifier.lower()
    using = join.args.get("using") or []
    on = join.args.get("on")
    if using:
        for identifier in using:
            column = identifier.name.lower()
            if _field(tables[left_q], column) is None or _field(tables[right_q], column) is None:
                candidate.reason = f"USING ({identifier.name}) names a column one side lacks"
                return
            candidate.keys.append((_field_name(tables[left_q], column), _field_name(tables[right_q], column)))
        candidate.on_sql = "USING (" + ", ".join(i.sql(dialect="duckdb") for i in using) + ")"
    elif on is not None:
        for conjunct in on.flatten() if isinstance(on, exp.And) else [on]:
            if not (isinstance(conjunct, exp.EQ) and isinstance(conjunct.this, exp.Column)):
                continue
            if not isinstance(conjunct.expression, exp.Column):
                continue
            first, second = column_key(conjunct.this, tables), column_key(conjunct.expression, tables)
            if first is None or second is None:
                continue
            if first[0] == right_q and second[0] == left_q:
                first, second = second, first
            if first[0] == left_q and second[0] == right_q:
                candidate.keys.append(
                    (_field_name(tables[left_q], first[1]), _field_name(tables[right_q], second[1]))
                )
        candidate.on_sql = "ON " + _qualified_sql(on, tables)
    if not candidate.keys:
        candidate.reason = (
            "the join condition holds no equality between a column of each side (non-equi join)"
        )
        return
    candidate.schemas = {left_q: tables[left_q], right_q: tables[right_q]}
    reason = _qualify_scope(candidate, select, tables, bool(using))
    if reason is not None:
        candidate.reason = reason


def _qualified_sql(condition: exp.Expr, tables: Mapping[str, pa.Schema]) -> str:
    """The ON condition with unqualified columns of one side qualified (the small joins repeat it)."""
    copy = condition.copy()
    for column in list(copy.find_all(exp.Column)):
        if len(column.parts) == 1:
            key = column_key(column, tables)
            if key is not None:
                column.replace(exp.column(column.name, table=key[0], quoted=True))
    return copy.sql(dialect="duckdb")


def _qualify_scope(
    candidate: JoinCandidate, select: exp.Select, tables: Mapping[str, pa.Schema], using: bool
) -> str | None:
    """Plan the qualification of every unqualified column of the joining SELECT (the rewrite replaces the
    two tables by one view of their columns); the reason it cannot, or None."""
    left_q, right_q = candidate.left.qualifier.lower(), candidate.right.qualifier.lower()
    for qualifier in (left_q, right_q):
        if _field(tables[qualifier], qualifier) is not None:
            return f"a column of {qualifier!r} has the table's own name"
    aliases = {e.alias.lower() for e in select.expressions if isinstance(e, exp.Alias)}
    keys = {a.lower() for a, b in candidate.keys if a.lower() == b.lower()} if using else set()
    for node in select.walk():
        if node is select:
            continue
        if isinstance(node, exp.Select | exp.Subquery | exp.Lambda | exp.Union):
            return "the joining SELECT holds a subquery or lambda"
        if isinstance(node, exp.Star) and not isinstance(node.parent, exp.Count | exp.Column):
            if using or node.args.get("except_") or node.args.get("replace") or node.args.get("rename"):
                return "SELECT * over a USING join (or with EXCLUDE / REPLACE)"
            continue
        if isinstance(node, exp.Columns):
            return "COLUMNS(...) in the joining SELECT"
        if not isinstance(node, exp.Column):
            continue
        parts = node.parts
        if len(parts) > 2:
            return f"column {node.sql(dialect='duckdb')} is qualified with a schema"
        if isinstance(node.this, exp.Star):
            star = node.this
            if node.parent is not select or any(star.args.get(k) for k in ("except_", "replace", "rename")):
                return "a qualified * with EXCLUDE / REPLACE, or inside an expression"
            continue
        if len(parts) == 2:
            continue
        name = node.name.lower()
        owners = [q for q in (left_q, right_q) if _field(tables[q], name) is not None]
        if name in (left_q, right_q):
            return f"the unqualified name {node.name!r} is also a table's name"
        if name in aliases and owners:
            return f"{node.name!r} is both a column and a select alias"
        if not owners:
            continue
        if len(owners) == 1:
            candidate.qualified[id(node)] = exp.column(node.name, table=owners[0], quoted=True)
        elif name in keys:
            left = exp.column(node.name, table=left_q, quoted=True)
            right = exp.column(node.name, table=right_q, quoted=True)
            candidate.qualified[id(node)] = {
                "INNER": left,
                "LEFT": left,
                "RIGHT": right,
                "FULL": exp.func("coalesce", left, right),
            }[candidate.kind]
        else:
            return f"the unqualified column {node.name!r} is in both datasets"
    return None


def _field(schema: pa.Schema, name: str) -> pa.Field | None:
    matches = [f for f in schema if f.name.lower() == name.lower()]
    return matches[0] if len(matches) == 1 else None


def _field_name(schema: pa.Schema, name: str) -> str:
    found = _field(schema, name)
    assert found is not None
    return found.name


# --- compatibility -------------------------------------------------------------------------------------


GroupOf = Callable[[Any], Any]


def partition_groups(
    left_field: BoundField, right_field: BoundField, left_type: pa.DataType, right_type: pa.DataType
) -> tuple[GroupOf, GroupOf] | str:
    """How to map each side's partition value of the key to a join group, or why the layouts are
    incompatible."""
    from airflow_partitions.transforms.bucket import BucketTransform
    from airflow_partitions.transforms.temporal import DateTruncTransform

    left, right = left_field.transform, right_field.transform
    shown = f"{left.canonical} vs {right.canonical}"
    if pa.types.is_floating(left_type) or pa.types.is_floating(right_type):
        return f"{shown}: float keys (NaN and -0.0 compare equal across partitions)"
    if not same_key_type(left_type, right_type):
        return f"{shown}: the key columns have different types ({left_type} vs {right_type})"
    if isinstance(left, BucketTransform) and isinstance(right, BucketTransform):
        if not (pa.types.is_integer(left_type) or left_type == right_type):
            return f"{shown}: the key columns hash differently"
        coarse = min(left.num_buckets, right.num_buckets)
        fine = max(left.num_buckets, right.num_buckets)
        if fine % coarse:
            return f"{shown}: bucket {left.num_buckets} vs {right.num_buckets}, neither divides the other"
        return _bucket_group(coarse), _bucket_group(coarse)
    if isinstance(left, DateTruncTransform) and isinstance(right, DateTruncTransform):
        if left.unit == right.unit:
            return _same, _same
        if right.unit in _COARSER_UNITS[left.unit]:
            return _trunc_group(right), _same
        if left.unit in _COARSER_UNITS[right.unit]:
            return _same, _trunc_group(left)
        return f"{shown}: {left.unit} and {right.unit} periods do not nest"
    if type(left) is not type(right) or left.canonical.replace(
        left.column_sql, "\0"
    ) != right.canonical.replace(right.column_sql, "\0"):
        return f"{shown}: different transforms"
    if left_type != right_type:
        return f"{shown}: the key columns have different types ({left_type} vs {right_type})"
    return _same, _same


def _same(value: Any) -> Any:
    return value


def _bucket_group(coarse: int) -> GroupOf:
    return lambda value: None if value is None else int(value) % coarse


def _trunc_group(coarse: Any) -> GroupOf:
    return lambda value: None if value is None else coarse.apply_scalar(value)


def decide_join(candidate: JoinCandidate, left_plan: PrunePlan, right_plan: PrunePlan) -> JoinDecision:
    """Whether `candidate` runs partition-wise over the two pruned plans, and its pair groups."""
    decision = JoinDecision(
        candidate.left, candidate.right, candidate.kind, candidate.keys, False, "", candidate=candidate
    )
    if candidate.reason is not None:
        decision.reason = candidate.reason
        return decision
    reasons = []
    for left_column, right_column in candidate.keys:
        left_fields = [f for f in left_plan.index.fields if f.columns == (left_column,)]
        right_fields = [f for f in right_plan.index.fields if f.columns == (right_column,)]
        if not left_fields or not right_fields:
            missing = [
                f"{side.dataset} is not partitioned on {column}"
                for side, column, fields in (
                    (candidate.left, left_column, left_fields),
                    (candidate.right, right_column, right_fields),
                )
                if not fields
            ]
            reasons.append("; ".join(missing))
            continue
        left_type = left_plan.index.schema.field(left_column).type
        right_type = right_plan.index.schema.field(right_column).type
        for left_field, right_field in itertools.product(left_fields, right_fields):
            mapping = partition_groups(left_field, right_field, left_type, right_type)
            if isinstance(mapping, str):
                reasons.append(mapping)
                continue
            try:
                decision.pairs = _pair_groups(
                    candidate.kind, left_plan, right_plan, left_field, right_field, mapping
                )
            except (AirflowPartitionsError, TypeError, ValueError, OverflowError) as err:
                # A partition value the coarse transform cannot take: the plain join stays exact.
                reasons.append(f"cannot group the partition values ({err})")
                continue
            decision.split = True
            decision.reason = (
                f"{left_field.transform.canonical} vs {right_field.transform.canonical} are compatible"
            )
            return decision
    decision.reason = "; ".join(dict.fromkeys(reasons)) or "no partition field on the join keys"
    return decision


def _pair_groups(
    kind: str,
    left_plan: PrunePlan,
    right_plan: PrunePlan,
    left_field: BoundField,
    right_field: BoundField,
    mapping: tuple[GroupOf, GroupOf],
) -> list[PairGroup]:
    groups: dict[Any, tuple[list[Any], list[Any]]] = {}
    for side, plan, field_, group_of in (
        (0, left_plan, left_field, mapping[0]),
        (1, right_plan, right_field, mapping[1]),
    ):
        for selected in plan.selected:
            value = plan.index.key_values(selected.position)[field_.position]
            group = _group_key(group_of(value))
            groups.setdefault(group, ([], []))[side].append(selected)
    needed = []
    for group, (lefts, rights) in groups.items():
        if group == NULL_GROUP:
            # A NULL key never satisfies the equality: only an outer join's preserved side keeps its
            # NULL-key rows, each emitted once, NULL-extended.
            lefts = lefts if kind in ("LEFT", "FULL") else []
            rights = rights if kind in ("RIGHT", "FULL") else []
        # An inner join emits nothing for a group one side lacks; a left join needs the left side, ...
        keep = {
            "INNER": lefts and rights,
            "LEFT": lefts,
            "RIGHT": rights,
            "FULL": lefts or rights,
        }[kind]
        if keep:
            needed.append((group, lefts, rights))
    needed.sort(key=lambda item: (-sum(p.rows for p in item[1] + item[2]), item[0]))
    batches: list[list[Any]] = [[] for _ in range(min(len(needed), MAX_JOIN_BRANCHES))]
    sizes = [0] * len(batches)
    for item in needed:  # largest first onto the lightest batch
        target = sizes.index(min(sizes))
        batches[target].append(item)
        sizes[target] += sum(p.rows for p in item[1] + item[2])
    pairs = []
    for batch in batches:
        batch.sort(key=lambda item: item[0])
        lefts = [p for _, ls, _ in batch for p in ls]
        rights = [p for _, _, rs in batch for p in rs]
        pairs.append(
            PairGroup(
                tuple(str(group) for group, _, _ in batch),
                tuple(p.key_path for p in lefts),
                tuple(p.key_path for p in rights),
                tuple(f for p in lefts for f in p.files),
                tuple(f for p in rights for f in p.files),
            )
        )
    pairs.sort(key=lambda pair: pair.groups)
    return pairs


def _group_key(value: Any) -> str:
    """A group's printable identity (NULL is a group of its own; strings quoted, times in ISO form)."""
    if value is None:
        return NULL_GROUP
    if isinstance(value, str):
        return repr(value)
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


# --- rewriting ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JoinSplit:
    """A split join ready to run: the name of the view of its union, and each pair group's SQL."""

    decision: JoinDecision
    view: str

    def branch_sql(self, left_relation: str, right_relation: str) -> str:
        """One small join over the two relations, its rows the columns the statement reads."""
        candidate = self.decision.candidate
        assert candidate is not None
        items = [
            f"{_quote(q)}.{_quote(column)} AS {_quote(name)}" for (q, column), name in candidate.flat.items()
        ]
        if not items:
            items = [f"NULL::INTEGER AS {_quote(self.view + '_row')}"]  # count(*) reads no column
        left, right = _quote(candidate.left.qualifier), _quote(candidate.right.qualifier)
        return (
            f"SELECT {', '.join(items)} FROM {left_relation} AS {left} "
            f"{candidate.kind} JOIN {right_relation} AS {right} {candidate.on_sql}"
        )


def rewrite_splits(tree: exp.Expr, splits: Sequence[JoinSplit], name_of: Callable[[str], str]) -> str:
    """`tree` (modified) with each split join replaced by its view and the joining SELECT's unqualified
    columns qualified; the DuckDB SQL. `name_of(expression SQL)`: the name DuckDB gives an unaliased
    select item, which the rewritten item keeps (`sum(amount)`, not `sum(o.amount)`)."""
    for split in splits:
        candidate = split.decision.candidate
        assert candidate is not None
        assert candidate.select is not None
        select = candidate.select
        renamed: dict[int, str] = {}  # by position in the select list
        for position, item in enumerate(select.expressions):
            if isinstance(item, exp.Alias | exp.Star):
                continue
            if isinstance(item, exp.Column):
                if isinstance(candidate.qualified.get(id(item)), exp.Func):  # a USING key of a FULL join
                    renamed[position] = item.name
                continue
            if item.find(exp.Column) is not None:  # its columns become the view's: keep DuckDB's name
                renamed[position] = name_of(item.sql(dialect="duckdb"))
        for node in list(select.walk()):
            replacement = candidate.qualified.get(id(node))
            if replacement is not None:
                node.replace(replacement.copy())
        if renamed:
            select.set(
                "expressions",
                [
                    exp.alias_(item, renamed[position], quoted=True, copy=False)
                    if position in renamed
                    else item
                    for position, item in enumerate(select.expressions)
                ],
            )
        star_items = [e for e in select.expressions if isinstance(e, exp.Star)]  # `*` of an ON join
        if star_items:
            expanded: list[exp.Expr] = []
            for item in select.expressions:
                if isinstance(item, exp.Star):
                    expanded.extend(
                        exp.Column(this=exp.Star(), table=exp.to_identifier(q, quoted=True))
                        for q in (candidate.left.qualifier, candidate.right.qualifier)
                    )
                else:
                    expanded.append(item)
            select.set("expressions", expanded)
        select.set("from_", exp.From(this=exp.to_table(split.view)))
        select.set("joins", None)
        _flatten_columns(candidate, select, split.view)
    return tree.sql(dialect="duckdb")


def _flatten_columns(candidate: JoinCandidate, select: exp.Select, view: str) -> None:
    """Replace each `side.column` of the rewritten SELECT by the view's column for it (one per column
    read, named `<view>_<n>`); a select item keeps its name, and `side.*` becomes every column of the
    side under its own name (`candidate.flat` records the view's columns)."""
    sides = {side.qualifier.lower(): side.qualifier for side in (candidate.left, candidate.right)}
    top = {id(item) for item in select.expressions}

    def view_column(qualifier: str, name: str) -> exp.Column:
        key = (sides[qualifier], name)
        if key not in candidate.flat:
            candidate.flat[key] = f"{view}_{len(candidate.flat)}"
        return exp.column(candidate.flat[key], quoted=True)

    expanded: list[exp.Expr] = []
    for item in list(select.expressions):
        if isinstance(item, exp.Column) and isinstance(item.this, exp.Star) and len(item.parts) == 2:
            qualifier = item.parts[0].name.lower()
            if qualifier in sides:
                for schema_field in candidate.schemas[qualifier]:
                    column = view_column(qualifier, schema_field.name)
                    expanded.append(exp.alias_(column, schema_field.name, quoted=True, copy=False))
                continue
        expanded.append(item)
    select.set("expressions", expanded)
    for column in list(select.find_all(exp.Column)):
        parts = column.parts
        if len(parts) != 2 or parts[0].name.lower() not in sides or isinstance(column.this, exp.Star):
            continue
        qualifier = parts[0].name.lower()
        found = _field(candidate.schemas[qualifier], column.name)
        if found is None:
            continue  # DuckDB says the column does not exist
        replacement: exp.Expr = view_column(qualifier, found.name)
        if id(column) in top:
            replacement = exp.alias_(replacement, column.name, quoted=True, copy=False)
        column.replace(replacement)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# How a one-row result of `count` / `sum` / `min` / `max` over pair groups combines into the whole's.
STREAMED_AGGREGATES: dict[type[exp.Expr], str] = {
    exp.Count: "count",
    exp.Sum: "sum",
    exp.Min: "min",
    exp.Max: "max",
}


def streamed_shape(tree: exp.Expr, split: JoinSplit) -> list[str] | None:
    """How the statement's results over the split join's pair groups, run one group at a time, combine
    into exactly its result over the whole join; None when they do not.

    `[]`: the statement is a plain projection / filter of the join (its rows are the groups' rows, in no
    promised order); else one of `STREAMED_AGGREGATES`' kinds per select item: the statement is a single
    row of `count` / `sum` / `min` / `max` (no DISTINCT, FILTER, nested aggregate or arithmetic around
    one). Anything else (GROUP BY, HAVING, DISTINCT, ORDER BY, LIMIT, windows, CTEs, set operations,
    subqueries, other aggregates) needs the whole join at once.
    """
    candidate = split.decision.candidate
    if candidate is None or tree is not candidate.select or not isinstance(tree, exp.Select):
        return None
    for clause in ("with_", "group", "having", "order", "limit", "offset", "distinct", "qualify", "windows"):
        if tree.args.get(clause):
            return None
    if tree.find(exp.Window, exp.Subquery, exp.Lambda, exp.Distinct) is not None:
        return None
    if any(node is not tree for node in tree.find_all(exp.Select)):
        return None
    kinds: list[str] = []
    plain = True
    for item in tree.expressions:
        node = item.this if isinstance(item, exp.Alias) else item
        if node.find(exp.AggFunc) is None:
            if kinds:
                return None
            continue
        plain = False
        kind = STREAMED_AGGREGATES.get(type(node))
        inner = [n for n in node.find_all(exp.AggFunc) if n is not node]
        if kind is None or inner or node.find(exp.Filter) is not None:
            return None
        kinds.append(kind)
    if not plain and len(kinds) != len(tree.expressions):
        return None
    return kinds
