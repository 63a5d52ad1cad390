"""refresh_mode: changes with change data capture through the refresh DAG (`dag.test()`): the first run
creates the slot and copies the table; the second merges inserts, a move, a key change and deletes on
the Spark executors; the commit task records the WAL position and advances the slot."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from airflow_e2e.metadata_db import in_process_metadata_db
from test_cdc_postgres import assert_equals_source, create_accounts, execute
from test_operators import StatsdListener, statsd  # noqa: F401 (the `statsd` fixture)

from airflow_partitions.catalog import open_catalog
from airflow_partitions.refresh.cdc import change_stream, committed_position
from airflow_partitions.spec import load_spec

pytestmark = [pytest.mark.airflow, pytest.mark.postgres, pytest.mark.slow]


def test_cdc_through_the_refresh_dag(
    pg_logical_database: str,
    tmp_path: Path,
    statsd: StatsdListener,  # noqa: F811 (the fixture imported above)
) -> None:
    from airflow_partitions.operators.run_conf import RefreshRunConf

    url = pg_logical_database
    create_accounts(url)
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: accounts\n"
        "    from: postgres:public.accounts\n"
        f"    params: {{url: '{url}', pushdown: always}}\n"
        "    acceleration:\n"
        "      refresh_mode: changes\n"
        "      primary_key: [id]\n"
        '      partition_by: [{r: "region"}]\n'
    )
    project = load_spec(tmp_path / "spec.yaml")
    dataset = project.dataset("accounts")
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "refresh_accounts.py").write_text(
        "from airflow_partitions.dag_factory import build_refresh_dags\n"
        f"globals().update(build_refresh_dags({str(tmp_path / 'spec.yaml')!r}))\n"
    )
    with in_process_metadata_db(str(dags)):
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=str(dags))
        assert bag.import_errors == {}, bag.import_errors
        dag = bag.dags["refresh_accounts"]
        assert str(dag.test(run_conf=RefreshRunConf().to_conf()).state) == "success"
        assert_equals_source(project)
        execute(
            url,
            "UPDATE public.accounts SET region = 'k=v', note = NULL WHERE id = 1",
            "UPDATE public.accounts SET id = 700 WHERE id = 2",
            "DELETE FROM public.accounts WHERE id IN (20, 21)",
            "INSERT INTO public.accounts VALUES (701, NULL, NULL, NULL, NULL, NULL)",
        )
        with psycopg.connect(url) as conn:
            changed = conn.execute("SELECT count(*) FROM public.accounts").fetchone()
        assert changed == (29,)
        assert str(dag.test(run_conf=RefreshRunConf().to_conf()).state) == "success"
    assert_equals_source(project)
    catalog = open_catalog(project, dataset)
    assert catalog.versions()[-1].operation == "refresh"
    info = change_stream(project, dataset).info()
    assert info is not None
    assert info.confirmed_flush_lsn == committed_position(catalog), "the commit task advanced the slot"
    lags = statsd.wait_for("airflow.dataset_acceleration_refresh_cdc_lag_bytes.accounts", 2)
    assert len(lags) == 2, "each commit task exports the slot's lag"
    assert all(kind == "g" and value >= 0 for value, kind in lags)
