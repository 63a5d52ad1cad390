"""Quoting for the few SQL strings the storage engines build for DuckDB."""

from __future__ import annotations


def quote_identifier(name: str) -> str:
    """A DuckDB identifier that means exactly `name`, whatever characters it holds."""
    if "\x00" in name:
        raise ValueError(f"identifier {name!r} contains a NUL character")
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    """A DuckDB string literal that means exactly `text`."""
    if "\x00" in text:
        raise ValueError(f"literal {text!r} contains a NUL character")
    return "'" + text.replace("'", "''") + "'"
