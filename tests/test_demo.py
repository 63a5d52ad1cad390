"""`make demo` prints a short, readable screen and puts Airflow's task logs in the file it names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

REPO_ROOT = Path(__file__).resolve().parents[1]
MAX_SCREEN_LINES = 60


def test_demo_screen_is_short_and_names_the_log_file(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("AIRFLOW_HOME", None)
    result = subprocess.run(
        [sys.executable, "-m", "airflow_partitions.demo", "--root", str(tmp_path), "--rows", "5000"],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    screen = (result.stdout + result.stderr).splitlines()
    log_file = tmp_path / ".demo" / "demo.log"
    assert result.returncode == 0, "\n".join(screen[-40:])
    assert len(screen) < MAX_SCREEN_LINES, "\n".join(screen)
    assert any(str(log_file) in line for line in screen), "the screen names the log file"
    assert any("partitions refreshed: 51/51" in line for line in screen), "partitions done / total"
    assert any(line.strip().startswith("Spark stage") for line in screen), "the Spark stage's progress"
    assert any("conservation: {" in line and "'written': 5000" in line for line in screen)
    assert any("read   1 of 51 partitions" in line for line in screen), "the pruned reads"
    assert not any("[DAG TEST]" in line or "task_runner.py" in line for line in screen)

    logs = log_file.read_text(errors="replace")
    assert "[DAG TEST] end task task_id=commit" in logs, "Airflow's task logs went to the file"
    assert len(logs.splitlines()) > 10 * len(screen)
