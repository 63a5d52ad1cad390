"""1,500 partitions through the real scheduler: the session stack lets a run map 6 refresh tasks
(`[airflow_partitions] max_mapped_tasks`), so the `wide_e2e` refresh runs as 6 batch tasks. Every
partition is committed and fresh afterwards; while batches run, the Partitions page's API marks exactly
the partitions of the running batches as refreshing.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import pytest
import requests
from airflow_e2e.shared import STACK_MAX_MAPPED_TASKS, WIDE_DAG_ID, WIDE_DATASET, WIDE_PARTITIONS
from airflow_e2e.stack import AirflowStack

from airflow_partitions.cli.backfill import AirflowApiClient

pytestmark = [
    pytest.mark.airflow,
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.postgres,
    pytest.mark.scale,
]

REFRESH_TASK = "partition.refresh"


def admin_get(stack: AirflowStack, path: str) -> Any:
    login = requests.post(
        f"{stack.api_url}/auth/token",
        json={"username": "admin", "password": stack.password},
        timeout=30,
    )
    login.raise_for_status()
    response = requests.get(
        f"{stack.api_url}{path}",
        headers={"Authorization": f"Bearer {login.json()['access_token']}"},
        timeout=120,
    )
    response.raise_for_status()
    return response.json()


def running_batches(client: AirflowApiClient, run_id: str) -> set[int]:
    return {
        int(ti["map_index"])
        for ti in client.task_instances(WIDE_DAG_ID, run_id)
        if ti["task_id"] == REFRESH_TASK and ti["state"] == "running"
    }


def refreshing(stack: AirflowStack) -> set[str]:
    document = admin_get(stack, f"/partitions/api/dags/{WIDE_DAG_ID}/partitions")
    return {p["key_path"] for p in document["datasets"][0]["partitions"] if p["state"] == "refreshing"}


def batches_of(stack: AirflowStack, run_id: str) -> dict[int, set[str]]:
    """map index -> key paths of each batch, from the discovery task's returned work."""
    path = (
        f"/api/v2/dags/{WIDE_DAG_ID}/dagRuns/{quote(run_id, safe='')}/taskInstances/discover/"
        "xcomEntries/return_value"
    )
    work = admin_get(stack, path)["value"]
    return {int(batch["batch"]): {item["key_path"] for item in batch["items"]} for batch in work}


@pytest.mark.timeout(1500)
def test_fifteen_hundred_partitions_refresh_in_batches(stack: AirflowStack, client: AirflowApiClient) -> None:
    from airflow_partitions.refresh.partition_states import partition_states
    from airflow_partitions.spec import load_spec

    stack.wait_for_dag(client, WIDE_DAG_ID, poll=2)
    run_id = client.trigger_dag_run(WIDE_DAG_ID, {"partitions": None})["dag_run_id"]

    # While batch tasks run, the page's API shows their partitions refreshing: whole batches, and at
    # least every batch running before and after the API was asked.
    batches: dict[int, set[str]] = {}
    checked = False
    while True:
        state = client.get_dag_run(WIDE_DAG_ID, run_id)["state"]
        if state in ("success", "failed"):
            break
        before = running_batches(client, run_id)
        if before and not checked:
            batches = batches or batches_of(stack, run_id)
            shown = refreshing(stack)
            after = running_batches(client, run_id)
            for index in before & after:
                assert batches[index] <= shown, f"batch {index} runs: its partitions are refreshing"
            assert all(keys <= shown or not keys & shown for keys in batches.values()), "whole batches"
            checked = bool(before & after)
        time.sleep(1)
    assert state == "success", stack.logs_tail()
    assert checked, "no batch task was seen running twice in a row; the refreshing check did not run"

    refresh = [ti for ti in client.task_instances(WIDE_DAG_ID, run_id) if ti["task_id"] == REFRESH_TASK]
    assert len(refresh) == STACK_MAX_MAPPED_TASKS
    assert {ti["state"] for ti in refresh} == {"success"}
    assert all(ti["rendered_map_index"].startswith("250 partitions: k=") for ti in refresh), refresh[0]
    assert set().union(*batches.values()) == {f"k={k}" for k in range(WIDE_PARTITIONS)}

    project = load_spec(stack.dags_folder / "datasets.yaml")
    states = partition_states(project, project.dataset(WIDE_DATASET))
    assert len(states.partitions) == WIDE_PARTITIONS
    assert {str(p.state) for p in states.partitions} == {"fresh"}, "every partition committed and fresh"
    assert {p.entry.written_by.map_index for p in states.partitions if p.entry and p.entry.written_by} == set(
        range(STACK_MAX_MAPPED_TASKS)
    )
    assert refreshing(stack) == set(), "nothing refreshing once the run is over"
