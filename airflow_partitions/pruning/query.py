"""Read-only checks for user SQL, and the filter a query applies to one dataset table, for pruning.

`check_read_only(sql)` asks DuckDB's own parser how many statements `sql` holds and what they are: exactly
one SELECT (WITH ... SELECT, set operations, FROM-first) passes, anything else raises `UnsafeQueryError`.
So does an invisible Unicode format character outside a string literal (`refuse_format_characters`).

`dataset_filter(sql, dataset, schema)` finds every reference to the dataset table and, for each, the
conditions of its scope's WHERE (and, in a scope of inner joins, its joins' ONs) that constrain the
table's own rows: the conjuncts over its columns, bound leniently (what cannot be used is unknown, never
false), plus, in a scope of inner joins, the conjuncts on another table's column an equi-join ties to
one of its columns (`derived_conditions`). The preserved side of a LEFT / RIGHT join keeps only its
WHERE conjuncts. A reference whose scope joins it otherwise with an outer, semi, anti, as-of or lateral
join, renames its columns, or that a CTE of the same name shadows, contributes "everything". The
dataset's predicate is the OR of its references', so every row any part of the query can see stays
readable; the query itself still applies all its conditions.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import cast

import pyarrow as pa
from sqlglot import exp
from sqlglot.errors import SqlglotError

from airflow_partitions.exceptions import UnsafeQueryError
from airflow_partitions.pruning.deep import deep_stack
from airflow_partitions.pruning.expressions import AlwaysFalse, AlwaysTrue, Predicate, or_
from airflow_partitions.pruning.filters import DIALECT, FilterBinder
from airflow_partitions.pruning.sql_text import parse_one_sql, parse_sql
from airflow_partitions.transforms.duckdb_rewrite import rewrite_partition_nodes
from airflow_partitions.transforms.parser import is_multi_bucket_call, is_transform_call, may_call_transforms

_INNER_KINDS = (None, "", "INNER", "CROSS")
_CONTEXT_LINE = re.compile(r"LINE (\d+): (.*)")


def check_read_only(sql: str) -> None:
    """Raise `UnsafeQueryError` unless `sql` is exactly one SELECT statement (per DuckDB's parser)."""
    import duckdb

    if not isinstance(sql, str) or not sql.strip():
        raise UnsafeQueryError("the query is empty; pass one SELECT statement")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as err:
        raise UnsafeQueryError(
            f"the query is not valid SQL: {describe_duckdb_parse_error(err)}; pass one SELECT statement"
        ) from err
    refuse_format_characters(sql)
    if len(statements) != 1:
        raise UnsafeQueryError(
            f"the query holds {len(statements)} statements; pass exactly one read-only SELECT statement"
        )
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        name = str(kind).rsplit(".", 1)[-1]
        raise UnsafeQueryError(
            f"only read-only SELECT queries are accepted, not {name} statements; "
            "use SELECT ... FROM <dataset>"
        )


def refuse_format_characters(sql: str) -> None:
    """`UnsafeQueryError` for a Unicode format character (category Cf: U+200B ZERO WIDTH SPACE, U+FEFF,
    U+202E, soft hyphen, ...) outside a string literal.

    DuckDB's tokenizer reads some of them as white space (`\u200bevents` is `events`), sqlglot as part of
    the name: the query and its pruning would then disagree on which table is meant. Invisible, they are
    never what the author meant; inside a string literal they are data and stay.
    """
    import duckdb

    if sql.isascii():
        return
    found = [(at, char) for at, char in enumerate(sql) if unicodedata.category(char) == "Cf"]
    if not found:
        return
    data = sql.encode()
    literals = []
    try:
        tokens = duckdb.tokenize(sql)
    except duckdb.Error:
        tokens = []
    # DuckDB's token positions are byte offsets; a literal ends at its last quote before the next token.
    for number, (start, kind) in enumerate(tokens):
        if kind == duckdb.token_type.string_const:
            end = tokens[number + 1][0] if number + 1 < len(tokens) else len(data)
            text = data[start:end]
            literals.append((start, start + max(text.rfind(b"'"), text.rfind(b"$"))))
    for at, char in found:
        offset = len(sql[:at].encode())
        if any(start < offset < end for start, end in literals):
            continue
        name = unicodedata.name(char, "a format character")
        raise UnsafeQueryError(
            f"the query holds the invisible character U+{ord(char):04X} ({name}) at character {at + 1}, "
            "outside a string literal, where it would change which table or column a name means; delete it"
        )


def describe_duckdb_parse_error(err: Exception) -> str:
    """DuckDB's parser message on one line: what is wrong and where (`syntax error at or near "SELEC" at
    line 1, column 1`), without its multi-line caret picture."""
    lines = str(err).strip().splitlines()
    head = lines[0].removeprefix("Parser Error: ").strip() if lines else type(err).__name__
    for number, line in enumerate(lines):
        context = _CONTEXT_LINE.match(line)
        if context is None or number + 1 >= len(lines) or "^" not in lines[number + 1]:
            continue
        text = context.group(2)
        if text.startswith("..."):  # DuckDB cut the line: the caret no longer gives the column
            return f"{head} at line {context.group(1)}"
        column = lines[number + 1].index("^") - (len(line) - len(text)) + 1
        return f"{head} at line {context.group(1)}, column {column}"
    return head


@deep_stack
def executable_sql(sql: str, schema: pa.Schema) -> str:
    """`sql` with partition transform calls rewritten so DuckDB computes exactly our partition values.

    A query without such calls runs exactly as written.
    """
    if not may_call_transforms(sql):
        return sql  # no function a partition transform could be spelled with: skip parsing
    try:
        tree = parse_one_sql(sql)
    except (SqlglotError, ValueError):
        return sql
    if not any(is_transform_call(node) or is_multi_bucket_call(node) for node in tree.walk()):
        return sql
    return rewrite_partition_nodes(tree, {field.name: field.type for field in schema}).sql(dialect=DIALECT)


@deep_stack
def dataset_filter(
    sql: str,
    dataset: str,
    schema: pa.Schema,
    references: int | None = None,
    *,
    schemas: Mapping[str, pa.Schema] | None = None,
) -> Predicate:
    """The rows of `dataset` that `sql` can look at, as a predicate (TRUE when it cannot tell).

    `references`: how many times DuckDB, which runs the query, resolves a name of `sql` to the dataset
    (`read.query.check_sandboxed`). When this parse finds another number, the two disagree on what a
    name means, and the predicate is TRUE: every row stays readable, never an empty placeholder.

    `schemas`: every dataset the query may read (lower-cased name -> schema). In a scope of inner joins,
    a condition on one column also constrains every column an equality (`ON o.k = c.k`, `USING (k)`,
    `WHERE o.k = c.k`) ties it to, when the two have the same type: `WHERE o.k = 5` prunes `c` too.
    """
    try:
        trees = parse_sql(sql)
    except (SqlglotError, ValueError):
        return AlwaysTrue()
    statements = [tree for tree in trees if tree is not None]
    if len(statements) != 1:
        return AlwaysTrue()
    tree = statements[0]
    name = dataset.lower()
    if any(cte.alias_or_name.lower() == name for cte in tree.find_all(exp.CTE)):
        return AlwaysTrue()
    tables = [table for table in tree.find_all(exp.Table) if _is_dataset(table, name)]
    if references is not None and len(tables) != references:
        return AlwaysTrue()
    if not tables:
        return AlwaysFalse()
    known = {name: schema, **{key.lower(): value for key, value in (schemas or {}).items()}}
    return or_(*(_reference_filter(table, schema, known) for table in tables))


@deep_stack
def tables_named_in(sql: str) -> set[str]:
    """Lower-cased names of the plain tables `sql` reads (CTE names excluded); empty if unparsable."""
    try:
        tree = parse_one_sql(sql)
    except (SqlglotError, ValueError):
        return set()
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    return {
        table.name.lower()
        for table in tree.find_all(exp.Table)
        if isinstance(table.this, exp.Identifier) and table.name.lower() not in ctes
    }


def _is_dataset(table: exp.Table, name: str) -> bool:
    """Whether `table` names the dataset's view: `events`, `main.events`, `temp.events` or
    `temp.main.events` (the view is temporary: catalog `temp`, schema `main`)."""
    if not isinstance(table.this, exp.Identifier) or table.name.lower() != name:
        return False
    catalog = table.args.get("catalog")
    database = table.args.get("db")
    schema = database.name.lower() if database is not None else None
    if catalog is not None:
        return catalog.name.lower() == "temp" and schema == "main"
    return schema in (None, "main", "temp")


def _reference_filter(table: exp.Table, schema: pa.Schema, schemas: Mapping[str, pa.Schema]) -> Predicate:
    select = _scope_of(table)
    if select is None:
        return AlwaysTrue()
    alias = table.args.get("alias")
    if alias is not None and alias.columns:
        return AlwaysTrue()
    if table.args.get("pivots") or table.args.get("joins"):
        return AlwaysTrue()
    joins = select.args.get("joins") or []
    if all(_is_inner(join) for join in joins):
        conditions = scope_conditions(select)
        conditions.extend(derived_conditions(select, conditions, schemas))
    elif _is_preserved(table, select, joins):
        # Every output row holds a real row of the preserved side of an outer join: its WHERE
        # conjuncts on that side's columns still rule rows out (not the ONs, nor derived ones).
        where = select.args.get("where")
        conditions = (
            []
            if where is None
            else list(where.this.flatten() if isinstance(where.this, exp.And) else [where.this])
        )
    else:
        return AlwaysTrue()
    if not conditions:
        return AlwaysTrue()
    own_name = (table.alias or table.name).lower()
    names = {n.lower() for n in schema.names}

    def resolve(column: exp.Column) -> str | None:
        parts = column.parts
        if len(parts) == 1:
            return column.name if column.name.lower() in names else None
        if len(parts) == 2 and parts[0].name.lower() == own_name:
            return column.name
        return None

    # A condition naming another table's column (the join condition itself) says nothing of this
    # table's rows alone: it is left out, as unknown.
    own = [c for c in conditions if all(resolve(column) is not None for column in c.find_all(exp.Column))]
    if not own:
        return AlwaysTrue()
    return FilterBinder(schema, lenient=True, resolve_column=resolve).bind_node(
        cast(exp.Expression, exp.and_(*own))
    )


def scope_conditions(select: exp.Select) -> list[exp.Expr]:
    """The conjuncts every row of a scope of inner joins satisfies: its WHERE's and its joins' ONs'."""
    conditions: list[exp.Expr] = []
    where = select.args.get("where")
    if where is not None:
        conditions.extend(where.this.flatten() if isinstance(where.this, exp.And) else [where.this])
    for join in select.args.get("joins") or ():
        on = join.args.get("on")
        if on is not None:
            conditions.extend(on.flatten() if isinstance(on, exp.And) else [on])
    return conditions


def scope_tables(select: exp.Select, schemas: Mapping[str, pa.Schema]) -> dict[str, pa.Schema]:
    """The datasets a scope reads directly, by the (lower-cased) name its columns qualify them with."""
    items = [select.args.get("from_"), *(select.args.get("joins") or ())]
    tables: dict[str, pa.Schema] = {}
    for item in items:
        table = item.this if item is not None else None
        if not isinstance(table, exp.Table):
            continue
        name = table.name.lower()
        alias = table.args.get("alias")
        if name in schemas and _is_dataset(table, name) and not (alias is not None and alias.columns):
            tables[(table.alias or table.name).lower()] = schemas[name]
    return tables


ColumnKey = tuple[str, str]  # (qualifier, column name), lower-cased


def column_key(column: exp.Column, tables: Mapping[str, pa.Schema]) -> ColumnKey | None:
    """Which dataset column of the scope `column` names: qualified, or unqualified and in one table."""
    parts = column.parts
    name = column.name.lower()
    if len(parts) == 2:
        qualifier = parts[0].name.lower()
        schema = tables.get(qualifier)
        return (qualifier, name) if schema is not None and _field(schema, name) is not None else None
    if len(parts) != 1:
        return None
    owners = [q for q, schema in tables.items() if _field(schema, name) is not None]
    return (owners[0], name) if len(owners) == 1 else None


def _field(schema: pa.Schema, name: str) -> pa.Field | None:
    matches = [field for field in schema if field.name.lower() == name]
    return matches[0] if len(matches) == 1 else None


def same_key_type(left: pa.DataType, right: pa.DataType) -> bool:
    """Whether equal values of the two types are equal without a cast that could change a condition."""
    return left == right or (pa.types.is_integer(left) and pa.types.is_integer(right))


def equal_columns(
    select: exp.Select, conditions: list[exp.Expr], schemas: Mapping[str, pa.Schema]
) -> list[set[ColumnKey]]:
    """Classes of dataset columns an inner-join scope holds equal (`a.k = b.k`, `USING (k)`), each of
    columns of one type (`same_key_type`)."""
    tables = scope_tables(select, schemas)
    pairs: list[tuple[ColumnKey, ColumnKey]] = []
    for condition in conditions:
        if isinstance(condition, exp.EQ) and isinstance(condition.this, exp.Column):
            right = condition.expression
            if isinstance(right, exp.Column):
                left_key, right_key = column_key(condition.this, tables), column_key(right, tables)
                if left_key is not None and right_key is not None:
                    pairs.append((left_key, right_key))
    earlier: list[str] = []
    from_item = select.args.get("from_")
    if from_item is not None and isinstance(from_item.this, exp.Table):
        earlier.append((from_item.this.alias or from_item.this.name).lower())
    for join in select.args.get("joins") or ():
        joined = join.this
        name = (joined.alias or joined.name).lower() if isinstance(joined, exp.Table) else None
        for identifier in join.args.get("using") or ():
            column = identifier.name.lower()
            owners = [q for q in earlier if q in tables and _field(tables[q], column) is not None]
            if name in tables and len(owners) == 1 and _field(tables[name], column) is not None:
                pairs.append(((owners[0], column), (name, column)))
        if name is not None:
            earlier.append(name)
    classes: list[set[ColumnKey]] = []
    for left, right in pairs:
        left_field, right_field = _field(tables[left[0]], left[1]), _field(tables[right[0]], right[1])
        if left_field is None or right_field is None or not same_key_type(left_field.type, right_field.type):
            continue
        merged = {left, right}
        for existing in [c for c in classes if c & merged]:
            merged |= existing
            classes.remove(existing)
        classes.append(merged)
    return classes


def derived_conditions(
    select: exp.Select, conditions: list[exp.Expr], schemas: Mapping[str, pa.Schema]
) -> list[exp.Expr]:
    """Conditions on one column copied to every column it is held equal to in an inner-join scope.

    Rows that reach the scope's output satisfy `a.k = b.k` and `P(a.k)`, so they satisfy `P(b.k)`: a
    filter on `orders.customer_id` prunes `customers` when the join is on that key.
    """
    classes = equal_columns(select, conditions, schemas)
    if not classes:
        return []
    tables = scope_tables(select, schemas)
    derived: list[exp.Expr] = []
    for condition in conditions:
        if condition.find(exp.Select, exp.Subquery) is not None:
            continue
        columns = list(condition.find_all(exp.Column))
        keys = {column_key(column, tables) for column in columns}
        if len(keys) != 1 or None in keys:
            continue
        (key,) = keys
        assert key is not None
        for members in classes:
            if key not in members:
                continue
            for qualifier, name in sorted(members - {key}):
                copy = condition.copy()
                for column in list(copy.find_all(exp.Column)):
                    column.replace(exp.column(name, table=qualifier, quoted=True))
                derived.append(copy)
    return derived


def _scope_of(table: exp.Table) -> exp.Select | None:
    parent = table.parent
    if isinstance(parent, exp.From) or (isinstance(parent, exp.Join) and parent.this is table):
        owner = parent.parent
    else:
        return None
    return owner if isinstance(owner, exp.Select) else None


def _is_preserved(table: exp.Table, select: exp.Select, joins: list[exp.Join]) -> bool:
    """Whether `table` is the side an outer join keeps whole: the FROM item of a chain of LEFT joins
    (inner ones allowed among them), or the table of a single RIGHT join."""
    from_item = select.args.get("from_")
    plain = [join for join in joins if not _is_inner(join)]
    if any(join.args.get("method") or isinstance(join.this, exp.Lateral | exp.Unnest) for join in joins):
        return False
    sides = {str(join.args.get("side") or "").upper() for join in plain}
    kinds = {str(join.args.get("kind") or "").upper() for join in plain}
    if not kinds <= {"", "OUTER"}:
        return False
    if sides == {"LEFT"}:
        return from_item is not None and from_item.this is table
    if sides == {"RIGHT"} and len(joins) == 1:
        return joins[0].this is table
    return False


def _is_inner(join: exp.Join) -> bool:
    side = join.args.get("side")
    kind = join.args.get("kind")
    method = join.args.get("method")
    if side or method:
        return False
    if isinstance(join.this, exp.Lateral | exp.Unnest):
        return False
    return (str(kind).upper() if kind else None) in _INNER_KINDS
