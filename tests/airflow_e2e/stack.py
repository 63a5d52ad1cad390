"""Runs a real Airflow 3 (api-server, scheduler, dag-processor, triggerer) as subprocesses on a fresh DB.

The stack uses LocalExecutor, a throw-away Postgres metadata database and its own AIRFLOW_HOME, so it
shares nothing with other runs on the machine. Every component logs to `<home>/logs/<component>.log`;
`AirflowStack.logs_tail()` collects the ends of those logs for failure messages.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .metadata_db import MetadataDatabase, create_migrated_database, drop_database

COMPONENTS: tuple[str, ...] = ("api-server", "scheduler", "dag-processor", "triggerer")
ADMIN_USER = "admin"
# The file the Dockerfile installs as $AIRFLOW_HOME/config/airflow_local_settings.py.
LOCAL_SETTINGS_PRELOAD = (
    Path(__file__).resolve().parents[2] / "deploy" / "airflow_local_settings.py"
).read_text()


class AirflowStackError(RuntimeError):
    """The Airflow stack did not start, or something it ran did not finish in time."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def airflow_executable() -> str:
    """The `airflow` script of the interpreter running the tests (the venv's)."""
    candidate = Path(sys.executable).with_name("airflow")
    if not candidate.exists():
        raise AirflowStackError(f"no airflow executable next to {sys.executable}; install apache-airflow")
    return str(candidate)


@dataclass
class AirflowStack:
    """One Airflow deployment on loopback; `start()` it, use `api_url` / `password`, then `stop()`."""

    home: Path
    dags_folder: Path
    extra_env: Mapping[str, str] = field(default_factory=dict)
    parallelism: int = 4
    # Write the airflow_local_settings.py the README recommends: every Airflow process preloads what
    # refresh tasks import, and LocalExecutor's forked task processes start with it loaded.
    preload: bool = False
    api_port: int = field(default_factory=free_port)
    password: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    # More SimpleAuthManager users besides the admin: name -> role (viewer, user, op, admin); their
    # passwords are in `passwords`.
    users: Mapping[str, str] = field(default_factory=dict)
    passwords: dict[str, str] = field(default_factory=dict)
    database: MetadataDatabase | None = None
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _log_files: dict[str, IO[bytes]] = field(default_factory=dict)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    def environment(self) -> dict[str, str]:
        """The environment every component (and every `airflow` CLI call) runs with."""
        if self.database is None:
            raise AirflowStackError("the stack has no metadata database yet; call start() first")
        jwt_secret = self._shared_secret("jwt_secret")
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api_url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
                f"{name}:{role}" for name, role in {ADMIN_USER: "admin", **self.users}.items()
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.database.sqlalchemy_url,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": self.database.sqlalchemy_async_url,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__BASE_URL": self.api_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": jwt_secret,
            "AIRFLOW__API__SECRET_KEY": jwt_secret,
            # Pick up new DAG files and queued runs within seconds rather than minutes.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.logs_dir / "tasks"),
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        }
        env.update(self.extra_env)
        # A pytest run may have put its own settings in os.environ; these components must not inherit
        # the unit-test mode or a different AIRFLOW_HOME's database.
        return env

    def _shared_secret(self, name: str) -> str:
        path = self.home / f".{name}"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(32))
        return path.read_text()

    # --- lifecycle --------------------------------------------------------------------------------

    def prepare(self, *, timeout: float = 120.0) -> None:
        """Create AIRFLOW_HOME and a fresh metadata database, and migrate it (no component started).

        Enough for `airflow dags test`, which runs a whole DAG in one process.
        """
        self.home.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.passwords = {name: secrets.token_urlsafe(12) for name in self.users}
        self.passwords[ADMIN_USER] = self.password
        (self.home / "passwords.json").write_text(json.dumps(self.passwords))
        if self.preload:
            (self.home / "config").mkdir(exist_ok=True)
            (self.home / "config" / "airflow_local_settings.py").write_text(LOCAL_SETTINGS_PRELOAD)
        # A copy of the process's migrated template: `db migrate` then finds the schema current.
        self.database = create_migrated_database("ap_e2e")
        try:
            self.run_cli(["db", "migrate"], timeout=timeout)
        except BaseException:
            self.stop()
            raise

    def start(self, components: Sequence[str] = COMPONENTS, *, timeout: float = 120.0) -> None:
        """Create the database, migrate it, start `components`, and wait for the API to answer."""
        self.prepare(timeout=timeout)
        try:
            for component in components:
                self._spawn(component)
            self.wait_until_healthy(timeout=timeout)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, component: str) -> None:
        log_file = (self.logs_dir / f"{component}.log").open("ab")
        self._log_files[component] = log_file
        self.processes[component] = subprocess.Popen(
            [airflow_executable(), component],
            env=self.environment(),
            cwd=self.home,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            # Own process group: stop() signals each component together with the task processes it forked.
            start_new_session=True,
        )

    def run_cli(
        self,
        args: Sequence[str],
        *,
        timeout: float = 120.0,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run one `airflow ...` command with this stack's configuration; raise with its output on error.

        `env` adds to (or overrides) the stack's environment for this one command: connections, config.
        """
        result = subprocess.run(
            [airflow_executable(), *args],
            env={**self.environment(), **(env or {})},
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise AirflowStackError(
                f"`airflow {' '.join(args)}` exited {result.returncode}:\n{result.stdout[-6000:]}\n"
                f"{result.stderr[-6000:]}"
            )
        return result

    def dags_test(
        self,
        dag_id: str,
        conf: Mapping[str, Any] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 600.0,
    ) -> subprocess.CompletedProcess[str]:
        """`airflow dags test DAG_ID --conf JSON`: the whole DAG in one new process; its output returned."""
        return self.run_cli(
            ["dags", "test", dag_id, "--conf", json.dumps(dict(conf or {}))], timeout=timeout, env=env
        )

    def wait_until_healthy(self, *, timeout: float) -> None:
        """Wait until the api-server answers its health endpoint; fail early if a component died."""
        import requests

        deadline = time.monotonic() + timeout
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            self.raise_if_dead()
            try:
                response = requests.get(f"{self.api_url}/api/v2/monitor/health", timeout=5)
                if response.status_code == 200:
                    return
                last_error = f"HTTP {response.status_code}: {response.text[:200]}"
            except requests.RequestException as err:
                last_error = str(err)
            time.sleep(1.0)
        raise AirflowStackError(
            f"api-server not healthy after {timeout:.0f}s ({last_error})\n{self.logs_tail()}"
        )

    def wait_for_dag(self, client: Any, dag_id: str, *, timeout: float = 120.0, poll: float = 1.0) -> None:
        """Wait until the api-server serves `dag_id` (the dag-processor has parsed its file); `client` is an
        `AirflowApiClient`. Fails early if a component died."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.get_dag(dag_id)
                return
            except Exception:
                self.raise_if_dead()
                if time.monotonic() > deadline:
                    raise
                time.sleep(poll)

    def raise_if_dead(self) -> None:
        for component, process in self.processes.items():
            if process.poll() is not None:
                raise AirflowStackError(
                    f"{component} exited with code {process.returncode}\n{self.logs_tail()}"
                )

    def stop(self, *, grace: float = 20.0) -> None:
        """Stop every component (and its task processes), then drop the database."""
        for process in self.processes.values():
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for process in self.processes.values():
            remaining = max(0.1, deadline - time.monotonic())
            try:
                process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(timeout=10)
        self.processes.clear()
        for log_file in self._log_files.values():
            log_file.close()
        self._log_files.clear()
        if self.database is not None:
            drop_database(self.database)
            self.database = None

    # --- diagnostics ------------------------------------------------------------------------------

    def logs_tail(self, lines: int = 40) -> str:
        """The last lines of every component log and task log, for assertion messages."""
        chunks: list[str] = []
        for path in sorted(self.logs_dir.rglob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            chunks.append(f"----- {path.relative_to(self.logs_dir)} -----\n" + "\n".join(text))
        return "\n".join(chunks)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of a read-only SQL query against the metadata database (asset events, task states...)."""
        if self.database is None:
            raise AirflowStackError("the stack is not running")
        with self.database.connect() as conn:
            return list(conn.execute(sql, params).fetchall())


@contextmanager
def running_airflow(
    home: Path,
    dags_folder: Path,
    *,
    extra_env: Mapping[str, str] | None = None,
    components: Sequence[str] = COMPONENTS,
    parallelism: int = 4,
    preload: bool = False,
    timeout: float = 120.0,
    users: Mapping[str, str] | None = None,
) -> Iterator[AirflowStack]:
    """Start an `AirflowStack` for the duration of a `with` block; always torn down."""
    stack = AirflowStack(
        home=home,
        dags_folder=dags_folder,
        extra_env=dict(extra_env or {}),
        parallelism=parallelism,
        preload=preload,
        users=dict(users or {}),
    )
    stack.start(components, timeout=timeout)
    try:
        yield stack
    finally:
        stack.stop()
