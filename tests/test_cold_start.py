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


def test_parquet_point_read_in_a_fresh_process_imports_no_pandas(
    point_read_acceleration: tuple[Path, pa.Table],
) -> None:
    spec_path, _ = point_read_acceleration
    report = fresh_python(
        textwrap.dedent(
            f"""
            import json, sys
            from airflow_partitions.read import PartitionedDatasetReader
            PartitionedDatasetReader({str(spec_path)!r}, "trips").read("zone = 5")
            print(json.dumps({{"loaded": "pandas" in sys.modules}}))
            """
        )
    )
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


@pytest.mark.parametrize("argv", [["--help"], ["refresh", "--help"], ["query", "--help"], ["plan", "--help"]])
def test_help_imports_no_engine(argv: list[str]) -> None:
    report = fresh_python(
        textwrap.dedent(
            f"""
            import contextlib, io, json, sys
            from airflow_partitions.cli.main import main
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
                main({argv!r})
            engines = ("pyarrow", "duckdb", "pandas", "airflow", "pyspark")
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
