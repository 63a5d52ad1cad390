"""`airflow-partitions plan` and `airflow-partitions query` over a real acceleration."""

from __future__ import annotations

import csv
import io
import json

import pyarrow as pa
import pytest
from test_pruning_support import Acceleration, build_acceleration

from airflow_partitions.cli.main import main


@pytest.fixture(scope="module")
def acceleration(tmp_path_factory: pytest.TempPathFactory) -> Acceleration:
    rows = 200
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "user_id": pa.array([i % 40 for i in range(rows)], pa.int64()),
            "city": pa.array([["Zürich", "Oslo", "Lyon", "Kyiv"][i % 4] for i in range(rows)], pa.string()),
        }
    )
    return build_acceleration(tmp_path_factory.mktemp("cli"), table, [("user_bucket", "bucket(8, user_id)")])


def test_plan_explains_every_partition(
    acceleration: Acceleration, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["plan", str(acceleration.spec_path), "events", "--where", "user_id = 7"])
    out = capsys.readouterr().out
    assert status == 0
    total = len(acceleration.all_key_paths)
    assert f"selected 1 of {total} partitions" in out
    assert out.count("SKIP") == total - 1, "one line per skipped partition"
    assert "bucket(8, user_id): 7 ->" in out, "skips say which bucket user_id 7 hashes to"
    assert "residual" in out


def test_plan_json(acceleration: Acceleration, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["plan", str(acceleration.spec_path), "events", "--where", "user_id IN (1, 2)", "--json"])
    document = json.loads(capsys.readouterr().out)
    assert status == 0
    assert document["total"] == len(acceleration.all_key_paths)
    assert document["selected"] == len(acceleration.matching_key_paths("user_id IN (1, 2)"))
    assert {p["key_path"] for p in document["partitions"]} == acceleration.all_key_paths
    assert all(p["reason"] for p in document["partitions"])


def test_plan_reports_bad_filters(acceleration: Acceleration, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["plan", str(acceleration.spec_path), "events", "--where", "usr_id = 7"])
    assert status == 2
    assert "unknown column 'usr_id'" in capsys.readouterr().err


def test_query_prints_a_table(acceleration: Acceleration, capsys: pytest.CaptureFixture[str]) -> None:
    sql = "SELECT city, count(*) AS n FROM events WHERE user_id = 7 GROUP BY city ORDER BY city"
    status = main(["query", str(acceleration.spec_path), sql])
    out = capsys.readouterr().out
    assert status == 0
    assert "city" in out.splitlines()[0]
    assert "Kyiv" in out
    assert out.rstrip().endswith("(1 row)")


def test_query_json_and_csv(acceleration: Acceleration, capsys: pytest.CaptureFixture[str]) -> None:
    sql = "SELECT id, city FROM events WHERE bucket(8, user_id) = 3 ORDER BY id"
    assert main(["query", str(acceleration.spec_path), sql, "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = acceleration.expected_rows("bucket(8, user_id) = 3", ["id", "city"]).to_pylist()
    assert lines == sorted(expected, key=lambda r: r["id"])
    assert main(["query", str(acceleration.spec_path), sql, "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(int(r["id"]), r["city"]) for r in rows] == [(r["id"], r["city"]) for r in lines]


def test_query_refuses_writes(acceleration: Acceleration, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", str(acceleration.spec_path), "DROP VIEW events"]) == 2
    assert "only read-only SELECT" in capsys.readouterr().err
    assert main(["query", str(acceleration.spec_path), "SELECT 1 FROM nowhere"]) == 2
    assert "reads none of the spec's datasets" in capsys.readouterr().err


def test_plan_states_a_decimal_truncate_width_in_the_column_units(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    from decimal import Decimal

    amounts = [Decimal("0.00"), Decimal("9.99"), Decimal("10.00"), Decimal("-0.01"), None, Decimal("1234.56")]
    table = pa.table(
        {
            "id": pa.array(range(len(amounts)), pa.int64()),
            "amount": pa.array(amounts, pa.decimal128(12, 2)),
            "code": pa.array(["a/b", "", None, "k=v", "100%", "Ü'\""], pa.string()),
        }
    )
    built = build_acceleration(
        tmp_path_factory.mktemp("decimal"),
        table,
        [("amount_band", "truncate(1000, amount)"), ("code_prefix", "truncate(2, code)")],
    )
    status = main(["plan", str(built.spec_path), "events", "--where", "amount >= 10"])
    out = capsys.readouterr().out
    assert status == 0
    assert "partition field amount_band: truncate(1000, amount) on decimal(12,2): ranges 10.00 wide" in out, (
        out
    )
    assert "partition field code_prefix: truncate(2, code) on string: the first 2 characters" in out
    # The statement is what the data shows: 9.99 and 10.00 fall in different ranges, 0.00 and 9.99 share one.
    bands = {key_path.split("/")[0] for key_path in built.all_key_paths}
    assert {"amount_band=0.00", "amount_band=10.00", "amount_band=-10.00", "amount_band=1230.00"} <= bands, (
        bands
    )
