"""Column type names of the `schema:` block, schedule checks, and the spec package's import cost."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_partitions.exceptions import PartitionSpecError
from airflow_partitions.spec.arrow_types import parse_arrow_type
from airflow_partitions.spec.schedule import schedule_problem

REPO_ROOT = Path(__file__).resolve().parent.parent

ROUND_TRIP_TYPES = [
    pa.bool_(),
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.uint8(),
    pa.uint16(),
    pa.uint32(),
    pa.uint64(),
    pa.float16(),
    pa.float32(),
    pa.float64(),
    pa.string(),
    pa.large_string(),
    pa.binary(),
    pa.large_binary(),
    pa.date32(),
    pa.date64(),
    pa.timestamp("s"),
    pa.timestamp("ms"),
    pa.timestamp("us"),
    pa.timestamp("ns"),
    pa.timestamp("us", "UTC"),
    pa.timestamp("ns", "Europe/Paris"),
    pa.timestamp("ms", "+05:30"),
    pa.time32("ms"),
    pa.time64("ns"),
    pa.duration("us"),
    pa.decimal128(10, 2),
    pa.decimal128(38, 0),
    pa.decimal256(60, 10),
    pa.list_(pa.int64()),
    pa.large_list(pa.timestamp("us", "UTC")),
    pa.list_(pa.list_(pa.string())),
]


@pytest.mark.parametrize("arrow_type", ROUND_TRIP_TYPES, ids=str)
def test_arrow_spelling_round_trips(arrow_type: pa.DataType) -> None:
    assert parse_arrow_type(str(arrow_type)) == arrow_type


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("timestamp", pa.timestamp("us")),
        ("timestamp[us, UTC]", pa.timestamp("us", "UTC")),
        ("timestamp[ms,utc]", pa.timestamp("ms", "UTC")),
        ("TIMESTAMP[NS]", pa.timestamp("ns")),
        ("date", pa.date32()),
        ("decimal(10,2)", pa.decimal128(10, 2)),
        ("decimal(12)", pa.decimal128(12, 0)),
        ("decimal(50, 4)", pa.decimal256(50, 4)),
        ("bool", pa.bool_()),
        ("boolean", pa.bool_()),
        ("Int64", pa.int64()),
        ("utf8", pa.string()),
        ("double", pa.float64()),
        ("list<int64>", pa.list_(pa.int64())),
        ("  string  ", pa.string()),
    ],
)
def test_short_spellings(text: str, expected: pa.DataType) -> None:
    assert parse_arrow_type(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("int128", "unknown type name; supported: bool, int8..int64"),
        ("struct<a: int64>", "unknown type name"),
        ("", "expected a type name"),
        ("timestamp[xs]", "unit 'xs' is not one of s, ms, us, ns"),
        ("timestamp[us, Mars/Olympus]", "unknown time zone 'Mars/Olympus'"),
        ("timestamp[us, UTC, extra]", "timestamp takes [unit] or [unit, time zone]"),
        ("time32[us]", "unit 'us' is not one of s, ms"),
        ("time64", "time64 takes exactly one unit"),
        ("decimal", "malformed parameters"),
        ("decimal(a, b)", "decimal takes (precision, scale) as integers"),
        ("decimal(0, 0)", "precision 0 is outside 1..76"),
        ("decimal128(39, 2)", "precision 39 is outside 1..38"),
        ("decimal(5, 6)", "scale 6 must be between 0 and the precision 5"),
        ("list<nope>", "unsupported column type 'nope'"),
    ],
)
def test_bad_type_names(text: str, fragment: str) -> None:
    with pytest.raises(PartitionSpecError) as caught:
        parse_arrow_type(text)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    "schedule",
    [
        "@once",
        "@hourly",
        "@DAILY",
        "* * * * *",
        "*/15 * * * *",
        "0 0 1 1 *",
        "0 9-17/2 * * 1-5",
        "30 6 * * SUN,SAT",
        "0 0 1-7 * MON",
        "0 0 L * *",
        "0 0 15W * *",
        "0 0 * * 5L",
        "0 0 * * 1#3",
        "0 0 * * 7",
        "0 0 ? * MON",
    ],
)
def test_schedules_airflow_accepts(schedule: str) -> None:
    assert schedule_problem(schedule) is None


@pytest.mark.parametrize(
    ("schedule", "fragment"),
    [
        ("@fortnightly", "unknown schedule preset '@fortnightly'"),
        ("hourly", "has 1 field(s); a cron expression has 5"),
        ("0 0 * * * *", "has 6 field(s)"),
        ("60 * * * *", "minute value 60 is outside 0-59"),
        ("0 0 0 * *", "day of month value 0 is outside 1-31"),
        ("0 0 * 13 *", "month value 13 is outside 1-12"),
        ("0 0 * * 8", "day of week value 8 is outside 0-7"),
        ("0 0 * * FUNDAY", "day of week value 'FUNDAY' is not a number or one of SUN"),
        ("5-1 * * * *", "minute range '5-1' runs backwards"),
        ("*/x * * * *", "minute step 'x' must be a positive integer"),
        ("1-2-3 * * * *", "minute item '1-2-3' is not a number"),
        ("0 0 1,,2 * *", "day of month item '' is not a number"),
    ],
)
def test_schedules_rejected(schedule: str, fragment: str) -> None:
    problem = schedule_problem(schedule)
    assert problem is not None
    assert fragment in problem


HEAVY_MODULES = ("pyarrow", "duckdb", "pyspark", "pandas", "boto3", "airflow")


def _modules_loaded_by(code: str) -> list[str]:
    probe = textwrap.dedent(code) + textwrap.dedent(
        f"""
        import json, sys
        print(json.dumps(sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules)))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO_ROOT, check=True, timeout=120
    )
    return list(json.loads(result.stdout.strip().splitlines()[-1]))


def test_importing_the_spec_package_loads_no_heavy_module() -> None:
    assert _modules_loaded_by("import airflow_partitions.spec") == []


def test_loading_a_spec_without_schema_loads_no_heavy_module(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(
        textwrap.dedent(
            """
            datasets:
              - name: trips
                from: file:trips/
                acceleration:
                  engine: duckdb
                  partition_by: [bucket(8, id), "date_trunc('day', ts)", "truncate(10, amount)", region]
            """
        ).replace("[bucket(8, id),", '["bucket(8, id)",')
    )
    loaded = _modules_loaded_by(
        f"""
        from airflow_partitions.spec import load_spec
        assert len(load_spec({str(path)!r}).datasets[0].partition_by) == 4
        """
    )
    assert loaded == [], f"loading a spec (DAG parse time) imported {loaded}"
