"""`strategy="auto"`: the in-process Arrow path when the source fits the memory budget, Spark otherwise.

Real Parquet sources of hostile rows and the real Postgres; the choice is checked on its own (fast), and
end to end where Arrow runs (no Spark needed): the rows read back equal the source, and `refresh --json`
says which strategy ran and why. Budgets are set per test (the suite's default, in conftest.py, is 0).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from matrix_support import hostile_chunks
from test_arrow_refresh import (
    COMPOSITE,
    DATASET,
    IDENTITY,
    assert_same_rows,
    read_back,
    write_source,
    write_spec,
)

from airflow_partitions.cli.main import main
from airflow_partitions.exceptions import RefreshError
from airflow_partitions.refresh import plan_refresh, refresh_dataset
from airflow_partitions.refresh.arrow_budget import BUDGET_ENV, arrow_memory_budget, parse_bytes
from airflow_partitions.refresh.pipeline import load_project
from airflow_partitions.refresh.strategy import StrategyChoice, choose_strategy
from airflow_partitions.sources import open_dataset_source


@pytest.fixture
def file_source(tmp_path: Path) -> tuple[Path, pa.Table]:
    chunks = hostile_chunks(seed=34)
    write_source(tmp_path, chunks)
    return write_spec(tmp_path, "parquet", COMPOSITE), pa.concat_tables(chunks)


def choice_for(spec: Path, **kwargs: Any) -> StrategyChoice:
    project = load_project(spec)
    dataset = project.dataset(DATASET)
    source = open_dataset_source(dataset)
    plan = plan_refresh(project, dataset, source=source)
    return choose_strategy(project, plan, source, **kwargs)


def test_small_file_source_runs_in_process_and_keeps_every_row(
    file_source: tuple[Path, pa.Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, table = file_source
    monkeypatch.setenv(BUDGET_ENV, "1GiB")
    summary = refresh_dataset(spec, DATASET)
    assert summary.strategy == "arrow"
    assert summary.stage_mode == "arrow"
    assert "parquet file(s)" in str(summary.strategy_reason)
    assert "<= Arrow memory budget 1.0 GiB" in str(summary.strategy_reason)
    assert_same_rows(read_back(spec), table, "auto (arrow)")


def test_large_file_source_streams_unless_the_spill_does_not_fit(
    file_source: tuple[Path, pa.Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the memory budget the Arrow path streams and spills (its memory does not grow with the
    source); Spark only when the spilled rows would not fit the spill directory's disk."""
    from airflow_partitions.refresh import strategy as strategy_module

    spec, _ = file_source
    stored = sum(p.stat().st_size for p in (spec.parent / "src").iterdir())
    choice = choice_for(spec, budget=stored)  # the estimate is several times the stored bytes
    assert choice.engine == "arrow"
    assert "> Arrow memory budget" in choice.reason
    assert "streamed in batches, partitions spilled to " in choice.reason
    assert choice.estimated_bytes is not None
    assert choice.estimated_bytes > stored
    fits = choice_for(spec, budget=100 * stored)
    assert fits.engine == "arrow"
    assert "<= Arrow memory budget" in fits.reason
    monkeypatch.setattr(strategy_module, "free_bytes", lambda directory: 1000)
    full_disk = choice_for(spec, budget=stored)
    assert full_disk.engine == "spark"
    assert full_disk.strategy == "auto"  # the Spark stage still reads straight from a source that prunes
    assert "of spilled rows exceed the 1000 B free under " in full_disk.reason
    assert choice_for(spec, budget=100 * stored).engine == "arrow", "rows held in memory need no disk"


def test_explicit_strategies_are_kept(file_source: tuple[Path, pa.Table]) -> None:
    spec, table = file_source
    for explicit in ("spark", "pushdown", "arrow"):
        choice = choice_for(spec, strategy=explicit, budget=0)
        assert (choice.strategy, choice.reason) == (explicit, f"strategy {explicit!r} was set explicitly")
    # The suite's budget is 0 (auto never picks Arrow), yet an explicit arrow runs in process.
    summary = refresh_dataset(spec, DATASET, strategy="arrow")
    assert (summary.strategy, summary.stage_mode) == ("arrow", "arrow")
    assert_same_rows(read_back(spec), table, "explicit arrow")


def test_spark_given_or_unsupported_plan_goes_to_spark(file_source: tuple[Path, pa.Table]) -> None:
    spec, _ = file_source
    choice = choice_for(spec, spark_given="a Spark Connect server", budget=1024**3)
    assert choice.engine == "spark"
    assert "Spark is configured for this refresh (a Spark Connect server)" in choice.reason
    assert choice_for(spec, budget=0).reason == "the Arrow memory budget is 0 (never in-process)"


def test_append_mode_goes_to_spark_with_the_reason(tmp_path: Path) -> None:
    write_source(tmp_path, hostile_chunks(seed=35))
    spec = write_spec(
        tmp_path,
        "parquet",
        IDENTITY,
        extra=("      refresh_mode: append", "      refresh: {watermark_column: id}"),
    )
    refresh_dataset(spec, DATASET, strategy="arrow")  # the first refresh writes whole partitions
    pq.write_table(
        hostile_chunks(36, rows=30, chunks=1)[0].set_column(
            0, "id", pa.array(range(30_000, 30_030), pa.int64())
        ),
        tmp_path / "src" / "chunk8.parquet",
    )
    choice = choice_for(spec, budget=1024**3)
    assert choice.engine == "spark"
    assert "cannot run this plan: strategy 'arrow' does not support refresh_mode 'append'" in choice.reason


def test_refresh_json_says_which_strategy_ran_and_why(
    file_source: tuple[Path, pa.Table], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec, _ = file_source
    monkeypatch.setenv(BUDGET_ENV, "512MiB")
    assert main(["refresh", str(spec), DATASET, "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["strategy"] == "arrow"
    assert summary["strategy_reason"].endswith("<= Arrow memory budget 512.0 MiB")
    assert summary["stage_mode"] == "arrow"
    monkeypatch.setenv(BUDGET_ENV, "1GiB")
    assert main(["refresh", str(spec), DATASET, "--full"]) == 0
    assert f"{DATASET}: strategy arrow: " in capsys.readouterr().err


@pytest.mark.postgres
def test_postgres_source_sized_from_its_catalog(tmp_path: Path, pg_database: str) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.trips (id bigint PRIMARY KEY, zone int, note text)")
        conn.execute(
            "INSERT INTO public.trips SELECT i, CASE WHEN i % 9 = 0 THEN NULL ELSE i % 13 END, "
            "'n/' || i FROM generate_series(1, 2000) AS i"
        )
        conn.execute("ANALYZE public.trips")
        stored = conn.execute("SELECT pg_total_relation_size('public.trips')").fetchone()[0]  # type: ignore[index]
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        f"  - name: {DATASET}\n"
        "    from: postgres:public.trips\n"
        f"    params: {{url: '{pg_database}'}}\n"
        "    acceleration:\n"
        "      engine: parquet\n"
        "      partition_by:\n"
        '        - zb: "bucket(4, zone)"\n'
    )
    spec = tmp_path / "spec.yaml"
    small = choice_for(spec, budget=1024**3)
    assert small.engine == "arrow"
    assert "Postgres table public.trips" in small.reason
    assert "~2,000 rows" in small.reason
    tiny = choice_for(spec, budget=stored)  # the estimate is three times the stored bytes
    assert tiny.engine == "arrow"  # streamed in ADBC batches and spilled
    assert "> Arrow memory budget" in tiny.reason
    assert "streamed in batches" in tiny.reason


def test_budget_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_bytes("2GiB") == 2 * 1024**3
    assert parse_bytes("512 MB") == 512 * 1000**2
    assert parse_bytes("1e9") == 10**9
    with pytest.raises(RefreshError, match=r"AP_ARROW_MEMORY_BUDGET is 'lots'; give bytes"):
        parse_bytes("lots")
    monkeypatch.delenv(BUDGET_ENV)
    monkeypatch.setenv("AIRFLOW__AIRFLOW_PARTITIONS__ARROW_MEMORY_BUDGET", "3GiB")
    assert arrow_memory_budget() == 3 * 1024**3
    monkeypatch.delenv("AIRFLOW__AIRFLOW_PARTITIONS__ARROW_MEMORY_BUDGET")
    assert arrow_memory_budget() > 0
