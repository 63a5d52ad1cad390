"""refresh_mode: append and changes through the refresh DAG (`dag.test()`): the mode comes from the spec,
the DAG has no new parameter; the second run of `clicks` appends only the new rows to the committed
partition, the second run of `accounts` upserts a changed row that moves to another partition."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from airflow_e2e.metadata_db import in_process_metadata_db
from support_no_reads import no_data_reads

from airflow_partitions.catalog import open_catalog
from airflow_partitions.sources import open_source
from airflow_partitions.spec import load_spec
from airflow_partitions.storage import get_storage

pytestmark = [pytest.mark.airflow, pytest.mark.postgres, pytest.mark.slow]


def test_append_and_changes_through_the_refresh_dag(pg_database: str, tmp_path: Path) -> None:
    from airflow_partitions.operators.run_conf import RefreshRunConf

    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.clicks (id bigint PRIMARY KEY, page text, at timestamp)")
        conn.execute("CREATE INDEX clicks_at ON public.clicks (at)")
        conn.execute(
            "INSERT INTO public.clicks SELECT i, CASE WHEN i % 5 = 0 THEN NULL ELSE 'p/' || i || '%' END, "
            "timestamp '2026-04-01' + i * interval '7 minutes' FROM generate_series(0, 99) AS i"
        )
        conn.execute(
            "CREATE TABLE public.accounts (id bigint PRIMARY KEY, region text, updated_at timestamptz)"
        )
        conn.execute(
            "INSERT INTO public.accounts SELECT i, CASE WHEN i % 3 = 0 THEN 'eu' ELSE 'us/é' END, "
            "timestamptz '2026-04-01 00:00+00' + i * interval '1 minute' FROM generate_series(0, 29) AS i"
        )
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: clicks\n"
        "    from: postgres:public.clicks\n"
        f"    params: {{url: '{pg_database}'}}\n"
        "    acceleration:\n"
        "      refresh_mode: append\n"
        "      partition_by: [{day: \"date_trunc('day', at)\"}]\n"
        "      refresh: {watermark_column: at}\n"
        "  - name: accounts\n"
        "    from: postgres:public.accounts\n"
        f"    params: {{url: '{pg_database}', pushdown: always}}\n"
        "    acceleration:\n"
        "      refresh_mode: changes\n"
        "      primary_key: [id]\n"
        '      partition_by: [{r: "region"}]\n'
        "      refresh: {watermark_column: updated_at}\n"
    )
    project = load_spec(tmp_path / "spec.yaml")
    dataset = project.dataset("clicks")
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "refresh_clicks.py").write_text(
        "from airflow_partitions.dag_factory import build_refresh_dags\n"
        f"globals().update(build_refresh_dags({str(tmp_path / 'spec.yaml')!r}))\n"
    )
    with in_process_metadata_db(str(dags)):
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=str(dags))
        assert bag.import_errors == {}, bag.import_errors
        dag = bag.dags["refresh_clicks"]
        assert str(dag.test(run_conf=RefreshRunConf().to_conf()).state) == "success"
        catalog = open_catalog(project, dataset)
        first = catalog.latest()
        assert first is not None
        assert first.total_rows == 100
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO public.clicks SELECT i, 'new', timestamp '2026-04-01 23:30' "
                "+ i * interval '1 s' FROM generate_series(1000, 1009) AS i"
            )
        run = dag.test(run_conf=RefreshRunConf().to_conf())
        assert str(run.state) == "success"
        accounts_dag = bag.dags["refresh_accounts"]
        assert str(accounts_dag.test(run_conf=RefreshRunConf().to_conf()).state) == "success"
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute(
                "UPDATE public.accounts SET region = 'eu', updated_at = timestamptz '2026-04-02 00:00+00' "
                "WHERE id = 1"
            )
        guarded = [tmp_path / "acc" / "accounts", tmp_path / "acc" / "_staging"]
        with no_data_reads(guarded) as guard:
            changes_run = accounts_dag.test(run_conf=RefreshRunConf().to_conf())
        guard.check()  # the Spark executors merged and wrote the partitions, not the task process
        assert str(changes_run.state) == "success"
    accounts = project.dataset("accounts")
    moved = open_catalog(project, accounts).latest()
    assert moved is not None
    assert moved.operation == "refresh"
    assert {path: entry.rows for path, entry in moved.partitions.items()} == {"r=eu": 11, "r=us%2F%C3%A9": 19}
    accounts_files = [f for entry in moved.partitions.values() for f in entry.files]
    accounts_table = get_storage(accounts.acceleration).read(
        open_catalog(project, accounts).data_root, accounts_files
    )
    assert sorted(accounts_table.to_pylist(), key=lambda r: r["id"]) == sorted(
        open_source(accounts.source).read_all().to_pylist(), key=lambda r: r["id"]
    )
    second = open_catalog(project, dataset).latest()
    assert second is not None
    day = "day=2026-04-01T00%3A00%3A00"
    assert set(first.partitions[day].files) < set(second.partitions[day].files), "files kept, one added"
    assert second.partitions[day].rows == first.partitions[day].rows + 10
    header = open_catalog(project, dataset).versions()[-1]
    assert header.conservation is not None
    assert header.conservation["routed"] == header.conservation["written"] == 10
    assert header.conservation["late_rows"] == {}, "the DAG's plan audited the appends: nothing late"
    files = [f for entry in second.partitions.values() for f in entry.files]
    table = get_storage(dataset.acceleration).read(open_catalog(project, dataset).data_root, files)
    source = open_source(dataset.source).read_all()
    assert table.schema.equals(source.schema)
    assert sorted(table.to_pylist(), key=lambda r: r["id"]) == sorted(
        source.to_pylist(), key=lambda r: r["id"]
    ), "every source row once, with its NULLs and types"
