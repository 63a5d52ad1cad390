"""`make demo`: the whole story on embedded defaults, from nothing to a pruned read.

1. Generate sample data under `.demo/` (taxi trips as Parquet, events as JSON lines, sensor readings as CSV).
2. Start a local S3 endpoint (moto's server on 127.0.0.1) with an `accelerations` bucket for snapshots.
3. Validate `dags/datasets.yaml` and show each dataset's partition values for a few sample rows.
4. Run the taxi_trips refresh DAG for real with `dag.test()`: discovery, one Spark stage, one mapped task per
   partition (refresh + snapshot upload), one atomic commit, manifest publish.
5. Read it back with partition pruning and print how many partitions each query opened.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEMO_DIR = REPO_ROOT / ".demo"
SPEC_PATH = REPO_ROOT / "dags" / "datasets.yaml"
SNAPSHOT_BUCKET = "accelerations"


def _say(message: str) -> None:
    print(f"\n== {message}", flush=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def generate_data(rows: int) -> None:
    from airflow_partitions.sample_data import write_events, write_sensor_readings, write_taxi_trips

    write_taxi_trips(DEMO_DIR / "taxi_trips", rows)
    write_events(DEMO_DIR / "events", max(1_000, rows // 20))
    write_sensor_readings(DEMO_DIR / "sensor_readings", max(1_000, rows // 20))
    print(f"taxi_trips: {rows:,} rows in 4 Parquet files; events and sensor readings beside them")


def start_s3_endpoint() -> tuple[Any, dict[str, str]]:
    """moto's S3 server on loopback, exported as the `aws_default` Airflow connection."""
    import logging

    from moto.server import ThreadedMotoServer

    from airflow_partitions.objectstore import S3Settings

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    # The endpoint's web server logs a line per request once logging is configured; keep the demo readable.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    settings = {
        "endpoint_url": f"http://127.0.0.1:{port}",
        "aws_access_key_id": "demo",
        "aws_secret_access_key": "demo-secret",
        "region_name": "us-east-1",
    }
    S3Settings.from_mapping(settings).create_client().create_bucket(Bucket=SNAPSHOT_BUCKET)
    os.environ["AIRFLOW_CONN_AWS_DEFAULT"] = json.dumps(
        {
            "conn_type": "aws",
            "login": settings["aws_access_key_id"],
            "password": settings["aws_secret_access_key"],
            "extra": {"endpoint_url": settings["endpoint_url"], "region_name": "us-east-1"},
        }
    )
    print(f"S3 endpoint {settings['endpoint_url']}, bucket s3://{SNAPSHOT_BUCKET}")
    return server, settings


def show_spec() -> None:
    import pyarrow as pa

    from airflow_partitions.cli.main import main as cli_main
    from airflow_partitions.sample_data import taxi_trips
    from airflow_partitions.spec import load_spec

    if cli_main(["validate", str(SPEC_PATH)]) != 0:
        raise SystemExit("dags/datasets.yaml is invalid (see above)")
    project = load_spec(SPEC_PATH)
    sample = taxi_trips(5, seed=1)
    dataset = project.dataset("taxi_trips").bind(sample.schema)
    print("\nPartition values of 5 sample taxi trips:")
    columns = {f.name: f.transform.apply(sample[f.transform.source_column]) for f in dataset.partition_by}
    preview = pa.table({"PULocationID": sample["PULocationID"], **columns})
    for row in preview.to_pylist():
        print("   ", row)


def configure_airflow() -> None:
    home = DEMO_DIR / "airflow_home"
    home.mkdir(parents=True, exist_ok=True)
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(REPO_ROOT / "dags"))
    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{home / 'airflow.db'}"
    airflow_bin = Path(sys.executable).with_name("airflow")
    subprocess.run([str(airflow_bin), "db", "migrate"], check=True, stdout=subprocess.DEVNULL)


def run_refresh_dag(dataset: str) -> float:
    from airflow_partitions.dag_factory import build_refresh_dags, refresh_dag_id

    dags = build_refresh_dags(SPEC_PATH)
    dag = dags[refresh_dag_id(dataset)]
    started = time.perf_counter()
    dag_run = dag.test()
    elapsed = time.perf_counter() - started
    state = str(getattr(dag_run, "state", "unknown"))
    print(f"DAG {dag.dag_id}: {state} in {elapsed:.1f} s")
    if "success" not in state:
        raise SystemExit(f"refresh DAG ended {state}; see the task logs above")
    return elapsed


def show_results(dataset: str, s3: dict[str, str]) -> None:
    from airflow_partitions.cli.main import main as cli_main
    from airflow_partitions.objectstore import S3Settings
    from airflow_partitions.read import PartitionedDatasetReader

    cli_main(["status", str(SPEC_PATH), dataset])
    client = S3Settings.from_mapping(s3).create_client()
    objects = client.list_objects_v2(Bucket=SNAPSHOT_BUCKET).get("KeyCount", 0)
    print(f"snapshot objects in s3://{SNAPSHOT_BUCKET}: {objects}")

    reader = PartitionedDatasetReader(SPEC_PATH, dataset)
    for where in ["PULocationID = 132", "PULocationID IN (5, 7, 11)", "bucket(50, PULocationID) = 7", None]:
        plan = reader.plan(where)
        table = reader.read(where=where, columns=["PULocationID", "fare_amount"])
        label = where or "(no filter)"
        selected = f"{len(plan.selected):>3} of {plan.total}"
        print(f"  WHERE {label:<32} read {selected} partitions -> {table.num_rows:,} rows")
    result = reader.query(
        f"SELECT PULocationID, count(*) AS trips, round(avg(fare_amount), 2) AS avg_fare "
        f"FROM {dataset} WHERE PULocationID IN (132, 5) GROUP BY 1 ORDER BY 1"
    )
    print("  query:", result.to_pylist())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="taxi trips to generate (default 200k)")
    parser.add_argument("--dataset", default="taxi_trips")
    args = parser.parse_args(argv)

    os.environ.setdefault("TZ", "UTC")
    _say("1/5 generating sample data under .demo/")
    generate_data(args.rows)
    _say("2/5 starting a local S3 endpoint")
    server, s3 = start_s3_endpoint()
    try:
        _say("3/5 validating dags/datasets.yaml")
        show_spec()
        _say("4/5 running the refresh DAG (Spark local mode, one mapped task per partition)")
        configure_airflow()
        run_refresh_dag(args.dataset)
        _say("5/5 pruned reads")
        show_results(args.dataset, s3)
    finally:
        server.stop()
    print("\nDone. Try: .venv/bin/airflow-partitions plan dags/datasets.yaml taxi_trips \\")
    print("              --where 'PULocationID = 132'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
