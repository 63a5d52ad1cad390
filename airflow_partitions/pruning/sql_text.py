"""Parsing user SQL for pruning: `sqlglot.parse` in DuckDB's dialect, in time linear in long IN lists.

Filters (`filters.parse_where_sql`) and the query checks (`query.dataset_filter`, `tables_named_in`,
`executable_sql`) parse through `parse_sql` / `parse_one_sql`; the trees are exactly sqlglot's.
"""

from __future__ import annotations

import contextlib
import gc
import re
import threading
import uuid
from collections.abc import Iterator

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

DIALECT = "duckdb"

# Long IN lists of plain literals are taken out of the text before sqlglot parses it (sqlglot spends ~15 µs
# per value, most of a 100,000-value list's planning) and put back into the tree as the nodes sqlglot
# would have built. Only text outside strings, quoted names and comments is looked at; a text with a
# backslash, `$` or a block comment, where quoting rules differ, is parsed as it is.
COMPACTED_LIST_LENGTH = 64
GC_PAUSE_CHARS = 64 * 1024
_COLLECTION_LOCK = threading.Lock()
_collection_pauses = 0
_collection_was_enabled = False
_SKIPPED_OR_IN = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|--[^\n]*|\bIN\s*\(""", re.IGNORECASE)
_LITERAL = r"(?:-?[0-9]+(?:\.[0-9]+)?|'(?:[^']|'')*'|NULL|TRUE|FALSE)"
_LITERAL_LIST = re.compile(
    rf"\s*(?:{_LITERAL}\s*,\s*){{{COMPACTED_LIST_LENGTH - 1},}}{_LITERAL}\s*\)", re.IGNORECASE
)
_LIST_ITEM = re.compile(_LITERAL, re.IGNORECASE)


@contextlib.contextmanager
def collection_paused(text: str) -> Iterator[None]:
    """Python's cyclic garbage collector off while a long filter text (`GC_PAUSE_CHARS`+) is parsed and
    bound: its passes over the hundreds of thousands of nodes a 100,000-value IN list allocates made
    planning grow faster than the list (2.1 s for 100,000 values, 0.1 s for 10,000). Nothing is freed
    later than it would be: the collector runs again once the last pause ends."""
    global _collection_pauses, _collection_was_enabled
    if len(text) < GC_PAUSE_CHARS:
        yield
        return
    with _COLLECTION_LOCK:
        if _collection_pauses == 0:
            _collection_was_enabled = gc.isenabled()
            gc.disable()
        _collection_pauses += 1
    try:
        yield
    finally:
        with _COLLECTION_LOCK:
            _collection_pauses -= 1
            if _collection_pauses == 0 and _collection_was_enabled:
                gc.enable()


def parse_sql(sql: str) -> list[exp.Expr | None]:
    """`sqlglot.parse(sql)` in DuckDB's dialect, in time linear in the length of long literal IN lists."""
    with collection_paused(sql):
        return _parse_sql(sql)


def _parse_sql(sql: str) -> list[exp.Expr | None]:
    if len(sql) < 8 * COMPACTED_LIST_LENGTH or "\\" in sql or "$" in sql or "/*" in sql:
        return sqlglot.parse(sql, read=DIALECT)
    pieces: list[str] = []
    lists: dict[str, str] = {}
    position = 0
    search_from = 0
    while (token := _SKIPPED_OR_IN.search(sql, search_from)) is not None:
        search_from = token.end()
        if not token.group().upper().startswith("IN"):
            continue
        literals = _LITERAL_LIST.match(sql, token.end())
        if literals is None:
            continue
        placeholder = f"__ap_in_list_{len(lists)}_{uuid.uuid4().hex}"
        lists[placeholder] = sql[token.end() : literals.end() - 1]
        pieces += [sql[position : token.end()], placeholder, ")"]
        position = search_from = literals.end()
    if not lists:
        return sqlglot.parse(sql, read=DIALECT)
    statements = sqlglot.parse("".join(pieces) + sql[position:], read=DIALECT)
    for statement in statements:
        if statement is None:
            continue
        for node in list(statement.find_all(exp.In)):
            items = node.expressions
            if len(items) == 1 and isinstance(items[0], exp.Column) and items[0].name in lists:
                node.set("expressions", _literal_nodes(lists.pop(items[0].name)))
    if lists:  # a placeholder landed somewhere unexpected: let sqlglot read the text itself
        return sqlglot.parse(sql, read=DIALECT)
    return statements


def parse_one_sql(sql: str) -> exp.Expr:
    """`sqlglot.parse_one(sql)` in DuckDB's dialect through `parse_sql` (several statements: a Block)."""
    statements = parse_sql(sql)
    if not statements or statements[0] is None:
        raise ParseError("no SQL statement was parsed")
    if len(statements) > 1:
        return exp.Block(expressions=statements)
    return statements[0]


def _literal_nodes(text: str) -> list[exp.Expression]:
    """The nodes sqlglot builds for a comma-separated list of plain literals."""
    nodes: list[exp.Expression] = []
    for item in _LIST_ITEM.findall(text):
        first = item[0]
        if first.isdigit():
            nodes.append(exp.Literal(this=item, is_string=False))
        elif first == "-":
            nodes.append(exp.Neg(this=exp.Literal(this=item[1:], is_string=False)))
        elif first == "'":
            nodes.append(exp.Literal(this=item[1:-1].replace("''", "'"), is_string=True))
        elif item.upper() == "NULL":
            nodes.append(exp.Null())
        else:
            nodes.append(exp.Boolean(this=item.upper() == "TRUE"))
    return nodes
