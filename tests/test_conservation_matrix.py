"""The conservation matrix: every refresh path, over every kind of source, layout and engine, keeps every row.

Each combination (source x layout x engine x path, covered pairwise) writes hostile rows to a real source,
refreshes through the real code (the `airflow-partitions refresh` CLI in this process, `refresh_dataset`
for forced strategies, the CLI in a separate process against a real Spark Connect server), then reads the
whole acceleration back through `PartitionedDatasetHook` and compares it with what the source holds, as a
multiset of per-row hashes with the source's own types. Thirty seeded random filters per combination are
then read through the hook and compared with DuckDB filtering the source rows (read back from the source
with pyarrow / json / psycopg, never through the package's source connectors).

Paths: `full` (one refresh), `incremental` (refresh, change the source, refresh: equals the new source),
`partitions` / `where` (refresh, change the source, refresh a selection: selected partitions hold the new
rows and the others the old ones; then a plain refresh equals the new source), `respec` (refresh under
another partition_by, change partition_by: a partial refresh moves the old rows of its selection into the new
layout and refreshes the selection, the others keep their old rows; a plain refresh re-partitions and
equals the new source), `pushdown`, `spark` (forced
strategies) and `connect` (Spark Connect).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import io
import json
import os
import random
import select
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from matrix_support import (
    SCHEMA,
    DuckDBOracle,
    FilterGenerator,
    MatrixSource,
    SourceChange,
    all_pairs,
    change_source,
    csv_read_options,
    csv_text,
    hostile_chunks,
    json_line,
    key_path,
    multiset_difference,
    non_null_values,
    parse_json_lines,
    partition_values,
    row_digests,
    rows_by_key,
    schema_types,
    sql_literal,
    uncovered_pairs,
    valid_pairs,
)

from airflow_partitions.cli.main import main as cli_main
from airflow_partitions.refresh import refresh_dataset
from airflow_partitions.refresh.written import written_mode_refusal
from airflow_partitions.spec import load_spec
from airflow_partitions.transforms import parse_transform

REPO = Path(__file__).resolve().parent.parent
DATASET = "m"
FILTERS_PER_COMBINATION = 30


@dataclass(frozen=True)
class Layout:
    """A partition_by list, and what pushdown needs of it."""

    fields: tuple[tuple[str, str], ...]
    # Hive directory columns that decide every field (a Hive source is written with them), else None.
    hive: tuple[str, ...] | None
    # Postgres can read one partition by range: every transform monotonic with a preimage, over an index.
    postgres_pushdown: bool
    # The layout needs a decimal column, which a CSV file cannot carry (it infers double).
    needs_decimal: bool = False


LAYOUTS: dict[str, Layout] = {
    "bucket": Layout((("b", "bucket(8, n_int)"),), ("n_int",), False),
    "identity": Layout((("sk", "s"),), ("s",), True),
    "date_trunc": Layout((("mo", "date_trunc('month', ts)"),), None, True),
    "year_month": Layout(
        (("y", "date_part('year', ts_naive)"), ("m", "date_part('month', ts_naive)")), None, False
    ),
    "trunc_int": Layout((("ti", "truncate(1000, n_int)"),), ("n_int",), True),
    # Width in unscaled units (Iceberg): 100000 at scale 2 is ranges of 1000.00.
    "trunc_dec": Layout((("td", "truncate(100000, amount)"),), None, True, needs_decimal=True),
    "trunc_str": Layout((("t2", "truncate(2, s)"),), ("s",), True),
    "mod": Layout((("r", "n_int % 4"),), ("n_int",), False),
    "composite": Layout(
        (("cb", "bucket(4, s)"), ("cy", "date_part('year', d)"), ("cf", "flag")), None, False
    ),
    # Custom expressions: each combination draws its own two from the conformance grammar
    # (`random_expression_fields`); these are the fallback when no draw fits the source.
    "expressions": Layout(
        (
            ("lo", "lower(s)"),
            ("band", "CASE WHEN n_int > 1000 THEN 'big' WHEN n_int < 0 THEN 'negative' ELSE 'small' END"),
        ),
        ("s", "n_int"),
        False,
    ),
}
# The layout a `respec` combination starts from before partition_by changes to the combination's layout.
RESPEC_FROM: tuple[tuple[str, str], ...] = (("old", "bucket(2, id)"),)
# A Hive source whose layout is not decided by directories is still Hive-partitioned, by this column.
HIVE_FALLBACK = ("flag",)

AXES: dict[str, list[str]] = {
    "source": ["parquet", "csv", "json", "hive", "postgres", "s3"],
    "layout": list(LAYOUTS),
    "engine": ["parquet", "arrow", "duckdb_files", "duckdb_tables"],
    "path": ["full", "incremental", "partitions", "where", "respec", "pushdown", "spark", "connect", "arrow"],
}


def valid(combination: dict[str, str]) -> bool:
    layout = LAYOUTS[combination["layout"]]
    source = combination["source"]
    if source == "csv" and layout.needs_decimal:
        return False
    if combination["path"] == "pushdown":
        if source == "hive":
            return layout.hive is not None
        if source == "postgres":
            return layout.postgres_pushdown
        return False  # plain files and S3 objects cannot be read one partition at a time
    return True


# Triples pairwise coverage need not reach, kept because they once lost rows: a Hive source whose directory
# values the Spark stage must decode (non-ASCII, empty string), as the auto strategy would push down instead.
REQUIRED: list[dict[str, str]] = [
    {"source": "hive", "layout": "identity", "engine": "parquet", "path": "spark"},
]
COMBINATIONS = all_pairs(AXES, valid, required=REQUIRED)
IDS = [f"{c['source']}-{c['layout']}-{c['engine']}-{c['path']}" for c in COMBINATIONS]
print(
    f"conservation matrix: {len(COMBINATIONS)} combinations cover "
    f"{len(valid_pairs(AXES, valid))} valid pairs (full cross product: "
    f"{len(AXES['source']) * len(AXES['layout']) * len(AXES['engine']) * len(AXES['path'])})",
    file=sys.stderr,
)


def seed_of(name: str) -> int:
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)


# --- the spec ---------------------------------------------------------------------------------------------


def write_spec(root: Path, source: MatrixSource, engine: str, fields: Sequence[tuple[str, str]]) -> Path:
    lines = [f"accelerator_dir: {root / 'acc'}", "datasets:", f"  - name: {DATASET}", *source.spec_lines()]
    lines += ["    acceleration:", f"      engine: {'duckdb' if engine.startswith('duckdb') else engine}"]
    if engine == "duckdb_tables":
        lines.append("      params: {partition_mode: tables}")
    lines.append("      partition_by:")
    lines += [f'        - {name}: "{expression}"' for name, expression in fields]
    path = root / "datasets.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- running refreshes ------------------------------------------------------------------------------------


@dataclass
class CliResult:
    code: int | str
    stdout: str
    stderr: str

    def ok(self, what: str) -> None:
        assert self.code == 0, f"{what}: exit {self.code}\n{self.stderr[-3000:]}"


def cli_refresh(spec: Path, *options: str) -> CliResult:
    """`airflow-partitions refresh SPEC m --json ...` in this process (on the shared Spark session)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(["refresh", str(spec), DATASET, "--json", *options])
    return CliResult(code, out.getvalue(), err.getvalue())


WORKER = r"""
import contextlib, io, json, sys
from airflow_partitions.cli.main import main
answer = sys.stdout
for line in sys.stdin:
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(json.loads(line))
    except BaseException as error:
        code = f"{type(error).__name__}: {error}"
    result = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
    answer.write("@@result " + json.dumps(result) + "\n")
    answer.flush()
"""


class ConnectCli:
    """The CLI in its own process, as a Spark Connect client (it cannot share this process's classic session).

    One long-lived process serves every `connect` combination, so the client starts once.
    """

    def __init__(self, url: str, log: Path) -> None:
        self.url = url
        self.log = log.open("w")
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable}
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
            cwd=REPO,
        )

    def refresh(self, spec: Path, *options: str, timeout: float = 240) -> CliResult:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        argv = ["refresh", str(spec), DATASET, "--json", "--remote", self.url, *options]
        self.process.stdin.write(json.dumps(argv) + "\n")
        self.process.stdin.flush()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], deadline - time.monotonic())
            if not ready:
                break
            line = self.process.stdout.readline()
            if not line:
                raise AssertionError(
                    f"the Connect CLI process died (exit {self.process.poll()}); see {self.log.name}"
                )
            if line.startswith("@@result "):
                data = json.loads(line.removeprefix("@@result "))
                return CliResult(data["code"], data["stdout"], data["stderr"])
        raise AssertionError(f"the Connect CLI did not answer within {timeout} s; see {self.log.name}")

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def connect_cli(
    spark_connect_server: dict[str, Any], s3_server: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConnectCli]:
    # s3_server first: it puts the S3 credentials in the environment the process inherits.
    cli = ConnectCli(spark_connect_server["url"], tmp_path_factory.mktemp("connect-cli") / "client.log")
    yield cli
    cli.close()


# --- checks -----------------------------------------------------------------------------------------------


def conform_for_comparison(got: pa.Table, expected: pa.Table) -> tuple[pa.Table, list[str]]:
    """`got` in `expected`'s column order and types, and the type differences (values compared after)."""
    problems = []
    if set(got.column_names) != set(expected.column_names):
        problems.append(
            f"columns differ: read {sorted(got.column_names)}, source {sorted(expected.column_names)}"
        )
        return got, problems
    got_types, expected_types = schema_types(got.schema), schema_types(expected.schema)
    if got_types != expected_types:
        diff = {n: (got_types[n], expected_types[n]) for n in got_types if got_types[n] != expected_types[n]}
        problems.append(f"types differ (read, source): {diff}")
    arrays = []
    for field in expected.schema:
        column = got.column(field.name)
        try:
            arrays.append(column.cast(field.type) if column.type != field.type else column)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            problems.append(f"column {field.name}: {column.type} does not cast to {field.type}: {err}")
            return got, problems
    return pa.table(arrays, schema=expected.schema), problems


def describe_difference(got: pa.Table, expected: pa.Table, limit: int = 4) -> str | None:
    missing, extra = multiset_difference(got, expected)
    if not missing and not extra:
        return None
    return (
        f"{got.num_rows} rows read, {expected.num_rows} in the source; "
        f"{len(missing)} missing, {len(extra)} extra"
        f"\n    missing e.g. {missing[:limit]}\n    extra e.g. {extra[:limit]}"
    )


def check_equals_source(
    spec: Path, expected: pa.Table, fields: Sequence[tuple[str, str]], *, filters: int, seed: int
) -> None:
    """Full read == source (multiset of row hashes, types), then `filters` random filters == DuckDB."""
    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

    hook = PartitionedDatasetHook(dataset=DATASET, spec_path=str(spec))
    problems: list[str] = []
    try:
        got, type_problems = conform_for_comparison(hook.read(), expected)
        problems += type_problems
        difference = describe_difference(got, expected)
        if difference:
            problems.append(f"full read != source: {difference}")
        if filters:
            generator = FilterGenerator(expected, [expression for _, expression in fields], seed)
            oracle = DuckDBOracle(generator.oracle_table())
            failed = 0
            try:
                for matrix_filter in generator.filters(filters):
                    want = expected.take(pa.array(oracle.rows(matrix_filter.oracle_sql), pa.int64()))
                    try:
                        read, _ = conform_for_comparison(hook.read(matrix_filter.reader_sql), expected)
                    except Exception as err:  # any failure of a read is a finding: report it with its filter
                        problems.append(f"WHERE {matrix_filter.reader_sql}: {type(err).__name__}: {err}")
                        failed += 1
                        continue
                    difference = describe_difference(read, want, limit=2)
                    if difference:
                        problems.append(f"WHERE {matrix_filter.reader_sql}: {difference}")
                        failed += 1
            finally:
                oracle.close()
            if failed:
                problems.append(f"{failed} of {filters} filters differ from DuckDB over the source")
    finally:
        hook.reader.close()
    assert not problems, "\n".join(problems[:12])


def check_partial(
    spec: Path,
    old: pa.Table,
    new: pa.Table,
    fields: Sequence[tuple[str, str]],
    *,
    must_refresh: set[str],
    may_refresh: set[str] | None,
) -> None:
    """After a partial refresh: each partition holds exactly its old rows or exactly its new rows.

    Partitions in `must_refresh` hold the new rows; those outside `may_refresh` (None = any) the old ones.
    """
    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

    hook = PartitionedDatasetHook(dataset=DATASET, spec_path=str(spec))
    try:
        got, problems = conform_for_comparison(hook.read(), new)
    finally:
        hook.reader.close()
    assert not problems, "\n".join(problems)
    old_groups, new_groups, got_groups = (
        rows_by_key(old, fields),
        rows_by_key(new, fields),
        rows_by_key(got, fields),
    )
    empty = new.schema.empty_table()
    wrong = []
    for key in sorted(set(old_groups) | set(new_groups) | set(got_groups)):
        have = sorted(row_digests(got_groups.get(key, empty)))
        was, now = (
            sorted(row_digests(old_groups.get(key, empty))),
            sorted(row_digests(new_groups.get(key, empty))),
        )
        if key in must_refresh:
            allowed = {"new": now}
        elif may_refresh is None or key in may_refresh:
            allowed = {"old": was, "new": now}
        else:
            allowed = {"old": was}
        if have not in allowed.values():
            detail = describe_difference(got_groups.get(key, empty), new_groups.get(key, empty), limit=2)
            options = " or ".join(f"its {k} rows ({len(v)})" for k, v in allowed.items())
            wrong.append(f"partition {key}: holds {len(have)} rows, expected {options}; vs new: {detail}")
    assert not wrong, "partial refresh lost or changed rows:\n" + "\n".join(wrong[:10])


# --- the matrix -------------------------------------------------------------------------------------------


@dataclass
class World:
    """One combination's source, spec and data versions."""

    root: Path
    source: MatrixSource
    engine: str
    layout: Layout
    chunks: list[pa.Table]
    seed: int

    def spec(self, fields: Sequence[tuple[str, str]] | None = None) -> Path:
        return write_spec(self.root, self.source, self.engine, fields or self.layout.fields)

    def change(self) -> SourceChange:
        change = change_source(self.chunks, self.seed)
        self.source.apply(change)
        return change


def make_world(
    combination: dict[str, str], name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> World:
    kind = combination["source"]
    layout = LAYOUTS[combination["layout"]]
    source = MatrixSource(kind, tmp_path)
    if kind == "hive":
        source.hive_columns = layout.hive or HIVE_FALLBACK
    elif kind == "postgres":
        source.pg_url = request.getfixturevalue("pg_database")
    elif kind == "s3":
        source.s3 = request.getfixturevalue("s3_server")
        source.bucket = request.getfixturevalue("s3_bucket")
    seed = seed_of(name)
    chunks = hostile_chunks(seed)
    source.write(chunks)
    if combination["layout"] == "expressions":
        layout = dataclasses.replace(layout, fields=random_expression_fields(chunks, seed))
    return World(tmp_path, source, combination["engine"], layout, chunks, seed)


def random_expression_fields(chunks: list[pa.Table], seed: int) -> tuple[tuple[str, str], ...]:
    """Two custom expressions drawn from the conformance grammar (one over `s`, one over `n_int`) that
    every version of the source can compute, with 2..24 partition values each; the fixed layout's
    field where no draw fits."""
    import pyarrow.compute as pc
    from test_expression_conformance import ExpressionGrammar

    from airflow_partitions.exceptions import PartitionExpressionError, PartitionValueError

    every_version = pa.concat_tables([*chunks, *change_source(chunks, seed).chunks])
    grammar = ExpressionGrammar(seed, string_column="s", integer_column="n_int")
    fields: list[tuple[str, str]] = []
    for (name, fallback), column in zip(LAYOUTS["expressions"].fields, ("s", "n_int"), strict=True):
        chosen = fallback
        for _ in range(300):
            text = grammar.draw_over(column)
            try:
                transform = parse_transform(text)
                if transform.source_column != column:
                    continue
                bound = transform.bind(every_version.schema.field(column).type)
                distinct = len(pc.unique(bound.apply(every_version.column(column))))
            except (PartitionExpressionError, PartitionValueError):
                continue
            if 2 <= distinct <= 24:
                chosen = text
                break
        fields.append((name, chosen))
    return tuple(fields)


def choose_partitions(old: pa.Table, new: pa.Table, fields: Sequence[tuple[str, str]]) -> list[str]:
    """Up to three keys of the new source: one only the new version has, one with a NULL, one changed."""
    old_keys = {key_path(v, fields) for v in partition_values(old, fields)}
    new_values = sorted(set(partition_values(new, fields)), key=repr)
    new_only = [v for v in new_values if key_path(v, fields) not in old_keys]
    with_null = [v for v in new_values if None in v]
    old_groups, new_groups = rows_by_key(old, fields), rows_by_key(new, fields)
    changed = [
        v
        for v in new_values
        if sorted(row_digests(new_groups[key_path(v, fields)]))
        != sorted(row_digests(old_groups.get(key_path(v, fields), new.schema.empty_table())))
    ]
    chosen: list[str] = []
    for candidates in (new_only, with_null, changed):
        for values in candidates:
            path = key_path(values, fields)
            if path not in chosen:
                chosen.append(path)
                break
    return chosen


def where_condition(new: pa.Table, fields: Sequence[tuple[str, str]], seed: int) -> str:
    """A condition on the first field's source column: a range, or NULL (selects the NULL partition too)."""
    source_column = parse_transform(fields[0][1]).source_column
    values = sorted(non_null_values(new.column(source_column)))
    pivot = values[len(values) // 2]
    literal = sql_literal(pivot, new.schema.field(source_column).type, random.Random(seed))
    return f"{source_column} >= {literal} OR {source_column} IS NULL"


def matching_keys(table: pa.Table, where: str, fields: Sequence[tuple[str, str]]) -> set[str]:
    oracle = DuckDBOracle(table)
    try:
        rows = oracle.rows(where)
    finally:
        oracle.close()
    values = partition_values(table, fields)
    return {key_path(values[row], fields) for row in rows}


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.postgres
@pytest.mark.parametrize("combination", COMBINATIONS, ids=IDS)
def test_conservation(combination: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest) -> None:
    name = "-".join(combination.values())
    world = make_world(combination, name, tmp_path, request)
    fields = world.layout.fields
    path = combination["path"]
    seed = world.seed
    if path == "connect":
        connect: ConnectCli = request.getfixturevalue("connect_cli")
        connect.refresh(world.spec()).ok("refresh through Spark Connect")
        check_equals_source(
            world.spec(), world.source.expected(), fields, filters=FILTERS_PER_COMBINATION, seed=seed
        )
        return
    spark = request.getfixturevalue("spark") if path != "arrow" else None  # the arrow path needs none
    if path in ("full", "incremental", "partitions", "where"):
        spec = world.spec()
        cli_refresh(spec).ok("first refresh")
        old = world.source.expected()
        if path == "full":
            check_equals_source(spec, old, fields, filters=FILTERS_PER_COMBINATION, seed=seed)
            return
        check_equals_source(spec, old, fields, filters=0, seed=seed)
        world.change()
        new = world.source.expected()
        if path == "partitions":
            chosen = choose_partitions(old, new, fields)
            cli_refresh(spec, "--partitions", *chosen).ok(f"refresh --partitions {chosen}")
            check_partial(spec, old, new, fields, must_refresh=set(chosen), may_refresh=set(chosen))
        elif path == "where":
            where = where_condition(new, fields, seed)
            cli_refresh(spec, "--where", where).ok(f"refresh --where {where}")
            check_partial(
                spec, old, new, fields, must_refresh=matching_keys(new, where, fields), may_refresh=None
            )
        cli_refresh(spec).ok("refresh after the source changed")
        check_equals_source(spec, new, fields, filters=FILTERS_PER_COMBINATION, seed=seed)
        return
    if path == "respec":
        spec = world.spec(RESPEC_FROM)
        cli_refresh(spec).ok("refresh under the first partition_by")
        old = world.source.expected()
        check_equals_source(spec, old, RESPEC_FROM, filters=0, seed=seed)
        world.change()
        new = world.source.expected()
        spec = world.spec()
        chosen = choose_partitions(old, new, fields)[:1]
        # A partial refresh first moves the old partitions holding rows of the selection into the new
        # layout, then refreshes the selection: judged under the new partition_by, the chosen partition
        # holds the new rows and every other one its old rows, in one layout or the other, never both.
        cli_refresh(spec, "--partitions", *chosen).ok(
            f"refresh --partitions {chosen} after partition_by changed"
        )
        check_partial(spec, old, new, fields, must_refresh=set(chosen), may_refresh=set(chosen))
        cli_refresh(spec).ok("plain refresh after partition_by changed")
        check_equals_source(spec, new, fields, filters=FILTERS_PER_COMBINATION, seed=seed)
        return
    spec = world.spec()
    # arrow: the in-process path `strategy="auto"` picks for a source that fits the memory budget.
    strategy = path if path in ("pushdown", "arrow") else "spark"
    summary = refresh_dataset(spec, DATASET, strategy=strategy, spark=spark)
    # Through Spark the executors write the final files whenever the engine allows it.
    refusal = written_mode_refusal(load_spec(spec).dataset(DATASET))
    expected = "written" if strategy == "spark" and refusal is None else strategy
    assert summary.stage_mode == expected, f"asked for {strategy}, staged with {summary.stage_mode}"
    check_equals_source(spec, world.source.expected(), fields, filters=FILTERS_PER_COMBINATION, seed=seed)


# --- the generator itself ----------------------------------------------------------------------------------


def test_pairwise_covers_every_valid_pair_and_only_valid_combinations() -> None:
    assert all(valid(c) for c in COMBINATIONS)
    assert uncovered_pairs(COMBINATIONS, AXES, valid) == set()
    assert all_pairs(AXES, valid, required=REQUIRED) == COMBINATIONS, "the generator is deterministic"
    cross = 1
    for values in AXES.values():
        cross *= len(values)
    assert len(COMBINATIONS) < cross / 10
    print(f"conservation matrix: {len(COMBINATIONS)} combinations of {cross}")


def test_pairwise_generator_on_a_small_constrained_example() -> None:
    axes = {"a": ["1", "2", "3"], "b": ["x", "y"], "c": ["p", "q", "r"]}

    def no_3q(c: dict[str, str]) -> bool:
        return not (c["a"] == "3" and c["c"] == "q")

    # Pairs of (a, b), (a, c) and (b, c), minus the forbidden (a=3, c=q).
    assert len(valid_pairs(axes, no_3q)) == 3 * 2 + (3 * 3 - 1) + 2 * 3
    assert ("a", "3", "c", "q") not in valid_pairs(axes, no_3q)
    chosen = all_pairs(axes, no_3q)
    assert uncovered_pairs(chosen, axes, no_3q) == set()
    assert all(no_3q(c) for c in chosen)
    assert 8 <= len(chosen) < 3 * 2 * 3, "at least the (a, c) pairs, fewer than the cross product"
    # The last pick covered something new, so the coverage check notices when it is missing.
    assert uncovered_pairs(chosen[:-1], axes, no_3q)
    seeded = all_pairs(axes, no_3q, required=[{"a": "3", "b": "y", "c": "r"}])
    assert seeded[0] == {"a": "3", "b": "y", "c": "r"}
    assert uncovered_pairs(seeded, axes, no_3q) == set()
    with pytest.raises(ValueError, match="not valid"):
        all_pairs(axes, no_3q, required=[{"a": "3", "b": "x", "c": "q"}])


# --- the oracle's own parts ---------------------------------------------------------------------------------


def test_row_digests_tell_apart_what_a_lossy_copy_would_merge() -> None:
    table = pa.table(
        {
            "s": pa.array(["", None, "NULL", "none", "a"]),
            "x": pa.array([0.0, -0.0, None, 1.5, 1.5]),
        }
    )
    assert len(set(row_digests(table))) == 5
    assert row_digests(table.slice(0, 2)) != row_digests(table.slice(1, 2))
    same_instant = pa.table(
        {
            "ts": pa.array(
                [dt.datetime(2026, 1, 1, 10, 0, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30)))],
                pa.timestamp("us", "UTC"),
            )
        }
    )
    utc = pa.table(
        {"ts": pa.array([dt.datetime(2026, 1, 1, 4, 30, tzinfo=dt.UTC)], pa.timestamp("us", "UTC"))}
    )
    assert row_digests(same_instant) == row_digests(utc), "instants compare as UTC instants"


def test_json_lines_spell_every_offset_and_read_back_exactly() -> None:
    chunk = hostile_chunks(11)[0]
    lines = [json_line(row, i) for i, row in enumerate(chunk.to_pylist())]
    assert any("+05:30" in line for line in lines)
    assert any('Z"' in line for line in lines)
    assert any("+00:00" in line for line in lines)
    back = pa.Table.from_pylist(parse_json_lines("\n".join(lines)), schema=SCHEMA)
    assert describe_difference(back, chunk) is None


def test_csv_reads_back_with_only_empty_fields_as_null() -> None:
    import pyarrow.csv as pacsv

    chunk = hostile_chunks(12)[0]
    back = pacsv.read_csv(io.BytesIO(csv_text(chunk).encode()), convert_options=csv_read_options())
    written = chunk.column("s").to_pylist()
    read = back.column("s").to_pylist()
    assert read == [None if v == "" else v for v in written], "only '' becomes NULL ('NULL', 'NA' stay text)"
    assert {"NULL", "NA", 'say "hi"'} <= set(read)
    assert back.column("id").to_pylist() == chunk.column("id").to_pylist()
    assert back.column("ts").cast(pa.timestamp("us", "UTC")).equals(chunk.column("ts"))
