"""`airflow-partitions backfill`: resolve a filter to partitions and refresh them through Airflow.

The command triggers the dataset's refresh DAG with the same run conf the Airflow UI's trigger form sends
(`partitions`, `full_refresh`, `snapshot`), over the REST API v2, or runs that DAG in this process with
`--local`. `--dry-run` only lists the partitions the filter selects.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from airflow_partitions.exceptions import AirflowApiError, RunConfError

TERMINAL_RUN_STATES = frozenset({"success", "failed"})
ENV_API_URL = "AIRFLOW_PARTITIONS_API_URL"
ENV_API_TOKEN = "AIRFLOW_PARTITIONS_API_TOKEN"
ENV_API_USERNAME = "AIRFLOW_PARTITIONS_API_USERNAME"
ENV_API_PASSWORD = "AIRFLOW_PARTITIONS_API_PASSWORD"


# --- REST API v2 client ---------------------------------------------------------------------------


class AirflowApiClient:
    """The few Airflow REST API v2 calls a backfill needs, with bearer-token auth.

    Give either `token` or `username` + `password`; the latter are exchanged for a token at
    `POST /auth/token`, the endpoint the UI's login uses.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise AirflowApiError(f"Airflow URL {base_url!r} must start with http:// or https://")
        if token is None and (username is None or password is None):
            raise AirflowApiError(
                "no credentials for the Airflow API: pass --token, or --username and --password "
                f"(or set {ENV_API_TOKEN}, or {ENV_API_USERNAME} and {ENV_API_PASSWORD})"
            )
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._token = token
        self._username = username
        self._password = password
        self._session: Any = None

    @property
    def session(self) -> Any:
        if self._session is None:
            import requests

            self._session = requests.Session()
        return self._session

    def token(self) -> str:
        """The bearer token, fetched once from `/auth/token` when only a username/password was given."""
        if self._token is None:
            body = self._send(
                "POST",
                "/auth/token",
                json_body={"username": self._username, "password": self._password},
                authenticated=False,
            )
            token = body.get("access_token") if isinstance(body, dict) else None
            if not isinstance(token, str):
                raise AirflowApiError(f"{self.base_url}/auth/token returned no access_token: {body!r}")
            self._token = token
        return self._token

    def _send(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Mapping[str, Any] | None = None,
        authenticated: bool = True,
    ) -> Any:
        import requests

        headers = {"Accept": "application/json"}
        if authenticated:
            headers["Authorization"] = f"Bearer {self.token()}"
        url = f"{self.base_url}{path}"
        try:
            response = self.session.request(
                method, url, json=json_body, params=params, headers=headers, timeout=self.timeout
            )
        except requests.RequestException as err:
            raise AirflowApiError(f"cannot reach the Airflow API at {self.base_url}: {err}") from err
        if response.status_code in (401, 403):
            raise AirflowApiError(
                f"{method} {path}: HTTP {response.status_code} {_detail(response)}; check the token or "
                "the username/password and that the user may trigger DAG runs"
            )
        if response.status_code >= 400:
            raise AirflowApiError(f"{method} {path}: HTTP {response.status_code} {_detail(response)}")
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as err:
            raise AirflowApiError(f"{method} {path}: response is not JSON: {response.text[:200]!r}") from err

    def get_dag(self, dag_id: str) -> dict[str, Any]:
        """`GET /api/v2/dags/{dag_id}`; a clear error when the DAG is unknown (not parsed yet?)."""
        try:
            return dict(self._send("GET", f"/api/v2/dags/{quote(dag_id, safe='')}"))
        except AirflowApiError as err:
            if "HTTP 404" in str(err):
                raise AirflowApiError(
                    f"Airflow at {self.base_url} has no DAG {dag_id!r}: is the DAG file in the dags folder "
                    "and parsed without import errors (see `airflow dags list-import-errors`)?"
                ) from err
            raise

    def set_paused(self, dag_id: str, *, paused: bool) -> None:
        self._send("PATCH", f"/api/v2/dags/{quote(dag_id, safe='')}", json_body={"is_paused": paused})

    def trigger_dag_run(
        self, dag_id: str, conf: Mapping[str, Any], *, note: str | None = None, run_id: str | None = None
    ) -> dict[str, Any]:
        """`POST /api/v2/dags/{dag_id}/dagRuns` with `conf`, as the UI's trigger form does."""
        body: dict[str, Any] = {"logical_date": None, "conf": dict(conf)}
        if note:
            body["note"] = note
        if run_id:
            body["dag_run_id"] = run_id
        return dict(self._send("POST", f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns", json_body=body))

    def get_dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        path = f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}"
        return dict(self._send("GET", path))

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Every task instance of a run, mapped instances included (one row per map index)."""
        path = f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}/taskInstances"
        rows: list[dict[str, Any]] = []
        while True:
            page = self._send("GET", path, params={"limit": 100, "offset": len(rows)})
            batch = list(page.get("task_instances", []))
            rows.extend(batch)
            if not batch or len(rows) >= int(page.get("total_entries", len(rows))):
                return rows

    def wait_for_dag_run(
        self, dag_id: str, run_id: str, *, timeout: float = 3600.0, poll_interval: float = 2.0
    ) -> dict[str, Any]:
        """Poll a run until it succeeds or fails; raise `AirflowApiError` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.get_dag_run(dag_id, run_id)
            if run.get("state") in TERMINAL_RUN_STATES:
                return run
            if time.monotonic() >= deadline:
                raise AirflowApiError(
                    f"DAG run {dag_id}/{run_id} still {run.get('state')!r} after {timeout:.0f}s"
                )
            time.sleep(poll_interval)


def _detail(response: Any) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict) and "detail" in body:
        return json.dumps(body["detail"])[:300]
    return json.dumps(body)[:300]
