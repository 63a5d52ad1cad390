"""Smoke test of an installed package (`make compat`): run by the interpreter of a venv holding the lowest
supported Airflow, pyarrow, duckdb and boto3 and the package without its dev extras, from a directory
outside the checkout, so it sees only what `pip install` gives a user.

    python tests/install_smoke.py WORKDIR

It writes the example with `airflow-partitions init`, validates its spec, parses its DAG folder, checks
the provider's connection form and documentation link, checks the S3 calls the object store makes exist
in this botocore, runs one refresh through `dag.test()` (in-process Spark), reads it back through the hook
with every source row, and checks that a misspelt conf key is refused. Exit status 0 = all good.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

STARTED = time.monotonic()


def step(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.1f}s] {message}", flush=True)


def check(condition: bool, message: str) -> None:
    if not condition:
        print(f"FAILED: {message}", file=sys.stderr, flush=True)
        sys.exit(1)


def cli(*args: str) -> str:
    command = [str(Path(sys.executable).with_name("airflow-partitions")), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    check(result.returncode == 0, f"{' '.join(args)} exited {result.returncode}: {result.stderr[-2000:]}")
    return result.stdout


def main(workdir: Path) -> None:
    workdir = workdir.resolve()
    # Airflow reads its configuration when first imported.
    home = workdir / "airflow-home"
    os.environ.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(workdir / "example" / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        }
    )
    home.mkdir(exist_ok=True)
    import airflow

    import airflow_partitions

    check(
        "site-packages" in Path(airflow_partitions.__file__).resolve().parts,
        f"airflow_partitions imported from {airflow_partitions.__file__}, not from the installed package",
    )
    step(f"Airflow {airflow.__version__}, airflow-partitions from {Path(airflow_partitions.__file__).parent}")

    check("init" in cli("--help"), "`airflow-partitions --help` lists init")
    cli("init", str(workdir / "example"), "--rows", "2000")
    dags = workdir / "example" / "dags"
    spec = dags / "datasets.yaml"
    validated = json.loads(cli("validate", str(spec), "--json"))
    check(validated["valid"], f"the example spec validates: {validated}")
    step("init wrote the example; validate accepts it")

    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(dags))
    check(bag.import_errors == {}, f"the example DAG folder imports: {bag.import_errors}")
    expected = {"refresh_taxi_trips", "refresh_events", "refresh_sensor_readings"}
    check(set(bag.dag_ids) == expected, f"one DAG per dataset: {sorted(bag.dag_ids)}")
    check(bag.dags["refresh_taxi_trips"].start_date is None, "scheduled DAGs start no run when unpaused")
    step("DagBag parses the example DAG folder")

    from airflow.providers_manager import ProvidersManager

    from airflow_partitions.provider_info import DOCUMENTATION_URL

    manager = ProvidersManager()
    provider = manager.providers["airflow-partitions"]
    # Airflow 3.2.0 keeps the space after the comma of `Project-URL: Documentation, <url>`.
    linked = (provider.data.get("documentation-url") or "").strip()
    check(linked == DOCUMENTATION_URL, f"the providers page links the docs, not {linked!r}")
    check("login" in manager.field_behaviours["airflow_partitions"]["hidden_fields"], "Login is hidden")
    check(
        "extra__airflow_partitions__spec_path" in manager.connection_form_widgets,
        "the connection form has a spec_path field",
    )
    step("ProvidersManager: connection form and documentation URL")

    import boto3

    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    for operation, members in {
        "PutObject": ("IfNoneMatch", "IfMatch", "ChecksumSHA256"),
        "CompleteMultipartUpload": ("IfNoneMatch",),
    }.items():
        known = client.meta.service_model.operation_model(operation).input_shape.members
        check(all(m in known for m in members), f"botocore {operation} takes {members}")
    step(f"boto3 {boto3.__version__}: conditional writes available")

    from airflow.utils import db

    db.initdb()
    step("metadata database ready")

    from airflow_partitions.operators.run_conf import RefreshRunConf

    dag = bag.dags["refresh_events"]
    refused = dag.test(run_conf={"wher": "region = 'EU'"})
    check(str(refused.state) == "failed", "a misspelt conf key fails the run")
    check(not (workdir / "example" / "accelerations").exists(), "the refused run wrote nothing")
    run = dag.test(run_conf=RefreshRunConf().to_conf())
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    check(str(run.state) == "success", f"the refresh run succeeds: {states}")
    step("dag.test(): refused a misspelt conf, then refreshed events")

    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

    source_rows = sum(
        1 for line in (workdir / "example" / "data" / "events" / "events-000.jsonl").open() if line.strip()
    )
    hook = PartitionedDatasetHook(dataset="events", spec_path=str(spec))
    check(hook.read().num_rows == source_rows, "every source row reads back")
    eu = hook.read("region = 'EU'")
    check(0 < eu.num_rows < source_rows, "a pruned read returns the EU rows only")
    check(set(eu.column("region").to_pylist()) == {"EU"}, "only EU rows")
    step(f"read back {source_rows} rows; pruned read of {eu.num_rows} EU rows")
    print("install smoke test passed", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
