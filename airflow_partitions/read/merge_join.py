"""Sorted-merge joins of a split join's pair groups.

A bucketed dataset's partitions are written sorted by the bucket's source column (its default
`sort_by`), so the two sides of one pair group of a join on that key arrive sorted by the key. DuckDB
joins equalities only by hashing; a merge of the two sorted key columns finds the matching row pairs
for a fraction of that (Polars' join of sorted keys). Each pair group of an eligible join then runs as:

1. DuckDB reads each side's columns the statement uses (the same relation the hash join reads: the
   group's files, renames, NULL-filled columns) into Arrow;
2. the key columns are merged into the row positions of every matching pair (`join_indices`: NULL keys
   never match; a side that is not sorted is ordered first, so an appended or compacted partition stays
   correct, only slower);
3. each side's rows are taken in that order and the small join becomes a `POSITIONAL JOIN` of the two
   taken tables, under the very SELECT the hash join would run (`JoinSplit.branch_sql`).

Only the reads and the statements use the DuckDB connection: the merges and takes run on a worker
thread, one window of pair groups ahead, while DuckDB reads the next window and runs the statement over
the previous one. `merge_reason` says why a join keeps DuckDB's hash join.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import sys
import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from airflow_partitions.pruning.expressions import quote_identifier
from airflow_partitions.read.joins import JoinDecision, JoinSplit
from airflow_partitions.read.scan import ArrowStream

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

# Loading the merge (importing Polars, starting its threads) is paid once per process: ~0.3 s of CPU
# (measured: 0.44-0.47 s for python + Polars + a first join against 0.11 s for python + numpy). Like
# renting before buying, a process keeps the hash join until the mergeable joins it has run (this one
# included) total this many rows, about what the merge would have saved by then (~10 ns of CPU per row:
# 0.78 against 0.95-1.07 CPU s per 20M rows on `bench_joins`), then loads it: never more than about
# twice the better choice, whether the process runs one join or thousands.
MERGE_MIN_ROWS = 32_000_000
_hashed = [0]  # rows of mergeable joins this process ran with the hash join before loading the merge
_hashed_lock = threading.Lock()
_warmed_in: list[int | None] = [None]  # the process that started Polars' threads (`warm_up`)
# A pair group whose keys repeat so much that its join could hold more than this many rows per row of
# its two sides keeps DuckDB's hash join, which streams such a join's rows instead of holding them.
MAX_FANOUT = 4


@dataclass(frozen=True)
class MergeKeys:
    """The key column of each side (as the sides' relations name them) a merge join matches on."""

    left: str
    right: str


@dataclass(frozen=True)
class MergeChoice:
    """`merge_reason`'s answer: the keys (None: DuckDB's hash join), why; `deferred_rows`: the join's rows
    when only loading the merge held it back (the run counts them, `note_hashed`)."""

    keys: MergeKeys | None
    reason: str
    deferred_rows: int = 0


def merge_reason(
    decision: JoinDecision,
    schemas: Sequence[pa.Schema],
    selected_rows: int,
    *,
    enabled: bool,
    min_rows: int = MERGE_MIN_ROWS,
) -> MergeChoice:
    """Whether a streamed split join's pair groups are merged, on which keys, and why (or why DuckDB's
    hash join runs them)."""
    candidate = decision.candidate
    if not enabled:
        return MergeChoice(None, "merge joins are turned off (merge_joins=False)")
    if candidate is None or len(candidate.sides) != 2 or candidate.kind != "INNER":
        return MergeChoice(None, "only an inner join of two datasets is merged")
    if len(candidate.equalities) != 1 or candidate.residual:
        return MergeChoice(
            None, "the join condition is not a single key equality (other conditions need the hash join)"
        )
    (_, left), (_, right) = candidate.equalities[0]
    left_type, right_type = schemas[0].field(left).type, schemas[1].field(right).type
    if not mergeable_types(left_type, right_type):
        return MergeChoice(
            None,
            f"keys of types {left_type} and {right_type} are not merged (integers, dates, timestamps, "
            "strings, binaries)",
        )
    if importlib.util.find_spec("polars") is None:
        return MergeChoice(None, "Polars is not installed (pip install polars)")
    if _warmed_in[0] not in (None, os.getpid()):
        return MergeChoice(
            None, "the merge's threads were started before this process was forked (they do not survive it)"
        )
    total = hashed_rows() + selected_rows
    if not polars_loaded() and total < min_rows:
        return MergeChoice(
            None,
            f"this process's mergeable joins, this one's {selected_rows:,} selected rows included, total "
            f"{total:,} rows, under {min_rows:,}: loading the merge (Polars, once per process) would cost "
            "more than it has saved yet",
            deferred_rows=selected_rows,
        )
    return MergeChoice(
        MergeKeys(left, right),
        "the pair groups' sorted key columns merged (Polars), each group's rows then joined by position",
    )


def hashed_rows() -> int:
    """Rows of mergeable joins this process has run with the hash join, the merge not loaded yet."""
    return _hashed[0]


def note_hashed(rows: int) -> None:
    """A mergeable join of `rows` ran with the hash join because the merge was not loaded."""
    with _hashed_lock:
        _hashed[0] += rows


def polars_loaded() -> bool:
    """Whether this process has imported Polars already (a merge join then costs no load)."""
    return "polars" in sys.modules


def mergeable_types(left: pa.DataType, right: pa.DataType) -> bool:
    """Whether two key types compare equal in DuckDB exactly as the merge compares them: signed or
    unsigned integers up to 64 bits (uint64 excepted: it exceeds int64) as int64 values; one date or
    timestamp type on both sides, by its integer value; strings (or binaries) on both sides, byte by byte
    (DuckDB's default: no collation)."""

    def integer(t: pa.DataType) -> bool:
        return pa.types.is_integer(t) and not pa.types.is_uint64(t)

    if integer(left) and integer(right):
        return True
    if _text(left) or _text(right):
        return _text(left) == _text(right)
    temporal = pa.types.is_date32(left) or pa.types.is_date64(left) or pa.types.is_timestamp(left)
    return temporal and left.equals(right)


def _text(kind: pa.DataType) -> str | None:
    """Which text an Arrow type holds: "string" or "binary" (any offsets or views), else None."""
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return "string"
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind):
        return "binary"
    return None


def join_indices(
    left: pa.ChunkedArray | pa.Array, right: pa.ChunkedArray | pa.Array, max_fanout: float | None = None
) -> tuple[Any, Any] | None:
    """The row positions (into `left`, into `right`) of every pair of rows whose keys are equal, NULLs
    never equal: the rows of the inner join on the key, as numpy arrays of equal length (unsigned or
    int64 positions, every one within its side). None when `max_fanout` is given and the join could
    hold more rows than that many per row of both sides, found before anything of that size is
    allocated: the join's rows are the sum over keys of the two sides' counts, at most
    sqrt(sum of squared counts on the left x the same on the right) (Cauchy-Schwarz).
    """
    import polars as pl  # lazy: only a merge join loads Polars

    left_keys, left_rows = _keys(left)
    right_keys, right_rows = _keys(right)
    left_keys, left_order = _ascending(left_keys)
    right_keys, right_order = _ascending(right_keys)
    if max_fanout is not None:
        bound = math.sqrt(_squared_runs(left_keys) * _squared_runs(right_keys))
        if bound > max_fanout * max(1, len(left_keys) + len(right_keys)):
            return None
    # Both key columns ascend, which `set_sorted` tells Polars: it then merges instead of hashing.
    left_frame = pl.DataFrame({"k": left_keys}).with_row_index("i").with_columns(pl.col("k").set_sorted())
    right_frame = pl.DataFrame({"k": right_keys}).with_row_index("j").with_columns(pl.col("k").set_sorted())
    joined = left_frame.join(right_frame, on="k", how="inner")
    positions = []
    for column, order, rows in (("i", left_order, left_rows), ("j", right_order, right_rows)):
        found = joined.get_column(column).to_numpy()  # Polars' row index: uint32 (or uint64)
        if order is not None:
            found = order[found]
        if rows is not None:
            found = rows[found]
        positions.append(found)
    return positions[0], positions[1]


def _keys(column: pa.ChunkedArray | pa.Array) -> tuple[Any, np.ndarray | None]:
    """The non-NULL keys as a Polars series (integers, dates and timestamps as int64 values; strings and
    binaries as they are), and the positions of their rows (None: every row)."""
    import numpy as np
    import polars as pl  # lazy: only a merge join loads Polars

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    rows = None
    if array.null_count:
        rows = np.flatnonzero(array.is_valid().to_numpy(zero_copy_only=False))
        array = array.drop_null()
    kind = array.type
    text = _text(kind)
    if text is not None:
        wide = pa.large_string() if text == "string" else pa.large_binary()
        return pl.Series("k", array.cast(wide)), rows
    if pa.types.is_timestamp(kind) or pa.types.is_date64(kind):
        array = array.view(pa.int64())
    elif pa.types.is_date32(kind):
        array = array.view(pa.int32())
    values = array.cast(pa.int64()).to_numpy(zero_copy_only=False)
    return pl.Series("k", np.ascontiguousarray(values)), rows


def _squared_runs(values: Any) -> float:
    """The sum over the values of ascending `values` (a Polars series) of the square of each one's
    count (Polars' run lengths: numpy's temporaries cost several times as much in fresh pages)."""
    import polars as pl  # lazy: only a merge join loads Polars

    if len(values) == 0:
        return 0.0
    runs = values.rle().struct.field("len").cast(pl.Float64)
    return float(runs.pow(2).sum())


def _ascending(values: Any) -> tuple[Any, np.ndarray | None]:
    """`values` (a Polars series) in ascending order (bytes for strings), and the order taken as
    positions (None when they already ascend)."""
    import numpy as np

    if len(values) < 2 or values.is_sorted():
        return values, None
    order = values.arg_sort()
    return values.gather(order), order.to_numpy().astype(np.int64, copy=False)


# --- running ---------------------------------------------------------------------------------------


def merged_groups(
    connection: Any,
    split: JoinSplit,
    keys: MergeKeys,
    relations: Sequence[Sequence[str]],
    hash_branches: Sequence[str],
    window: int,
) -> MergedGroups | None:
    """The merge joins of a streamed split join's pair groups (`relations`: each group's relation of
    each side, as `multi._split_relations` gives them; `hash_branches`: each group's hash join over
    them, which a group the merge declines runs instead), each side reading the columns the rewritten
    statement uses (`candidate.flat`, filled by `rewrite_splits`) and its key.

    Loads Polars and starts its threads here, before the statement's memory guard caps the process's
    address space (their reservations are not the query's memory); None, with a warning, when Polars
    does not load (the hash joins run)."""
    candidate = split.decision.candidate
    assert candidate is not None
    columns: list[list[str]] = []
    for side, key in zip(candidate.sides, (keys.left, keys.right), strict=True):
        wanted = [c for (q, c), _ in candidate.flat.items() if q.lower() == side.qualifier.lower()]
        columns.append(list(dict.fromkeys([*wanted, key])))
    groups = [
        (MergeSide(group[0], tuple(columns[0])), MergeSide(group[1], tuple(columns[1])))
        for group in relations
    ]
    try:
        warm_up()
    except ImportError as err:  # an installation whose Polars does not load: the hash joins run
        log.warning("merge joins unavailable, the pair groups are hash-joined: %s", err)
        return None
    return MergedGroups(connection, split, keys, groups, hash_branches, window)


def warm_up() -> None:
    """Import Polars and run one small merge (its thread pool starts on first use)."""
    import polars as pl  # lazy: only a merge join loads Polars

    sorted_keys = pl.col("k").set_sorted()
    pl.DataFrame({"k": [1, 2]}).with_columns(sorted_keys).join(
        pl.DataFrame({"k": [2, 3]}).with_columns(sorted_keys), on="k", how="inner"
    )
    _warmed_in[0] = os.getpid()


@dataclass(frozen=True)
class MergeSide:
    """What one side of a pair group reads: its relation (SQL over the group's files), its columns."""

    relation: str
    columns: tuple[str, ...]  # as the relation names them, the key included


class MergedGroups:
    """The positional-join branches of a split join's pair groups, prepared a window ahead.

    `branches(start, stop)` returns the SQL of groups `start:stop` once their taken tables are
    registered on the connection (reading later groups' sides meanwhile, so the worker merges while
    DuckDB runs the statement); `release(start, stop)` drops them. `close()` ends the worker and drops
    whatever is still registered."""

    def __init__(
        self,
        connection: Any,
        split: JoinSplit,
        keys: MergeKeys,
        groups: Sequence[tuple[MergeSide, MergeSide]],
        hash_branches: Sequence[str],
        window: int,
    ) -> None:
        self._connection = connection
        self._split = split
        self._keys = keys
        self._groups = list(groups)
        self._hash_branches = list(hash_branches)
        self._window = max(1, window)
        self._prepared: dict[int, Future[tuple[pa.Table, pa.Table] | None]] = {}
        self._registered: dict[int, tuple[str, str]] = {}
        self._read = 0  # groups whose sides have been read and handed to the worker
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="ap-merge")

    def branches(self, start: int, stop: int) -> list[str]:
        """The small joins of groups `start:stop`: positional joins of their merged rows (registered on
        the connection), or a group's hash join where `_merge` declined it."""
        self._read_through(min(len(self._groups), stop + self._window))
        sql = []
        for index in range(start, stop):
            taken = self._prepared.pop(index).result()
            if taken is None:
                sql.append(self._hash_branches[index])
                continue
            base = f"ap_merge_{uuid.uuid4().hex[:12]}"
            pair = (f"{base}_l", f"{base}_r")
            for name, table in zip(pair, taken, strict=True):
                self._connection.register(name, ArrowStream(table))
            self._registered[index] = pair
            sql.append(self._split.branch_sql(*pair, positional=True))
        return sql

    def release(self, start: int, stop: int) -> None:
        for index in range(start, stop):
            for name in self._registered.pop(index, ()):
                self._connection.unregister(name)

    def close(self) -> None:
        for future in self._prepared.values():
            future.cancel()
        self._worker.shutdown(wait=True, cancel_futures=True)
        self.release(0, len(self._groups))

    def _read_through(self, stop: int) -> None:
        """Read the sides of groups up to `stop` (DuckDB, on the caller's thread) and hand each pair to
        the worker to merge and take."""
        while self._read < stop:
            left, right = self._groups[self._read]
            tables = [
                self._connection.sql(
                    "SELECT " + ", ".join(map(quote_identifier, side.columns)) + f" FROM ({side.relation})"
                ).to_arrow_table()
                for side in (left, right)
            ]
            self._prepared[self._read] = self._worker.submit(self._merge, tables[0], tables[1])
            self._read += 1

    def _merge(self, left: pa.Table, right: pa.Table) -> tuple[pa.Table, pa.Table] | None:
        """Each side's rows of the group's inner join, in matching order; None (the group's hash join)
        when the key columns as DuckDB read them (the files' types) do not merge, or their keys repeat
        past `MAX_FANOUT`."""
        import pyarrow.compute as pc

        left_keys, right_keys = left.column(self._keys.left), right.column(self._keys.right)
        if not mergeable_types(left_keys.type, right_keys.type):
            return None
        found = join_indices(left_keys, right_keys, MAX_FANOUT)
        if found is None:
            return None
        # The positions come from the sides' own row numbers: Arrow need not check their bounds again.
        return (
            pc.take(left, found[0], boundscheck=False),
            pc.take(right, found[1], boundscheck=False),
        )
