"""The freshness SLA's miss callback (`build_refresh_dags(..., on_freshness_miss=...)`) in real `dag.test()`
runs: it fires in the discover task of a run that finds partitions older than the dataset's `freshness`,
with exactly those partitions, and not for a dataset whose partitions are within theirs (nor for a dataset
with no version yet)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow_e2e.metadata_db import in_process_metadata_db

pytestmark = [pytest.mark.airflow, pytest.mark.postgres]

SPEC = """\
accelerator_dir: {root}/acc
datasets:
  - name: late
    from: file:{root}/src/
    freshness: 1s
    params: {{file_format: parquet}}
    acceleration:
      partition_by:
        - region: region
  - name: punctual
    from: file:{root}/src/
    freshness: 1d
    params: {{file_format: parquet}}
    acceleration:
      partition_by:
        - region: region
"""

DAG_FILE = """\
import json

from airflow_partitions.dag_factory import build_refresh_dags


def record_miss(miss, context):
    with open({out!r}, "a", encoding="utf-8") as out:
        out.write(json.dumps({{
            "dataset": miss.dataset,
            "sla_s": miss.sla.total_seconds(),
            "version": miss.version,
            "overdue": list(miss.overdue),
            "run_id": context["run_id"],
            "task_id": context["ti"].task_id,
        }}) + "\\n")


globals().update(build_refresh_dags({spec!r}, on_freshness_miss=record_miss, strategy="arrow"))
"""


def test_the_freshness_miss_callback_fires_only_past_the_sla(tmp_path: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    from airflow_partitions.operators.run_conf import RefreshRunConf
    from airflow_partitions.spec import load_spec
    from airflow_partitions.table import open_handle

    (tmp_path / "src").mkdir()
    table = pa.table(
        {"id": pa.array(range(7), pa.int64()), "region": ["EU", "US", None, "a/b=c", "", "Zürich", "EU"]}
    )
    pq.write_table(table, tmp_path / "src" / "part0.parquet")
    spec_path = tmp_path / "datasets.yaml"
    spec_path.write_text(SPEC.format(root=tmp_path))
    calls = tmp_path / "misses.jsonl"
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "refresh.py").write_text(DAG_FILE.format(spec=str(spec_path), out=str(calls)))

    def misses() -> list[dict[str, object]]:
        text = calls.read_text() if calls.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    with in_process_metadata_db(str(dags)):
        bag = DagBag(dag_folder=str(dags))
        assert bag.import_errors == {}, bag.import_errors
        conf = RefreshRunConf().to_conf()
        for dag_id in ("refresh_late", "refresh_punctual"):
            run = bag.dags[dag_id].test(run_conf=conf)
            assert str(run.state) == "success"
        assert misses() == [], "a dataset with no version yet misses no SLA: its partitions are missing"

        project = load_spec(spec_path)
        late = open_handle(project, project.dataset("late")).catalog.latest()
        assert late is not None
        # Past the 1 s SLA of `late`; `punctual`'s day is far off.
        oldest = min(entry.refreshed_at for entry in late.partitions.values())
        while time.time() <= oldest.timestamp() + 1.0:
            time.sleep(0.1)
        late_run = bag.dags["refresh_late"].test(run_conf=conf)
        punctual_run = bag.dags["refresh_punctual"].test(run_conf=conf)
        assert str(late_run.state) == str(punctual_run.state) == "success"

    from airflow_partitions.keys import partition_label

    expected = sorted(partition_label(["region"], entry.key) for entry in late.partitions.values())
    assert len(expected) == 6, "EU, US, NULL, a/b=c, the empty string, Zürich"
    seen = misses()
    assert len(seen) == 1, f"one miss, of `late` only: {seen}"
    (miss,) = seen
    assert miss["dataset"] == "late"
    assert miss["sla_s"] == 1.0
    assert miss["version"] == late.version
    assert sorted(miss["overdue"]) == expected  # type: ignore[call-overload]
    assert miss["run_id"] == late_run.run_id
    assert miss["task_id"] == "discover"
