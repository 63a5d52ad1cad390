"""Errors a user's filter or query can hit say what is wrong in plain words, typed.

Each case once gave a misleading answer: a filter calling `getenv()` failed as a `StorageError` while
reading, a misspelt SELECT was "reads none of the spec's datasets", parser internals (`Required keyword:
'expression' missing for <class 'sqlglot...EQ'>`) reached the user, and a column spelt with another case
resolved in filters although `partition_by` refuses it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_partitions.cli.main import main
from airflow_partitions.exceptions import FilterError, PartitionExpressionError, UnsafeQueryError
from airflow_partitions.pruning import bind_filter
from airflow_partitions.read import dataset_named_in
from airflow_partitions.transforms import parse_transform
from tests.test_pruning_support import Acceleration, build_acceleration

INTERNALS = ("sqlglot", "<class", "Required keyword", "\x1b", "SELECT 1 WHERE", "Traceback")


@pytest.fixture(scope="module")
def acceleration(tmp_path_factory: pytest.TempPathFactory) -> Acceleration:
    table = pa.table(
        {
            "PULocationID": pa.array([1, 2, 3, 132, None], pa.int64()),
            "v": ["a", "b", "c", "Zürich", None],
            "a": [1, 2, 3, 4, 5],
            "A": [10, 20, 30, 40, 50],
        }
    )
    directory: Path = tmp_path_factory.mktemp("filter-errors")
    return build_acceleration(directory, table, [("b", "bucket(4, PULocationID)")])


def _assert_plain(message: str) -> None:
    for internal in INTERNALS:
        assert internal not in message, f"{internal!r} leaks into the message: {message}"


# --- functions a filter may not call ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "function"),
    [
        ("getenv('HOME') = 'x'", "getenv"),
        ("v = getenv('HOME')", "getenv"),
        ("read_text('/etc/passwd') IS NOT NULL", "read_text"),
        ("length(read_blob('/etc/passwd')) > 0 OR v = 'a'", "read_blob"),
        ("v IN (SELECT getenv('HOME'))", "getenv"),
    ],
)
def test_a_filter_calling_an_environment_or_file_function_is_refused(
    acceleration: Acceleration, where: str, function: str
) -> None:
    with acceleration.reader() as reader:
        for call in (reader.plan, reader.read):
            with pytest.raises(FilterError) as info:
                call(where)
            message = str(info.value)
            assert f"{function}()" in message, message
            assert "cannot be used in a filter" in message, message
            _assert_plain(message)


# --- a query that is not SQL ----------------------------------------------------------------------------


def test_a_query_that_is_not_sql_says_so(
    acceleration: Acceleration, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(UnsafeQueryError) as info:
        dataset_named_in(acceleration.spec_path, "SELEC * FROM events")
    message = str(info.value)
    assert "not valid SQL" in message, message
    assert 'near "SELEC" at line 1, column 1' in message, message
    assert "reads none" not in message
    assert main(["query", str(acceleration.spec_path), "SELECT * FROM events WHERE v = "]) == 2
    err = capsys.readouterr().err
    assert "not valid SQL" in err, err
    assert "line 1, column 30" in err, err
    assert "\n" not in err.strip(), f"one line: {err!r}"


# --- parser internals never reach the user ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("PULocationID = ", "incomplete comparison '=' at character 14"),
        ("PULocationID = AND v = 'a'", "incomplete comparison '=' at character 16"),
        ("v = 'a' AND", "incomplete condition 'AND' at character 9"),
        ("NOT", "incomplete condition 'NOT' at character 1"),
        ("PULocationID BETWEEN 1", "incomplete BETWEEN"),
        ("PULocationID + = 3", "incomplete arithmetic '+'"),
        ("v IN (", "missing ')'"),
        ("(v = 'a'", "missing ')'"),
        ("v = 'a' 1", "unexpected '1' at character 9"),
        ("v = 'abc", "unclosed quote"),
        ('v = "abc', "unclosed quote"),
    ],
)
def test_filter_syntax_errors_are_plain(acceleration: Acceleration, where: str, expected: str) -> None:
    with acceleration.reader() as reader, pytest.raises(FilterError) as info:
        reader.plan(where)
    message = str(info.value)
    assert message.startswith("syntax error in filter"), message
    assert expected in message, message
    _assert_plain(message)


def test_syntax_errors_are_plain_on_every_path(
    acceleration: Acceleration, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = acceleration.table.schema
    with pytest.raises(FilterError) as info:
        bind_filter([("bucket(4, PULocationID", "=", 1)], schema)
    _assert_plain(str(info.value))
    assert "missing ')'" in str(info.value)
    with pytest.raises(PartitionExpressionError) as expression_info:
        parse_transform("bucket(16, id = ")
    _assert_plain(str(expression_info.value))
    assert "incomplete comparison '='" in str(expression_info.value)
    status = main(["plan", str(acceleration.spec_path), "events", "--where", "PULocationID = "])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "incomplete comparison '='" in err, err
    _assert_plain(err)


def test_refresh_where_syntax_errors_are_plain(acceleration: Acceleration) -> None:
    from airflow_partitions.refresh.pipeline import where_selector
    from airflow_partitions.spec import load_spec

    schema = acceleration.table.schema
    schema = schema.remove(schema.get_field_index("A"))  # a source may not hold both `a` and `A`
    dataset = load_spec(acceleration.spec_path).dataset("events").bind(schema)
    with pytest.raises(FilterError) as info:
        where_selector(dataset, "PULocationID = AND v = 'a'")
    assert "incomplete comparison '='" in str(info.value)
    _assert_plain(str(info.value))


# --- one rule for column names ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "where",
    [
        "PULocationId = 132",
        "pulocationid IN (1, 132)",
        '"PULOCATIONID" = 132',
        [("PULocationId", "=", 132)],
        "bucket(4, pulocationid) = 1",
    ],
)
def test_a_column_spelt_with_another_case_is_refused_with_the_exact_spelling(
    acceleration: Acceleration, where: Any
) -> None:
    with acceleration.reader() as reader, pytest.raises(FilterError) as info:
        reader.read(where)
    message = str(info.value)
    assert "case-sensitive; did you mean 'PULocationID'?" in message, message


def test_column_selection_follows_the_same_rule(acceleration: Acceleration) -> None:
    with acceleration.reader() as reader:
        with pytest.raises(FilterError, match="did you mean 'PULocationID'"):
            reader.read(columns=["pulocationid"])
        assert reader.read("PULocationID = 132", columns=["PULocationID", "v"]).to_pylist() == [
            {"PULocationID": 132, "v": "Zürich"}
        ]


def test_columns_differing_only_in_case_each_bind_exactly(acceleration: Acceleration) -> None:
    schema = acceleration.table.schema
    assert str(bind_filter("a = 1", schema)) != str(bind_filter("A = 1", schema))
    assert "'A'" in repr(bind_filter('"A" = 20', schema))
    assert "'a'" in repr(bind_filter("a = 20", schema))


def test_partition_by_keeps_the_same_rule() -> None:
    with pytest.raises(PartitionExpressionError, match="did you mean 'PULocationID'"):
        parse_transform("bucket(50, pulocationid)").resolve_source_column(["PULocationID"])


def test_a_source_with_columns_differing_only_by_case_is_refused(tmp_path: Path) -> None:
    """DuckDB reads accelerations and matches names case-insensitively: a source holding `a` and `A`
    would read one column as the other (or as NULL), so refresh and validate refuse it up front."""
    import pyarrow.parquet as pq

    from airflow_partitions.exceptions import SpecValidationError
    from airflow_partitions.refresh import plan_refresh
    from airflow_partitions.spec import load_spec, validate_against_schema

    (tmp_path / "src").mkdir()
    table = pa.table({"id": [1, 2, None], "a": ["x", None, "é/="], "A": [10, None, 30]})
    pq.write_table(table, tmp_path / "src" / "part.parquet")
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: cased\n"
        "    from: file:src\n"
        "    acceleration:\n"
        "      partition_by: ['bucket(2, id)']\n"
    )
    with pytest.raises(SpecValidationError) as info:
        plan_refresh(tmp_path / "spec.yaml", "cased")
    assert "'A' and 'a'" in str(info.value)
    assert "differ only by case" in str(info.value)
    assert not (tmp_path / "acc" / "cased" / "_catalog").exists(), "nothing committed"
    problems = validate_against_schema(load_spec(tmp_path / "spec.yaml").dataset("cased"), table.schema)
    assert any("differ only by case" in p for p in problems)


def test_query_sql_is_resolved_by_duckdb(acceleration: Acceleration) -> None:
    # A query is DuckDB SQL, run by DuckDB: its identifiers follow DuckDB's rule (case-insensitive).
    with acceleration.reader() as reader:
        result = reader.query("SELECT count(*) AS n FROM events WHERE pulocationid = 132")
    assert result.to_pylist() == [{"n": 1}]


# --- functions that sleep or answer differently on each call ------------------------------------------

NON_DETERMINISTIC = [
    ("PULocationID > sleep_ms(1)", "sleep_ms"),
    ("a < random() * 10", "rand"),  # DuckDB's other name for random()
    ("a = 1 OR setseed(0.5) IS NULL", "setseed"),
    ("v <> CAST(uuid() AS VARCHAR)", "uuid"),
    ("v <> CAST(gen_random_uuid() AS VARCHAR)", "uuid"),
    ("CAST(now() AS DATE) > DATE '2000-01-01'", "now"),
    ("current_timestamp > TIMESTAMPTZ '2000-01-01 00:00:00+00'", "current_timestamp"),
    ("current_date > DATE '2000-01-01' AND a = 1", "current_date"),
    ("get_current_timestamp() IS NOT NULL", "get_current_timestamp"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("where", "function"), NON_DETERMINISTIC)
def test_a_filter_calling_a_sleeping_or_non_deterministic_function_is_refused(
    acceleration: Acceleration, where: str, function: str
) -> None:
    with acceleration.reader() as reader:
        for call in (reader.plan, reader.read):
            with pytest.raises(FilterError) as info:
                call(where)
            message = str(info.value)
            assert f"{function}()" in message, message
            assert "answers differently on each call" in message, message
            _assert_plain(message)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "command",
    [
        ["plan", "{spec}", "events", "--where", "a > sleep_ms(1)"],
        ["plan", "{spec}", "events", "--where", "a > sleep_ms(1)", "--json"],
        ["write", "{spec}", "events", "--delete-where", "a > sleep_ms(1)"],
        ["write", "{spec}", "events", "--delete-where", "a < random() * 10", "--json"],
    ],
    ids=["plan", "plan-json", "delete-where", "delete-where-json"],
)
def test_cli_filters_refuse_a_sleeping_function(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    table = pa.table({"id": pa.array([1, 2, None], pa.int64()), "a": [1, None, 3]})
    acceleration = build_acceleration(tmp_path, table, [("b", "bucket(4, id)")])
    spec = str(acceleration.spec_path)
    assert main([part.format(spec=spec) for part in command]) == 2
    err = capsys.readouterr().err
    assert "cannot be used in a filter" in err, err
    assert acceleration.snapshot().version == 1, "nothing was deleted"


def test_a_filter_constant_is_evaluated_within_a_memory_limit(acceleration: Acceleration) -> None:
    """A constant DuckDB folds for pruning may not take the machine's memory (1 GB asked, 256 MiB given)."""
    from airflow_partitions.exceptions import QueryLimitError

    with acceleration.reader() as reader:
        for call in (reader.plan, reader.read):
            with pytest.raises(QueryLimitError) as info:
                call("a = length(repeat('x', 1000000000))")
            assert info.value.limit == "memory"
        assert reader.read("a = length(repeat('x', 3))").column("a").to_pylist() == [3]


@pytest.mark.timeout(120)
def test_a_delete_filter_is_bounded_in_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`write --delete-where` evaluates its filter on the partition rows within a query's default limits:
    a filter building a 16 GB list per row (memory DuckDB's own limit does not count) stops as a memory
    limit, deleting nothing."""
    table = pa.table({"id": pa.array([1, 2, None], pa.int64()), "v": ["a", None, "c/=%'"]})
    acceleration = build_acceleration(tmp_path, table, [("b", "bucket(4, id)")])
    where = "len(generate_series(1, 2000000000 + coalesce(id, 0))) > 0 OR v = 'a'"
    assert main(["write", str(acceleration.spec_path), "events", "--delete-where", where]) == 2
    assert "memory limit" in capsys.readouterr().err
    assert acceleration.snapshot().version == 1, "nothing was deleted"
