"""A real Spark standalone cluster (one master, workers) on loopback, from pip's pyspark, for tests.

Every node is its own JVM started with `spark-class` (pip's pyspark ships the classes but not the
`sbin/start-*.sh` scripts): `org.apache.spark.deploy.master.Master --host 127.0.0.1 --port P
--webui-port W`, then per worker `org.apache.spark.deploy.worker.Worker spark://127.0.0.1:P --cores 1
--memory 1g`. Workers run their Python executors on this interpreter and import the package from this
checkout (`PYSPARK_PYTHON`, `PYTHONPATH` in their environment, which executors inherit). Logs go to files
in one directory; failures quote their ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .stack import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class SparkClusterError(RuntimeError):
    """The cluster did not start, or did not reach the state a test waited for in time."""


def spark_home() -> Path:
    """pip's pyspark package directory: its `bin/spark-class` and `jars/` are a Spark distribution."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def node_environment() -> dict[str, str]:
    """The environment of every node: loopback only, this interpreter and this checkout for Python."""
    python_path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        # Bind the RPC endpoints and web UIs to loopback, not to the machine's public address.
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_HOSTNAME": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": python_path,
        "TZ": "UTC",
    }


@dataclass
class SparkWorker:
    index: int
    work_dir: Path
    log: Path
    process: subprocess.Popen[bytes]


@dataclass
class SparkCluster:
    """A running master and its workers; `master_url` is what a `spark` connection or `--master` takes."""

    root: Path
    port: int = field(default_factory=free_port)
    webui_port: int = field(default_factory=free_port)
    worker_count: int = 2
    master: subprocess.Popen[bytes] | None = None
    workers: list[SparkWorker] = field(default_factory=list)
    _handles: list[IO[bytes]] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def master_log(self) -> Path:
        return self.root / "master.log"

    # --- lifecycle --------------------------------------------------------------------------------

    def _spawn(self, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        handle = log.open("ab")
        self._handles.append(handle)
        return subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=node_environment(),
            cwd=self.root,
            # Own process group: stop() signals a node together with the executors it launched.
            start_new_session=True,
        )

    def start(self, *, timeout: float = 180.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.master = self._spawn(
            [
                MASTER_CLASS,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(self.webui_port),
            ],
            self.master_log,
        )
        for index in range(self.worker_count):
            self.start_worker(index)
        self.wait_for_workers(self.worker_count, timeout=timeout)

    def start_worker(self, index: int) -> SparkWorker:
        """Start worker `index` (again, after it was killed): 1 core, 1 GiB, its own work directory."""
        work_dir = self.root / f"worker-{index}"
        work_dir.mkdir(exist_ok=True)
        log = self.root / f"worker-{index}.log"
        process = self._spawn(
            [
                WORKER_CLASS,
                self.master_url,
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--webui-port",
                "0",
                "--work-dir",
                str(work_dir),
            ],
            log,
        )
        worker = SparkWorker(index, work_dir, log, process)
        self.workers = [w for w in self.workers if w.index != index] + [worker]
        self.workers.sort(key=lambda w: w.index)
        return worker

    def stop(self, *, grace: float = 20.0) -> None:
        """Stop workers (and their executors), then the master; nothing is left running."""
        processes = [w.process for w in self.workers] + ([self.master] if self.master else [])
        for process in processes:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # The group too: an executor JVM a worker launched must not outlive the test run.
            _signal_group(process, signal.SIGKILL)
            process.wait(timeout=10)
        for handle in self._handles:
            handle.close()
        self._handles.clear()

    # --- state ------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The master's JSON (`http://127.0.0.1:<webui>/json/`): workers, active and completed apps."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/", timeout=10) as response:
            return dict(json.load(response))

    def alive_workers(self) -> list[dict[str, Any]]:
        return [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]

    def wait_for_workers(self, count: int, *, timeout: float = 180.0) -> None:
        """Wait until `count` workers are ALIVE at the master; fail early when a node died."""
        deadline = time.monotonic() + timeout
        last = "no answer from the master yet"
        while True:
            self.raise_if_dead()
            try:
                alive = len(self.alive_workers())
                if alive >= count:
                    return
                last = f"{alive} of {count} workers alive"
            except OSError as err:
                last = str(err)
            if time.monotonic() > deadline:
                raise SparkClusterError(
                    f"the cluster was not ready within {timeout:.0f}s ({last})\n{self.logs_tail()}"
                )
            time.sleep(1.0)

    def raise_if_dead(self) -> None:
        if self.master is not None and self.master.poll() is not None:
            raise SparkClusterError(
                f"the Spark master exited with {self.master.returncode}\n{self.logs_tail()}"
            )

    def apps(self) -> list[dict[str, Any]]:
        """Every application the master knows, active or completed."""
        state = self.state()
        return [*state.get("activeapps", []), *state.get("completedapps", [])]

    def executor_logs(self, app_id: str) -> list[Path]:
        """The stderr files of the app's executors on every worker (`<work dir>/<app id>/<n>/stderr`)."""
        return sorted(p for w in self.workers for p in (w.work_dir / app_id).glob("*/stderr"))

    def tasks_run_by(self, app_id: str) -> int:
        """How many tasks executors on the workers started for `app_id` (from their logs)."""
        return sum(p.read_text(errors="replace").count("Running task") for p in self.executor_logs(app_id))

    def logs_tail(self, lines: int = 30) -> str:
        parts = []
        for path in [self.master_log, *(w.log for w in self.workers)]:
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path} ---\n" + "\n".join(tail))
        return "\n".join(parts)


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    if process.poll() is not None and sig != signal.SIGKILL:
        return
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


@contextmanager
def running_spark_cluster(root: Path, *, workers: int = 2, timeout: float = 180.0) -> Iterator[SparkCluster]:
    """Start a master and `workers` workers under `root` (logs there); stop them all afterwards."""
    cluster = SparkCluster(root, worker_count=workers)
    try:
        cluster.start(timeout=timeout)
        yield cluster
    except BaseException:
        print(f"Spark cluster logs are in {root}\n{cluster.logs_tail()}", file=sys.stderr)
        raise
    finally:
        cluster.stop()
