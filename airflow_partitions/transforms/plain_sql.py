"""The commonest SQL shapes read without sqlglot: plain column names, built-in transforms, `col op value`.

A CLI call or a new Airflow task that reads one partition pays for every import it makes, and sqlglot is
a good part of a cold point read. Most specs and point filters are written in a handful of shapes
(`bucket(50, PULocationID)`, `region`, `PULocationID = 264`), so those are recognised here with regular
expressions, and everything else (or anything doubtful) answers None and goes to the sqlglot parser as
before. What these shapes give is what sqlglot's parse gives for the same text, word for word: the tests
compare both on every keyword sqlglot's DuckDB dialect knows and on hostile names.

Nothing here imports sqlglot, pyarrow or numpy.
"""

from __future__ import annotations

import re

SUPPORTED_FORMS = (
    "a column, bucket(N, col), truncate(W, col), date_part('unit', col), "
    "YEAR/QUARTER/MONTH/WEEK/DAY/HOUR/MINUTE(col), date_trunc('unit', col), col % N, "
    "multi_bucket(N, col_a, col_b, ...), "
    "or a scalar expression over one column such as lower(col) (see the expression reference)"
)

# Words that, written bare, do not parse as a reference to a column of that name in DuckDB's dialect
# (keywords, and functions called without parentheses such as current_date), lower case. A name among
# them is quoted in canonical strings and makes the shapes below answer None (sqlglot decides).
# tests/test_plain_sql.py derives this set from sqlglot's own tables and checks it is complete.
RESERVED_WORDS = frozenset(
    {
        "alter", "analyze", "and", "any", "as", "attach", "begin", "between", "cache", "call", "case",
        "comment", "commit", "connect", "connect_by_root", "copy", "create", "cross", "current_catalog",
        "current_date", "current_time", "current_timestamp", "current_user", "delete", "desc", "describe",
        "detach", "disconnect", "distinct", "drop", "else", "except", "execute", "explain", "false",
        "fetch", "for", "force", "from", "glob", "grant", "having", "if", "ilike", "inner", "insert",
        "install", "intersect", "into", "join", "kill", "lateral", "like", "load", "localtime",
        "localtimestamp", "map", "merge", "not", "notnull", "null", "on", "only", "optimize", "or",
        "outer", "partitioned_by", "pivot", "pivot_wider", "positional", "pragma", "prepare", "qualify",
        "regexp", "rename", "reset", "returning", "revoke", "rlike", "rollback", "select",
        "session_user", "set", "show", "summarize", "tablesample", "then", "true", "truncate",
        "uncache", "union", "unpivot", "update", "use", "using", "vacuum", "when", "where", "with", "xor",
    }
)  # fmt: skip
# Names that read as a column alone but may start other syntax next to an operator or a parenthesis: the
# shapes below leave them to sqlglot (canonical strings still write them bare, as `is_plain_name` says).
_DOUBTFUL_WORDS = frozenset(
    {
        "interval", "is", "in", "escape", "collate", "array", "struct", "list", "exists", "cast",
        "try_cast", "extract", "position", "substring", "trim", "overlay", "columns", "unnest", "lambda",
        "date", "time", "timestamp", "timestamptz", "default", "row", "values", "similar", "filter",
        "over", "window", "within", "at", "some", "all", "asc",
    }
)  # fmt: skip

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A column as written: a plain identifier, or a double-quoted name ("" inside stands for one ").
_COLUMN = r'(?:[A-Za-z_][A-Za-z0-9_]*|"(?:[^"\x00]|"")+")'
_INTEGER = r"[0-9]+"
_UNIT = r"'[A-Za-z]+'"
_CALL = re.compile(
    rf"\s*(?P<function>bucket|truncate|date_trunc|date_part)\s*\(\s*(?P<first>{_INTEGER}|{_UNIT})\s*,"
    rf"\s*(?P<column>{_COLUMN})\s*\)\s*",
    re.IGNORECASE,
)
_MOD = re.compile(rf"\s*(?P<column>{_COLUMN})\s*%\s*(?P<modulus>{_INTEGER})\s*")
_BARE = re.compile(rf"\s*(?P<column>{_COLUMN})\s*")
# `column op value`, with `AND` between such comparisons; strings without backslashes ('' is one ').
_VALUE = r"-?[0-9]+|'(?:[^'\\\x00]|'')*'"
_COMPARISON = rf"(?P<column>{_COLUMN})\s*(?P<op><=|>=|<>|!=|=|<|>)\s*(?P<value>{_VALUE})"
_CONJUNCTION = re.compile(rf"\s*{_COMPARISON}\s*(?:(?P<more>AND)\s+|$)", re.IGNORECASE)


def is_plain_name(name: str) -> bool:
    """Whether `name` written bare reads back as the column `name` (an identifier, not a keyword)."""
    return _PLAIN.fullmatch(name) is not None and name.lower() not in RESERVED_WORDS


def column_name(written: str) -> str | None:
    """The column a written name refers to (quotes removed), None when sqlglot must decide."""
    if written.startswith('"'):
        name = written[1:-1].replace('""', '"')
        return name if name else None
    return written if is_plain_name(written) and written.lower() not in _DOUBTFUL_WORDS else None


def builtin_transform_parts(text: str) -> tuple[str, str, int | str | None] | None:
    """`(form, column, argument)` for a built-in transform written in its plain form, else None.

    Forms: `identity` (a bare column), `bucket` (N), `truncate` (W), `mod` (N), `date_trunc` and
    `date_part` (the unit, lower case). Arguments are not range-checked: the caller's constructors do.
    """
    matched = _CALL.fullmatch(text)
    if matched is not None:
        column = column_name(matched["column"])
        function, first = matched["function"].lower(), matched["first"]
        if column is None:
            return None
        if function in ("bucket", "truncate"):
            if first.startswith("'"):
                return None
            return function, column, int(first)
        if not first.startswith("'"):
            return None
        return function, column, first[1:-1].lower()
    matched = _MOD.fullmatch(text)
    if matched is not None:
        column = column_name(matched["column"])
        return None if column is None else ("mod", column, int(matched["modulus"]))
    matched = _BARE.fullmatch(text)
    if matched is not None:
        column = column_name(matched["column"])
        return None if column is None else ("identity", column, None)
    return None


def plain_comparisons(where: str) -> list[tuple[str, str, int | str]] | None:
    """`[(column, op, value), ...]` for a filter that is only `column op value` comparisons joined by AND
    (integers, '...' strings), else None. Values are as sqlglot's parse gives them: `int` or `str`."""
    found: list[tuple[str, str, int | str]] = []
    position = 0
    while True:
        matched = _CONJUNCTION.match(where, position)
        if matched is None:
            return None
        column = column_name(matched["column"])
        if column is None:
            return None
        text = matched["value"]
        value: int | str = text[1:-1].replace("''", "'") if text.startswith("'") else int(text)
        found.append((column, matched["op"], value))
        position = matched.end()
        if matched["more"] is None:
            return found if position == len(where) else None
