"""Quoting for the few SQL strings the storage engines build for DuckDB."""

from __future__ import annotations

from airflow_partitions.quoting import quote_identifier

__all__ = ["quote_identifier", "quote_literal"]


def quote_literal(text: str) -> str:
    """A DuckDB string literal that means exactly `text`."""
    if "\x00" in text:
        raise ValueError(f"literal {text!r} contains a NUL character")
    return "'" + text.replace("'", "''") + "'"
