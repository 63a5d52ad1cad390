"""`lower` / `upper` of a partition expression at Arrow speed with DuckDB's values on every row.

A partition value is what DuckDB computes. Arrow's `utf8_lower` / `utf8_upper` and DuckDB's `lower` /
`upper` both map each code point on its own (no context: a final sigma is 'σ' in both), and they agree
on every code point but a few dozen that the newer Unicode tables of Arrow map and DuckDB's leave as
they are (`DIFFERING`, measured over all 1,114,112 - 2,048 code points for the versions in
`VERIFIED_WITH`; under other versions the set is measured again, once per process). So the Arrow kernel
runs over the whole array, and only the rows holding one of those code points are evaluated again by
DuckDB: they are found in the UTF-8 bytes, vectorised (a byte at least the smallest lead byte of the set,
then the first two bytes of each candidate against the set's two-byte prefixes). A row found wrongly
(another code point with the same two-byte prefix) only costs a DuckDB evaluation; a row holding a
differing code point is always found, since every sequence's first two bytes are checked.

`tests/test_expression_conformance.py` measures the set again against the installed engines and compares
the fast path with DuckDB on every code point, on strings mixing them, and on hostile rows.

Spark has no exact case mapping of its own (its `lower` / `upper` follow ICU or the JVM: 'İ' -> 'i̇',
'ß' -> 'SS', a final 'Σ' -> 'ς', and the tables change with the JVM and a session setting). DuckDB maps
each code point to one code point without context, so its `lower` / `upper` is a translation table
(`translation`): measured from the installed DuckDB over every code point, once per process, and handed
to Spark's `translate` (`transforms.spark`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from airflow_partitions.transforms.duckdb_eval import evaluate_sql

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

CASE_FUNCTIONS = ("lower", "upper")
# (pyarrow, duckdb) versions the tables below were measured with.
VERIFIED_WITH = ("26.0.1", "2.0.0")
_Ranges = tuple[tuple[int, int], ...]
DIFFERING: dict[str, _Ranges] = {
    "lower": (
        (0x1C89, 0x1C89), (0xA7CB, 0xA7CC), (0xA7CE, 0xA7CE), (0xA7D2, 0xA7D2), (0xA7D4, 0xA7D4),
        (0xA7DA, 0xA7DA), (0xA7DC, 0xA7DD), (0xA7E2, 0xA7E2), (0xAB6C, 0xAB6D), (0x10D50, 0x10D65),
        (0x16EA0, 0x16EB8), (0x1DF40, 0x1DF40), (0x1DF48, 0x1DF48), (0x1DF4A, 0x1DF4A),
        (0x1DF4D, 0x1DF4D), (0x1DF51, 0x1DF51), (0x1DF68, 0x1DF68), (0x1DF6A, 0x1DF6A),
        (0x1DF6C, 0x1DF6C), (0x1DF6E, 0x1DF6E), (0x1DF72, 0x1DF72), (0x1DF74, 0x1DF74),
        (0x1DF76, 0x1DF76), (0x1DF78, 0x1DF78), (0x1DF7A, 0x1DF7A), (0x1DF7C, 0x1DF7C),
        (0x1DF7E, 0x1DF7E),
    ),
    "upper": (
        (0x19B, 0x19B), (0x264, 0x264), (0x277, 0x277), (0x27C, 0x27C), (0x1C8A, 0x1C8A),
        (0xA7CD, 0xA7CD), (0xA7CF, 0xA7CF), (0xA7D3, 0xA7D3), (0xA7D5, 0xA7D5), (0xA7DB, 0xA7DB),
        (0xAB4B, 0xAB4C), (0x10D70, 0x10D85), (0x16EBB, 0x16ED3), (0x1DF41, 0x1DF41),
        (0x1DF49, 0x1DF49), (0x1DF4B, 0x1DF4B), (0x1DF4E, 0x1DF4E), (0x1DF52, 0x1DF52),
        (0x1DF69, 0x1DF69), (0x1DF6B, 0x1DF6B), (0x1DF6D, 0x1DF6D), (0x1DF6F, 0x1DF6F),
        (0x1DF73, 0x1DF73), (0x1DF75, 0x1DF75), (0x1DF77, 0x1DF77), (0x1DF79, 0x1DF79),
        (0x1DF7B, 0x1DF7B), (0x1DF7D, 0x1DF7D), (0x1DF7F, 0x1DF7F),
    ),
}  # fmt: skip


def all_code_points() -> list[int]:
    """Every Unicode scalar value (the code points a valid UTF-8 string can hold)."""
    return [point for point in range(0x110000) if not 0xD800 <= point <= 0xDFFF]


def measure_differing(function: str) -> frozenset[int]:
    """The code points whose `function` differs between Arrow and DuckDB, each evaluated on its own."""
    import pyarrow as pa
    import pyarrow.compute as pc

    points = all_code_points()
    values = pa.array([chr(point) for point in points], pa.string())
    same = pc.equal(duckdb_case(function, values), getattr(pc, f"utf8_{function}")(values))
    differ = pc.invert(pc.fill_null(same, False))
    return frozenset(pa.array(points, pa.int64()).filter(differ).to_pylist())


@functools.cache
def differing(function: str) -> frozenset[int]:
    """The differing code points for the installed Arrow and DuckDB (measured when not `VERIFIED_WITH`)."""
    import duckdb
    import pyarrow as pa

    if (pa.__version__, duckdb.__version__) == VERIFIED_WITH:
        return frozenset(p for low, high in DIFFERING[function] for p in range(low, high + 1))
    return measure_differing(function)


@functools.cache
def _lookups(function: str) -> tuple[int, npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """The smallest lead byte, a table of lead bytes and a table of two-byte prefixes of the set."""
    import numpy as np

    leads = np.zeros(256, dtype=bool)
    pairs = np.zeros(1 << 16, dtype=bool)
    smallest = 256
    for point in differing(function):
        encoded = chr(point).encode("utf-8")
        if len(encoded) == 1:
            smallest = 0  # an ASCII code point (none today): every non-empty row is a candidate
            leads[encoded[0]] = True
            continue
        smallest = min(smallest, encoded[0])
        leads[encoded[0]] = True
        pairs[(encoded[0] << 8) | encoded[1]] = True
    return smallest, leads, pairs


def candidate_rows(function: str, values: pa.Array) -> npt.NDArray[np.int64]:
    """Positions of the rows of a string array that may hold a code point of `differing(function)`."""
    import numpy as np
    import pyarrow as pa

    smallest, leads, pairs = _lookups(function)
    if smallest == 256 or len(values) == 0:
        return np.empty(0, dtype=np.int64)
    offset_type = np.int64 if pa.types.is_large_string(values.type) else np.int32
    _, offset_buffer, data_buffer = values.buffers()
    offsets = np.frombuffer(offset_buffer, dtype=offset_type)[values.offset : values.offset + len(values) + 1]
    if data_buffer is None or offsets[-1] == offsets[0]:
        return np.empty(0, dtype=np.int64)
    body = np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0] : offsets[-1]]
    if smallest == 0:
        hits = np.arange(body.size)
    else:
        # Continuation bytes (0x80-0xBF) and ASCII are below every lead byte of the set.
        hits = np.flatnonzero(body >= smallest)
        hits = hits[leads[body[hits]]]
        hits = hits[hits + 1 < body.size]
        hits = hits[pairs[(body[hits].astype(np.uint16) << 8) | body[hits + 1]]]
    rows = np.searchsorted(offsets, hits + offsets[0], side="right") - 1
    return np.unique(rows).astype(np.int64)


def duckdb_case(function: str, values: pa.Array) -> pa.Array:
    """DuckDB's `lower` / `upper` of a string array (the definition)."""
    import pyarrow as pa

    return evaluate_sql(f"{function}(value)", "value", values, pa.string(), f"{function}(value)")


def case_map(function: str, values: Any) -> Any:
    """DuckDB's `lower` / `upper` of a string array: Arrow's kernel, the candidate rows through DuckDB."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    mapped = getattr(pc, f"utf8_{function}")(values)
    rows = candidate_rows(function, values)
    if rows.size == 0:
        return mapped
    chosen = np.zeros(len(values), dtype=bool)
    chosen[rows] = True
    mask = pa.Array.from_buffers(
        pa.bool_(), len(values), [None, pa.py_buffer(np.packbits(chosen, bitorder="little"))]
    )
    corrected = duckdb_case(function, values.filter(mask))
    return pc.replace_with_mask(mapped, mask, corrected.cast(mapped.type))


# ASCII rows: DuckDB's table restricted to ASCII, which Spark's `lower` / `upper` give on a pure ASCII
# string whatever its case mapping tables (a byte-wise fast path, no locale).
_ASCII_CASE = {
    "lower": {chr(point): chr(point + 32) for point in range(ord("A"), ord("Z") + 1)},
    "upper": {chr(point): chr(point - 32) for point in range(ord("a"), ord("z") + 1)},
}


def every_code_point_array() -> pa.Array:
    """One string per Unicode scalar value, in code point order (built from the UTF-8 bytes, vectorised)."""
    import numpy as np
    import pyarrow as pa

    points = np.arange(0x110000, dtype=np.uint32)
    points = points[(points < 0xD800) | (points > 0xDFFF)]
    data = points.astype("<u4").tobytes().decode("utf-32-le").encode("utf-8")
    lengths = np.select([points < 0x80, points < 0x800, points < 0x10000], [1, 2, 3], 4)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.Array.from_buffers(pa.string(), len(points), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


@functools.cache
def translation(function: str) -> tuple[str, str] | None:
    """DuckDB's `lower` / `upper` as a translation table: (the code points it changes, their images).

    Measured from the installed DuckDB over every code point (about a second, once per process). None
    when DuckDB's mapping is not a table Spark can apply exactly: an image that is not one code point (or
    is U+0000, which `translate` reads as "delete"), or ASCII mapped otherwise than A-Z <-> a-z (the rows
    Spark's own `lower` / `upper` compute). Then Spark keeps the Arrow UDF.
    """
    import pyarrow.compute as pc

    values = every_code_point_array()
    mapped = duckdb_case(function, values)
    changed = pc.invert(pc.equal(mapped, values))
    sources, images = values.filter(changed).to_pylist(), mapped.filter(changed).to_pylist()
    table = dict(zip(sources, images, strict=True))
    if any(len(image) != 1 or image == "\x00" for image in images):
        return None
    if {source: image for source, image in table.items() if source < "\x80"} != _ASCII_CASE[function]:
        return None
    return "".join(sources), "".join(images)
