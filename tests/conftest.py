"""Shared fixtures for real components: local Spark, a moto S3 server on loopback, a fresh Postgres DB.

Each fixture starts the real thing; nothing here is a mock. Session-scoped where start-up is costly.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow_e2e.stack import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent

# Isolate Airflow from the developer's ~/airflow before anything imports it.
# Under pytest-xdist (`make unit` runs two workers) each worker has a home of its own.
os.environ.setdefault(
    "AIRFLOW_HOME", str(REPO_ROOT / ".pytest_airflow_home" / os.environ.get("PYTEST_XDIST_WORKER", "main"))
)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ.setdefault("TZ", "UTC")
# `strategy="auto"` picks the in-process Arrow path for sources this small; the suite's refreshes keep
# testing the Spark stage they were written for. tests/test_refresh_strategy.py sets its own budgets.
os.environ.setdefault("AP_ARROW_MEMORY_BUDGET", "0")
# Every JVM the suite starts (the local Spark session, the Connect server, spark-submit, the Airflow stack's
# tasks) runs small jobs for seconds: the optimising JIT compiler and G1's concurrent threads cost more CPU
# than they save there. With C1 only and the serial collector, tests/test_refresh_spark.py took 47 s of
# CPU instead of 84 s (JVM 36 s instead of 68 s) and 44 s instead of 56 s of wall time on an idle machine.
# The JVMs print "Picked up JAVA_TOOL_OPTIONS" on stderr. Production sessions are untouched.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
# The suite's directories are thrown away: no fsync (objectstore/local.py). A module of verify tests made
# 10,859 fsyncs, 29 s of its 270 s under load; atomicity (temporary + rename or link) is unchanged, and
# tests/test_objectstore.py checks both settings. The Airflow stack's and subprocesses' writes inherit it.
os.environ.setdefault("AP_UNSAFE_NO_FSYNC", "1")

PG_HOST = os.environ.get("AP_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("AP_TEST_PG_PORT", "5432"))
PG_USER = os.environ.get("AP_TEST_PG_USER", "postgres")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One real local-mode SparkSession for the whole run (JVM start costs ~7 s)."""
    from airflow_partitions.refresh.spark_session import build_local_session

    session = build_local_session(app_name="airflow-partitions-tests")
    yield session
    session.stop()


# A directory of the whole run, shared by the xdist workers (they inherit the variable from the process
# that made it): what one process started for every worker is recorded here, and stopped by that process
# once every worker is done (pytest_unconfigure).
RUN_DIR_ENV = "AP_TEST_RUN_DIR"
_own_run_dir: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _own_run_dir
    if RUN_DIR_ENV not in os.environ:
        import tempfile

        _own_run_dir = Path(tempfile.mkdtemp(prefix="ap-test-run-"))
        os.environ[RUN_DIR_ENV] = str(_own_run_dir)
        # Every JVM of the run (the workers inherit the variable) maps one class-data-sharing archive of
        # Spark's classes: a JVM's start took 8.9 s without it, 4.0 s with it (tests/jvm_class_archive.py).
        from jvm_class_archive import with_class_archive

        os.environ["JAVA_TOOL_OPTIONS"] = with_class_archive(os.environ["JAVA_TOOL_OPTIONS"])


def pytest_unconfigure(config: pytest.Config) -> None:
    global _own_run_dir
    if _own_run_dir is None:
        return
    import json
    import shutil

    record = _own_run_dir / CONNECT_SERVER_RECORD
    if record.exists():
        from airflow_e2e.spark_connect import stop_connect_server

        stop_connect_server(json.loads(record.read_text())["pid"])
    shutil.rmtree(_own_run_dir, ignore_errors=True)
    os.environ.pop(RUN_DIR_ENV, None)
    _own_run_dir = None


@contextlib.contextmanager
def run_lock(name: str) -> Iterator[Path]:
    """An exclusive lock over the run's workers (a `flock` on a file of the run directory); yields the
    run directory."""
    import fcntl

    run_dir = Path(os.environ[RUN_DIR_ENV])
    with (run_dir / f"{name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield run_dir
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


CONNECT_SERVER_RECORD = "spark-connect.json"
# The shuffle width of the local sessions (`spark_session.DEFAULT_CONF`) rather than Spark's 200.
CONNECT_SERVER_CONF = {"spark.sql.shuffle.partitions": "8"}


@pytest.fixture(scope="session")
def spark_connect_server(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real Spark Connect server (its own JVM, local[2]) for the run: host, port and `sc://` URL.

    One server for every xdist worker: the first worker that asks starts it (its JVM start is the cost)
    and records it in the run directory, the others connect to it; the process that made the run directory
    stops it at the end. Clients of it must run in their own processes: a Connect session cannot share a
    Python process with the classic `spark` session of the other tests.
    """
    import json

    from airflow_e2e.spark_connect import start_connect_server

    with run_lock("spark-connect") as run_dir:
        record = run_dir / CONNECT_SERVER_RECORD
        if not record.exists():
            log = tmp_path_factory.mktemp("spark-connect") / "server.log"
            server, port = start_connect_server(log, conf=CONNECT_SERVER_CONF)
            record.write_text(json.dumps({"port": port, "pid": server.pid, "log": str(log)}))
        started = json.loads(record.read_text())
    host, port = "127.0.0.1", int(started["port"])
    return {"host": host, "port": port, "url": f"sc://{host}:{port}", "log": Path(started["log"])}


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real Spark standalone cluster for the session: a master and two 1-core workers on loopback
    (`airflow_e2e.spark_cluster.SparkCluster`; `.master_url`, `.state()`, logs under its `.root`)."""
    from airflow_e2e.spark_cluster import running_spark_cluster

    with running_spark_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2) as cluster:
        yield cluster


def _atomic_moto_server(port: int) -> Any:
    """moto's threaded S3 server with requests applied one at a time.

    moto checks `If-None-Match: *` and then stores the object without a lock, so under load two concurrent
    conditional PUTs of one key can both succeed; S3 never allows that. Serialising requests restores the
    atomicity the catalog's commit protocol relies on (and that real S3 and MinIO provide).
    """
    import threading

    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    class AtomicMotoServer(ThreadedMotoServer):
        def _server_entry(self) -> None:
            app = DomainDispatcherApplication(create_backend_app)
            lock = threading.Lock()

            def serialised(environ: Any, start_response: Any) -> Any:
                with lock:
                    return list(app(environ, start_response))

            self._server = make_server(
                self._ip_address, self._port, serialised, True, request_handler=MotoRequestHandler
            )
            self._server_ready_event.set()
            self._server.serve_forever()

    return AtomicMotoServer(ip_address="127.0.0.1", port=port, verbose=False)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict[str, str]]:
    """moto's S3 server over real HTTP on 127.0.0.1; yields connection settings for boto3/pyarrow."""
    port = free_port()
    server = _atomic_moto_server(port)
    server.start()
    settings = {
        "endpoint_url": f"http://127.0.0.1:{port}",
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "region_name": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ["AWS_ACCESS_KEY_ID"] = "testing"
    os.environ["AWS_SECRET_ACCESS_KEY"] = "testing"
    os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
    yield settings
    server.stop()
    for key, value in old.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def s3_bucket(s3_server: dict[str, str]) -> str:
    """A fresh, empty bucket on the moto server; returns its name."""
    import boto3

    name = f"ap-test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", **s3_server).create_bucket(Bucket=name)
    return name


def _pg_admin_connect() -> Any:
    import psycopg

    return psycopg.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", autocommit=True)


@contextlib.contextmanager
def fresh_pg_database() -> Iterator[str]:
    """A new Postgres database, dropped on exit; yields its URL."""
    name = f"ap_test_{uuid.uuid4().hex[:12]}"
    with _pg_admin_connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"
    finally:
        with _pg_admin_connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A fresh Postgres database for one test, dropped afterwards; yields its URL."""
    with fresh_pg_database() as url:
        yield url


@pytest.fixture(scope="module")
def pg_module_database() -> Iterator[str]:
    """A fresh Postgres database shared by one module's tests (for module-scoped sites)."""
    with fresh_pg_database() as url:
        yield url


@pytest.fixture
def s3_fault_proxy(s3_server: dict[str, str]) -> Iterator[Any]:
    """A `fault_proxy.FaultProxy` in front of the moto server, injecting nothing until a test asks.

    `proxy.through(s3_server)` gives client settings that go through it; `faulty(rate)` turns random
    faults on for a block, `inject_next` forces one exact fault.
    """
    from fault_proxy import FaultProxy

    with FaultProxy(s3_server["endpoint_url"], seed=13) as proxy:
        yield proxy


# --- the session's Airflow stack ------------------------------------------------------------------


# Closes the shared stack. Its processes poll all the time (the scheduler, dag-processor, api-server and
# triggerer took about 15% of a core together, idle): the stack stops once the last test that uses it is
# done (pytest_runtest_teardown below), not at the end of the session.
_stack_closer = contextlib.ExitStack()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, spark_connect_server: dict[str, Any]) -> Iterator[Any]:
    """One real Airflow (api-server, scheduler, dag-processor, triggerer) for every end-to-end module:
    the DAGs, data and users of `airflow_e2e/shared.py`."""
    from airflow_e2e.shared import shared_stack

    with _stack_closer:
        yield _stack_closer.enter_context(
            shared_stack(tmp_path_factory.mktemp("airflow_e2e"), spark_connect_server)
        )


def _uses_stack(item: pytest.Item) -> bool:
    return bool(STACK_FIXTURES.intersection(getattr(item, "fixturenames", ())))


_stack_tests_run: set[str] = set()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared stack once every test of the session that uses it has run in this process.

    Under xdist the stack's modules are one scope, so one worker runs all of them; in one process
    (UNIT_WORKERS=0) they are spread over the run and the stack stops after the last of them."""
    if not _uses_stack(item):
        return
    _stack_tests_run.add(item.nodeid)
    if all(other.nodeid in _stack_tests_run for other in item.session.items if _uses_stack(other)):
        _stack_closer.close()


@pytest.fixture(scope="session")
def client(stack: Any) -> Any:
    """An `AirflowApiClient` of the stack's admin, once the main refresh DAG is parsed."""
    from airflow_e2e.shared import DAG_ID

    from airflow_partitions.cli.backfill import AirflowApiClient

    api = AirflowApiClient(stack.api_url, username="admin", password=stack.password)
    stack.wait_for_dag(api, DAG_ID, poll=2)
    return api


@pytest.fixture(scope="session")
def built_wheel() -> Path:
    """The package's wheel, built once per run (shared by the xdist workers) with the venv's uv (skips
    when uv is not there)."""
    import shutil
    import subprocess
    import sys

    uv = Path(sys.executable).with_name("uv")
    if not uv.exists():
        pytest.skip("uv is not installed next to this interpreter")
    root = Path(__file__).resolve().parent.parent
    with run_lock("wheel") as run_dir:
        out = run_dir / "wheel"
        built = sorted(out.glob("airflow_partitions-*.whl"))
        if built:
            return built[0]
        shutil.rmtree(out, ignore_errors=True)
        # Build from a copy: setuptools leaves build/ and *.egg-info next to the sources it builds.
        source = out / "source"
        source.mkdir(parents=True)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(root / name, source / name)
        shutil.copytree(
            root / "airflow_partitions",
            source / "airflow_partitions",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        subprocess.run(
            [str(uv), "build", "--wheel", "--out-dir", str(out), str(source)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        (wheel,) = out.glob("airflow_partitions-*.whl")
        return wheel


# --- the scale lane --------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--scale",
        action="store_true",
        default=False,
        help="also run the tests marked `scale` (thousands of partitions, a Spark cluster): make test-scale",
    )


# Under pytest-xdist (`make unit` runs two workers) each test module runs whole on one worker (its module
# fixtures are built once, and tests that build on earlier ones in their module keep their order), and the
# modules of the session's shared Airflow stack run on the same worker, so the stack starts once.
STACK_FIXTURES = frozenset({"stack", "client"})
SHARED_STACK_MODULES = frozenset(
    {"tests/test_e2e_airflow.py", "tests/test_e2e_batches.py", "tests/test_partitions_page.py"}
)
SHARED_STACK_SCOPE = "the shared Airflow stack"

# Roughly how many seconds a scope (a module, or the shared stack's modules together) takes on one worker
# of an idle 2-core machine, from `--durations` of full runs; a scope not listed counts SECONDS_PER_TEST
# per test. The scheduler hands out the longest remaining scope first (longest-processing-time first), so
# the workers finish within about one scope of each other. Without it xdist hands out the scopes with the
# most tests first, and the shared stack's few but long end-to-end tests started last, on one worker,
# while the other sat idle. Add a module here when it takes more than half a minute.
SCOPE_SECONDS: dict[str, float] = {
    SHARED_STACK_SCOPE: 480,
    "tests/test_conservation_matrix.py": 420,
    "tests/test_catalog_crash.py": 150,
    "tests/test_transforms_spark.py": 150,
    "tests/test_watermark_differential.py": 120,
    "tests/test_conservation.py": 100,
    "tests/test_pruning_differential.py": 130,
    "tests/test_repartition.py": 180,
    "tests/test_rename_columns.py": 150,
    "tests/test_spark_modes_e2e.py": 120,
    "tests/test_ranged_reads.py": 70,
    "tests/test_in_lists.py": 60,
    "tests/test_expression_conformance.py": 90,
    "tests/test_catalog_concurrency.py": 90,
    "tests/test_written_stage.py": 90,
    "tests/test_refresh_modes.py": 90,
    "tests/test_cdc_postgres.py": 90,
    "tests/test_operators.py": 80,
    "tests/test_reader.py": 80,
    "tests/test_verify.py": 150,
    "tests/test_install.py": 70,
    "tests/test_packaging.py": 60,
    "tests/test_secrets.py": 60,
    "tests/test_dag_run.py": 60,
    "tests/test_refresh_spark.py": 60,
    "tests/test_spark_reach.py": 60,
    "tests/test_s3_accelerations.py": 60,
    "tests/test_respec.py": 60,
    # dag.test() modules (a metadata database each, a DAG run in process) and single Spark-heavy ones.
    "tests/test_forms.py": 45,
    "tests/test_batches.py": 45,
    "tests/test_sensors.py": 75,
    "tests/test_writes_airflow.py": 45,
    "tests/test_hook_partitioned_dataset.py": 45,
    "tests/test_read_run_partitions.py": 45,
    "tests/test_backfill_cli.py": 45,
    "tests/test_cdc_dag.py": 45,
    "tests/test_refresh_modes_dag.py": 45,
    "tests/test_refresh_strategy_dag.py": 45,
    "tests/test_refresh_connect.py": 45,
    "tests/test_hive_spark.py": 45,
    "tests/test_side_index.py": 45,
    "tests/test_demo.py": 200,
    "tests/test_freshness_callback.py": 30,
    # CPU-bound modules, idle seconds about their CPU seconds (user + sys, the JVM's included).
    "tests/test_arrow_stream.py": 35,
    "tests/test_cold_start.py": 30,
}
SECONDS_PER_TEST = 0.2


def _module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _scope_of(nodeid: str) -> str:
    module = _module_of(nodeid)
    return SHARED_STACK_SCOPE if module in SHARED_STACK_MODULES else module


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _scope_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            # The longest remaining scope goes next (the base class takes the queue's first).
            def seconds(scope: str) -> float:
                return SCOPE_SECONDS.get(scope, SECONDS_PER_TEST * len(self.workqueue[scope]))

            self.workqueue.move_to_end(max(self.workqueue, key=seconds), last=False)
            super()._assign_work_unit(node)

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = _module_of(item.nodeid)
        if (
            STACK_FIXTURES.intersection(getattr(item, "fixturenames", ()))
            and module not in SHARED_STACK_MODULES
        ):
            raise pytest.UsageError(
                f"{module} uses the shared Airflow stack: add it to SHARED_STACK_MODULES in "
                "tests/conftest.py so that its tests run on the stack's worker"
            )
    if config.getoption("--scale"):
        return
    skip = pytest.mark.skip(reason="a scale test (minutes): run `make test-scale` (pytest --scale -m scale)")
    for item in items:
        if "scale" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import sys

    # The migrated template this process cloned its Airflow metadata databases from, if it made one: at
    # the session's end, not only at interpreter exit (which a killed xdist worker may never reach).
    metadata_db = sys.modules.get("airflow_e2e.metadata_db")
    if metadata_db is not None:
        metadata_db.drop_migrated_template()


@pytest.fixture(scope="session")
def pg_logical_cluster() -> Iterator[tuple[str, int]]:
    """A private Postgres cluster with wal_level=logical for the session (`pg_logical`); (host, port)."""
    from pg_logical import logical_cluster

    with logical_cluster() as address:
        if address is None:
            pytest.fail("change data capture tests need Postgres' initdb/pg_ctl (Debian package postgresql)")
        yield address


@pytest.fixture
def pg_logical_database(pg_logical_cluster: tuple[str, int]) -> Iterator[str]:
    """A fresh database on the wal_level=logical cluster, dropped (with its slots) afterwards; its URL."""
    from pg_logical import fresh_database

    with fresh_database(*pg_logical_cluster) as url:
        yield url
