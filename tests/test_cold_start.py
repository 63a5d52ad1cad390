"""Cold starts: a fresh process (a CLI call, a new Airflow task) imports only what its work needs.

A Parquet point read goes through DuckDB, so it must not pay for `pyarrow.dataset` (which pulls in
pandas); `airflow-partitions --help` prints from argparse alone. Each check runs in a fresh interpreter
and looks at `sys.modules` afterwards. The parsed spec and the read database are kept per process.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
from decimal import Decimal as D
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.read.scan import shared_read_database
from airflow_partitions.spec import load_spec
from tests.test_pruning_support import build_acceleration

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("pandas", "pyarrow.dataset", "pyspark", "airflow")


def hostile_rows(rows: int = 600) -> pa.Table:
    words = ["", "a/b", "k=v", "50%", "it's", 'q"q', "ü", None]
    return pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "zone": pa.array([None if i % 29 == 0 else i % 17 for i in range(rows)], pa.int64()),
            "s": pa.array([words[i % len(words)] for i in range(rows)], pa.string()),
        }
    )


def fresh_python(code: str) -> dict[str, Any]:
    """Run `code` in a new interpreter with this checkout first on the path; it prints one JSON line."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def point_read_acceleration(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pa.Table]:
    table = hostile_rows()
    built = build_acceleration(
        tmp_path_factory.mktemp("cold"), table, [("zb", "bucket(4, zone)")], dataset="trips"
    )
    return built.spec_path, table


def test_parquet_point_read_in_a_fresh_process_imports_no_pyarrow_dataset(
    point_read_acceleration: tuple[Path, pa.Table],
) -> None:
    spec_path, table = point_read_acceleration
    expected = table.filter(pc.field("zone") == 5).num_rows
    report = fresh_python(
        textwrap.dedent(
            f"""
            import json, sys
            from airflow_partitions.read import PartitionedDatasetReader
            rows = PartitionedDatasetReader({str(spec_path)!r}, "trips").read("zone = 5").num_rows
            print(json.dumps({{"rows": rows, "loaded": sorted(m for m in {HEAVY!r} if m in sys.modules)}}))
            """
        )
    )
    assert report["rows"] == expected
    assert "pyarrow.dataset" not in report["loaded"]
    assert "pyspark" not in report["loaded"]
    assert "airflow" not in report["loaded"]


@pytest.mark.parametrize("where", ["zone = 5", "zone = 5 AND zone = 6"], ids=["point", "nothing"])
def test_parquet_point_read_in_a_fresh_process_imports_no_pandas(
    point_read_acceleration: tuple[Path, pa.Table], where: str
) -> None:
    spec_path, table = point_read_acceleration
    report = fresh_python(
        textwrap.dedent(
            f"""
            import json, sys
            from airflow_partitions.read import PartitionedDatasetReader
            read = PartitionedDatasetReader({str(spec_path)!r}, "trips").read({where!r})
            print(json.dumps({{"rows": read.num_rows, "names": read.column_names,
                               "loaded": "pandas" in sys.modules}}))
            """
        )
    )
    assert report["rows"] == (table.filter(pc.field("zone") == 5).num_rows if where == "zone = 5" else 0)
    assert report["names"] == table.column_names
    assert report["loaded"] is False


@pytest.fixture(scope="module")
def temporal_acceleration(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pa.Table]:
    rows = 400
    start = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "ts": pa.array(
                [None if i % 13 == 0 else start + dt.timedelta(hours=i) for i in range(rows)],
                pa.timestamp("us", tz="UTC"),
            ),
            "s": pa.array([["a", "b/c", None, "ü", ""][i % 5] for i in range(rows)], pa.string()),
            "d": pa.array(
                [None if i % 7 == 0 else dt.date(2024, 1, 1) + dt.timedelta(days=i % 40) for i in range(rows)]
            ),
        }
    )
    built = build_acceleration(
        tmp_path_factory.mktemp("cold-temporal"), table, [("day", "day(ts)"), ("s", "s")], dataset="trips"
    )
    return built.spec_path, table


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        (
            "ts >= TIMESTAMP '2024-01-05 00:00:00+00'",
            pc.field("ts") >= pa.scalar(dt.datetime(2024, 1, 5, tzinfo=dt.UTC)),
        ),
        ("d = DATE '2024-01-03'", pc.field("d") == pa.scalar(dt.date(2024, 1, 3))),
        ("s = 'ü'", pc.field("s") == "ü"),
    ],
    ids=["timestamp", "date", "string"],
)
def test_point_reads_on_other_kinds_import_no_pandas(
    temporal_acceleration: tuple[Path, pa.Table], where: str, expected: pc.Expression
) -> None:
    spec_path, table = temporal_acceleration
    report = fresh_python(
        textwrap.dedent(
            f"""
            import json, sys
            from airflow_partitions.read import PartitionedDatasetReader
            read = PartitionedDatasetReader({str(spec_path)!r}, "trips").read({where!r})
            ids = read.column("id").to_pylist()
            print(json.dumps({{"ids": sorted(ids), "loaded": "pandas" in sys.modules}}))
            """
        )
    )
    assert report["ids"] == sorted(table.filter(expected).column("id").to_pylist())
    assert report["ids"], "the predicate selects rows"
    assert report["loaded"] is False


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["refresh", "--help"], ["query", "--help"], ["plan", "--help"], ["vacuum", "--help"]],
)
def test_help_imports_no_engine(argv: list[str]) -> None:
    report = fresh_python(
        textwrap.dedent(
            f"""
            import contextlib, io, json, sys
            from airflow_partitions.cli.main import main
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
                main({argv!r})
            engines = ("pyarrow", "duckdb", "pandas", "airflow", "pyspark", "sqlglot", "yaml")
            print(json.dumps({{"usage": "usage:" in out.getvalue(),
                               "loaded": sorted(m for m in engines if m in sys.modules)}}))
            """
        )
    )
    assert report == {"usage": True, "loaded": []}


def test_spec_parsed_once_per_process_until_its_text_changes(tmp_path: Path) -> None:
    path = tmp_path / "datasets.yaml"
    text = textwrap.dedent(
        """\
        accelerator_dir: {root}
        datasets:
          - name: {name}
            from: file:/data/x.parquet
            acceleration:
              partition_by:
                - zb: "bucket(4, zone)"
        """
    )
    path.write_text(text.format(root=tmp_path / "acc", name="trips"), encoding="utf-8")
    first = load_spec(path)
    assert load_spec(path) is first, "an unchanged file is not parsed again"
    assert load_spec(path, check_types=False) is not first, "a lighter parse is its own entry"
    # Same size, same millisecond: the text decides, not the file time.
    path.write_text(text.format(root=tmp_path / "acc", name="rides"), encoding="utf-8")
    assert load_spec(path).names == ("rides",)


def test_readers_of_a_process_share_one_read_database(
    point_read_acceleration: tuple[Path, pa.Table],
) -> None:
    spec_path, table = point_read_acceleration
    expected = table.filter(pc.field("zone") == 5)
    with PartitionedDatasetReader(spec_path, "trips") as first:
        assert first.read("zone = 5").num_rows == expected.num_rows
    # The first reader is closed: the shared database stays open for the next one.
    with PartitionedDatasetReader(spec_path, "trips") as second:
        assert second.read("zone = 5").sort_by("id").equals(expected)
        assert second._scanner._base_connection() is shared_read_database()


@pytest.fixture(scope="module")
def decimal_ms_acceleration(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pa.Table]:
    """Partitions by a decimal (truncate) and by the hour of a millisecond timestamp, NULLs in both."""
    rows = 300
    start = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "amount": pa.array(
                [None if i % 11 == 0 else D(i * 7 - 500) / 100 for i in range(rows)],
                pa.decimal128(12, 2),
            ),
            "ts": pa.array(
                [
                    None if i % 13 == 0 else start + dt.timedelta(minutes=37 * i, milliseconds=i)
                    for i in range(rows)
                ],
                pa.timestamp("ms", tz="UTC"),
            ),
            "s": pa.array(
                [["a/b", "k=v", None, "ü", "", "50%", "it's"][i % 7] for i in range(rows)], pa.string()
            ),
        }
    )
    built = build_acceleration(
        tmp_path_factory.mktemp("cold-decimal-ms"),
        table,
        [("amt", "truncate(1000, amount)"), ("hr", "hour(ts)")],
        dataset="trips",
    )
    return built.spec_path, table


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        (
            "amount >= 1.00 AND amount < 3.50",
            (pc.field("amount") >= pa.scalar(D("1.00"), pa.decimal128(12, 2)))
            & (pc.field("amount") < pa.scalar(D("3.50"), pa.decimal128(12, 2))),
        ),
        (
            "ts >= TIMESTAMP '2024-03-02 00:00:00+00' AND ts < TIMESTAMP '2024-03-02 06:00:00+00'",
            (pc.field("ts") >= pa.scalar(dt.datetime(2024, 3, 2, tzinfo=dt.UTC), pa.timestamp("ms", "UTC")))
            & (
                pc.field("ts")
                < pa.scalar(dt.datetime(2024, 3, 2, 6, tzinfo=dt.UTC), pa.timestamp("ms", "UTC"))
            ),
        ),
        ("amount IS NULL", pc.field("amount").is_null()),
    ],
    ids=["decimal", "ms-timestamp", "decimal-null"],
)
def test_point_reads_of_decimal_and_ms_timestamp_partitions_import_no_pandas(
    decimal_ms_acceleration: tuple[Path, pa.Table], where: str, expected: pc.Expression
) -> None:
    spec_path, table = decimal_ms_acceleration
    report = fresh_python(
        textwrap.dedent(
            f"""
            import json, sys
            from airflow_partitions.read import PartitionedDatasetReader
            read = PartitionedDatasetReader({str(spec_path)!r}, "trips").read({where!r})
            ids = read.column("id").to_pylist()
            loaded = sorted(m for m in {HEAVY!r} if m in sys.modules)
            print(json.dumps({{"ids": sorted(ids), "loaded": loaded}}))
            """
        )
    )
    assert report["ids"] == sorted(table.filter(expected).column("id").to_pylist())
    assert report["ids"], "the predicate selects rows"
    assert report["loaded"] == []


def hostile_types(rows: int = 500) -> pa.Table:
    """Every common kind, NULLs in each (the partition column too), NaN, -0.0, offsets, unicode."""
    start = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
    regions = ["Zürich", "a/b", "k=v", "50%", "it's", 'q"q', "", None]
    return pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "region": pa.array([regions[i % len(regions)] for i in range(rows)], pa.string()),
            "small": pa.array([None if i % 9 == 0 else i % 100 - 50 for i in range(rows)], pa.int16()),
            "x": pa.array(
                [
                    None if i % 11 == 0 else float("nan") if i % 13 == 0 else -0.0 if i % 17 == 0 else i / 7
                    for i in range(rows)
                ],
                pa.float64(),
            ),
            "amount": pa.array(
                [None if i % 7 == 0 else D(i * 13 - 3000) / 100 for i in range(rows)], pa.decimal128(12, 2)
            ),
            "ts": pa.array(
                [None if i % 5 == 0 else start + dt.timedelta(minutes=91 * i) for i in range(rows)],
                pa.timestamp("us", tz="UTC"),
            ),
            "ms": pa.array(
                [
                    None
                    if i % 6 == 0
                    else dt.datetime(1969, 12, 31) + dt.timedelta(seconds=i, milliseconds=i)
                    for i in range(rows)
                ],
                pa.timestamp("ms"),
            ),
            "d": pa.array(
                [None if i % 8 == 0 else dt.date(2000, 2, 28) + dt.timedelta(days=i) for i in range(rows)]
            ),
            "flag": pa.array([None if i % 10 == 0 else i % 3 == 0 for i in range(rows)], pa.bool_()),
            "blob": pa.array(
                [None if i % 12 == 0 else bytes([i % 256, 0, 255]) for i in range(rows)], pa.binary()
            ),
        }
    )


@pytest.fixture(scope="module")
def identity_acceleration(tmp_path_factory: pytest.TempPathFactory) -> Any:
    table = hostile_types()
    return build_acceleration(tmp_path_factory.mktemp("cold-identity"), table, [("region", "region")])


IDENTITY_READS = [
    "region = 'Zürich'",
    "region = 'a/b'",
    "region = ''",
    "region IS NULL",
    "region IN ('k=v', '50%', 'it''s')",
    None,
]


@pytest.mark.parametrize("where", IDENTITY_READS)
@pytest.mark.parametrize("columns", [None, ["ms", "id", "x", "amount"]], ids=["all", "some"])
def test_exact_reads_without_duckdb_return_exactly_the_source_rows(
    identity_acceleration: Any, where: str | None, columns: list[str] | None
) -> None:
    """The exact files of a Parquet acceleration are read by pyarrow alone: same rows, same schema."""
    from matrix_support import multiset_difference

    acc = identity_acceleration
    with PartitionedDatasetReader(acc.spec_path, acc.dataset, catalog=acc.catalog) as reader:
        plan = reader.plan(where)
        assert plan.files, where
        assert not plan.inexact_files, "identity partitions: exact files only"
        got = reader.read(where, columns=columns)
    expected = acc.expected_rows(where, columns)
    assert got.schema.equals(expected.schema)
    assert multiset_difference(got, expected) == ([], [])
    assert got.num_rows == expected.num_rows


def test_an_exact_point_read_in_a_fresh_process_imports_no_duckdb(identity_acceleration: Any) -> None:
    acc = identity_acceleration
    expected = acc.expected_rows("region = 'a/b'").column("id").to_pylist()
    report = fresh_python(
        textwrap.dedent(
            f"""
            import json, sys
            from airflow_partitions.read import PartitionedDatasetReader
            read = PartitionedDatasetReader({str(acc.spec_path)!r}, {acc.dataset!r}).read("region = 'a/b'")
            engines = ("duckdb", "pandas", "pyarrow.dataset", "pyspark", "airflow")
            loaded = sorted(m for m in engines if m in sys.modules)
            print(json.dumps({{"ids": sorted(read.column("id").to_pylist()), "loaded": loaded}}))
            """
        )
    )
    assert report["ids"] == sorted(expected)
    assert report["ids"]
    assert report["loaded"] == []


def test_a_damaged_exact_file_is_refused_not_read(tmp_path: Path) -> None:
    """The SHA-256 check comes before pyarrow opens a file, as before DuckDB did."""
    from airflow_partitions.exceptions import StorageError

    table = hostile_types(120)
    acc = build_acceleration(tmp_path, table, [("region", "region")])
    with PartitionedDatasetReader(acc.spec_path, acc.dataset, catalog=acc.catalog) as reader:
        (file,) = reader.plan("region = 'a/b'").files
        path = acc.root / acc.dataset / file.path
        data = bytearray(path.read_bytes())
        data[len(data) // 3] ^= 0xFF
        path.write_bytes(bytes(data))
        with pytest.raises(StorageError):
            reader.read("region = 'a/b'")
