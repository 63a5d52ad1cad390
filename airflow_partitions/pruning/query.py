"""Read-only checks for user SQL, and the filter a query applies to one dataset table, for pruning.

`check_read_only(sql)` asks DuckDB's own parser how many statements `sql` holds and what they are: exactly
one SELECT (WITH ... SELECT, set operations, FROM-first) passes, anything else raises `UnsafeQueryError`.
So does an invisible Unicode format character outside a string literal (`refuse_format_characters`).

`dataset_filter(sql, dataset, schema)` finds every reference to the dataset table and, for each, the
conditions of its scope's WHERE that constrain the table's own rows: the conjuncts over its columns,
bound leniently (what cannot be used is unknown, never false). A reference whose scope joins it with an
outer, semi, anti, as-of or lateral join, renames its columns, or that a CTE of the same name shadows,
contributes "everything". The dataset's predicate is the OR of its references', so every row any part of
the query can see stays readable; the query itself still applies all its conditions.
"""

from __future__ import annotations

import re
import unicodedata

import pyarrow as pa
from sqlglot import exp
from sqlglot.errors import SqlglotError

from airflow_partitions.exceptions import UnsafeQueryError
from airflow_partitions.pruning.deep import deep_stack
from airflow_partitions.pruning.expressions import AlwaysFalse, AlwaysTrue, Predicate, or_
from airflow_partitions.pruning.filters import DIALECT, FilterBinder
from airflow_partitions.pruning.sql_text import parse_one_sql, parse_sql
from airflow_partitions.transforms.parser import is_transform_call, may_call_transforms

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
    from airflow_partitions.transforms.duckdb_functions import rewrite_partition_nodes

    if not may_call_transforms(sql):
        return sql  # no function a partition transform could be spelled with: skip parsing
    try:
        tree = parse_one_sql(sql)
    except (SqlglotError, ValueError):
        return sql
    if not any(is_transform_call(node) for node in tree.walk()):
        return sql
    return rewrite_partition_nodes(tree, {field.name: field.type for field in schema}).sql(dialect=DIALECT)


@deep_stack
def dataset_filter(sql: str, dataset: str, schema: pa.Schema, references: int | None = None) -> Predicate:
    """The rows of `dataset` that `sql` can look at, as a predicate (TRUE when it cannot tell).

    `references`: how many times DuckDB, which runs the query, resolves a name of `sql` to the dataset
    (`read.query.check_sandboxed`). When this parse finds another number, the two disagree on what a
    name means, and the predicate is TRUE: every row stays readable, never an empty placeholder.
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
    return or_(*(_reference_filter(table, schema) for table in tables))


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


def _reference_filter(table: exp.Table, schema: pa.Schema) -> Predicate:
    select = _scope_of(table)
    if select is None:
        return AlwaysTrue()
    alias = table.args.get("alias")
    if alias is not None and alias.columns:
        return AlwaysTrue()
    if table.args.get("pivots") or table.args.get("joins"):
        return AlwaysTrue()
    for join in select.args.get("joins") or ():
        if not _is_inner(join):
            return AlwaysTrue()
    where = select.args.get("where")
    if where is None:
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

    return FilterBinder(schema, lenient=True, resolve_column=resolve).bind_node(where.this)


def _scope_of(table: exp.Table) -> exp.Select | None:
    parent = table.parent
    if isinstance(parent, exp.From) or (isinstance(parent, exp.Join) and parent.this is table):
        owner = parent.parent
    else:
        return None
    return owner if isinstance(owner, exp.Select) else None


def _is_inner(join: exp.Join) -> bool:
    side = join.args.get("side")
    kind = join.args.get("kind")
    method = join.args.get("method")
    if side or method:
        return False
    if isinstance(join.this, exp.Lateral | exp.Unnest):
        return False
    return (str(kind).upper() if kind else None) in _INNER_KINDS
