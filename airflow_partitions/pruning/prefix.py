"""`LIKE 'prefix%'` and `starts_with(c, 'prefix')` as the range of strings they select.

For a non-NULL string `s`, `s LIKE 'ab%'` holds exactly when `'ab' <= s < 'ac'` in code point order
(DuckDB's and Arrow's default string order, which is UTF-8 byte order), and both are NULL for NULL, so
the range is an exact rewrite: identity, `truncate` over strings and prefix expressions (`left(c, n)`,
`substr(c, 1, n)`) prune through it like through any range.
"""

from __future__ import annotations

_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)
_WILDCARDS = frozenset("%_\\")


def like_prefix(pattern: str) -> str | None:
    """The prefix of a `LIKE` pattern of the form `prefix%` (wildcard-free, non-empty); else None."""
    stripped = pattern.rstrip("%")
    if not stripped or stripped == pattern or _WILDCARDS & set(stripped):
        return None
    return stripped


def prefix_upper_bound(prefix: str) -> str | None:
    """The least string above every string starting with `prefix` (None: no string is)."""
    characters = list(prefix)
    while characters:
        code = ord(characters[-1]) + 1
        if code in _SURROGATES:
            code = _SURROGATES.stop
        if code <= _MAX_CODE_POINT:
            characters[-1] = chr(code)
            return "".join(characters)
        characters.pop()
    return None
