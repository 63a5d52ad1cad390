"""A dataset partitioned by custom expressions, as Airflow shows it: mapped-task labels, the trigger form
and the DAG page name each field with its expression as written, and a label names one partition."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

LOWERED = "lower(region)"
BAND = "CASE WHEN amount > 1000 THEN 'big' ELSE 'small' END"


def _spec(root: Path) -> Path:
    regions = ["EU", "eu", "Zürich/Ost", None, "", "a=b", "100%"]
    table = pa.table(
        {
            "region": pa.array(regions * 3, pa.string()),
            "amount": pa.array([5, 2000, None, -3, 1001, 1000, 7] * 3, pa.int64()),
        }
    )
    (root / "sales").mkdir()
    pq.write_table(table, root / "sales" / "part.parquet")
    spec = root / "spec.yaml"
    spec.write_text(
        f"accelerator_dir: {root / 'acc'}\n"
        "datasets:\n"
        "  - name: sales\n"
        f"    from: file:{root / 'sales'}/\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        "      engine: parquet\n"
        "      partition_by:\n"
        f'        - lo: "{LOWERED}"\n'
        f'        - "{BAND}"\n'
    )
    return spec


def test_labels_and_the_trigger_form_show_the_expressions_as_written(tmp_path: Path) -> None:
    from airflow_partitions.dag_factory import describe_for_ui, run_params
    from airflow_partitions.operators import SparkPartitionRefreshOperator
    from airflow_partitions.refresh import plan_refresh
    from airflow_partitions.spec import load_spec

    spec_path = _spec(tmp_path)
    dataset = load_spec(spec_path).dataset("sales")
    description = run_params(dataset)["partitions"].description
    assert f"`lo` is `{LOWERED}`" in description
    assert f"`expr1` is `{BAND}`" in description
    assert "`lo=<value>/expr1=<value>`" in description
    assert "e.g." not in description, "no sample key made up for values only DuckDB computes"
    page = describe_for_ui(dataset)
    assert f"`lo`: `{LOWERED}`" in page
    assert f"`expr1`: `{BAND}`" in page

    plan = plan_refresh(str(spec_path), "sales")
    labels = []
    for item in plan.items:
        operator = SparkPartitionRefreshOperator(
            task_id="refresh", spec_path=str(spec_path), dataset="sales", work_item=item.to_json()
        )
        labels.append(operator.partition_label)
    # The values are the expressions' (lower-cased regions, CASE bands), NULL rows in their own partition.
    expected = {
        "lo=eu/expr1=small",
        "lo=eu/expr1=big",
        "lo=zürich%2Fost/expr1=small",
        "lo=%NULL/expr1=small",
        "lo=/expr1=big",
        "lo=a=b/expr1=small",
        "lo=100%25/expr1=small",
    }
    assert set(labels) == expected

    # A label, pasted into the trigger form, refreshes exactly that partition.
    chosen = plan_refresh(str(spec_path), "sales", partitions=["lo=zürich%2Fost/expr1=small"])
    wanted = plan.items[labels.index("lo=zürich%2Fost/expr1=small")].key_path
    assert [item.key_path for item in chosen.items] == [wanted]


def test_a_multi_bucket_field_is_shown_as_written_and_its_labels_name_buckets(tmp_path: Path) -> None:
    from airflow_partitions.dag_factory import describe_for_ui, run_params
    from airflow_partitions.operators import SparkPartitionRefreshOperator
    from airflow_partitions.refresh import plan_refresh
    from airflow_partitions.spec import load_spec
    from airflow_partitions.spec.describe import describe_field

    multi = "multi_bucket(4, region, amount)"
    spec_path = _spec(tmp_path)
    spec_path.write_text(
        spec_path.read_text().replace(f'- lo: "{LOWERED}"', f'- mb: "{multi}"'), encoding="utf-8"
    )
    dataset = load_spec(spec_path).dataset("sales")
    description = run_params(dataset)["partitions"].description
    assert f"`mb` is `{multi}`" in description
    assert f"`mb`: `{multi}`" in describe_for_ui(dataset)
    summary = describe_field(dataset.acceleration.partition_by[0])
    assert summary["source_columns"] == ["region", "amount"]
    assert summary["source_column"] is None

    plan = plan_refresh(str(spec_path), "sales")
    labels = {
        SparkPartitionRefreshOperator(
            task_id="refresh", spec_path=str(spec_path), dataset="sales", work_item=item.to_json()
        ).partition_label
        for item in plan.items
    }
    buckets = {label.split("/")[0] for label in labels}
    assert buckets <= {f"mb={n}" for n in range(4)}, labels
    chosen = plan_refresh(str(spec_path), "sales", partitions=[sorted(labels)[0]])
    assert len(chosen.items) == 1
