"""`airflow-partitions backfill`: resolve a filter to partitions and refresh them through Airflow.

The command discovers the dataset's partitions, keeps those the `--where` filter (or `--partitions`)
selects, and triggers the dataset's refresh DAG with the run conf the UI's trigger form sends:
`{"partitions": [...], "full_refresh": true, "snapshot": ...}`, over the Airflow REST API v2 (token
auth). `--local` runs that DAG in this process instead (`dag.test()`, against the configured metadata
database); `--dry-run` only lists the partitions. `airflow_cli_commands()` builds the same command for
Airflow's CLI, but it is not registered: Airflow 3.3 already has an `airflow partitions` group.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from airflow_partitions.cli import print_error
from airflow_partitions.dag_factory import build_refresh_dags, refresh_dag_id
from airflow_partitions.exceptions import AirflowApiError, AirflowPartitionsError, RunConfError
from airflow_partitions.hooks.connections import install_connection_resolver

TERMINAL_RUN_STATES = frozenset({"success", "failed"})
ENV_API_URL = "AIRFLOW_PARTITIONS_API_URL"
ENV_API_TOKEN = "AIRFLOW_PARTITIONS_API_TOKEN"
ENV_API_USERNAME = "AIRFLOW_PARTITIONS_API_USERNAME"
ENV_API_PASSWORD = "AIRFLOW_PARTITIONS_API_PASSWORD"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_NOTHING_SELECTED = 3


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
        if not base_url:
            raise AirflowApiError(f"no Airflow URL: pass --airflow-url http://host:8080 or set {ENV_API_URL}")
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
        self,
        dag_id: str,
        conf: Mapping[str, Any],
        *,
        note: str | None = None,
        run_id: str | None = None,
        partition_key: str | None = None,
    ) -> dict[str, Any]:
        """`POST /api/v2/dags/{dag_id}/dagRuns` with `conf` (and the run's `partition_key`, for a
        partitioned DAG), as the UI's trigger dialog does."""
        body: dict[str, Any] = {"logical_date": None, "conf": dict(conf)}
        if note:
            body["note"] = note
        if run_id:
            body["dag_run_id"] = run_id
        if partition_key is not None:
            body["partition_key"] = partition_key
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

    def clear_task_instances(
        self, dag_id: str, run_id: str, task_ids: Sequence[str | tuple[str, int]], *, downstream: bool = True
    ) -> list[dict[str, Any]]:
        """Clear failed task instances of a run (`(task_id, map_index)` for one partition) so they re-run.

        What the UI's Clear button does: with `downstream`, the tasks that depend on them (the
        partition's snapshot upload, the commit) are cleared too, and the run goes back to running.
        """
        body = {
            "dry_run": False,
            "dag_run_id": run_id,
            "task_ids": [list(t) if isinstance(t, tuple) else t for t in task_ids],
            "only_failed": True,
            "include_downstream": downstream,
            "reset_dag_runs": True,
        }
        path = f"/api/v2/dags/{quote(dag_id, safe='')}/clearTaskInstances"
        return list(self._send("POST", path, json_body=body).get("task_instances", []))

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


# --- resolving the selection ----------------------------------------------------------------------


@dataclass(frozen=True)
class BackfillSelection:
    """The partitions a backfill refreshes, and the run conf that asks the refresh DAG to do it."""

    dataset: str
    dag_id: str
    where: str | None
    partitions: tuple[str, ...]
    reasons: Mapping[str, str] = field(default_factory=dict)
    discovered: int = 0
    snapshot: bool = True

    def conf(self) -> dict[str, Any]:
        """The run conf (the same keys as the DAG's params, so the UI shows them on the run)."""
        from airflow_partitions.operators.run_conf import RefreshRunConf  # lazy: loads airflow

        return RefreshRunConf(partitions=self.partitions, full_refresh=True, snapshot=self.snapshot).to_conf()

    def note(self) -> str:
        what = f"where {self.where}" if self.where else f"{len(self.partitions)} named partition(s)"
        return f"airflow-partitions backfill of {self.dataset}: {what}"

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "dag_id": self.dag_id,
            "where": self.where,
            "discovered": self.discovered,
            "partitions": [{"key_path": p, "reason": self.reasons.get(p, "forced")} for p in self.partitions],
            "conf": self.conf(),
        }


def resolve_selection(
    spec_path: str,
    dataset: str,
    *,
    where: str | None = None,
    partitions: Sequence[str] | None = None,
    snapshot: bool = True,
) -> BackfillSelection:
    """Discover the dataset's partitions and keep those `where` / `partitions` select (all if neither).

    Runs the same discovery as the DAG's first task, so the keys are canonical and exist in the source.
    """
    from airflow_partitions.refresh.pipeline import plan_refresh  # lazy: loads sqlglot

    if (where is not None or partitions is not None) and _layouts_differ(spec_path, dataset):
        # Before planning: a selection's plan would start moving old partitions into the new layout.
        raise _respec_refusal(spec_path, dataset)
    plan = plan_refresh(spec_path, dataset, where=where, partitions=partitions, full=True)
    if plan.replace_all:
        # partition_by changed, or a re-partitioning is in progress. The run conf names its partitions:
        # a backfill is refused until the rebuild (or the batches) finish; say so now, not mid-run.
        raise _respec_refusal(spec_path, plan.dataset)
    selected = tuple(item.key_path for item in plan.items)
    return BackfillSelection(
        dataset=plan.dataset,
        dag_id=refresh_dag_id(plan.dataset),
        where=where,
        partitions=selected,
        reasons={item.key_path: str(item.reason) for item in plan.items},
        discovered=plan.discovered,
        snapshot=snapshot,
    )


def _layouts_differ(spec_path: str, dataset: str) -> bool:
    from airflow_partitions.refresh.pipeline import layouts_differ  # lazy: loads sqlglot
    from airflow_partitions.spec import load_spec  # lazy: loads sqlglot
    from airflow_partitions.table import open_handle  # lazy: loads sqlglot

    project = load_spec(spec_path)
    spec = project.dataset(dataset)
    snapshot = open_handle(project, spec).catalog.latest()
    return snapshot is not None and layouts_differ(snapshot, spec)


def _respec_refusal(spec_path: str, dataset: str) -> Exception:
    from airflow_partitions.refresh.discovery import partial_respec_error  # lazy: loads sqlglot
    from airflow_partitions.spec import load_spec  # lazy: loads sqlglot
    from airflow_partitions.table import open_handle  # lazy: loads sqlglot

    project = load_spec(spec_path)
    spec = project.dataset(dataset)
    snapshot = open_handle(project, spec).catalog.latest()
    old = [(f.name, f.canonical) for f in snapshot.partition_spec.fields] if snapshot is not None else []
    new = [(f.name, f.transform.canonical) for f in spec.acceleration.partition_by]
    return partial_respec_error(dataset, old, new, "a backfill names every partition it refreshes")


# --- running it -----------------------------------------------------------------------------------


def trigger_through_api(
    client: AirflowApiClient,
    selection: BackfillSelection,
    *,
    unpause: bool = False,
    wait: bool = False,
    timeout: float = 3600.0,
    poll_interval: float = 2.0,
) -> dict[str, Any]:
    """Trigger the refresh DAG with the selection's conf; optionally wait for the run to finish."""
    dag = client.get_dag(selection.dag_id)
    if dag.get("is_paused"):
        if not unpause:
            raise AirflowApiError(
                f"DAG {selection.dag_id} is paused: its run would wait forever. Unpause it in the UI or pass "
                "--unpause"
            )
        client.set_paused(selection.dag_id, paused=False)
    run = client.trigger_dag_run(selection.dag_id, selection.conf(), note=selection.note())
    if wait:
        run = client.wait_for_dag_run(
            selection.dag_id, str(run["dag_run_id"]), timeout=timeout, poll_interval=poll_interval
        )
    return run


def run_locally(spec_path: str, selection: BackfillSelection) -> str:
    """Run the refresh DAG in this process (`dag.test()`) with the selection's conf; the run's state."""

    dags = build_refresh_dags(spec_path)
    dag = dags.get(selection.dag_id)
    if dag is None:
        raise RunConfError(f"the spec builds no DAG {selection.dag_id!r}; is acceleration enabled?")
    try:
        run = dag.test(run_conf=selection.conf())
    except Exception as err:
        # dag.test needs an initialised metadata database; say how to get one.
        if "no such table" in str(err) or "does not exist" in str(err):
            raise AirflowApiError(
                f"the Airflow metadata database is not initialised ({err}); run `airflow db migrate` first"
            ) from err
        raise
    return str(run.state)


# --- command line ---------------------------------------------------------------------------------

# (flags, argparse keyword arguments); shared by `airflow-partitions backfill` and `airflow partitions
# backfill`, so the two commands cannot drift apart.
ARGUMENTS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("spec",), {"metavar": "SPEC", "help": "path of the spec YAML file (the one the DAG file loads)"}),
    (("dataset",), {"metavar": "DATASET", "help": "dataset name in the spec"}),
    (
        ("--where",),
        {"help": "SQL filter on partition fields (or identity columns), e.g. \"region = 'EU'\""},
    ),
    (
        ("--partitions",),
        {"nargs": "+", "metavar": "KEY", "help": "canonical partition keys, e.g. region=EU/day=2026-01-01"},
    ),
    (("--dry-run",), {"action": "store_true", "help": "only list the partitions; trigger nothing"}),
    (("--json",), {"action": "store_true", "help": "print a JSON document instead of text"}),
    (("--local",), {"action": "store_true", "help": "run the DAG in this process instead of via the API"}),
    (
        ("--airflow-url",),
        {"help": f"Airflow base URL, e.g. http://localhost:8080 (env {ENV_API_URL})"},
    ),
    (("--token",), {"help": f"API bearer token (env {ENV_API_TOKEN})"}),
    (("--username",), {"help": f"user to get a token for (env {ENV_API_USERNAME})"}),
    (("--password",), {"help": f"password of --username (env {ENV_API_PASSWORD})"}),
    (("--no-snapshot",), {"action": "store_true", "help": "do not upload snapshots in this run"}),
    (("--unpause",), {"action": "store_true", "help": "unpause the DAG if it is paused"}),
    (("--wait",), {"action": "store_true", "help": "wait for the run to finish; exit 1 if it fails"}),
    (("--timeout",), {"type": float, "default": 3600.0, "help": "seconds --wait waits (default 3600)"}),
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "backfill",
        help="refresh the partitions a filter selects, through Airflow",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    for flags, options in ARGUMENTS:
        parser.add_argument(*flags, **options)
    parser.set_defaults(func=run)


def run(
    args: argparse.Namespace, *, out: Callable[[str], None] = print, airflow_connections: bool = False
) -> int:
    """The command: resolve, then list (dry run), run locally, or trigger over the API.

    Postgres sources resolve `params.connection_id` from `AIRFLOW_CONN_<ID>`; with `airflow_connections`
    (inside the `airflow` command) through Airflow's connections instead.
    """
    if args.where and args.partitions:
        raise RunConfError("give --where or --partitions, not both")
    if args.local and (args.airflow_url or args.token):
        raise RunConfError("--local runs the DAG in this process; drop --airflow-url / --token")
    client: AirflowApiClient | None = None
    if not args.dry_run and not args.local:
        # Fail on missing credentials before the (possibly slow) discovery.
        client = AirflowApiClient(
            args.airflow_url or os.environ.get(ENV_API_URL) or "",
            token=args.token or os.environ.get(ENV_API_TOKEN),
            username=args.username or os.environ.get(ENV_API_USERNAME),
            password=args.password or os.environ.get(ENV_API_PASSWORD),
        )
    if airflow_connections:
        install_connection_resolver()
    selection = resolve_selection(
        args.spec,
        args.dataset,
        where=args.where,
        partitions=args.partitions,
        snapshot=not args.no_snapshot,
    )
    report: dict[str, Any] = selection.to_json()
    if not selection.partitions:
        report["result"] = "nothing selected"
        out(json.dumps(report, indent=2) if args.json else _describe(selection) + "\nnothing to backfill")
        return EXIT_NOTHING_SELECTED
    if args.dry_run:
        report["result"] = "dry run"
        out(json.dumps(report, indent=2) if args.json else _describe(selection))
        return EXIT_OK
    if args.local:
        state = run_locally(args.spec, selection)
        report.update(result="ran locally", state=state)
        out(json.dumps(report, indent=2) if args.json else f"{_describe(selection)}\nlocal run: {state}")
        return EXIT_OK if state == "success" else EXIT_FAILED
    assert client is not None
    dag_run = trigger_through_api(
        client, selection, unpause=args.unpause, wait=args.wait, timeout=args.timeout
    )
    run_id = str(dag_run.get("dag_run_id"))
    state = str(dag_run.get("state"))
    report.update(result="triggered", dag_run_id=run_id, state=state, url=_run_url(client, selection, run_id))
    if args.json:
        out(json.dumps(report, indent=2))
    else:
        out(f"{_describe(selection)}\ntriggered {selection.dag_id} run {run_id} ({state}): {report['url']}")
    if args.wait and state != "success":
        return EXIT_FAILED
    return EXIT_OK


def _describe(selection: BackfillSelection) -> str:
    what = f"match {selection.where}" if selection.where else "selected"
    lines = [
        f"{selection.dataset}: {len(selection.partitions)} of {selection.discovered} partition(s) {what}"
    ]
    lines += [f"  {path}  ({selection.reasons.get(path, 'forced')})" for path in selection.partitions]
    return "\n".join(lines)


def _run_url(client: AirflowApiClient, selection: BackfillSelection, run_id: str) -> str:
    return f"{client.base_url}/dags/{quote(selection.dag_id, safe='')}/runs/{quote(run_id, safe='')}"


# --- `airflow partitions ...` ---------------------------------------------------------------------


def airflow_cli_commands() -> list[Any]:
    """The provider's Airflow CLI commands (provider info `cli`): `airflow partitions backfill`."""
    from airflow.cli.cli_config import ActionCommand, Arg, GroupCommand

    return [
        GroupCommand(
            name="partitions",
            help="Partitioned accelerations (airflow-partitions)",
            subcommands=[
                ActionCommand(
                    name="backfill",
                    help="Refresh the partitions a filter selects, through Airflow",
                    func=_airflow_backfill,
                    args=[Arg(flags, **options) for flags, options in ARGUMENTS],
                )
            ],
        )
    ]


def _airflow_backfill(args: argparse.Namespace) -> None:

    try:
        code = run(args, airflow_connections=True)
    except AirflowPartitionsError as err:
        print_error(err)
        code = 2
    if code:
        sys.exit(code)
