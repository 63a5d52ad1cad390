"""Multi-dataset queries and partition-wise joins, differential against DuckDB over the sources.

Pairs of datasets of one spec with compatible layouts (bucket 8 vs 16, day vs month, identity vs
identity) and incompatible ones (bucket 4 vs 6, identity vs bucket) are joined inner / left / right /
full, with hostile string keys (`/`, `=`, `%`, quotes, unicode, empty) and NULL join keys: every answer
must equal DuckDB's over the two source tables, and the plan must say which joins were split and why.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from test_pruning_support import build_datasets_spec

from airflow_partitions.catalog import PartitionEntry
from airflow_partitions.cli.main import main
from airflow_partitions.exceptions import FilterError, QueryLimitError, UnsafeQueryError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.read import PartitionedDatasetReader, multi
from airflow_partitions.read.multi import DatasetQuery, DatasetQueryPlan
from airflow_partitions.read.reader import datasets_query
from airflow_partitions.read.sandbox import QueryLimits
from airflow_partitions.storage import get_storage

KEYS = [
    "a",
    "a/b",
    "k=v",
    "100%",
    "it's",
    '"q"',
    "",
    "Zürich",
    "日本",
    "x y",
    *[f"k{i}" for i in range(12)],
    None,
]
UTC = dt.UTC


def _rows(count: int, seed: int) -> pa.Table:
    keys = [KEYS[(i * seed + i // 3) % len(KEYS)] for i in range(count)]
    start = dt.datetime(2026, 1, 28, 5, 30, tzinfo=UTC)
    times = [
        None if i % 11 == 0 else start + dt.timedelta(hours=(i * seed * 7) % (24 * 70)) for i in range(count)
    ]
    return pa.table(
        {
            "id": pa.array(range(count), pa.int64()),
            "k": pa.array(keys, pa.string()),
            "ts": pa.array(times, pa.timestamp("us", tz="UTC")),
            "v": pa.array([None if i % 13 == 5 else (i * seed) % 50 for i in range(count)], pa.int64()),
            # Negative and positive integers around the truncate widths' boundaries, and NULLs.
            "n": pa.array(
                [None if i % 17 == 3 else (i * seed * 37) % 640 - 320 for i in range(count)], pa.int64()
            ),
        }
    )


def _sparse(count: int, *, low_half: bool) -> pa.Table:
    """Keys in the low (or high) half of each hundred from -300 to 299, and in group -100 anywhere."""
    keys = []
    for i in range(count):
        if i % 9 == 4:
            keys.append(None)
            continue
        group = (i % 6) * 100 - 300
        offset = (i * 7) % 50 + (0 if low_half else 50)
        keys.append(group + (i * 13) % 100 if group == -100 else group + offset)
    return pa.table({"id": pa.array(range(count), pa.int64()), "n": pa.array(keys, pa.int64())})


# dataset -> (rows, partition fields)
LAYOUTS: dict[str, tuple[pa.Table, list[tuple[str, str]]]] = {
    "l_b8": (_rows(90, 3), [("kb", "bucket(8, k)")]),
    "r_b16": (_rows(70, 5), [("kb", "bucket(16, k)")]),
    "l_b4": (_rows(60, 7), [("kb", "bucket(4, k)")]),
    "r_b6": (_rows(60, 5), [("kb", "bucket(6, k)")]),
    "l_id": (_rows(80, 7), [("kk", "k")]),
    "r_id": (_rows(50, 3), [("kk", "k")]),
    "l_day": (_rows(90, 5), [("d", "date_trunc('day', ts)")]),
    "r_month": (_rows(70, 3), [("m", "date_trunc('month', ts)")]),
    "l_t10": (_rows(90, 7), [("nt", "truncate(10, n)")]),
    "r_t100": (_rows(80, 3), [("nt", "truncate(100, n)")]),
    "r_t15": (_rows(60, 5), [("nt", "truncate(15, n)")]),
    "l_s2": (_rows(70, 5), [("ks", "truncate(2, k)")]),
    "r_s4": (_rows(60, 7), [("ks", "truncate(4, k)")]),
    # Third sides of joins of three datasets.
    "x_b32": (_rows(80, 11), [("kb", "bucket(32, k)")]),
    "x_id": (_rows(60, 11), [("kk", "k")]),
    "x_hour": (_rows(80, 3), [("h", "date_trunc('hour', ts)")]),
    # Key ranges that meet in one truncate(100) group only (-100..-1 on both sides), NULL keys too.
    "l_lo": (_sparse(60, low_half=True), [("nt", "truncate(100, n)")]),
    "r_hi": (_sparse(50, low_half=False), [("nt", "truncate(10, n)")]),
}


@pytest.fixture(scope="module", autouse=True)
def _split_small_joins() -> Any:
    """The datasets here are small: split their joins anyway (the size threshold has its own test)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(multi, "SPLIT_MIN_BYTES", 0)
        yield


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One spec with every layout's dataset, each written and committed as a refresh would."""
    return build_datasets_spec(tmp_path_factory.mktemp("joins"), LAYOUTS, "joins.yaml")


@pytest.fixture(scope="module")
def query(spec: Path) -> Any:
    with datasets_query(spec) as opened:
        yield opened


@pytest.fixture
def streamed_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(pair groups, groups per statement) of each streamed run of a split join's statement."""
    runs: list[tuple[int, int]] = []
    run_streamed = multi._run_streamed

    def counted(
        connection: Any, statement: str, view: str, branches: Any, kinds: Any, window: int = 1, **named: Any
    ) -> pa.Table:
        runs.append((len(branches), window))
        return run_streamed(connection, statement, view, branches, kinds, window, **named)

    monkeypatch.setattr(multi, "_run_streamed", counted)
    return runs


def _oracle(sql: str) -> list[tuple[Any, ...]]:
    connection = duckdb.connect()
    connection.execute("SET TimeZone = 'UTC'")
    for name, (table, _) in LAYOUTS.items():
        connection.register(name, table)
    return _canonical(connection.sql(sql).to_arrow_table())


def _canonical(table: pa.Table) -> list[tuple[Any, ...]]:
    rows = (
        list(zip(*(column.to_pylist() for column in table.columns), strict=True)) if table.num_columns else []
    )
    return sorted(rows, key=repr)


# (left, right, split expected, reason fragment)
PAIRS = [
    ("l_b8", "r_b16", True, "bucket(8, k) vs bucket(16, k) are compatible"),
    ("l_b4", "r_b6", False, "bucket 4 vs 6, neither divides the other"),
    ("l_day", "r_month", True, "date_trunc('day', ts) vs date_trunc('month', ts) are compatible"),
    ("l_id", "r_id", True, "k vs k are compatible"),
    ("l_id", "r_b16", False, "k vs bucket(16, k): different transforms"),
    ("l_t10", "r_t100", True, "truncate(10, n) vs truncate(100, n) are compatible"),
    ("l_t10", "r_t15", False, "truncate 10 vs 15, neither width divides the other"),
    ("l_s2", "r_s4", True, "truncate(2, k) vs truncate(4, k) are compatible"),
]
SHAPES = [
    "SELECT count(*) AS n FROM {l} JOIN {r} USING ({key})",
    "SELECT a.id, b.id AS rid, a.{key}, b.v FROM {l} a LEFT JOIN {r} b ON a.{key} = b.{key}",
    "SELECT b.{key}, count(a.id), sum(b.v) AS s FROM {l} a RIGHT JOIN {r} b "
    "ON a.{key} = b.{key} AND a.v >= b.v GROUP BY b.{key}",
    "SELECT * FROM {l} a FULL OUTER JOIN {r} b ON b.{key} = a.{key} "
    "WHERE a.id IS NULL OR b.id IS NULL OR a.v < 20",
    "SELECT {key}, count(*), max({r}.v) FROM {l} FULL JOIN {r} USING ({key}) GROUP BY ALL",
    "SELECT count(*), count(DISTINCT a.id), sum(a.v * b.v) FROM {l} a JOIN {r} b ON a.{key} = b.{key} "
    "WHERE a.{key} IN ({values})",
]


def _join_key(left: str) -> str:
    return {"l_day": "ts", "l_t10": "n"}.get(left, "k")


def _values(left: str) -> str:
    if left == "l_t10":
        return "-320, -301, -300, -1, 0, 9, 10, 99, 100, 317"
    if left == "l_day":
        return "TIMESTAMPTZ '2026-02-03 12:30:00+00', TIMESTAMPTZ '2026-03-30 21:30:00+00'"
    return "'k=v', '100%', 'it''s', 'Zürich', ''"


@pytest.mark.parametrize(("left", "right", "split", "reason"), PAIRS, ids=[f"{p[0]}-{p[1]}" for p in PAIRS])
@pytest.mark.parametrize(
    "shape", SHAPES, ids=["inner-using", "left", "right-extra-on", "full-star", "full-using", "filtered"]
)
def test_every_join_equals_duckdb_over_the_sources(
    query: DatasetQuery, left: str, right: str, split: bool, reason: str, shape: str
) -> None:
    key = _join_key(left)
    sql = shape.format(l=left, r=right, key=key, values=_values(left))
    plan = query.plan(sql)
    assert [d.split for d in plan.joins] == [split], plan.explain()
    assert reason in plan.joins[0].reason, plan.explain()
    got = query.query(sql)
    expected = _oracle(sql)
    assert _canonical(got) == expected, f"{sql}\n{plan.explain()}"
    assert got.column_names == duckdb_names(sql), "output names are DuckDB's for the plain statement"
    unsplit = query.query(sql, split_joins=False)
    assert _canonical(unsplit) == expected


# (first, second, third, split expected, reason fragment): three datasets joined on one key.
TRIPLES = [
    ("l_b8", "r_b16", "x_b32", True, "bucket(8, k) vs bucket(16, k) vs bucket(32, k) are compatible"),
    ("x_b32", "l_b8", "r_b16", True, "bucket(32, k) vs bucket(8, k) vs bucket(16, k) are compatible"),
    ("l_id", "r_id", "x_id", True, "k vs k vs k are compatible"),
    ("x_hour", "l_day", "r_month", True, "are compatible"),
    ("l_b8", "r_b16", "r_b6", False, "neither divides the other"),
    ("l_id", "x_id", "r_b16", False, "different transforms"),
]
TRIPLE_SHAPES = [
    "SELECT count(*) AS n FROM {a} JOIN {b} ON {a}.{key} = {b}.{key} JOIN {c} ON {c}.{key} = {b}.{key}",
    "SELECT x.id, y.id AS yid, z.id AS zid, {key}, z.v FROM {a} x JOIN {b} y USING ({key}) "
    "JOIN {c} z USING ({key})",
    "SELECT x.{key}, count(*) AS n, sum(y.v) AS s, max(z.id) AS m FROM {a} x "
    "JOIN {b} y ON x.{key} = y.{key} AND x.v >= y.v JOIN {c} z ON z.{key} = x.{key} GROUP BY x.{key}",
    "SELECT * FROM {a} x JOIN {b} y ON x.{key} = y.{key} JOIN {c} z ON y.{key} = z.{key} AND z.v <> x.v "
    "WHERE x.{key} IN ({values}) OR z.v < 5",
]


@pytest.mark.parametrize(("a", "b", "c", "split", "reason"), TRIPLES, ids=["-".join(t[:3]) for t in TRIPLES])
@pytest.mark.parametrize(
    "shape", TRIPLE_SHAPES, ids=["count", "using-chain", "group-by-key", "star-filtered"]
)
def test_joins_of_three_datasets_equal_duckdb_over_the_sources(
    query: DatasetQuery, a: str, b: str, c: str, split: bool, reason: str, shape: str
) -> None:
    key = "ts" if "x_hour" in (a, b, c) else "k"
    values = _values("l_day" if key == "ts" else "l_b8")
    sql = shape.format(a=a, b=b, c=c, key=key, values=values)
    plan = query.plan(sql)
    assert [d.split for d in plan.joins] == [split], plan.explain()
    assert reason in plan.joins[0].reason, plan.explain()
    expected = _oracle(sql)
    assert _canonical(query.query(sql)) == expected, f"{sql}\n{plan.explain()}"
    assert _canonical(query.query(sql, split_joins=False)) == expected
    if split:
        assert all(len(pair.partitions) == 3 for pair in plan.joins[0].pairs)
        assert re.search(r"\n  pair group .*: \d+ x \d+ x \d+ partition\(s\)", plan.explain())


def test_three_bucket_layouts_group_under_the_coarsest(query: DatasetQuery) -> None:
    sql = "SELECT count(*) AS n FROM r_b16 a JOIN x_b32 b ON a.k = b.k JOIN l_b8 c ON c.k = b.k"
    plan = query.plan(sql)
    (decision,) = plan.joins
    assert decision.split, plan.explain()
    assert len(decision.pairs) > 1
    for pair in decision.pairs:
        (group,) = pair.groups
        coarse = int(group)
        assert coarse < 8, "a group is a bucket of the coarsest layout, bucket(8)"
        sixteen, thirty_two, eight = pair.partitions
        assert [int(p.split("=")[1]) for p in eight] == [coarse]
        assert {int(p.split("=")[1]) % 8 for p in sixteen + thirty_two} == {coarse}
        assert not any("NULL" in p for side in pair.partitions for p in side), "an inner join skips NULL"
    assert query.query(sql).to_pylist()[0]["n"] == _oracle(sql)[0][0] > 0
    assert plan.to_json()["joins"][0]["more"] == [{"dataset": "l_b8", "as": "c"}]


def duckdb_names(sql: str) -> list[str]:
    connection = duckdb.connect()
    for name, (table, _) in LAYOUTS.items():
        connection.register(name, table)
    return connection.sql(sql).columns


def test_outer_joins_emit_null_key_rows_exactly_once(query: DatasetQuery) -> None:
    sql = "SELECT a.id, b.id FROM l_b8 a FULL JOIN r_b16 b ON a.k = b.k WHERE a.k IS NULL AND b.k IS NULL"
    got = _canonical(query.query(sql))
    left_nulls = LAYOUTS["l_b8"][0].column("k").null_count
    right_nulls = LAYOUTS["r_b16"][0].column("k").null_count
    assert left_nulls, "the data holds NULL keys on the left"
    assert right_nulls, "the data holds NULL keys on the right"
    assert len(got) == left_nulls + right_nulls, "each NULL-key row once, never matched to another"
    assert got == _oracle(sql)
    groups = query.plan(sql).joins[0].pairs
    assert any("NULL" in pair.groups for pair in groups), "NULL partitions form a group of the full join"
    inner = query.plan("SELECT count(*) FROM l_b8 a JOIN r_b16 b ON a.k = b.k").joins[0].pairs
    assert all("NULL" not in pair.groups for pair in inner), "an inner join skips the NULL partitions"


def test_coarse_bucket_groups_hold_the_fine_buckets_it_divides(query: DatasetQuery) -> None:
    plan = query.plan("SELECT count(*) FROM l_b8 a JOIN r_b16 b ON a.k = b.k")
    for pair in plan.joins[0].pairs:
        (group,) = pair.groups
        coarse = int(group)
        assert {int(p.split("=")[1]) % 8 for p in pair.right_partitions} <= {coarse}
        assert all(int(p.split("=")[1]) == coarse for p in pair.left_partitions)


def test_coarse_truncate_groups_hold_the_fine_ranges_it_divides(query: DatasetQuery) -> None:
    sql = "SELECT count(*) AS n FROM l_t10 a JOIN r_t100 b ON a.n = b.n"
    plan = query.plan(sql)
    (decision,) = plan.joins
    assert decision.split, plan.explain()
    assert len(decision.pairs) > 2
    for pair in decision.pairs:
        (group,) = pair.groups
        coarse = int(group)
        assert coarse % 100 == 0
        assert {int(p.split("=")[1]) // 100 * 100 for p in pair.left_partitions} == {coarse}
        assert [int(p.split("=")[1]) for p in pair.right_partitions] == [coarse]
    matched = query.query(sql).to_pylist()[0]["n"]
    assert matched == _oracle(sql)[0][0] > 0, "the data has matching keys across groups"


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT count(*) FROM l_b8 a JOIN r_b16 b ON a.k < b.k", "non-equi join"),
        ("SELECT count(*) FROM l_b8 a JOIN r_b16 b ON a.v = b.v", "not partitioned on v"),
        ("SELECT count(*) FROM l_b8 a SEMI JOIN r_b16 b ON a.k = b.k", "SEMI join"),
        ("SELECT count(*) FROM l_b8 a NATURAL JOIN r_b16 b", "NATURAL join"),
        (
            "SELECT count(*) FROM l_b8 a JOIN r_b16 b ON a.k = b.k JOIN r_id c ON c.k = a.k",
            "bucket(8, k) vs k: different transforms",
        ),
        (
            "SELECT count(*) FROM l_b8 a JOIN r_b16 b ON a.k = b.k LEFT JOIN x_b32 c ON c.k = a.k",
            "split only when every join is inner",
        ),
        (
            "SELECT count(*) FROM l_b8 a JOIN r_b16 b ON a.k = b.k JOIN x_b32 c ON c.v = a.v",
            "do not reach x_b32",
        ),
        (
            "SELECT count(*) FROM l_b8 a JOIN r_b16 b ON a.k = b.k, (SELECT 1) AS c",
            "joining datasets alone",
        ),
        ("SELECT a.id, (SELECT 1) FROM l_b8 a JOIN r_b16 b ON a.k = b.k", "subquery"),
    ],
)
def test_unsplittable_shapes_fall_back_and_say_why(query: DatasetQuery, sql: str, reason: str) -> None:
    plan = query.plan(sql)
    assert plan.joins, plan.explain()
    assert not plan.joins[0].split
    assert reason in plan.joins[0].reason, plan.joins[0].reason
    assert _canonical(query.query(sql)) == _oracle(sql)


def test_a_filter_on_one_side_prunes_the_other_through_the_join_key(query: DatasetQuery) -> None:
    sql = "SELECT count(*), sum(b.v) FROM l_b8 a JOIN r_b16 b USING (k) WHERE a.k = 'k=v'"
    plan = query.plan(sql)
    right = plan.plans["r_b16"]
    assert len(right.selected) == 1 < right.total, "Should read one bucket of r_b16: the key is pinned"
    assert len(plan.plans["l_b8"].selected) == 1
    assert _canonical(query.query(sql)) == _oracle(sql)
    # An outer join's other side is not pruned by it (its unmatched rows must still appear).
    outer = query.plan("SELECT count(*) FROM l_b8 a LEFT JOIN r_b16 b USING (k) WHERE b.v > 100")
    assert len(outer.plans["l_b8"].selected) == outer.plans["l_b8"].total
    # The preserved side of an outer join is pruned by the WHERE conditions on its own columns.
    for sql, kept, whole in (
        ("SELECT a.id, b.id FROM l_b8 a LEFT JOIN r_b16 b USING (k) WHERE a.k = 'k=v'", "l_b8", "r_b16"),
        (
            "SELECT a.id, b.id FROM l_b8 a RIGHT JOIN r_b16 b ON a.k = b.k WHERE b.k IN ('k=v', '')",
            "r_b16",
            "l_b8",
        ),
        ("SELECT a.id, b.k FROM l_b8 a FULL JOIN r_b16 b ON a.k = b.k WHERE a.k = 'k=v'", None, "l_b8"),
    ):
        plan = query.plan(sql)
        if kept is not None:
            assert len(plan.plans[kept].selected) < plan.plans[kept].total, f"Should prune {kept}: {sql}"
        assert len(plan.plans[whole].selected) == plan.plans[whole].total, (
            f"Should read all of {whole}: {sql}"
        )
        assert _canonical(query.query(sql)) == _oracle(sql)


def test_each_dataset_at_its_own_version_or_as_of(query: DatasetQuery) -> None:
    sql = "SELECT count(*) AS n FROM l_id a JOIN r_id b USING (k)"
    before = query.query(sql).to_pylist()
    reader = query.reader("r_id")
    first = reader.snapshot()
    moment = dt.datetime.now(UTC)
    # A second version of r_id: one more row of key 'a' in its partition.
    extra = pa.table(
        {"id": [999], "k": ["a"], "ts": pa.array([None], pa.timestamp("us", tz="UTC")), "v": [1]}
    )
    storage = get_storage("parquet")
    root = Path(reader.data_root)
    files = storage.publish(root, storage.write(extra, root, "kk=a"))
    entry = PartitionEntry.from_files(
        PartitionKey(("a",)), first.partition_spec, first.partitions["kk=a"].files + tuple(files)
    )
    reader.catalog.commit(base_version=first.version, upserts=[entry], partition_spec=first.partition_spec)
    left_a = LAYOUTS["l_id"][0].column("k").to_pylist().count("a")
    assert left_a, "the left side holds key 'a'"
    assert query.query(sql).to_pylist() == [{"n": before[0]["n"] + left_a}]
    assert query.query(sql, versions={"r_id": first.version}).to_pylist() == before
    assert query.query(sql, as_of=moment).to_pylist() == before
    with pytest.raises(FilterError, match="versions= names nope"):
        query.query(sql, versions={"nope": 1})


def test_the_sandbox_holds_for_every_dataset(query: DatasetQuery) -> None:
    with pytest.raises(UnsafeQueryError, match="sees only the datasets 'l_b8', 'r_b16'"):
        query.query("SELECT count(*) FROM l_b8 a JOIN r_b16 b ON a.k = b.k, information_schema.tables")
    with pytest.raises(UnsafeQueryError, match="duckdb_settings"):
        query.query("SELECT count(*) FROM l_b8 a JOIN r_b16 b ON a.k = b.k JOIN duckdb_settings() s ON true")
    with pytest.raises(UnsafeQueryError, match="read_parquet"):
        query.query("SELECT * FROM l_b8 JOIN read_parquet('/etc/passwd') USING (k)")


def test_reader_hook_and_cli_query_several_datasets(spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sql = "SELECT a.k, count(*) AS n FROM l_b8 a JOIN r_b16 b ON a.k = b.k GROUP BY a.k"
    with PartitionedDatasetReader(spec, "l_b8") as reader:
        assert _canonical(reader.query(sql)) == _oracle(sql)
        plan = reader.plan_datasets_query(sql)
        assert isinstance(plan, DatasetQueryPlan)
        assert plan.joins[0].split
    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

    hook = PartitionedDatasetHook(dataset="r_b16", spec_path=str(spec))
    assert _canonical(hook.query(sql)) == _oracle(sql)
    capsys.readouterr()
    assert main(["query", str(spec), sql, "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(((r["k"], r["n"]) for r in lines), key=repr) == _oracle(sql)


def test_cli_plan_shows_the_pairs_and_why(
    spec: Path, query: DatasetQuery, capsys: pytest.CaptureFixture[str]
) -> None:
    split_sql = "SELECT count(*) FROM l_b8 a JOIN r_b16 b ON a.k = b.k"
    assert main(["plan", str(spec), "--query", split_sql]) == 0
    out = capsys.readouterr().out
    pairs = query.plan(split_sql).joins[0].pairs
    assert f"split into {len(pairs)} pair group(s)" in out, out
    for pair in pairs:
        sizes = f"{len(pair.left_partitions)} x {len(pair.right_partitions)} partition(s)"
        assert f"pair group {pair.groups[0]}: {sizes}" in out, out
    assert (
        main(["plan", str(spec), "--query", "SELECT count(*) FROM l_b4 a JOIN r_b6 b USING (k)", "--json"])
        == 0
    )
    document = json.loads(capsys.readouterr().out)
    (join,) = document["joins"]
    assert join["split"] is False
    assert "bucket 4 vs 6" in join["reason"]
    assert set(document["datasets"]) == {"l_b4", "r_b6"}


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT DISTINCT a.k FROM l_b8 a JOIN r_b16 b ON a.k = b.k ORDER BY a.k",
        "SELECT a.*, b.v AS bv FROM l_b8 a LEFT JOIN r_b16 b ON a.k = b.k",
        "SELECT a.k, row_number() OVER (PARTITION BY a.k ORDER BY a.id, b.id) AS rn "
        "FROM l_b8 a JOIN r_b16 b ON a.k = b.k",
        "SELECT b.k, sum(a.v) FROM l_b8 a RIGHT JOIN r_b16 b ON a.k = b.k "
        "GROUP BY b.k HAVING count(a.id) > 2",
        "SELECT a.k, count(*) FROM l_b8 AS a JOIN r_b16 AS b ON a.k = b.k WHERE b.v IS NOT NULL "
        "GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 5",
        "WITH j AS (SELECT a.k, b.v FROM l_b8 a JOIN r_b16 b USING (k)) SELECT k, sum(v) FROM j GROUP BY k",
        "SELECT count(*), min(b.id - a.id) FROM l_b8 a JOIN r_b16 b ON a.k = b.k AND a.id < b.id",
        "SELECT k, id FROM l_b8 JOIN r_b16 USING (k) WHERE l_b8.v > 3",
    ],
)
def test_the_statement_around_a_split_join_is_unchanged(query: DatasetQuery, sql: str) -> None:
    """Split, the statement's columns, stars, windows, HAVING, LIMIT and CTEs read what they did."""
    if "SELECT k, id FROM" in sql:
        with pytest.raises(FilterError, match="query failed"):  # `id` is ambiguous for DuckDB too
            query.query(sql)
        assert not query.plan(sql).joins[0].split
        return
    plan = query.plan(sql)
    assert [d.split for d in plan.joins] == [True], plan.explain()
    got = query.query(sql)
    assert _canonical(got) == _oracle(sql)
    assert got.column_names == duckdb_names(sql)


def test_the_limits_bound_a_multi_dataset_query(query: DatasetQuery) -> None:
    from airflow_partitions.exceptions import QueryLimitError

    slow = "SELECT count(*) FROM l_b8 a JOIN r_b16 b ON a.k = b.k, range(2000000000) r WHERE r.range % 7 = 3"
    with pytest.raises(QueryLimitError):
        query.query(slow, timeout_s=0.5)
    big = "SELECT list(r.range) FROM l_b8 a JOIN r_b16 b ON a.k = b.k, range(5000000) r GROUP BY a.id"
    with pytest.raises(QueryLimitError):
        query.query(big, memory_limit="64MB")


def test_a_join_reads_catalog_tables_and_a_tagged_version(
    spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A split join that also reads `ap_partitions` of both sides, with r_b16 pinned by a tag to the
    version before a later commit added a row: every figure is the tagged version's."""
    sql = (
        "WITH j AS (SELECT count(*) AS n, sum(a.v * b.v) AS s FROM l_b8 a JOIN r_b16 b ON a.k = b.k), "
        "r AS (SELECT sum(rows) AS right_rows FROM ap_partitions('r_b16')), "
        "l AS (SELECT count(*) AS left_partitions FROM ap_partitions('l_b8') p WHERE p.rows > 0) "
        "SELECT * FROM j, r, l"
    )
    join_sql = "SELECT count(*) AS n, sum(a.v * b.v) AS s FROM l_b8 a JOIN r_b16 b ON a.k = b.k"
    (expected_n, expected_s) = _oracle(join_sql)[0]
    with PartitionedDatasetReader(spec, "r_b16") as reader:
        tagged = reader.snapshot()
        reader.catalog.tag("join-release", tagged.version)
        left_partitions = len(reader._reader_of("l_b8").snapshot().partitions)
        # A later version of r_b16 with one more row of key 'a' in its partition.
        (key_path,) = [partition.key_path for partition in reader.plan("k = 'a'").selected]
        extra = pa.table(
            {"id": [999], "k": ["a"], "ts": pa.array([None], pa.timestamp("us", tz="UTC")), "v": [3]}
        )
        storage = get_storage("parquet")
        root = Path(reader.data_root)
        files = storage.publish(root, storage.write(extra, root, key_path))
        original = tagged.partitions[key_path]
        grown = PartitionEntry.from_files(original.key, tagged.partition_spec, original.files + tuple(files))
        newer = reader.catalog.commit(
            base_version=tagged.version, upserts=[grown], partition_spec=tagged.partition_spec
        )
        try:
            newest = reader.query(sql).to_pylist()[0]
            assert newest["right_rows"] == LAYOUTS["r_b16"][0].num_rows + 1, "newest: one more row"
            assert newest["n"] > expected_n, "the added row joins rows of key 'a'"
            pinned = reader.query(sql, tag="join-release")
            assert pinned.to_pylist() == [
                {
                    "n": expected_n,
                    "s": expected_s,
                    "right_rows": LAYOUTS["r_b16"][0].num_rows,
                    "left_partitions": left_partitions,
                }
            ], "the tag pins r_b16's rows and its catalog table; l_b8 is read at its newest"
            plan = reader.plan_datasets_query(sql, {"r_b16": reader.snapshot(tag="join-release").version})
            assert plan.joins[0].split, plan.explain()
            capsys.readouterr()
            assert main(["query", str(spec), sql, "--tag", "join-release"]) != 0
            assert "--tag is ambiguous: the query reads l_b8, r_b16" in capsys.readouterr().err
            pinned_cli = ["query", str(spec), sql, "--dataset", "r_b16", "--tag", "join-release", "--json"]
            assert main(pinned_cli) == 0
            out = capsys.readouterr().out.splitlines()
            assert [json.loads(line) for line in out] == [
                {name: str(value) if name in ("s", "right_rows") else value for name, value in row.items()}
                for row in pinned.to_pylist()
            ], "the CLI's --tag pins --dataset"
            # A query naming a dataset only through a catalog table function finds it.
            catalog_only = "SELECT count(*) AS parts FROM ap_partitions('l_b8')"
            assert main(["query", str(spec), catalog_only, "--json"]) == 0
            assert json.loads(capsys.readouterr().out) == {"parts": left_partitions}
        finally:
            # Put r_b16 back as the other tests expect it (a new version holding the original partition).
            reader.catalog.commit(
                base_version=newer, upserts=[original], partition_spec=tagged.partition_spec
            )
            reader.catalog.delete_tag("join-release")
    with PartitionedDatasetReader(spec, "r_b16") as reader:
        assert _canonical(reader.query(join_sql)) == _oracle(join_sql), "r_b16 is back as it was"


@pytest.mark.parametrize(
    ("sql", "streamed"),
    [
        (
            "SELECT count(*) AS n, sum(a.v) AS s, min(b.ts), max(a.k), count(b.v) "
            "FROM l_b8 a JOIN r_b16 b ON a.k = b.k",
            True,
        ),
        ("SELECT a.id, b.v FROM l_b8 a LEFT JOIN r_b16 b ON a.k = b.k WHERE a.v < 20 OR b.v IS NULL", True),
        ("SELECT count(*) FROM l_b8 a FULL JOIN r_b16 b ON a.k = b.k WHERE a.id IS NULL", True),
        ("SELECT count(DISTINCT a.k) FROM l_b8 a JOIN r_b16 b ON a.k = b.k", False),
        ("SELECT avg(a.v) FROM l_b8 a JOIN r_b16 b ON a.k = b.k", False),
        ("SELECT sum(a.v) + 1 FROM l_b8 a JOIN r_b16 b ON a.k = b.k", False),
        ("SELECT a.k, count(*) FROM l_b8 a JOIN r_b16 b ON a.k = b.k GROUP BY a.k", True),
        (
            "SELECT b.k, a.v, count(DISTINCT a.id) AS n, max(b.ts) AS m FROM l_b8 a JOIN r_b16 b "
            "USING (k) GROUP BY b.k, a.v HAVING count(*) > 1",
            True,
        ),
        ("SELECT k, count(*) AS n, sum(b.v) FROM l_b8 a LEFT JOIN r_b16 b USING (k) GROUP BY 1", True),
        ("SELECT b.k, count(*) FROM l_b8 a LEFT JOIN r_b16 b ON a.k = b.k GROUP BY b.k", False),
        ("SELECT a.k, count(*) FROM l_b8 a FULL JOIN r_b16 b ON a.k = b.k GROUP BY a.k", False),
        ("SELECT a.v, count(*) FROM l_b8 a JOIN r_b16 b ON a.k = b.k GROUP BY a.v", False),
        ("SELECT a.k, avg(b.v) FROM l_b8 a JOIN r_b16 b ON a.k = b.k GROUP BY a.k", True),
        ("SELECT a.k, count(*) FROM l_b8 a JOIN r_b16 b ON a.k = b.k GROUP BY ROLLUP (a.k)", False),
        (
            "SELECT c.k, count(*) AS n, sum(a.v) AS s FROM l_b8 a JOIN r_b16 b ON a.k = b.k "
            "JOIN x_b32 c ON c.k = b.k GROUP BY c.k",
            True,
        ),
        ("SELECT a.id FROM l_b8 a JOIN r_b16 b ON a.k = b.k ORDER BY a.id LIMIT 5", False),
        ("SELECT count(*), a.k FROM l_b8 a JOIN r_b16 b ON a.k = b.k", False),
    ],
)
def test_pair_groups_stream_one_statement_each_only_where_exact(
    query: DatasetQuery,
    sql: str,
    streamed: bool,
    streamed_runs: list[tuple[int, int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A statement over a split join runs once per pair group only when the groups' results combine
    into exactly its result; the answer equals DuckDB's over the sources either way."""
    from airflow_partitions.read.joins import JoinSplit, streamed_shape

    plan = query.plan(sql)
    assert plan.joins[0].split, plan.explain()
    shape = streamed_shape(plan.tree, JoinSplit(plan.joins[0], "v"))
    assert (shape is not None) == streamed, shape
    if "count(*), a.k" in sql:
        with pytest.raises(FilterError, match="query failed"):  # not valid SQL without GROUP BY
            query.query(sql)
        return
    monkeypatch.setattr(query, "groups_per_statement", 1)
    assert _canonical(query.query(sql)) == _oracle(sql), sql
    runs = [groups for groups, _ in streamed_runs]
    windows = [window for _, window in streamed_runs]
    assert bool(runs) == streamed, runs
    assert not runs or runs[0] == len(plan.joins[0].pairs), "one statement per pair group"
    assert not windows or windows == [1]


WINDOWED = [
    "SELECT count(*) AS n, sum(a.v) AS s, min(b.ts), max(a.k), count(b.v) FROM {l} a JOIN {r} b ON a.k = b.k",
    "SELECT a.id, b.v FROM {l} a LEFT JOIN {r} b ON a.k = b.k WHERE a.v < 20 OR b.v IS NULL",
    "SELECT count(*), sum(a.id) FROM {l} a FULL JOIN {r} b ON a.k = b.k WHERE a.id IS NULL OR b.k IS NULL",
    "SELECT k, count(*) AS n, sum(b.v) FROM {l} a LEFT JOIN {r} b USING (k) GROUP BY 1",
]


@pytest.mark.parametrize("window", [1, 2, 3, 5])
@pytest.mark.parametrize(("left", "right"), [("l_b8", "r_b16"), ("l_s2", "r_s4"), ("l_b4", "r_b6")])
@pytest.mark.parametrize("shape", WINDOWED, ids=["aggregates", "left-rows", "full-null-keys", "grouped"])
def test_several_pair_groups_per_statement_give_the_same_answer(
    query: DatasetQuery,
    spec: Path,
    window: int,
    left: str,
    right: str,
    shape: str,
    streamed_runs: list[tuple[int, int]],
) -> None:
    """Pair groups joined `window` at a time in one statement (hostile and NULL keys; a window that does
    not divide the number of groups; incompatible layouts still one plain join): DuckDB's answer over the
    sources, in ceil(groups / window) statements."""
    sql = shape.format(l=left, r=right)
    plan = query.plan(sql)
    with datasets_query(spec, groups_per_statement=window) as windowed:
        assert _canonical(windowed.query(sql)) == _oracle(sql), f"{sql}\n{plan.explain()}"
    statements = [-(-groups // each) for groups, each in streamed_runs]
    pairs = len(plan.joins[0].pairs)
    if not plan.joins[0].split:
        assert "neither divides the other" in plan.joins[0].reason
        assert statements == []
    else:
        assert pairs > 5, plan.explain()
        assert statements == [-(-pairs // window)], (statements, pairs)


@pytest.mark.parametrize(
    ("sql", "window", "streamed"),
    [
        ("SELECT count(*) AS n, sum(a.v) AS s FROM l_b8 a JOIN r_b16 b ON a.k = b.k", None, True),
        ("SELECT count(*) AS n, sum(a.v) AS s FROM l_b8 a JOIN r_b16 b ON a.k = b.k", 3, True),
        ("SELECT count(*) AS n FROM l_b8 a JOIN r_b16 b ON a.k = b.k", 100, False),
        ("SELECT a.id FROM l_b8 a JOIN r_b16 b ON a.k = b.k ORDER BY a.id LIMIT 5", None, False),
    ],
)
def test_the_plan_says_how_many_pair_groups_each_statement_joins_and_why(
    spec: Path,
    sql: str,
    window: int | None,
    streamed: bool,
    capsys: pytest.CaptureFixture[str],
    streamed_runs: list[tuple[int, int]],
) -> None:
    """`plan` / `explain` of a split join: the statements it runs, the pair groups each joins (one per
    DuckDB thread, or `groups_per_statement`) under which memory limit, or why one statement joins all;
    the query then runs exactly so."""
    limits = QueryLimits(threads=2, memory_limit="1GB")
    with datasets_query(spec, groups_per_statement=window, query_limits=limits) as windowed:
        plan = windowed.plan(sql)
        pairs = len(plan.joins[0].pairs)
        assert plan.joins[0].split, plan.explain()
        assert pairs > 5, plan.explain()
        text = plan.explain()
        groups = window or 2
        if streamed:
            line = f"  statements: {-(-pairs // groups)}, each joining up to {groups} pair group(s) ("
            assert line in text, text
            why = "groups_per_statement=3" if window else "one per DuckDB thread (2)"
            assert why in text, text
            assert "exceed the memory limit (1GB)" in text, text
        else:
            assert f"  statements: one over all {pairs} pair group(s): " in text, text
            reason = "no more pair groups than one statement joins" if window else "needs the whole join"
            assert reason in text, text
        document = plan.to_json()["split_statements"]
        assert document["streamed"] is streamed
        assert document["groups_per_statement"] == groups
        assert document["memory_limit"] == "1GB"
        assert _canonical(windowed.query(sql)) == _oracle(sql)
        assert [groups for groups, _ in streamed_runs] == ([pairs] if streamed else [])
    assert main(["plan", str(spec), "--query", sql]) == 0
    assert "  statements: " in capsys.readouterr().out


@pytest.mark.parametrize(
    ("types", "windows", "whole"),
    [
        (["BIGINT", "BIGINT", "BIGINT", "BIGINT"], 4, False),
        (["DOUBLE", "DOUBLE", "DOUBLE", "DOUBLE"], 1, True),  # bound, not run
        (["BIGINT", "BIGINT", "BIGINT", "DOUBLE"], 4, True),
    ],
    ids=["integers", "floats", "float-in-the-last-group"],
)
def test_a_floating_sum_over_pair_groups_runs_once_over_all_of_them(
    types: list[str], windows: int, whole: bool
) -> None:
    """A floating-point sum depends on the order of addition, so the statement runs once over every
    pair group, whether the first window's types say so or only a later window's result does (files of
    one partition storing the column as a float, the others as integers); integer sums stream."""
    connection = duckdb.connect()
    branches = [
        f"SELECT {value}::{kind} AS x" for value, kind in zip([1e16, 1, -1e16, 3], types, strict=True)
    ]
    statement = 'SELECT count(*) AS n, sum(x) AS s FROM "v"'
    views: list[str] = []

    class Recording:
        def execute(self, text: str) -> Any:
            views.append(text)
            return connection.execute(text)

        def sql(self, text: str) -> Any:
            return connection.sql(text)

    got = multi._run_streamed(Recording(), statement, "v", branches, ["count", "sum"], 1)
    connection.execute('CREATE OR REPLACE TEMP VIEW "v" AS ' + " UNION ALL ".join(branches))
    assert got.equals(connection.sql(statement).to_arrow_table()), got
    assert len([text for text in views if "UNION ALL" not in text]) == windows
    assert len([text for text in views if text.count("UNION ALL") == len(branches) - 1]) == whole


@pytest.mark.parametrize(
    ("statement", "shape"),
    [
        ('SELECT min(x) AS lo, max(x) AS hi, count(*) AS n FROM "v"', ["min", "max", "count"]),
        ('SELECT x FROM "v" WHERE x IS NOT NULL', []),
    ],
    ids=["min-max", "rows"],
)
def test_pair_groups_whose_files_store_a_column_as_other_types_run_once_over_all_of_them(
    statement: str, shape: list[str]
) -> None:
    """Files of some partitions storing a column as INTEGER, of others as BIGINT (schema drift): the
    windows' results differ in type, so the statement runs once over every pair group and gives the
    whole union's answer and type, instead of failing to combine the windows."""
    connection = duckdb.connect()
    values = [(-(2**31), "INTEGER"), (2**40, "BIGINT"), (None, "INTEGER"), (7, "BIGINT")]
    branches = [f"SELECT ({'NULL' if v is None else v})::{kind} AS x" for v, kind in values]
    got = multi._run_streamed(connection, statement, "v", branches, shape, 1)
    connection.execute('CREATE OR REPLACE TEMP VIEW "v" AS ' + " UNION ALL ".join(branches))
    expected = connection.sql(statement).to_arrow_table()
    assert got.schema.equals(expected.schema), got.schema
    assert sorted(got.to_pylist(), key=repr) == sorted(expected.to_pylist(), key=repr)


def test_a_window_over_the_memory_limit_runs_its_pair_groups_one_at_a_time(
    query: DatasetQuery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DuckDB out of memory joining several pair groups in one statement: that window's groups run
    again one at a time, every group counted once; out of memory with one group is the query's error."""
    sql = "SELECT count(*) AS n, sum(a.v) AS s, count(b.v) FROM l_b8 a LEFT JOIN r_b16 b ON a.k = b.k"
    views: list[str] = []

    class Tight:
        """A real DuckDB connection whose statements run out of memory over a union of two groups."""

        def __init__(self, connection: Any) -> None:
            self.connection = connection

        def execute(self, text: str) -> Any:
            views.append(text)
            return self.connection.execute(text)

        def sql(self, text: str) -> Any:
            if views and " UNION ALL " in views[-1] and "ap_join_" in views[-1]:
                raise duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block")
            return self.connection.sql(text)

    execute = multi._run_streamed

    def tight(connection: Any, *args: Any, **named: Any) -> pa.Table:
        return execute(Tight(connection), *args, **named)

    monkeypatch.setattr(multi, "_run_streamed", tight)
    monkeypatch.setattr(query, "groups_per_statement", 3)
    assert _canonical(query.query(sql)) == _oracle(sql)
    pairs = len(query.plan(sql).joins[0].pairs)
    windows = [text for text in views if " UNION ALL " in text]
    assert len(windows) == -(-pairs // 3) - (1 if pairs % 3 == 1 else 0), (len(windows), pairs)
    assert len(views) - len(windows) == pairs, "each group once on its own"
    # One group alone out of memory: the query fails (typed), nothing retried or left out.
    views.clear()
    monkeypatch.setattr(query, "groups_per_statement", 1)

    def alone(self: Tight, text: str) -> Any:
        if views:
            raise duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block")
        return self.connection.sql(text)

    monkeypatch.setattr(Tight, "sql", alone)
    with pytest.raises(QueryLimitError):
        query.query(sql)
    assert len(views) == 1


def test_small_joins_are_not_split_and_the_plan_says_why(spec: Path) -> None:
    sql = "SELECT count(*) AS n FROM l_b8 a JOIN r_b16 b ON a.k = b.k"
    with datasets_query(spec, split_min_bytes=1 << 40) as small:
        plan = small.plan(sql)
        assert not plan.joins[0].split
        assert "under split_min_bytes (1,099,511,627,776)" in plan.joins[0].reason, plan.explain()
        assert _canonical(small.query(sql)) == _oracle(sql)


def test_a_multi_dataset_query_records_each_dataset_read_with_its_pruning(query: DatasetQuery) -> None:
    """Read statistics: one record per dataset the query reads, in that dataset's own log."""
    sql = "SELECT count(*) AS n, sum(b.v) AS s FROM l_b8 a JOIN r_b16 b USING (k) WHERE a.k = 'it''s'"
    logs = {name: query.reader(name).read_stats.log for name in ("l_b8", "r_b16", "l_id")}
    assert all(log is not None for log in logs.values())
    before = {name: len(log.records()) for name, log in logs.items() if log is not None}
    plan = query.plan(sql)
    result = query.query(sql)
    assert _canonical(result) == _oracle(sql)
    for name in ("l_b8", "r_b16"):
        log = logs[name]
        assert log is not None
        records = log.records()[before[name] :]
        assert len(records) == 1, f"one record for {name}, read once by the query"
        (record,) = records
        dataset_plan = plan.plans[name]
        assert record["dataset"] == name
        assert record["kind"] == "query"
        assert record["version"] == dataset_plan.version
        assert record["partitions"] == len(dataset_plan.selected) == 1, "pruned through the join key"
        assert record["partitions_total"] == dataset_plan.total > 1
        assert record["files"] == len(dataset_plan.files)
        assert record["bytes"] == sum(f.bytes for f in dataset_plan.files) > 0
        assert record["filter"] is not None
        assert "k" in record["columns"]
        assert "it's" not in json.dumps(record), "literals are not recorded unless asked"
        assert record["rows"] == result.num_rows
    log = logs["l_id"]
    assert log is not None
    assert len(log.records()) == before["l_id"], "a dataset not read records nothing"


def test_inner_pair_groups_whose_key_ranges_do_not_meet_are_skipped(query: DatasetQuery) -> None:
    """An inner join's group whose sides' key ranges (file min / max) have no common point emits
    nothing and is not joined; outer joins keep every group; answers equal DuckDB's either way."""
    inner = "SELECT count(*) AS n, sum(a.id * b.id) AS s FROM l_lo a JOIN r_hi b ON a.n = b.n"
    decision = query.plan(inner).joins[0]
    assert decision.split, decision.reason
    assert [pair.groups for pair in decision.pairs] == [("-100",)], "only the group whose ranges meet"
    assert _canonical(query.query(inner)) == _oracle(inner)
    assert _oracle(inner)[0][0] > 0, "the meeting group has matches"
    for sql in (
        "SELECT a.id, b.id FROM l_lo a LEFT JOIN r_hi b ON a.n = b.n",
        "SELECT a.id, b.id FROM l_lo a FULL JOIN r_hi b ON a.n = b.n",
        "SELECT count(*) FROM l_lo a JOIN r_hi b ON a.n = b.n JOIN l_t10 c ON c.n = b.n",
    ):
        assert _canonical(query.query(sql)) == _oracle(sql), sql
    left = query.plan("SELECT a.id FROM l_lo a LEFT JOIN r_hi b ON a.n = b.n").joins[0]
    assert len(left.pairs) == 7, "a left join keeps each of its six groups and the NULL group"
    chain = query.plan("SELECT count(*) FROM l_lo a JOIN r_hi b ON a.n = b.n JOIN l_t10 c ON c.n = b.n")
    assert [pair.groups for pair in chain.joins[0].pairs] == [("-100",)], chain.explain()
