"""`make demo`: the whole story on embedded defaults, from nothing to a pruned read.

1. Generate sample data under `.demo/` (taxi trips as Parquet, events as JSON lines, sensor readings as CSV).
2. Start a local S3 endpoint (moto's server on 127.0.0.1) with an `accelerations` bucket for snapshots.
3. Validate `dags/datasets.yaml` and show each dataset's partition values for a few sample rows.
4. Run the taxi_trips refresh DAG for real with `dag.test()`: discovery, one Spark stage, one mapped task per
   partition (refresh + snapshot upload), one atomic commit, manifest publish.
5. Read it back with partition pruning and print how many partitions each query opened.

The screen shows what a person wants to follow (Spark stage progress, partitions done / total, the
conservation check, the pruned reads); Airflow's task logs, Spark's own output and the full validation
report go to `.demo/demo.log`, which the demo names.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from airflow_partitions.cli.main import main as cli_main
from airflow_partitions.dag_factory import build_refresh_dags, refresh_dag_id
from airflow_partitions.objectstore import S3Settings
from airflow_partitions.sample_data import taxi_trips, write_events, write_sensor_readings, write_taxi_trips

REPO_ROOT = Path(__file__).resolve().parent.parent
DEMO_DIR = REPO_ROOT / ".demo"
SPEC_PATH = REPO_ROOT / "dags" / "datasets.yaml"
LOG_FILE = DEMO_DIR / "demo.log"
SNAPSHOT_BUCKET = "accelerations"


def use_root(root: Path) -> None:
    """Run the demo under `root` instead of the repository: the example spec is copied to `root/dags/`,
    so its relative paths (`../.demo`, `../.accelerations`) land under `root` too."""
    global DEMO_DIR, SPEC_PATH, LOG_FILE
    root = root.resolve()
    (root / "dags").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO_ROOT / "dags" / "datasets.yaml", root / "dags" / "datasets.yaml")
    DEMO_DIR, SPEC_PATH, LOG_FILE = (
        root / ".demo",
        root / "dags" / "datasets.yaml",
        root / ".demo" / "demo.log",
    )


def _say(message: str) -> None:
    print(f"\n== {message}", flush=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def generate_data(rows: int) -> None:

    write_taxi_trips(DEMO_DIR / "taxi_trips", rows)
    write_events(DEMO_DIR / "events", max(1_000, rows // 20))
    write_sensor_readings(DEMO_DIR / "sensor_readings", max(1_000, rows // 20))
    print(f"taxi_trips: {rows:,} rows in 4 Parquet files; events and sensor readings beside them")


def start_s3_endpoint() -> tuple[Any, dict[str, str]]:
    """moto's S3 server on loopback, exported as the `aws_default` Airflow connection."""
    import logging

    from moto.server import ThreadedMotoServer

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

    from airflow_partitions.spec import load_spec  # lazy: loads sqlglot

    report = io.StringIO()
    with contextlib.redirect_stdout(report), contextlib.redirect_stderr(report):
        code = cli_main(["validate", str(SPEC_PATH)])
    with LOG_FILE.open("a", encoding="utf-8") as log:
        log.write(report.getvalue())
    if code != 0:
        print(report.getvalue())
        raise SystemExit("dags/datasets.yaml is invalid (see above)")
    project = load_spec(SPEC_PATH)
    warnings = re.search(r"^(\d+) warning\(s\)", report.getvalue(), re.MULTILINE)
    print(
        f"{SPEC_PATH.name}: valid, {len(project.datasets)} datasets ({', '.join(project.names)}); "
        f"{warnings.group(1) if warnings else 0} warning(s), the full report is in {LOG_FILE}"
    )
    sample = taxi_trips(5, seed=1)
    dataset = project.dataset("taxi_trips").bind(sample.schema)
    print("\nPartition values of 5 sample taxi trips:")
    columns = {f.name: f.transform.apply_table(sample) for f in dataset.partition_by}
    preview = pa.table({"PULocationID": sample["PULocationID"], **columns})
    for row in preview.to_pylist():
        print("   ", row)


def airflow_environment() -> dict[str, str]:
    """The demo's Airflow: its home and SQLite database under `.demo/`, the example DAG folder, this spec."""
    home = DEMO_DIR / "airflow_home"
    home.mkdir(parents=True, exist_ok=True)
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": os.environ.get("AIRFLOW__CORE__LOAD_EXAMPLES", "False"),
        "AIRFLOW__CORE__DAGS_FOLDER": os.environ.get("AIRFLOW__CORE__DAGS_FOLDER", str(REPO_ROOT / "dags")),
        # The example DAG file there loads this spec (the repository's, or the copy under --root).
        "AIRFLOW_PARTITIONS_SPEC": str(SPEC_PATH),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
    }


def start_migration() -> subprocess.Popen[bytes]:
    """`airflow db migrate` of the demo's database, in the background (its output goes to the log file):
    it takes seconds of its own, while the sample data, the S3 endpoint and the validation need none of it.
    `configure_airflow` waits for it."""
    airflow_bin = Path(sys.executable).with_name("airflow")
    with LOG_FILE.open("ab") as log:
        return subprocess.Popen(
            [str(airflow_bin), "db", "migrate"],
            env={**os.environ, **airflow_environment()},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )


def configure_airflow(migration: subprocess.Popen[bytes]) -> None:
    """Point this process's Airflow at the demo's home once its database is migrated."""
    if migration.wait() != 0:
        raise SystemExit(f"`airflow db migrate` failed (exit code {migration.returncode}); see {LOG_FILE}")
    os.environ.update(airflow_environment())


@contextlib.contextmanager
def quiet_output(log_path: Path) -> Iterator[IO[str]]:
    """Send everything written to this process's stdout and stderr (Airflow's task logs, Spark's JVM) to
    `log_path`; yield a stream that still reaches the terminal."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(1), "w", buffering=1)
    with log_path.open("ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield terminal
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            terminal.close()


# What the progress report picks out of the task logs (the operators' own log lines).
_PLANNED = re.compile(r"Dataset \S+: (\d+) partition\(s\) to refresh, (\d+) to remove")
_STAGED = re.compile(r"Staged (\d+) partition\(s\) .* in ([\d.]+)s; rows read (\S+), routed (\S+)")
_REFRESHED = re.compile(r"\] Partition (.+?) \((\w+)\): (\S+) rows routed")
_COMMITTED = re.compile(r"(Committed \S+ version \d+: .*?removed)")
_CONSERVED = re.compile(r"Row conservation of \S+: (\{.*?\})")
_PUBLISHED = re.compile(r"(Published \S+ version \d+ .*?latest is \d+)")


def _count(text: str) -> str:
    """`20000` as `20,000`; anything else as it is."""
    return f"{int(text):,}" if text.isdigit() else text


class Progress:
    """Follows a refresh in the log file and Spark's status tracker; prints a few lines as it goes."""

    def __init__(self, log_path: Path, out: IO[str]) -> None:
        self.log_path = log_path
        self.out = out
        self.offset = log_path.stat().st_size if log_path.exists() else 0
        self.total: int | None = None
        self.done = 0
        self.shown_quarter = 0
        self.stages: dict[int, int] = {}
        self.finished: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._poll_spark()
        self._read_log()

    def say(self, text: str) -> None:
        self.out.write(f"   {text}\n")
        self.out.flush()

    def _follow(self) -> None:
        while not self._stop.wait(0.3):
            self._read_log()
            self._poll_spark()

    def _read_log(self) -> None:
        with self.log_path.open("rb") as log:
            log.seek(self.offset)
            chunk = log.read()
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        for line in chunk[:end].decode("utf-8", errors="replace").splitlines():
            self._line(line)

    def _line(self, line: str) -> None:
        if match := _PLANNED.search(line):
            self.total = int(match.group(1))
            self.say(f"discover: {self.total} partition(s) to refresh, {match.group(2)} to remove")
        elif match := _STAGED.search(line):
            parts, seconds, read, routed = (_count(value) for value in match.groups())
            self.say(
                f"stage: one Spark job read {read} rows, routed {routed} to {parts} partitions in {seconds} s"
            )
        elif _REFRESHED.search(line):
            self.done += 1
            quarter = 4 * self.done // max(self.total or self.done, 1)
            if quarter > self.shown_quarter:
                self.shown_quarter = quarter
                self.say(f"partitions refreshed: {self.done}/{self.total or '?'}")
        elif match := _CONSERVED.search(line):
            self.say(f"conservation: {match.group(1)}")
        elif (match := _COMMITTED.search(line)) or (match := _PUBLISHED.search(line)):
            self.say(match.group(1))

    def _poll_spark(self) -> None:
        from pyspark import SparkContext

        context = SparkContext._active_spark_context
        if context is None:
            return
        try:
            tracker = context.statusTracker()
            stage_ids = set(tracker.getActiveStageIds())
            for job_id in tracker.getJobIdsForGroup():
                job = tracker.getJobInfo(job_id)
                stage_ids.update(job.stageIds if job is not None else ())
            # One line as a stage starts and one once its tasks are done: the screen stays short.
            for stage_id in sorted(stage_ids - self.finished):
                info = tracker.getStageInfo(stage_id)
                if info is None or info.numTasks == 0:
                    continue
                if info.numCompletedTasks >= info.numTasks:
                    self.finished.add(stage_id)
                    self.say(f"Spark stage {stage_id}: {info.numCompletedTasks}/{info.numTasks} tasks done")
                elif stage_id not in self.stages:
                    self.stages[stage_id] = info.numTasks
                    self.say(f"Spark stage {stage_id}: running {info.numTasks} task(s)")
        except Exception:  # the session may stop between two polls; progress is best-effort
            return


def run_refresh_dag(dataset: str) -> float:

    # The demo shows the Spark pipeline (local mode): `auto` would run data this small in process.
    dags = build_refresh_dags(SPEC_PATH, strategy="spark")
    dag = dags[refresh_dag_id(dataset)]
    print(f"Airflow task logs and Spark output: {LOG_FILE}")
    started = time.perf_counter()
    with quiet_output(LOG_FILE) as terminal, Progress(LOG_FILE, terminal):
        dag_run = dag.test()
    elapsed = time.perf_counter() - started
    state = str(getattr(dag_run, "state", "unknown"))
    print(f"DAG {dag.dag_id}: {state} in {elapsed:.1f} s")
    if "success" not in state:
        raise SystemExit(f"refresh DAG ended {state}; see the task logs in {LOG_FILE}")
    return elapsed


def show_results(dataset: str, s3: dict[str, str]) -> None:
    from airflow_partitions.read import PartitionedDatasetReader  # lazy: loads numpy, pyarrow, sqlglot

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
    parser.add_argument(
        "--root", type=Path, help="run under this directory instead of the repository (data, catalog, logs)"
    )
    args = parser.parse_args(argv)
    if args.root is not None:
        use_root(args.root)

    os.environ.setdefault("TZ", "UTC")
    DEMO_DIR.mkdir(parents=True, exist_ok=True)
    LOG_FILE.write_text("")
    migration = start_migration()
    server = None
    try:
        _say("1/5 generating sample data under .demo/")
        generate_data(args.rows)
        _say("2/5 starting a local S3 endpoint")
        server, s3 = start_s3_endpoint()
        _say("3/5 validating dags/datasets.yaml")
        show_spec()
        _say("4/5 running the refresh DAG (Spark local mode, one mapped task per partition)")
        configure_airflow(migration)
        run_refresh_dag(args.dataset)
        _say("5/5 pruned reads")
        show_results(args.dataset, s3)
    finally:
        if migration.poll() is None:  # a step before the DAG failed
            migration.kill()
            migration.wait()
        if server is not None:
            server.stop()
    import logging

    # py4j says goodbye on the console when the interpreter exits; that line belongs in no screen.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    print(f"\nFull logs: {LOG_FILE}")
    print("Done. Try: .venv/bin/airflow-partitions plan dags/datasets.yaml taxi_trips \\")
    print("              --where 'PULocationID = 132'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
