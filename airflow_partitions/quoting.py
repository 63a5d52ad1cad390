"""The one SQL identifier quoting: DuckDB and Postgres both read `"name"` with inner quotes doubled."""

from __future__ import annotations


def quote_identifier(name: str) -> str:
    """A double-quoted identifier that means exactly `name`, whatever characters it holds.

    A NUL character is refused (`ValueError`): Postgres cannot hold one in a name, and C string APIs
    would cut the name short there.
    """
    if "\x00" in name:
        raise ValueError(f"identifier {name!r} contains a NUL character")
    return '"' + name.replace('"', '""') + '"'
