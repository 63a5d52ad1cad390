"""Checks the partition keys of a refresh DAG's trigger request before Airflow does, and refuses a wrong
one with a message people read.

Airflow validates a run's conf against the DAG's params with jsonschema and answers a bad `partitions`
key with the validator's text: the key, the whole key regular expression and the schema it failed. The
trigger dialog shows that text as is. This ASGI middleware (a `fastapi_root_middlewares` entry of the
plugin) sees `POST /api/v2/dags/{dag_id}/dagRuns` first: for a refresh DAG of airflow-partitions it checks
every `partitions` key and the `partition_key` with `keys.key_text_problem` and answers 400 with what is
wrong, what the dataset's keys look like and a few existing keys. Anything else, and every other request,
goes to Airflow untouched; the param's pattern still guards runs created without the API server.
"""

from __future__ import annotations

import json
import re
from typing import Any

from airflow_partitions.keys import key_text_problem, partition_label
from airflow_partitions.plugins.page_data import refresh_dag

# The trigger endpoint of Airflow's public API, wherever the api-server's base path puts it.
TRIGGER_PATH = re.compile(r"/api/v2/dags/(?P<dag_id>[^/]+)/dagRuns/?$")
# Existing keys named in the message, as examples of the dataset's key format.
EXAMPLE_KEYS = 3


def trigger_problems(dag_id: str, body: dict[str, Any]) -> str | None:
    """What is wrong with the partition keys of a trigger request of `dag_id`, or None (also when
    `dag_id` is not a refresh DAG, or the request names no key: Airflow answers those itself)."""
    from airflow_partitions.operators.run_conf import PARTITIONS  # lazy: loads airflow
    from airflow_partitions.spec import load_spec  # lazy: loads sqlglot

    conf = body.get("conf")
    named = conf.get(PARTITIONS) if isinstance(conf, dict) else None
    if isinstance(named, str):  # the form's list field may send one key per line
        named = named.splitlines()
    keys = [key for key in named if isinstance(key, str) and key.strip()] if isinstance(named, list) else []
    partition_key = body.get("partition_key")
    if not keys and not (isinstance(partition_key, str) and partition_key.strip()):
        return None
    dag = refresh_dag(dag_id)
    if dag is None:
        return None
    project = load_spec(dag.spec_path, check_types=False)
    dataset = project.dataset(dag.dataset)
    names = dataset.acceleration.partition_names
    problems = [f"Partitions: {problem}" for key in keys if (problem := key_text_problem(key, names))]
    if (
        isinstance(partition_key, str)
        and partition_key.strip()
        and (problem := key_text_problem(partition_key, names))
    ):
        problems.append(f"Partition Key: {problem}")
    if not problems:
        return None
    examples = existing_keys(dag)
    hint = f" Existing partitions of {dataset.name}: {', '.join(examples)}." if examples else ""
    return (
        f"Nothing was triggered: {'; '.join(problems)}.{hint} A key is written as the mapped refresh task "
        "shows it (name=value/name=value) or as Airflow's partition key (values joined by |)."
    )


def existing_keys(dag: Any, limit: int = EXAMPLE_KEYS) -> list[str]:
    """The labels of the first `limit` partitions (natural order) of the newest version; [] if unreadable."""
    from airflow_partitions.hooks.snapshot_storage import SnapshotStorageHook  # lazy: loads airflow
    from airflow_partitions.spec import load_spec  # lazy: loads sqlglot
    from airflow_partitions.table import open_handle  # lazy: loads sqlglot

    try:
        project = load_spec(dag.spec_path, check_types=False)
        dataset = project.dataset(dag.dataset)
        settings = SnapshotStorageHook(aws_conn_id=dag.aws_conn_id).dataset_settings(project, dataset)
        snapshot = open_handle(project, dataset, s3_settings=settings).catalog.latest()
    except Exception:  # an example only: the message stands without it
        return []
    if snapshot is None:
        return []
    names = snapshot.partition_spec.names
    labels = sorted(partition_label(names, entry.key) for entry in snapshot.partitions.values())
    return labels[:limit]


class TriggerKeyCheck:
    """ASGI middleware: a refresh DAG's trigger request with a malformed partition key gets a 400 that
    says what is wrong (`trigger_problems`); everything else passes through unchanged."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        match = (
            TRIGGER_PATH.search(scope.get("path", ""))
            if scope.get("type") == "http" and scope.get("method") == "POST"
            else None
        )
        if match is None:
            await self.app(scope, receive, send)
            return
        messages: list[dict[str, Any]] = []
        chunks: list[bytes] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        problem = await self.check(match["dag_id"], b"".join(chunks))
        if problem is not None:
            payload = json.dumps({"detail": problem}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 400,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(payload)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": payload})
            return
        pending = iter(messages)

        async def replay() -> Any:
            # The body read above, then whatever the client sends next (a disconnect).
            return next(pending, None) or await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def check(dag_id: str, body: bytes) -> str | None:
        import asyncio
        from urllib.parse import unquote

        try:
            request = json.loads(body or b"{}")
        except ValueError:
            return None  # Airflow answers a malformed body itself
        if not isinstance(request, dict):
            return None
        try:
            return await asyncio.to_thread(trigger_problems, unquote(dag_id), request)
        except Exception:  # never stand between a user and Airflow's own validation
            return None
