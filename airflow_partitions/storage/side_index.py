"""Exact side indexes: per data file and index column, what values it can hold, to skip files on `=` / `IN`.

A file's index of one column is its `has_null` flag plus either the *value set* (the sorted 32-bit hashes of
its distinct values, when there are at most `max_values` of them) or a *split-block bloom filter* sized for
the configured false-positive rate. Both answer "might this file hold value v?" with no false negative: a
"no" proves the value absent, a "yes" only costs a read. They are built at write time, once per file, from
the rows written, and kept in the file's catalog entry (`DataFile.index`, base64 text).

The hash is engine independent and documented, so any writer can build the same index:

* each non-NULL value is encoded canonically per *kind*: integers, booleans (0 / 1) and dates (days since
  1970-01-01) as a signed 64-bit integer, timestamps as whole microseconds since the epoch (floored;
  UTC for zoned types, wall clock for naive ones, whatever the unit), strings as UTF-8 bytes, binaries
  as their bytes;
* `h32` = Murmur3 x86 32-bit, seed 0, of those bytes (integers: of the 8 little-endian bytes, Iceberg's
  `hashLong`), vectorised over Arrow buffers (`transforms.arrow_hash`);
* the value set stores `h32`s; the bloom filter follows Parquet's split-block bloom filter (256-bit blocks
  of eight 32-bit words, the Parquet salt constants) keyed by `h64 = splitmix64(h32)` (one step of
  SplitMix64 from state `h32`: add 0x9E3779B97F4A7C15, then its finaliser): block
  `((h64 >> 32) * blocks) >> 32`, and in word i the bit `(uint32(h64) * SALT[i]) >> 27`; the filter's
  bytes are the words in order, little-endian, as in a Parquet file.

Two values with the same `h32` are indistinguishable: for an absent value that is a false positive with
probability (distinct values) / 2**32, far below any configured bound. A column whose bloom filter would
exceed `max_bytes` gets no index in that file (the file is then always read), so catalog entries stay small.
"""

from __future__ import annotations

import base64
import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import StorageError
from airflow_partitions.spec.index_settings import (
    BLOCK_BYTES,
    DEFAULT_FPP,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_VALUES,
    index_kind,
    index_settings_problem,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

# Parquet's split-block bloom filter salts (parquet-format BloomFilter.md).
SALT = (0x47B6137B, 0x44974D91, 0x8824AD5B, 0xA2B7289D, 0x705495C7, 0x2DF1424B, 0x9EFC4947, 0x5C6BFB31)
_MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF


@dataclass(frozen=True, slots=True)
class IndexConfig:
    """Which columns get a side index, the bloom filters' false-positive rate, the largest value set,
    and the largest bloom filter (bytes) a file keeps per column."""

    columns: tuple[str, ...] = ()
    fpp: float = DEFAULT_FPP
    max_values: int = DEFAULT_MAX_VALUES
    max_bytes: int = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple(self.columns))
        problem = index_settings_problem(self.columns, self.fpp, self.max_values, self.max_bytes)
        if problem:
            raise StorageError(problem)


# --- hashing --------------------------------------------------------------------------------------


def value_hashes(values: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.uint32]:
    """`h32` of every non-NULL value of `values` (in order, duplicates kept)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from airflow_partitions.transforms import arrow_hash  # lazy: loads numpy

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    kind = index_kind(values.type)
    if kind is None:
        raise StorageError(f"side indexes do not support type {values.type}")
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    if values.null_count:
        values = values.drop_null()
    if kind in ("string", "binary"):
        target = pa.large_string() if kind == "string" else pa.large_binary()
        if not values.type.equals(target):
            values = values.cast(target)
        buffers = values.buffers()
        offsets = np.frombuffer(buffers[1], dtype=np.int64)[values.offset : values.offset + len(values) + 1]
        data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
        return arrow_hash.hash_ragged(data, offsets[:-1], np.diff(offsets))
    if kind == "boolean":
        integers = values.cast(pa.int64())
    elif kind == "date":
        integers = values.cast(pa.date32()).cast(pa.int32()).cast(pa.int64())
    elif kind in ("timestamp", "timestamptz"):
        unit = values.type.unit
        ticks = values.cast(pa.int64())
        if unit == "s":
            integers = pc.multiply(ticks, 1_000_000)
        elif unit == "ms":
            integers = pc.multiply(ticks, 1000)
        elif unit == "ns":
            # Floor to whole microseconds: equal instants agree, whatever unit each file was written in.
            integers = pa.array(np.floor_divide(ticks.to_numpy(zero_copy_only=False), 1000))
        else:
            integers = ticks
    else:
        integers = values.cast(pa.int64(), safe=False)
    array = integers.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return arrow_hash.hash_int64(array)


def literal_hashes(values: Iterable[Any], arrow_type: pa.DataType) -> list[int] | None:
    """`h32` of filter literals typed like a column of `arrow_type` (None: a literal does not fit)."""
    import pyarrow as pa

    kind_type = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    try:
        array = pa.array(list(values), type=kind_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError):
        return None
    return [int(h) for h in value_hashes(array)]


def _splitmix64(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    import numpy as np

    with np.errstate(over="ignore"):
        z = values + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _splitmix64_scalar(value: int) -> int:
    z = (value + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def bloom_blocks(distinct: int, fpp: float) -> int:
    """The fewest blocks of a split-block bloom filter whose expected false-positive rate for `distinct`
    values is at most `fpp`.

    Parquet's sizing formula (bits = -8 n / ln(1 - fpp ** (1/8))) assumes every block holds its mean
    load and undershoots (1.5% measured for a 1% target). The expectation (`expected_fpp`) depends on the
    mean load per block alone, so the largest load meeting `fpp` is found once per rate.
    """
    return max(1, math.ceil(max(distinct, 1) / _largest_load(fpp)))


@functools.lru_cache(maxsize=64)
def _largest_load(fpp: float) -> float:
    """The largest mean number of values per block whose expected false-positive rate is at most `fpp`."""
    low, high = 1e-6, 4096.0
    for _ in range(60):
        middle = (low + high) / 2
        if _fpp_at_load(middle) <= fpp:
            low = middle
        else:
            high = middle
    return low


def expected_fpp(distinct: int, blocks: int) -> float:
    """Expected false-positive rate of a split-block bloom filter of `blocks` blocks holding `distinct`
    values: a probe hits a block holding j values (Poisson, mean distinct / blocks) and finds its eight
    bits set with probability (1 - (31/32) ** j) ** 8."""
    return _fpp_at_load(distinct / blocks)


def _fpp_at_load(mean: float) -> float:
    last = int(mean + 12 * math.sqrt(mean) + 30)
    total = 0.0
    log_p = -mean  # log of the Poisson probability of j, starting at j = 0
    for j in range(last + 1):
        if j:
            log_p += math.log(mean) - math.log(j)
        total += math.exp(log_p) * (1.0 - (31.0 / 32.0) ** j) ** 8
    return total


def build_bloom(hashes: npt.NDArray[np.uint32], blocks: int) -> bytes:
    """The split-block bloom filter of `blocks` blocks holding `hashes` (see the module docstring)."""
    import numpy as np

    h64 = _splitmix64(hashes.astype(np.uint64))
    block = (((h64 >> np.uint64(32)) * np.uint64(blocks)) >> np.uint64(32)).astype(np.uint32)
    key = h64.astype(np.uint32)  # the low 32 bits
    salts = np.array(SALT, dtype=np.uint32)
    word_offsets = np.arange(0, 256, 32, dtype=np.uint32)
    with np.errstate(over="ignore"):
        flat = key[:, None] * salts[None, :]  # (values, 8)
    # Bit positions in the filter: block * 256 + word * 32 + bit (uint32: `max_bytes` keeps the filter far
    # below 2**32 bits); words little-endian, so the byte layout equals Parquet's (`packbits` little bit
    # order within each byte).
    np.right_shift(flat, np.uint32(27), out=flat)
    np.add(flat, word_offsets[None, :], out=flat)
    np.add(flat, (block * np.uint32(256))[:, None], out=flat)
    bits = np.zeros(blocks * 256, dtype=bool)
    bits[flat.ravel().astype(np.intp)] = True
    return np.packbits(bits, bitorder="little").tobytes()


class Probe:
    """One looked-up value's hash, with what a bloom filter check needs precomputed: the high 32 bits
    that pick the block, and per word the byte offset inside the block and the bit mask."""

    __slots__ = ("bits", "h32", "high")

    def __init__(self, h32: int) -> None:
        self.h32 = h32
        h64 = _splitmix64_scalar(h32)
        self.high = h64 >> 32
        key = h64 & _MASK32
        bits = []
        for word, salt in enumerate(SALT):
            bit = ((key * salt) & _MASK32) >> 27
            bits.append((word * 4 + (bit >> 3), 1 << (bit & 7)))
        self.bits = tuple(bits)


class ProbeSet:
    """The hashes a filter looks up, prepared once per plan for every file's index: few values are
    checked one by one, many (a long IN list) with numpy over all of them at once."""

    VECTOR_FROM = 32

    def __init__(self, hashes: Iterable[int]) -> None:
        import numpy as np

        self.hashes = frozenset(int(h) for h in hashes)
        self.probes = [Probe(h) for h in sorted(self.hashes)]
        self._vector: tuple[Any, Any, Any] | None = None
        if len(self.probes) >= self.VECTOR_FROM:
            highs = np.array([p.high for p in self.probes], dtype=np.uint64)
            offsets = np.array([[o for o, _ in p.bits] for p in self.probes], dtype=np.int64)
            masks = np.array([[m for _, m in p.bits] for p in self.probes], dtype=np.uint8)
            self._vector = (highs, offsets, masks)

    def in_set(self, members: frozenset[int]) -> bool:
        return not members.isdisjoint(self.hashes)

    def in_bloom(self, bloom: bytes) -> bool:
        if self._vector is None:
            return any(bloom_might_contain(bloom, probe) for probe in self.probes)
        import numpy as np

        highs, offsets, masks = self._vector
        blocks = np.uint64(len(bloom) // BLOCK_BYTES)
        bases = ((highs * blocks) >> np.uint64(32)).astype(np.int64) * BLOCK_BYTES
        data = np.frombuffer(bloom, dtype=np.uint8)
        return bool(((data[bases[:, None] + offsets] & masks) != 0).all(axis=1).any())


def bloom_might_contain(bloom: bytes, probe: Probe) -> bool:
    """Whether a bloom filter built by `build_bloom` may hold the probed value."""
    base = ((probe.high * (len(bloom) // BLOCK_BYTES)) >> 32) * BLOCK_BYTES
    return all(bloom[base + offset] & mask for offset, mask in probe.bits)


# --- the per-file, per-column index ---------------------------------------------------------------


class ColumnIndex:
    """One column's index in one file: `kind`, `has_null`, and a value set or a bloom filter (base64)."""

    __slots__ = ("_bloom", "_set", "bloom_text", "has_null", "kind", "set_text")

    def __init__(
        self, kind: str, has_null: bool, *, set_text: str | None = None, bloom_text: str | None = None
    ) -> None:
        if (set_text is None) == (bloom_text is None):
            raise StorageError("a column index holds exactly one of a value set and a bloom filter")
        self.kind = kind
        self.has_null = bool(has_null)
        self.set_text = set_text
        self.bloom_text = bloom_text
        self._set: frozenset[int] | None = None
        self._bloom: bytes | None = None

    @property
    def is_bloom(self) -> bool:
        return self.bloom_text is not None

    @property
    def size_bytes(self) -> int:
        """Bytes of the encoded index (what it adds to the catalog entry)."""
        return len(self.set_text or self.bloom_text or "")

    def might_contain(self, h32: int) -> bool:
        """False only when the file holds no non-NULL value hashing to `h32`."""
        return self.might_contain_any(ProbeSet([h32]))

    def might_contain_any(self, probes: ProbeSet) -> bool:
        """False only when the file holds none of the probed values (`probes` made once per filter)."""
        if self.set_text is not None:
            if self._set is None:
                import numpy as np

                raw = base64.b64decode(self.set_text)
                self._set = frozenset(np.frombuffer(raw, dtype="<u4").tolist())
            return probes.in_set(self._set)
        if self._bloom is None:
            self._bloom = base64.b64decode(self.bloom_text or "")
        return probes.in_bloom(self._bloom)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "nulls": self.has_null}
        if self.set_text is not None:
            data["set"] = self.set_text
        else:
            data["bloom"] = self.bloom_text
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ColumnIndex:
        try:
            return cls(
                str(data["kind"]),
                bool(data["nulls"]),
                set_text=data.get("set"),
                bloom_text=data.get("bloom"),
            )
        except (KeyError, TypeError) as err:
            raise StorageError(f"malformed column index {dict(data)!r}: {err}") from err

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ColumnIndex) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash((self.kind, self.has_null, self.set_text, self.bloom_text))

    def __repr__(self) -> str:
        shape = "bloom" if self.is_bloom else "set"
        return f"ColumnIndex({self.kind}, {shape}, {self.size_bytes} bytes, nulls={self.has_null})"


def build_column_index(column: pa.Array | pa.ChunkedArray, config: IndexConfig) -> ColumnIndex | None:
    """The index of one column of one file (None: its bloom filter would exceed `config.max_bytes`)."""
    import numpy as np
    import pyarrow.compute as pc

    kind = index_kind(column.type)
    if kind is None:
        raise StorageError(f"side indexes do not support type {column.type}")
    has_null = column.null_count > 0
    if kind in ("string", "binary"):
        # Hashing a string costs more than finding the distinct ones: hash each distinct value once.
        distinct = pc.unique(column)
        count = len(distinct) - (1 if has_null else 0)
        if count > config.max_values and bloom_blocks(count, config.fpp) * BLOCK_BYTES > config.max_bytes:
            return None  # distinct values hash apart but for rare collisions: too many either way
        hashes = value_hashes(distinct)
    else:
        # Fixed-width values hash faster than a hash table finds the distinct ones: hash every row, then
        # keep one of each hash (sorted, so the value set below needs no second sort).
        hashes = np.sort(value_hashes(column))
        if len(hashes) > 1:
            hashes = hashes[np.r_[True, hashes[1:] != hashes[:-1]]]
    if len(hashes) <= config.max_values:
        text = base64.b64encode(np.unique(hashes).astype("<u4").tobytes()).decode("ascii")
        return ColumnIndex(kind, has_null, set_text=text)
    blocks = bloom_blocks(len(hashes), config.fpp)
    if blocks * BLOCK_BYTES > config.max_bytes:
        return None
    bloom = build_bloom(hashes, blocks)
    return ColumnIndex(kind, has_null, bloom_text=base64.b64encode(bloom).decode("ascii"))


def build_file_index(table: pa.Table, config: IndexConfig | None) -> dict[str, ColumnIndex]:
    """The index of every configured column `table` has (a file written before a column existed has
    none for it, and is then always read)."""
    if config is None or not config.columns:
        return {}
    built: dict[str, ColumnIndex] = {}
    for name in config.columns:
        if name not in table.column_names:
            continue
        column_index = build_column_index(table.column(name), config)
        if column_index is not None:
            built[name] = column_index
    return built


__all__ = [
    "DEFAULT_FPP",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_VALUES",
    "ColumnIndex",
    "IndexConfig",
    "Probe",
    "ProbeSet",
    "bloom_blocks",
    "build_bloom",
    "build_column_index",
    "build_file_index",
    "index_kind",
    "literal_hashes",
    "value_hashes",
]
