"""Merge joins of split joins' pair groups (`read.merge_join`), differential against DuckDB over the sources.

Datasets bucketed on integer, date, timestamp and string keys (NULL keys, keys repeated on both sides,
negative and extreme values, int32 against int64, hostile strings, partitions sorted by the key or not,
several files per partition; Parquet, DuckDB and Arrow IPC engines) are joined with every statement
shape that streams: each answer must equal DuckDB's over the two source tables, the plan must say the
pair groups were merged, and every pair group must have gone through the merge. Joins the merge does not
take keep the hash join, say why, and answer the same.
"""

from __future__ import annotations

import datetime as dt
import decimal
import os
import threading
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_pruning_support import build_datasets_spec

from airflow_partitions.read import merge_join, multi
from airflow_partitions.read.multi import DatasetQuery
from airflow_partitions.read.reader import datasets_query
from airflow_partitions.read.sandbox import QueryLimits

STRINGS = ["a/b", "k=v", "100%", "it's", '"q"', "", "Zürich", "日本", None]


def _table(count: int, seed: int, key: str, kind: pa.DataType) -> pa.Table:
    """`count` rows whose `key` repeats (about every value on both sides of a join, several times),
    with NULL keys, negative and extreme integers, and hostile payload."""
    values: list[Any] = []
    for i in range(count):
        if i % 13 == 4:
            values.append(None)
        elif i % 29 == 7:
            values.append(-(2**31) if kind == pa.int32() else -(2**62))
        else:
            values.append(((i * seed) % 61) - 20)
    if pa.types.is_date32(kind):
        values = [None if v is None else dt.date(2026, 1, 1) + dt.timedelta(days=v % 400) for v in values]
    elif pa.types.is_timestamp(kind):
        start = dt.datetime(2026, 3, 29, 0, 30, tzinfo=dt.UTC)
        values = [None if v is None else start + dt.timedelta(minutes=17 * (v % 300)) for v in values]
    return pa.table(
        {
            "id": pa.array(range(count), pa.int64()),
            key: pa.array(values, kind),
            "v": pa.array([None if i % 11 == 3 else (i * seed) % 50 for i in range(count)], pa.int64()),
            "s": pa.array([STRINGS[(i * seed) % len(STRINGS)] for i in range(count)], pa.string()),
        }
    )


def _strings(table: pa.Table, seed: int) -> pa.Table:
    """`table` with string keys `k`: hostile prefixes, a few hundred values, NULLs."""
    keys = [
        None if i % 13 == 4 else f"{STRINGS[(i * seed) % 8]}{(i * seed) % 53}" for i in range(table.num_rows)
    ]
    return table.set_column(1, "k", pa.array(keys, pa.string()))


def _decimals(table: pa.Table) -> pa.Table:
    keys = [None if v is None else decimal.Decimal(v % 40) / 4 for v in table.column("k").to_pylist()]
    return table.set_column(1, "k", pa.array(keys, pa.decimal128(10, 2)))


SORTED = {"sort_by": ["k"]}
# dataset -> (rows, partition fields, storage options, max rows per file)
LAYOUTS: dict[str, tuple[pa.Table, list[tuple[str, str]], dict[str, Any], int | None]] = {
    # Each partition sorted by the key, cut into several files.
    "ml": (_table(400, 7, "k", pa.int64()), [("kb", "bucket(8, k)")], SORTED, 20),
    # int32 keys, one sorted file per partition.
    "mr": (_table(300, 5, "k", pa.int32()), [("kb", "bucket(16, k)")], SORTED, None),
    # Unsorted partitions of several files: the merge orders each side first.
    "mu": (_table(350, 3, "k", pa.int64()), [("kb", "bucket(16, k)")], {}, 30),
    "dl": (_table(300, 3, "d", pa.date32()), [("db", "bucket(4, d)")], {"sort_by": ["d"]}, None),
    "dr": (_table(250, 7, "d", pa.date32()), [("db", "bucket(8, d)")], {}, 40),
    "tl": (_table(300, 5, "t", pa.timestamp("us", tz="UTC")), [("tb", "bucket(4, t)")], {}, None),
    "tr": (_table(250, 3, "t", pa.timestamp("us", tz="UTC")), [("tb", "bucket(4, t)")], {}, 35),
    # One key on 120 rows of each side (14,400 rows joined in its group): that group keeps the hash join.
    "hl": (
        _table(300, 7, "k", pa.int64()).set_column(1, "k", pa.array([5] * 120 + list(range(180)))),
        [("kb", "bucket(4, k)")],
        SORTED,
        None,
    ),
    "hr": (
        _table(260, 3, "k", pa.int64()).set_column(1, "k", pa.array(list(range(140)) + [5] * 120)),
        [("kb", "bucket(4, k)")],
        {},
        None,
    ),
    # Other engines: DuckDB files of one table each, Arrow IPC (unsorted, several files per partition).
    "ed": (_table(320, 11, "k", pa.int64()), [("kb", "bucket(16, k)")], {}, None),
    "ea": (_table(280, 13, "k", pa.int64()), [("kb", "bucket(8, k)")], {}, 25),
    # String keys (hostile, NULLs, repeated), one side sorted, the other not and cut into several files.
    "sl": (_strings(_table(300, 3, "k", pa.int64()), 3), [("kb", "bucket(8, k)")], SORTED, None),
    "sr": (_strings(_table(260, 5, "k", pa.int64()), 5), [("kb", "bucket(16, k)")], {}, 30),
    # Decimal keys: the hash join.
    "nl": (_decimals(_table(120, 3, "k", pa.int64())), [("kb", "bucket(4, k)")], {}, None),
    "nr": (_decimals(_table(100, 7, "k", pa.int64())), [("kb", "bucket(4, k)")], {}, None),
}


ENGINES = {"ed": "duckdb", "ea": "arrow"}


@pytest.fixture(scope="module", autouse=True)
def _split_small_joins() -> Any:
    """The datasets here are small: split their joins anyway (the size threshold has its own test)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(multi, "SPLIT_MIN_BYTES", 0)
        yield


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_datasets_spec(tmp_path_factory.mktemp("merge_joins"), LAYOUTS, "merge.yaml", ENGINES)


@pytest.fixture(scope="module")
def query(spec: Path) -> Any:
    with datasets_query(spec, merge_min_rows=0) as opened:
        yield opened


@pytest.fixture
def merges(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """The rows of each pair group the merge joined (one entry per `join_indices` call; None: the
    group's keys repeat too much and it keeps the hash join)."""
    calls: list[int | None] = []
    join_indices = merge_join.join_indices

    def counted(left: Any, right: Any, max_fanout: float | None = None) -> Any:
        found = join_indices(left, right, max_fanout)
        calls.append(None if found is None else len(found[0]))
        return found

    monkeypatch.setattr(merge_join, "join_indices", counted)
    return calls


def _oracle(sql: str) -> list[tuple[Any, ...]]:
    connection = duckdb.connect()
    connection.execute("SET TimeZone = 'UTC'")
    for name, (table, *_) in LAYOUTS.items():
        connection.register(name, table)
    return _canonical(connection.sql(sql).to_arrow_table())


def _canonical(table: pa.Table) -> list[tuple[Any, ...]]:
    rows = list(zip(*(column.to_pylist() for column in table.columns), strict=True))
    return sorted(rows, key=repr)


PAIRS = [
    ("ml", "mr", "k"),
    ("mu", "mr", "k"),
    ("ml", "mu", "k"),
    ("dl", "dr", "d"),
    ("tl", "tr", "t"),
    ("ml", "ed", "k"),
    ("ea", "mr", "k"),
    ("sl", "sr", "k"),
]
SHAPES = [
    "SELECT count(*) AS n, sum(a.v) AS s, min(b.v), max(a.id), count(b.v) FROM {l} a JOIN {r} b "
    "ON a.{k} = b.{k}",
    "SELECT a.id, b.id AS rid, a.{k}, b.s, a.v FROM {l} a JOIN {r} b ON a.{k} = b.{k} "
    "WHERE a.v < 40 OR b.v IS NULL",
    "SELECT {k}, count(*) AS n, sum(b.v), max(a.s) FROM {l} a JOIN {r} b USING ({k}) GROUP BY 1",
    "SELECT * FROM {l} a JOIN {r} b ON b.{k} = a.{k}",
    "SELECT count(*) FROM {l} JOIN {r} USING ({k})",
]


@pytest.mark.parametrize(("left", "right", "key"), PAIRS, ids=[f"{p[0]}-{p[1]}" for p in PAIRS])
@pytest.mark.parametrize("shape", SHAPES, ids=["aggregates", "rows", "grouped", "star", "count"])
def test_merged_pair_groups_equal_duckdb_over_the_sources(
    query: DatasetQuery, merges: list[int | None], left: str, right: str, key: str, shape: str
) -> None:
    sql = shape.format(l=left, r=right, k=key)
    plan = query.plan(sql)
    assert plan.joins[0].split, plan.explain()
    assert plan.streamed, plan.explain()
    assert plan.merge is not None, plan.explain()
    assert "  pair joins: sorted merge: " in plan.explain()
    assert plan.to_json()["split_statements"]["pair_join"] == "merge"
    got = _canonical(query.query(sql))
    assert got == _oracle(sql), f"{sql}\n{plan.explain()}"
    assert len(merges) == len(plan.joins[0].pairs), "every pair group merged"
    assert None not in merges, merges
    assert sum(m for m in merges if m is not None) > 0


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        (
            "SELECT count(*), sum(b.v) FROM ml a LEFT JOIN mr b ON a.k = b.k",
            "only an inner join of two datasets is merged",
        ),
        (
            "SELECT count(*), sum(b.v) FROM ml a JOIN mr b ON a.k = b.k AND a.v < b.v",
            "not a single key equality",
        ),
        (
            "SELECT count(*), max(a.s) FROM nl a JOIN nr b ON a.k = b.k",
            "keys of types decimal128(10, 2) and decimal128(10, 2)",
        ),
    ],
    ids=["left", "residual-on", "decimals"],
)
def test_joins_the_merge_does_not_take_keep_the_hash_join_and_say_why(
    query: DatasetQuery, merges: list[int | None], sql: str, reason: str
) -> None:
    plan = query.plan(sql)
    assert plan.joins[0].split, plan.explain()
    assert plan.streamed, plan.explain()
    assert plan.merge is None
    assert f"  pair joins: hash join: {plan.merge_reason}" in plan.explain()
    assert reason in plan.merge_reason
    assert _canonical(query.query(sql)) == _oracle(sql)
    assert merges == []


def test_a_pair_group_whose_keys_repeat_past_the_fanout_keeps_the_hash_join(
    query: DatasetQuery, merges: list[int | None]
) -> None:
    """The join of the group holding key 5 would hold 14,400 rows for its ~300: instead of taking them
    into memory, that group runs DuckDB's hash join (which streams them); the others merge."""
    for sql in (SHAPES[0].format(l="hl", r="hr", k="k"), SHAPES[1].format(l="hl", r="hr", k="k")):
        merges.clear()
        plan = query.plan(sql)
        assert plan.merge is not None, plan.explain()
        assert _canonical(query.query(sql)) == _oracle(sql)
        assert merges.count(None) == 1, merges
        assert len(merges) == len(plan.joins[0].pairs) > 1
    repeated = pa.array([7] * 50, pa.int64())
    assert merge_join.join_indices(repeated, repeated, merge_join.MAX_FANOUT) is None
    rows, other = merge_join.join_indices(repeated, repeated)
    assert len(rows) == len(other) == 2500


def test_merge_joins_turned_off_or_loaded_once_they_would_have_paid(
    spec: Path, merges: list[int | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`merge_joins=False` keeps the hash join. A process that has not loaded the merge keeps the hash
    join until its mergeable joins (plans do not count, queries do) total `merge_min_rows` rows, the
    query that reaches it included; then it merges."""
    sql = SHAPES[0].format(l="ml", r="mr", k="k")  # 700 selected rows
    with datasets_query(spec, merge_joins=False, merge_min_rows=0) as off:
        assert "turned off (merge_joins=False)" in off.plan(sql).merge_reason
        assert _canonical(off.query(sql)) == _oracle(sql)
    assert merges == []
    loaded = [False]
    monkeypatch.setattr(merge_join, "polars_loaded", lambda: loaded[0])
    monkeypatch.setattr(merge_join, "_hashed", [0])
    with datasets_query(spec, merge_min_rows=2_000) as rented:
        for total, run in ((700, False), (700, True), (1_400, True)):  # a plan alone counts nothing
            reason = rented.plan(sql).merge_reason
            assert f"total {total:,} rows, under 2,000" in reason, reason
            if run:
                assert _canonical(rented.query(sql)) == _oracle(sql)
                assert merges == []
        assert merge_join.hashed_rows() == 1_400
        plan = rented.plan(sql)  # 2,100 rows with this one: the merge loads
        assert plan.merge is not None, plan.merge_reason
        assert _canonical(rented.query(sql)) == _oracle(sql)
        assert len(merges) == len(plan.joins[0].pairs)
        assert merge_join.hashed_rows() == 1_400, "a merged join is not counted"
        loaded[0] = True
        merge_join._hashed[0] = 0
        assert rented.plan(sql).merge is not None, "loaded: merged at any size"


def test_a_process_forked_after_the_merge_started_its_threads_keeps_the_hash_join(
    query: DatasetQuery, merges: list[int | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Polars' thread pool does not survive a fork: a child of a process that merged keeps the hash join
    (a forked Airflow task of a parent that ran a merge join), and says why."""
    sql = SHAPES[0].format(l="ml", r="mr", k="k")
    assert query.plan(sql).merge is not None
    monkeypatch.setattr(merge_join, "_warmed_in", [os.getpid() + 1])
    plan = query.plan(sql)
    assert plan.merge is None
    assert "started before this process was forked" in plan.merge_reason
    assert _canonical(query.query(sql)) == _oracle(sql)
    assert merges == []


def test_a_merge_whose_polars_does_not_load_falls_back_to_the_hash_join(
    query: DatasetQuery, merges: list[int | None], monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    def broken() -> None:
        raise ImportError("polars: this CPU lacks the instructions the build needs")

    monkeypatch.setattr(merge_join, "warm_up", broken)
    sql = SHAPES[0].format(l="ml", r="mr", k="k")
    assert query.plan(sql).merge is not None
    with caplog.at_level("WARNING", logger=merge_join.__name__):
        assert _canonical(query.query(sql)) == _oracle(sql)
    assert merges == []
    assert "merge joins unavailable" in caplog.text
    assert "lacks the instructions" in caplog.text


def test_a_failed_merge_fails_the_query_and_leaves_nothing_behind(
    query: DatasetQuery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merge that fails mid-way (the third pair group) ends the query with its error; the worker
    thread ends and no merged table stays registered; the next query answers in full."""
    sql = SHAPES[1].format(l="ml", r="mu", k="k")
    join_indices = merge_join.join_indices
    calls: list[int] = []

    def failing(left: Any, right: Any, max_fanout: float | None = None) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("merge failed on purpose")
        return join_indices(left, right, max_fanout)

    monkeypatch.setattr(merge_join, "join_indices", failing)
    with pytest.raises(RuntimeError, match="merge failed on purpose"):
        query.query(sql)
    assert not [t for t in threading.enumerate() if t.name.startswith("ap-merge")]
    monkeypatch.setattr(merge_join, "join_indices", join_indices)
    assert _canonical(query.query(sql)) == _oracle(sql)
    assert not [t for t in threading.enumerate() if t.name.startswith("ap-merge")]


def test_merged_tables_are_dropped_window_by_window(
    query: DatasetQuery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each window's merged tables are registered while its statement runs and dropped after: at most
    two windows' worth at a time (the one running and the one read ahead), none after the query."""
    live: set[str] = set()
    peak = [0]
    register = merge_join.MergedGroups.branches
    release = merge_join.MergedGroups.release

    def branches(self: Any, start: int, stop: int) -> list[str]:
        sql = register(self, start, stop)
        live.update(name for pair in self._registered.values() for name in pair)
        peak[0] = max(peak[0], len(self._registered))
        return sql

    def released(self: Any, start: int, stop: int) -> None:
        for index in range(start, stop):
            live.difference_update(self._registered.get(index, ()))
        release(self, start, stop)

    monkeypatch.setattr(merge_join.MergedGroups, "branches", branches)
    monkeypatch.setattr(merge_join.MergedGroups, "release", released)
    sql = SHAPES[0].format(l="ml", r="mu", k="k")
    with datasets_query(query.project, merge_min_rows=0, groups_per_statement=2) as windowed:
        assert _canonical(windowed.query(sql)) == _oracle(sql)
    assert peak[0] == 2, peak
    assert live == set()


def test_a_merge_join_runs_under_a_small_memory_limit(spec: Path) -> None:
    """The query's memory guard caps the address space while the statements run: Polars is loaded and
    its threads started before, so a merge under a small limit answers instead of failing to allocate."""
    sql = SHAPES[2].format(l="dl", r="dr", k="d")
    with datasets_query(spec, merge_min_rows=0, query_limits=QueryLimits(memory_limit="200MB")) as small:
        assert small.plan(sql).merge is not None
        assert _canonical(small.query(sql)) == _oracle(sql)


KEYS = st.one_of(st.none(), st.integers(-5, 5), st.sampled_from([-(2**63), 2**63 - 1, 0]))


@settings(max_examples=150, deadline=None)
@given(
    left=st.lists(KEYS, max_size=40),
    right=st.lists(KEYS, max_size=40),
    chunk=st.integers(1, 7),
    kind=st.sampled_from([pa.int64(), pa.int32(), pa.uint32(), pa.int8()]),
)
def test_join_indices_are_exactly_the_inner_join_of_the_keys(
    left: list[int | None], right: list[int | None], chunk: int, kind: pa.DataType
) -> None:
    """Every pair of positions whose keys are equal, once; NULL never equal; any order, any chunking."""

    def fit(values: list[int | None]) -> list[int | None]:
        low, high = (
            (0, 2**32 - 1)
            if kind == pa.uint32()
            else (-(2 ** (kind.bit_width - 1)), 2 ** (kind.bit_width - 1) - 1)
        )
        return [None if v is None else min(max(v, low), high) for v in values]

    left, right = fit(left), fit(right)
    chunked = pa.chunked_array(
        [pa.array(left[i : i + chunk], kind) for i in range(0, len(left), chunk)] or [pa.array([], kind)],
        kind,
    )
    rows, other = merge_join.join_indices(chunked, pa.array(right, pa.int64()))
    got = sorted(zip(rows.tolist(), other.tolist(), strict=True))
    expected = sorted(
        (i, j) for i, a in enumerate(left) for j, b in enumerate(right) if a is not None and a == b
    )
    assert got == expected


def test_join_indices_of_dates_and_timestamps() -> None:
    day = dt.date(2026, 3, 29)
    left = pa.array([day, None, day - dt.timedelta(days=1), day, dt.date(1969, 12, 31)], pa.date32())
    right = pa.array([dt.date(1969, 12, 31), day, None, day], pa.date32())
    rows, other = merge_join.join_indices(left, right)
    assert sorted(zip(rows.tolist(), other.tolist(), strict=True)) == [(0, 1), (0, 3), (3, 1), (3, 3), (4, 0)]
    moment = dt.datetime(2026, 3, 29, 1, 30, tzinfo=dt.UTC)
    stamps = pa.array([moment, None, moment - dt.timedelta(microseconds=1)], pa.timestamp("us", tz="UTC"))
    rows, other = merge_join.join_indices(stamps, stamps)
    assert sorted(zip(rows.tolist(), other.tolist(), strict=True)) == [(0, 0), (2, 2)]


TEXT = st.one_of(
    st.none(), st.sampled_from(["", "a", "a/b", "k=v", "100%", "it's", "Zürich", "日本", "ab", "b"])
)


@settings(max_examples=100, deadline=None)
@given(
    left=st.lists(TEXT, max_size=30),
    right=st.lists(TEXT, max_size=30),
    wide=st.booleans(),
    binary=st.booleans(),
)
def test_join_indices_of_strings_are_exactly_the_inner_join_of_the_keys(
    left: list[str | None], right: list[str | None], wide: bool, binary: bool
) -> None:
    """Strings (or their UTF-8 bytes) match byte for byte, in any order, string against large_string."""
    kinds = (pa.large_binary(), pa.binary()) if binary else (pa.large_string(), pa.string())

    def values(keys: list[str | None]) -> list[Any]:
        return [None if k is None else (k.encode() if binary else k) for k in keys]

    found = merge_join.join_indices(
        pa.array(values(left), kinds[0] if wide else kinds[1]), pa.array(values(right), kinds[1])
    )
    assert found is not None
    got = sorted(zip(found[0].tolist(), found[1].tolist(), strict=True))
    expected = sorted(
        (i, j) for i, a in enumerate(left) for j, b in enumerate(right) if a is not None and a == b
    )
    assert got == expected
    assert merge_join.mergeable_types(kinds[0], kinds[1])
    assert not merge_join.mergeable_types(pa.string(), pa.binary())
    assert not merge_join.mergeable_types(pa.string(), pa.int64())
