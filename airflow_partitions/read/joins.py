"""The join planner of multi-dataset queries: which equi-joins of two datasets run partition-wise.

A join `a JOIN b ON a.k = b.k` of two datasets partitioned on the join key by compatible transforms can
run as many small joins, one per group of matching partitions, whose results are then unioned: a row of
`a` can only match rows of `b` whose key falls in the same group. Compatible (`partition_groups`):

* the same transform over columns of the same type (identity vs identity, bucket(N) vs bucket(N),
  truncate(W) vs truncate(W), ...): a group is one partition value;
* `bucket(N1)` and `bucket(N2)` where one divides the other: coarse bucket `b` holds the fine buckets
  `b + k * N_coarse`, since `(h mod N_fine) mod N_coarse = h mod N_coarse`;
* `date_trunc` units nested in each other (day under month, hour under day, month under year, ...): a
  group is one coarse period;
* `truncate(W1)` and `truncate(W2)` of integers or decimals (same type) where one width divides the
  other: coarse range `[c, c + W_coarse)` holds the fine ranges starting at `c, c + W_fine, ...`, since
  the floors nest (`floor(floor(x / f) * f / (k f)) = floor(x / (k f))`, negatives included); of strings
  or binary, any two lengths: the shorter prefix of the longer prefix is the shorter prefix. A group is
  one coarse value, the fine side's partition value truncated by the coarse transform.

Only shapes where the split is exactly the plain join are split (`find_joins`): a SELECT whose FROM is
one dataset joined to one other dataset, inner / left / right / full, with an `ON` conjunction holding an
equality of the two key columns (any other conjuncts stay inside each small join) or `USING`. NULL never
satisfies the equality, so the NULL partitions form a group of their own, where an outer join emits
their rows once, NULL-extended. An inner join also leaves out a group whose sides' key ranges (their
files' min / max) have no common value (`_key_ranges_meet`): no row of it can satisfy the equality.

Three or more datasets (`FROM a JOIN b ON ... JOIN c ON ...`, every join inner) are split when the
equalities of the join conditions put one column of every dataset in one class (`a.k = b.k`,
`c.k = b.k`: inner joins make equality transitive) and each dataset is partitioned on its column of the
class by layouts compatible with the coarsest of them (`_chain_groups`): a group is one value of the
coarsest layout, and every dataset's partitions of that group join together in one small join. A row
of the result has the same key in every dataset, hence one group; a NULL key matches nothing.

Anything else (another shape, incompatible layouts, float keys, keys of different types, a column the
rewrite could not qualify) runs as one plain join, and the plan says why.

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
from airflow_partitions.spec.renames import ColumnRenames
from airflow_partitions.transforms.bucket import BucketTransform
from airflow_partitions.transforms.temporal import DateTruncTransform
from airflow_partitions.transforms.truncate import TruncateTransform

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


SideColumn = tuple[int, str]  # (position of the side in the FROM clause, column name as the schema has it)


@dataclass
class JoinCandidate:
    """A join of datasets found in the statement (two, or more joined in a chain), and whether its shape
    can be split."""

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
    # The datasets after the second (`FROM a JOIN b JOIN c ...`) and their joins' conditions.
    more: list[JoinSide] = field(default_factory=list)
    more_on: list[str] = field(default_factory=list)
    # Every column equality of the join conditions, between two sides (lower position first).
    equalities: list[tuple[SideColumn, SideColumn]] = field(default_factory=list)
    # Whether a join condition holds more than those equalities (another conjunct, or an equality
    # that is not between two sides' columns).
    residual: bool = False

    @property
    def sides(self) -> list[JoinSide]:
        return [self.left, self.right, *self.more]


@dataclass(frozen=True)
class PairGroup:
    """One small join: the partitions of each side whose keys fall in the group(s) `groups`."""

    groups: tuple[str, ...]
    left_partitions: tuple[str, ...]
    right_partitions: tuple[str, ...]
    left_files: tuple[DataFile, ...] = ()
    right_files: tuple[DataFile, ...] = ()
    # The sides after the second, in order (joins of three or more datasets).
    more_partitions: tuple[tuple[str, ...], ...] = ()
    more_files: tuple[tuple[DataFile, ...], ...] = ()

    @property
    def partitions(self) -> tuple[tuple[str, ...], ...]:
        """Each side's partitions, in the order of the FROM clause."""
        return (self.left_partitions, self.right_partitions, *self.more_partitions)

    @property
    def files(self) -> tuple[tuple[DataFile, ...], ...]:
        return (self.left_files, self.right_files, *self.more_files)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "groups": list(self.groups),
            "left_partitions": list(self.left_partitions),
            "right_partitions": list(self.right_partitions),
        }
        if self.more_partitions:
            out["partitions"] = [list(side) for side in self.partitions]
        return out


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
    # The key column of each side the split groups by, as (side position, column); empty when not split.
    split_columns: list[SideColumn] = field(default_factory=list)

    @property
    def sides(self) -> list[JoinSide]:
        return self.candidate.sides if self.candidate is not None else [self.left, self.right]

    def describe(self) -> str:
        sides = self.sides
        if len(sides) > 2 and self.candidate is not None:
            on = " AND ".join(
                f"{sides[i].qualifier}.{a} = {sides[j].qualifier}.{b}"
                for (i, a), (j, b) in self.candidate.equalities
            )
        else:
            on = " AND ".join(f"{self.left.qualifier}.{a} = {self.right.qualifier}.{b}" for a, b in self.keys)
        head = f"{self.kind} JOIN " + ", ".join(f"{side.dataset} AS {side.qualifier}" for side in sides)
        head += f" ON {on}" if on else ""
        verdict = f"split into {len(self.pairs)} pair group(s)" if self.split else "not split"
        return f"{head}: {verdict}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {
            "left": {"dataset": self.left.dataset, "as": self.left.qualifier},
            "right": {"dataset": self.right.dataset, "as": self.right.qualifier},
            **(
                {"more": [{"dataset": s.dataset, "as": s.qualifier} for s in self.sides[2:]]}
                if len(self.sides) > 2
                else {}
            ),
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
        sides = [JoinSide(names[t.name.lower()], t.alias or t.name) for t in datasets]
        candidate = JoinCandidate(sides[0], sides[1], "JOIN", [], None, select, more=sides[2:])
        candidates.append(candidate)
        if len(datasets) != len(tables) or any(t is not d for t, d in zip(tables, datasets, strict=True)):
            candidate.reason = "only a SELECT joining datasets alone (FROM a JOIN b [JOIN c ...]) is split"
            continue
        if shadowed & {t.name.lower() for t in datasets}:
            candidate.reason = "a CTE of the query has a dataset's name"
            continue
        written = [side.qualifier for side in sides]
        repeated = [q for q in written if qualifiers.get(q.lower(), 0) > 1]
        if repeated or len({q.lower() for q in written}) != len(written):
            candidate.reason = f"the name {repeated[0] if repeated else written[0]!r} names two tables"
            continue
        _check_join_shape(candidate, joins, datasets, schemas)
    return candidates


def _check_join_shape(
    candidate: JoinCandidate,
    joins: Sequence[exp.Join],
    datasets: Sequence[exp.Table],
    schemas: Mapping[str, pa.Schema],
) -> None:
    kinds = []
    for join in joins:
        side = join.args.get("side")
        kind = join.args.get("kind")
        method = join.args.get("method")
        side_name = _SIDES.get(str(side).upper() if side else None, "?")
        kind_name = str(kind).upper() if kind else None
        if (
            method
            or side_name == "?"
            or (kind_name not in _KINDS)
            or (kind_name == "OUTER" and not side_name)
        ):
            written = " ".join(str(part).upper() for part in (method, side, kind) if part) or "JOIN"
            candidate.kind = written
            candidate.reason = f"a {written} join is not an inner or outer equi-join"
            return
        kinds.append(side_name or "INNER")
    candidate.kind = kinds[0]
    if len(kinds) > 1 and any(kind != "INNER" for kind in kinds):
        candidate.kind = " / ".join(kinds)
        candidate.reason = "a join of three or more datasets is split only when every join is inner"
        return
    for table in datasets:
        alias = table.args.get("alias")
        if (alias is not None and alias.columns) or table.args.get("pivots") or table.args.get("joins"):
            candidate.reason = "a table renames its columns or is pivoted"
            return
    select = candidate.select
    assert select is not None
    tables = scope_tables(select, schemas)
    qualifiers = [side.qualifier.lower() for side in candidate.sides]
    position_of = {q: i for i, q in enumerate(qualifiers)}
    conditions: list[str] = []
    using_columns: list[set[str]] = []
    for position, join in enumerate(joins, start=1):
        using = join.args.get("using") or []
        on = join.args.get("on")
        if using:
            named = set()
            for identifier in using:
                column = identifier.name.lower()
                earlier = [i for i in range(position) if _field(tables[qualifiers[i]], column) is not None]
                if _field(tables[qualifiers[position]], column) is None or not earlier:
                    candidate.reason = f"USING ({identifier.name}) names a column one side lacks"
                    return
                named.add(column)
                candidate.equalities.append(
                    (
                        (earlier[0], _field_name(tables[qualifiers[earlier[0]]], column)),
                        (position, _field_name(tables[qualifiers[position]], column)),
                    )
                )
            using_columns.append(named)
            conditions.append("USING (" + ", ".join(i.sql(dialect="duckdb") for i in using) + ")")
        elif on is not None:
            using_columns.append(set())
            conjuncts = list(on.flatten()) if isinstance(on, exp.And) else [on]
            found = len(candidate.equalities)
            for conjunct in conjuncts:
                if not (isinstance(conjunct, exp.EQ) and isinstance(conjunct.this, exp.Column)):
                    continue
                if not isinstance(conjunct.expression, exp.Column):
                    continue
                first, second = column_key(conjunct.this, tables), column_key(conjunct.expression, tables)
                if first is None or second is None:
                    continue
                a, b = position_of.get(first[0]), position_of.get(second[0])
                if a is None or b is None or a == b or max(a, b) > position:
                    continue
                one = (a, _field_name(tables[first[0]], first[1]))
                two = (b, _field_name(tables[second[0]], second[1]))
                candidate.equalities.append((one, two) if a < b else (two, one))
            if len(candidate.equalities) - found != len(conjuncts):
                candidate.residual = True
            conditions.append("ON " + _qualified_sql(on, tables))
        else:
            using_columns.append(set())
            conditions.append("")
    candidate.on_sql, candidate.more_on = conditions[0], conditions[1:]
    candidate.keys = [(a, b) for (i, a), (j, b) in candidate.equalities if (i, j) == (0, 1)]
    if not candidate.equalities or not all(conditions):
        candidate.reason = (
            "the join condition holds no equality between a column of each side (non-equi join)"
        )
        return
    candidate.schemas = {q: tables[q] for q in qualifiers}
    reason = _qualify_scope(candidate, select, tables, using_columns)
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
    candidate: JoinCandidate,
    select: exp.Select,
    tables: Mapping[str, pa.Schema],
    using_columns: Sequence[set[str]],
) -> str | None:
    """Plan the qualification of every unqualified column of the joining SELECT (the rewrite replaces the
    joined tables by one view of their columns); the reason it cannot, or None."""
    qualifiers = [side.qualifier.lower() for side in candidate.sides]
    left_q, right_q = qualifiers[0], qualifiers[1]
    for qualifier in qualifiers:
        if _field(tables[qualifier], qualifier) is not None:
            return f"a column of {qualifier!r} has the table's own name"
    aliases = {e.alias.lower() for e in select.expressions if isinstance(e, exp.Alias)}
    using = any(using_columns)
    # A column named in the USING of every join: unqualified, it is the first side's (all joins inner
    # when there are several, so every side's value is the same).
    keys = set.intersection(*using_columns) if using_columns else set()
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
        owners = [q for q in qualifiers if _field(tables[q], name) is not None]
        if name in qualifiers:
            return f"the unqualified name {node.name!r} is also a table's name"
        if name in aliases and owners:
            return f"{node.name!r} is both a column and a select alias"
        if not owners:
            continue
        if len(owners) == 1 or (name in keys and len(qualifiers) > 2):
            candidate.qualified[id(node)] = exp.column(node.name, table=owners[0], quoted=True)
        elif name in keys and set(owners) == {left_q, right_q}:
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
    if (
        isinstance(left, TruncateTransform)
        and isinstance(right, TruncateTransform)
        and left.width != right.width
    ):
        return _truncate_groups(left, right, left_type, right_type, shown)
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


def _truncate_groups(
    left: Any, right: Any, left_type: pa.DataType, right_type: pa.DataType, shown: str
) -> tuple[GroupOf, GroupOf] | str:
    """Groups of `truncate(W1)` vs `truncate(W2)` (W1 != W2): the coarse side's values, and the fine
    side's truncated by the coarse transform; or why they do not nest."""
    numeric = pa.types.is_integer(left_type) or pa.types.is_decimal(left_type)
    if numeric:
        if pa.types.is_decimal(left_type) and left_type != right_type:
            return f"{shown}: decimals of different scales ({left_type} vs {right_type})"
        coarse_is_left = left.width > right.width
        wide, narrow = max(left.width, right.width), min(left.width, right.width)
        if wide % narrow:
            return f"{shown}: truncate {left.width} vs {right.width}, neither width divides the other"
    else:
        # Strings and binary: the shorter prefix is the coarser partition.
        coarse_is_left = left.width < right.width
    if coarse_is_left:
        return _same, _trunc_group(left)
    return _trunc_group(right), _same


def _same(value: Any) -> Any:
    return value


def _bucket_group(coarse: int) -> GroupOf:
    return lambda value: None if value is None else int(value) % coarse


def _trunc_group(coarse: Any) -> GroupOf:
    return lambda value: None if value is None else coarse.apply_scalar(value)


def decide_join(
    candidate: JoinCandidate,
    *plans: PrunePlan,
    renames: Sequence[ColumnRenames] | None = None,
) -> JoinDecision:
    """Whether `candidate` runs partition-wise over the pruned plans of its sides (in the order of the
    FROM clause), and its pair groups. `renames` (one per side): a dataset's `renamed_columns`, whose
    plan speaks stored names where the statement speaks current ones."""
    sides_renames = list(renames) if renames is not None else [ColumnRenames() for _ in plans]
    decision = JoinDecision(
        candidate.left, candidate.right, candidate.kind, candidate.keys, False, "", candidate=candidate
    )
    if candidate.reason is not None:
        decision.reason = candidate.reason
        return decision
    if len(plans) > 2:
        return _decide_chain(decision, candidate, plans, sides_renames)
    left_plan, right_plan = plans
    left_names, right_names = sides_renames
    reasons = []
    for left_column, right_column in candidate.keys:
        left_stored, right_stored = left_names.stored(left_column), right_names.stored(right_column)
        left_fields = [f for f in left_plan.index.fields if f.columns == (left_stored,)]
        right_fields = [f for f in right_plan.index.fields if f.columns == (right_stored,)]
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
        left_type = left_plan.index.schema.field(left_stored).type
        right_type = right_plan.index.schema.field(right_stored).type
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
            decision.split_columns = [(0, left_column), (1, right_column)]
            decision.reason = (
                f"{left_field.transform.canonical} vs {right_field.transform.canonical} are compatible"
            )
            return decision
    decision.reason = "; ".join(dict.fromkeys(reasons)) or "no partition field on the join keys"
    return decision


def _decide_chain(
    decision: JoinDecision,
    candidate: JoinCandidate,
    plans: Sequence[PrunePlan],
    renames: Sequence[ColumnRenames],
) -> JoinDecision:
    """`decide_join` of three or more datasets joined inner: split when one class of equal columns holds
    a column of every side, each side partitioned on it compatibly with the coarsest side's layout."""
    sides = candidate.sides
    parent: dict[SideColumn, SideColumn] = {}

    def root(item: SideColumn) -> SideColumn:
        while parent.setdefault(item, item) != item:
            item = parent[item]
        return item

    for one, two in candidate.equalities:
        parent[root(one)] = root(two)
    classes: dict[SideColumn, list[SideColumn]] = {}
    for item in list(parent):
        classes.setdefault(root(item), []).append(item)
    reasons: list[str] = []
    for members in sorted(classes.values(), key=lambda m: sorted(m)):
        columns: dict[int, list[str]] = {}
        for position, column in sorted(members):
            columns.setdefault(position, []).append(column)
        shown = " = ".join(f"{sides[i].qualifier}.{c}" for i, c in sorted(members))
        missing = [sides[i].dataset for i in range(len(sides)) if i not in columns]
        if missing:
            reasons.append(f"the equal keys {shown} do not reach {', '.join(missing)}")
            continue
        options: list[list[tuple[BoundField, pa.DataType]]] = []
        for position, plan in enumerate(plans):
            stored = {renames[position].stored(column) for column in columns[position]}
            found = [
                (f, plan.index.schema.field(f.column).type)
                for f in plan.index.fields
                if len(f.columns) == 1 and f.column in stored
            ]
            if not found:
                reasons.append(
                    f"{sides[position].dataset} is not partitioned on {', '.join(columns[position])}"
                )
                break
            options.append(found)
        else:
            for combination in itertools.product(*options):
                fields = [f for f, _ in combination]
                mapping = _chain_groups(fields, [t for _, t in combination], plans)
                if isinstance(mapping, str):
                    reasons.append(mapping)
                    continue
                try:
                    decision.pairs = _chain_pair_groups(plans, fields, mapping)
                except (AirflowPartitionsError, TypeError, ValueError, OverflowError) as err:
                    reasons.append(f"cannot group the partition values ({err})")
                    continue
                decision.split = True
                # The statement's (current) name of each side's split column.
                decision.split_columns = [(i, renames[i].current(f.column)) for i, f in enumerate(fields)]
                decision.reason = " vs ".join(f.transform.canonical for f in fields) + " are compatible"
                return decision
    decision.reason = "; ".join(dict.fromkeys(reasons)) or "no partition field on the join keys"
    return decision


def _chain_groups(
    fields: Sequence[BoundField], types: Sequence[pa.DataType], plans: Sequence[PrunePlan]
) -> list[GroupOf] | str:
    """Each side's group function under the coarsest side's layout: the side whose partition values are
    their own groups against every other side (`partition_groups`), the others mapped onto them."""
    reasons: list[str] = []
    for coarse in range(len(fields)):
        values = [
            plans[coarse].index.key_values(p.position)[fields[coarse].position]
            for p in plans[coarse].selected
        ]
        groups: list[GroupOf] = []
        for other in range(len(fields)):
            if other == coarse:
                groups.append(_same)
                continue
            mapping = partition_groups(fields[coarse], fields[other], types[coarse], types[other])
            if isinstance(mapping, str):
                reasons.append(mapping)
                break
            if any(_group_key(mapping[0](v)) != _group_key(v) for v in values):
                reasons.append(
                    f"{fields[coarse].transform.canonical} is not the coarser of it and "
                    f"{fields[other].transform.canonical}"
                )
                break
            groups.append(mapping[1])
        else:
            return groups
    incompatible = [r for r in reasons if "not the coarser" not in r]
    return "; ".join(dict.fromkeys(incompatible or reasons))


def _chain_pair_groups(
    plans: Sequence[PrunePlan], fields: Sequence[BoundField], groups_of: Sequence[GroupOf]
) -> list[PairGroup]:
    """The small joins of an inner join chain: the groups every side has partitions of (NULL skipped),
    whose sides' key ranges meet (`_key_ranges_meet`)."""
    groups: dict[str, list[list[Any]]] = {}
    for side, (plan, field_, group_of) in enumerate(zip(plans, fields, groups_of, strict=True)):
        for selected in plan.selected:
            value = plan.index.key_values(selected.position)[field_.position]
            group = _group_key(group_of(value))
            if group != NULL_GROUP:
                groups.setdefault(group, [[] for _ in plans])[side].append(selected)
    columns = [field_.column for field_ in fields]
    return _batched(
        [
            (group, sides)
            for group, sides in groups.items()
            if all(sides) and _key_ranges_meet(list(zip(sides, columns, strict=True)))
        ]
    )


def _key_ranges_meet(sides: Sequence[tuple[Sequence[Any], str]]) -> bool:
    """Whether the key columns of every side's selected partitions (`(partitions, column)` per side) may
    hold one common non-NULL value, by their files' min / max: False only when the ranges provably have
    no common point, so an inner join of the group emits nothing. A row of an inner join has one key value
    in every side, inside each side's range; the ranges of a total order meet in a common point when
    the largest minimum is at most the smallest maximum. Unknown statistics, or values that do not
    compare, say they may meet."""
    lows: list[Any] = []
    highs: list[Any] = []
    for partitions, column in sides:
        side_low = side_high = None
        for file in (f for partition in partitions for f in partition.files):
            stats = file.stats.get(column)
            if stats is not None and stats.null_count == file.rows:
                continue  # only NULL keys here: they match nothing
            if stats is None or stats.min is None or stats.max is None:
                return True
            try:
                side_low = stats.min if side_low is None or stats.min < side_low else side_low
                side_high = stats.max if side_high is None or stats.max > side_high else side_high
            except TypeError:
                return True
        if side_low is None:
            return False  # no non-NULL key on this side
        lows.append(side_low)
        highs.append(side_high)
    try:
        return bool(max(lows) <= min(highs))
    except TypeError:
        return True


def _batched(needed: list[tuple[str, list[list[Any]]]]) -> list[PairGroup]:
    """Pair groups of the needed groups (group, each side's selected partitions), at most
    `MAX_JOIN_BRANCHES`: largest groups first onto the lightest batch."""
    needed.sort(key=lambda item: (-sum(p.rows for side in item[1] for p in side), item[0]))
    batches: list[list[Any]] = [[] for _ in range(min(len(needed), MAX_JOIN_BRANCHES))]
    sizes = [0] * len(batches)
    for item in needed:
        target = sizes.index(min(sizes))
        batches[target].append(item)
        sizes[target] += sum(p.rows for side in item[1] for p in side)
    pairs = []
    for batch in batches:
        batch.sort(key=lambda item: item[0])
        count = len(batch[0][1])
        sides = [[p for _, lists in batch for p in lists[side]] for side in range(count)]
        pairs.append(
            PairGroup(
                tuple(str(group) for group, _ in batch),
                tuple(p.key_path for p in sides[0]),
                tuple(p.key_path for p in sides[1]),
                tuple(f for p in sides[0] for f in p.files),
                tuple(f for p in sides[1] for f in p.files),
                tuple(tuple(p.key_path for p in side) for side in sides[2:]),
                tuple(tuple(f for p in side for f in p.files) for side in sides[2:]),
            )
        )
    pairs.sort(key=lambda pair: pair.groups)
    return pairs


def _pair_groups(
    kind: str,
    left_plan: PrunePlan,
    right_plan: PrunePlan,
    left_field: BoundField,
    right_field: BoundField,
    mapping: tuple[GroupOf, GroupOf],
) -> list[PairGroup]:
    groups: dict[Any, tuple[list[Any], list[Any]]] = {}
    columns = (left_field.column, right_field.column)
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
        # An inner join emits nothing for a group one side lacks, or whose sides' key ranges do not
        # meet; a left join needs the left side, ...
        keep = bool(
            {
                "INNER": lefts and rights,
                "LEFT": lefts,
                "RIGHT": rights,
                "FULL": lefts or rights,
            }[kind]
        )
        if keep and kind == "INNER":
            keep = _key_ranges_meet([(lefts, columns[0]), (rights, columns[1])])
        if keep:
            needed.append((group, [lefts, rights]))
    return _batched(needed)


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

    def branch_sql(self, *relations: str, positional: bool = False) -> str:
        """One small join over the sides' relations (in FROM order), its rows the columns the statement
        reads. `positional`: the relations hold the join's rows already matched, row by row (a merge
        join's taken rows, `read.merge_join`), joined by position instead of by the condition."""
        candidate = self.decision.candidate
        assert candidate is not None
        items = [
            f"{_quote(q)}.{_quote(column)} AS {_quote(name)}" for (q, column), name in candidate.flat.items()
        ]
        if not items:
            items = [f"NULL::INTEGER AS {_quote(self.view + '_row')}"]  # count(*) reads no column
        sides = candidate.sides
        text = f"SELECT {', '.join(items)} FROM {relations[0]} AS {_quote(sides[0].qualifier)}"
        for relation, side, condition in zip(
            relations[1:], sides[1:], [candidate.on_sql, *candidate.more_on], strict=True
        ):
            if positional:
                text += f" POSITIONAL JOIN {relation} AS {_quote(side.qualifier)}"
            else:
                text += f" {candidate.kind} JOIN {relation} AS {_quote(side.qualifier)} {condition}"
        return text


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
                        exp.Column(this=exp.Star(), table=exp.to_identifier(side.qualifier, quoted=True))
                        for side in candidate.sides
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
    sides = {side.qualifier.lower(): side.qualifier for side in candidate.sides}
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


# The shape of a statement grouped by a key the split groups by: each pair group's result rows are whole
# groups of the statement, none shared with another pair group's, so the results concatenate.
GROUPED = "groups"

# How a one-row result of `count` / `sum` / `min` / `max` over pair groups combines into the whole's.
STREAMED_AGGREGATES: dict[type[exp.Expr], str] = {
    exp.Count: "count",
    exp.Sum: "sum",
    exp.Min: "min",
    exp.Max: "max",
}


def _grouped_by_split_key(tree: exp.Select, candidate: JoinCandidate, decision: JoinDecision) -> bool:
    """Whether the plain GROUP BY of `tree` has an item that is a split key column of a side whose rows of
    one key value all lie in one pair group (see `streamed_shape`); before or after the rewrite."""
    group = tree.args["group"]
    if any(group.args.get(k) for k in ("rollup", "cube", "grouping_sets", "all", "totals")):
        return False
    eligible_sides = {
        "INNER": set(range(len(candidate.sides))),
        "LEFT": {0},
        "RIGHT": {1},
    }.get(candidate.kind, set())
    qualifiers = [side.qualifier.lower() for side in candidate.sides]
    eligible = {
        (qualifiers[position], column.lower())
        for position, column in decision.split_columns
        if position in eligible_sides
    }
    by_view = {name: (q.lower(), c.lower()) for (q, c), name in candidate.flat.items()}
    for item in group.expressions:
        if isinstance(item, exp.Literal) and item.is_int:
            position = int(item.this) - 1
            if not 0 <= position < len(tree.expressions):
                continue
            item = tree.expressions[position]
            item = item.this if isinstance(item, exp.Alias) else item
        if not candidate.flat:  # before the rewrite: its qualifications of unqualified columns apply
            item = candidate.qualified.get(id(item), item)
        if not isinstance(item, exp.Column) or isinstance(item.this, exp.Star):
            continue
        parts = item.parts
        if len(parts) == 2:
            key = (parts[0].name.lower(), item.name.lower())
        elif len(parts) == 1:
            found = by_view.get(item.name)
            if found is None:
                continue
            key = found
        else:
            continue
        if key in eligible:
            return True
    return False


def streamed_shape(tree: exp.Expr, split: JoinSplit) -> list[str] | None:
    """How the statement's results over the split join's pair groups, run one group at a time, combine
    into exactly its result over the whole join; None when they do not.

    `[]`: the statement is a plain projection / filter of the join (its rows are the groups' rows, in no
    promised order); `[GROUPED]`: it has a plain `GROUP BY` (any aggregates, `HAVING` too) one of whose
    items is a key column the split groups by, of a side whose every row with one key value lies in one
    pair group (any side of an inner join; the preserved side of a left / right join, NULL keys
    included; no side of a full join), so each statement group is computed whole within one pair group;
    else one of `STREAMED_AGGREGATES`' kinds per select item: the statement is a single row of `count` /
    `sum` / `min` / `max` (no DISTINCT, FILTER, nested aggregate or arithmetic around one). Anything else
    (another GROUP BY, HAVING without it, DISTINCT, ORDER BY, LIMIT, windows, CTEs, set operations,
    subqueries, other aggregates) needs the whole join at once.
    """
    candidate = split.decision.candidate
    if candidate is None or tree is not candidate.select or not isinstance(tree, exp.Select):
        return None
    for clause in ("with_", "order", "limit", "offset", "distinct", "qualify", "windows"):
        if tree.args.get(clause):
            return None
    if tree.find(exp.Window, exp.Subquery, exp.Lambda) is not None:
        return None
    if any(node is not tree for node in tree.find_all(exp.Select)):
        return None
    if tree.args.get("group"):
        return [GROUPED] if _grouped_by_split_key(tree, candidate, split.decision) else None
    if tree.args.get("having") or tree.find(exp.Distinct) is not None:
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
