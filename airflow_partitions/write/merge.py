"""Merge rows on key columns: upsert (incoming rows replace existing rows with the same key) and delete
by a set of keys, vectorised in Arrow, with the counts a conservation check needs.

Keys compare as DuckDB's `IS NOT DISTINCT FROM` does, the one key equality of upserts and deletes by key
(writes and the changes merge of a refresh): a NULL key value matches a NULL, so rows of the NULL
partition can be upserted and deleted like any other; -0.0 matches 0.0; NaN matches NaN (every NaN, of
either sign or payload, is one value, as DuckDB orders and compares it). Both sides must have the same
schema (the caller conforms them). Key values of the two sides are dictionary-encoded together, NULL
encoded as a value, so matching is an integer join whatever the key types are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import WriteKeyError

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.storage import DataFile

# Reads partition files: all their columns (None) or the named ones, in the dataset's schema.
ReadFiles = Callable[[Sequence["DataFile"], Sequence[str] | None], "pa.Table"]

_ROW = "__ap_row"


@dataclass(frozen=True, slots=True)
class MergeResult:
    """The rows after a merge and how they came about: `rows == kept + added`,
    `kept + removed == rows of the existing table`."""

    table: pa.Table
    kept: int  # existing rows left as they were
    removed: int  # existing rows whose key matched (replaced by an upsert, or deleted)
    added: int  # incoming rows added

    @property
    def rows(self) -> int:
        return self.table.num_rows


def check_key_columns(schema: pa.Schema, keys: Sequence[str], *, what: str = "upsert") -> tuple[str, ...]:
    """`keys` as a tuple, refused when empty, repeated, not in `schema`, or of a type that cannot be
    compared (nested types)."""
    import pyarrow as pa

    columns = tuple(keys)
    if not columns:
        raise WriteKeyError(
            f"{what} needs key columns: pass keys=[...] (CLI: --key COLUMN) or declare "
            "acceleration.primary_key in the spec"
        )
    repeated = sorted({c for c in columns if columns.count(c) > 1})
    if repeated:
        raise WriteKeyError(f"{what} key columns repeat {repeated}; name each column once")
    unknown = [c for c in columns if c not in schema.names]
    if unknown:
        raise WriteKeyError(
            f"{what} key column(s) {unknown} are not columns of the dataset (its columns: {schema.names})"
        )
    nested = [c for c in columns if pa.types.is_nested(schema.field(c).type)]
    if nested:
        raise WriteKeyError(f"{what} key column(s) {nested} are nested types, which cannot be keys")
    return columns


def comparable_keys(values: pa.Array) -> pa.Array:
    """`values` with the key values `IS NOT DISTINCT FROM` holds equal made identical: a float column's
    -0.0 as 0.0 and each NaN as one NaN (Arrow's hashing tells them apart by their bits). NULL stays NULL.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_floating(values.type):
        return values
    if pa.types.is_float16(values.type):
        values = values.cast(pa.float32())
    # IEEE: -0.0 + 0.0 is 0.0, every other value is unchanged (NaN stays a NaN, replaced next).
    zeroed = pc.add(values, pa.scalar(0.0, values.type))
    one_nan = pa.scalar(float("nan"), values.type)
    return pc.if_else(pc.is_nan(zeroed), one_nan, zeroed)


def _key_codes(left: pa.Table, right: pa.Table, keys: Sequence[str]) -> tuple[pa.Table, pa.Table]:
    """Integer codes of each key column, shared by both sides (NULL is a code too), plus row numbers."""
    import pyarrow as pa
    import pyarrow.compute as pc

    left_columns: dict[str, pa.Array] = {}
    right_columns: dict[str, pa.Array] = {}
    for position, name in enumerate(keys):
        left_values = left.column(name)
        right_values = right.column(name)
        if not left_values.type.equals(right_values.type):
            raise WriteKeyError(
                f"key column {name!r} is {left_values.type} on one side and {right_values.type} on the "
                "other; conform both sides to the dataset schema first"
            )
        both = pa.chunked_array([*left_values.chunks, *right_values.chunks], type=left_values.type)
        if pa.types.is_dictionary(both.type):
            both = both.cast(both.type.value_type)
        combined = both.combine_chunks() if both.num_chunks else pa.array([], both.type)
        codes = pc.dictionary_encode(comparable_keys(combined), null_encoding="encode").indices
        code_name = f"__ap_c{position}"
        left_columns[code_name] = codes.slice(0, left.num_rows)
        right_columns[code_name] = codes.slice(left.num_rows)
    left_columns[_ROW] = pa.array(range(left.num_rows), pa.int64())
    right_columns[_ROW] = pa.array(range(right.num_rows), pa.int64())
    return pa.table(left_columns), pa.table(right_columns)


def key_match_mask(table: pa.Table, key_rows: pa.Table, keys: Sequence[str]) -> pa.BooleanArray:
    """For each row of `table`: does its key appear among `key_rows`' keys (NULL-safe)?"""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows == 0 or key_rows.num_rows == 0:
        return pa.array([False] * table.num_rows, pa.bool_())
    left, right = _key_codes(table, key_rows, keys)
    code_names = [name for name in left.column_names if name != _ROW]
    if len(code_names) == 1:
        found = pc.is_in(left.column(code_names[0]), value_set=right.column(code_names[0]).combine_chunks())
        return found.combine_chunks() if isinstance(found, pa.ChunkedArray) else found
    matched = left.join(
        right.select(code_names).group_by(code_names).aggregate([]),
        keys=code_names,
        join_type="left semi",
        use_threads=False,
    )
    mask = pa.array([False] * table.num_rows, pa.bool_()).to_numpy(zero_copy_only=False).copy()
    mask[matched.column(_ROW).to_numpy()] = True
    return pa.array(mask, pa.bool_())


def duplicate_keys(table: pa.Table, keys: Sequence[str], *, limit: int = 5) -> list[tuple[object, ...]]:
    """Up to `limit` key values that occur more than once in `table` (NULL-safe)."""
    import pyarrow.compute as pc

    if table.num_rows < 2:
        return []
    codes, _ = _key_codes(table, table.slice(0, 0), keys)
    code_names = [name for name in codes.column_names if name != _ROW]
    counted = codes.group_by(code_names, use_threads=False).aggregate([(_ROW, "count"), (_ROW, "min")])
    repeated = counted.filter(pc.greater(counted.column(f"{_ROW}_count"), 1))
    if repeated.num_rows == 0:
        return []
    first_rows = repeated.column(f"{_ROW}_min").slice(0, limit)
    sample = table.select(list(keys)).take(first_rows)
    return [tuple(row[name] for name in keys) for row in sample.to_pylist()]


def check_unique_keys(table: pa.Table, keys: Sequence[str], *, what: str = "upsert") -> None:
    """Refuse incoming rows that repeat a key: which of them should win would be a guess."""
    repeated = duplicate_keys(table, keys)
    if repeated:
        raise WriteKeyError(
            f"{what} rows repeat key {list(keys)} values, e.g. {repeated}; each key may appear once per "
            "write (deduplicate the input, or append instead)"
        )


def upsert_rows(
    existing: pa.Table, incoming: pa.Table, keys: Sequence[str], *, replaces: pa.Table | None = None
) -> MergeResult:
    """`existing` without the rows whose key is in `replaces` (default `incoming`), then `incoming`.

    `replaces` lets a caller remove keys of rows that were routed to another partition (an upsert that
    moves a row: its old partition drops it, its new one receives it).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    matched = key_match_mask(existing, incoming if replaces is None else replaces, keys)
    kept = existing.filter(pc.invert(matched)) if existing.num_rows else existing
    removed = existing.num_rows - kept.num_rows
    if incoming.num_rows == 0:
        table = kept
    elif kept.num_rows == 0:
        table = incoming
    else:
        table = pa.concat_tables([kept, incoming])
    return MergeResult(table=table, kept=kept.num_rows, removed=removed, added=incoming.num_rows)


def delete_rows_by_key(existing: pa.Table, key_rows: pa.Table, keys: Sequence[str]) -> MergeResult:
    """`existing` without the rows whose key is among `key_rows`' keys."""
    import pyarrow.compute as pc

    matched = key_match_mask(existing, key_rows, keys)
    kept = existing.filter(pc.invert(matched)) if existing.num_rows else existing
    return MergeResult(table=kept, kept=kept.num_rows, removed=existing.num_rows - kept.num_rows, added=0)


def delete_rows_matching(existing: pa.Table, mask: pa.Array | pa.ChunkedArray) -> MergeResult:
    """`existing` without the rows where `mask` is TRUE (a NULL mask value keeps the row, as SQL's
    `DELETE ... WHERE` does)."""
    import pyarrow.compute as pc

    drop = pc.fill_null(mask, False)
    kept = existing.filter(pc.invert(drop)) if existing.num_rows else existing
    return MergeResult(table=kept, kept=kept.num_rows, removed=existing.num_rows - kept.num_rows, added=0)


# --- the one upsert / merge algorithm over a partition's files ---------------------------------------


@dataclass(frozen=True, slots=True)
class KeyRemoval:
    """A partition's files without the rows of some keys: the files kept as they are, the surviving rows
    of the files that held a key (None: no file did, or none was read), and the rows removed."""

    kept: list[DataFile]
    survivors: pa.Table | None
    removed: int


def remove_keys(
    files: Sequence[DataFile],
    read: ReadFiles,
    keys: Sequence[str],
    key_rows: pa.Table,
    *,
    keep_untouched: bool,
    probe_keys: bool = False,
) -> KeyRemoval:
    """The one upsert / merge rule, for writes (upsert), changes refreshes and the executors' merges:
    every key among `key_rows`' (NULL-safe, `key_match_mask`) leaves the partition whose committed files
    are `files`; the caller then adds the rows routed to it.

    `keep_untouched` (a write): a file that holds none of the keys stays as it is; it is ruled out by its
    column statistics, then (`probe_keys`) by reading its key columns, else by reading it. Without it (a
    changes refresh, which rewrites the whole partition) every file is read, in one read, and `survivors`
    holds all the rows kept.
    """
    import pyarrow as pa

    if not keep_untouched:
        if not files:
            return KeyRemoval([], None, 0)
        merged = delete_rows_by_key(read(files, None), key_rows, keys)
        return KeyRemoval([], merged.table, merged.removed)
    bounds = key_bounds(key_rows, keys)
    kept: list[DataFile] = []
    survivors: list[pa.Table] = []
    removed = 0
    for file in files:
        if not may_hold_keys(file, bounds):
            kept.append(file)
            continue
        if probe_keys and not key_match_mask(read([file], keys), key_rows, keys).true_count:
            kept.append(file)
            continue
        merged = delete_rows_by_key(read([file], None), key_rows, keys)
        if merged.removed == 0:
            kept.append(file)
            continue
        survivors.append(merged.table)
        removed += merged.removed
    if not survivors:
        return KeyRemoval(kept, None, 0)
    table = pa.concat_tables(survivors) if len(survivors) > 1 else survivors[0]
    return KeyRemoval(kept, table, removed)


def key_bounds(keys_table: pa.Table, keys: Sequence[str]) -> dict[str, tuple[Any, Any, bool] | None]:
    """Per key column: (min, max, has NULL) of the incoming keys (min / max None when all NULL), or None
    when the bounds cannot rule out a file: an unordered type, or a NaN key (min / max skip NaN, and
    file statistics leave NaN out, but a NaN key matches a NaN row)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    bounds: dict[str, tuple[Any, Any, bool] | None] = {}
    for name in keys:
        column = keys_table.column(name)
        if pa.types.is_floating(column.type) and pc.any(pc.is_nan(column)).as_py():
            bounds[name] = None
            continue
        try:
            extremes = pc.min_max(column)
            low, high = extremes["min"].as_py(), extremes["max"].as_py()
        except Exception:  # an unordered type: no bounds, every file may match
            bounds[name] = None
            continue
        bounds[name] = (low, high, column.null_count > 0)
    return bounds


def may_hold_keys(file: DataFile, bounds: Mapping[str, tuple[Any, Any, bool] | None]) -> bool:
    """Whether `file` may hold a row with one of the incoming keys, judged on its column statistics.

    Never rules out on doubt: a column without statistics, or bounds that do not compare, may match.
    """
    for name, bound in bounds.items():
        stats = file.stats.get(name)
        if stats is None or bound is None:
            continue
        low, high, has_null = bound
        null_may_match = has_null and stats.null_count > 0
        if low is None or high is None:
            values_may_match = low is None and high is None and not has_null  # unordered: keep
        elif stats.min is None or stats.max is None:
            values_may_match = stats.null_count < file.rows
        else:
            try:
                values_may_match = not (high < stats.min or low > stats.max)
            except TypeError:
                values_may_match = True
        if not (null_may_match or values_may_match):
            return False
    return True
