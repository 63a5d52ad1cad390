"""The routes of the Partitions page (`plugins/partitions.py`), imported on the page's first request.

Auth is Airflow's: `GetUserDep` takes the caller from the UI's session cookie or a bearer token, and
`requires_access_dag` asks the configured auth manager, as Airflow's own API does for the same DAG.
"""

from __future__ import annotations

from typing import Any, Literal

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, status
from fastapi.responses import HTMLResponse
from pydantic import BaseModel

from airflow_partitions.plugins.page import PAGE_HTML
from airflow_partitions.plugins.page_data import (
    RefreshDag,
    dataset_document,
    partition_detail,
    partitions_to_refresh,
    recent_runs,
    refresh_dag,
    refresh_dags,
    set_paused,
    trigger_refresh,
)


class RefreshRequest(BaseModel):
    """What to refresh: these key paths, or every failed, stale or missing partition."""

    partitions: list[str] | None = None
    needs_refresh: bool = False


def may(
    user: Any, dag_id: str, method: Literal["GET", "POST", "PUT", "DELETE"], entity: DagAccessEntity | None
) -> bool:
    """Whether the auth manager lets `user` do `method` on the DAG (or on its `entity`, e.g. runs)."""
    return bool(
        get_auth_manager().is_authorized_dag(
            method=method, user=user, access_entity=entity, details=DagDetails(id=dag_id)
        )
    )


def known_refresh_dag(dag_id: str) -> RefreshDag:
    dag = refresh_dag(dag_id)
    if dag is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"{dag_id!r} is not a refresh DAG of airflow-partitions"
        )
    return dag


def create_app() -> FastAPI:
    app = FastAPI(
        title="airflow-partitions: Partitions",
        description="Partition states of accelerated datasets, and refreshes of chosen partitions.",
        # `/docs` is the README (`docs` below); the API's own OpenAPI pages live under `/api`.
        docs_url="/api/docs",
        redoc_url=None,
        openapi_url="/api/openapi.json",
    )

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> str:
        return PAGE_HTML

    @app.get("/docs", response_class=HTMLResponse, include_in_schema=False)
    def docs() -> str:
        """The installed package's README: the provider's documentation URL (`DOCUMENTATION_URL`)."""
        return documentation_html()

    @app.get("/api/datasets")
    def datasets(user: GetUserDep) -> dict[str, Any]:
        """The refresh DAGs (one per dataset) the caller may read."""
        allowed = get_auth_manager().get_authorized_dag_ids(user=user, method="GET")
        return {
            "datasets": [
                {"dag_id": dag.dag_id, "dataset": dag.dataset, "spec": dag.spec_path}
                for dag in refresh_dags()
                if dag.dag_id in allowed
            ]
        }

    @app.get("/api/dags/{dag_id}/partitions", dependencies=[Depends(requires_access_dag(method="GET"))])
    def partitions(dag_id: str, user: GetUserDep) -> dict[str, Any]:
        """Every partition of the DAG's dataset with its state: `status --partitions --json`; `airflow`
        adds whether the DAG is paused and what the caller may do (the page disables what it may not)."""
        document = dataset_document(known_refresh_dag(dag_id))
        document["airflow"].update(
            is_paused=recent_runs(dag_id, limit=0)["is_paused"],
            can_trigger=may(user, dag_id, "POST", DagAccessEntity.RUN),
            can_unpause=may(user, dag_id, "PUT", None),
        )
        return document

    @app.get("/api/dags/{dag_id}/partition", dependencies=[Depends(requires_access_dag(method="GET"))])
    def partition(dag_id: str, key_path: str) -> dict[str, Any]:
        """One partition's refresh history over the retained catalog versions (newest first)."""
        return partition_detail(known_refresh_dag(dag_id), key_path)

    @app.get("/api/dags/{dag_id}/runs", dependencies=[Depends(requires_access_dag(method="GET"))])
    def runs(dag_id: str) -> dict[str, Any]:
        """Whether the DAG is paused and its newest runs with their partition counts (cheap: polled)."""
        known_refresh_dag(dag_id)
        return recent_runs(dag_id)

    @app.post("/api/dags/{dag_id}/unpause", dependencies=[Depends(requires_access_dag(method="PUT"))])
    def unpause(dag_id: str) -> dict[str, Any]:
        """Unpause the DAG (Airflow's toggle), so the runs the page triggers are scheduled."""
        known_refresh_dag(dag_id)
        set_paused(dag_id, False)
        return {"dag_id": dag_id, "is_paused": False}

    @app.post(
        "/api/dags/{dag_id}/refresh",
        dependencies=[Depends(requires_access_dag(method="POST", access_entity=DagAccessEntity.RUN))],
    )
    def refresh(
        dag_id: str,
        user: GetUserDep,
        body: RefreshRequest,
    ) -> dict[str, Any]:
        """Trigger a refresh of `partitions`, or (`needs_refresh`) of every failed, stale or missing one."""
        partitions, needs_refresh = body.partitions, body.needs_refresh
        dag = known_refresh_dag(dag_id)
        if needs_refresh:
            if partitions:
                raise HTTPException(status.HTTP_400_BAD_REQUEST, "give partitions or needs_refresh, not both")
            partitions = partitions_to_refresh(dataset_document(dag))
        selected = [p for p in dict.fromkeys(partitions or []) if p]
        if not selected:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, "no partition selected: nothing to refresh")
        try:
            run_id = trigger_refresh(dag.dag_id, selected, user)
        except ValueError as err:  # Airflow refused the run (conf, allowed run types, a duplicate id)
            raise HTTPException(status.HTTP_400_BAD_REQUEST, str(err)) from err
        return {"dag_id": dag.dag_id, "dag_run_id": run_id, "partitions": selected}

    return app


def documentation_html() -> str:
    """The README the installed distribution carries (its long description), as one HTML page.

    Served by the provider itself, so the providers page's documentation link works wherever the package
    is installed, published or not. Markdown is rendered with markdown-it (Airflow's `rich` brings it);
    without it the text is shown as is.
    """
    import html
    from importlib.metadata import PackageNotFoundError, metadata

    try:
        # `description`: the README, from the metadata's body or its Description header.
        text = str(metadata("airflow-partitions").json.get("description") or "")
    except PackageNotFoundError:
        text = ""
    if not text.strip():
        text = "# airflow-partitions\n\nThe package's README is not in its installed metadata."
    try:
        from markdown_it import MarkdownIt

        body = MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
    except ImportError:
        body = f"<pre>{html.escape(text)}</pre>"
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>airflow-partitions</title>'
        "<style>body{font-family:sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.45}"
        "pre,code{background:#f4f4f4}pre{padding:.6rem;overflow-x:auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:.2rem .5rem}</style></head>"
        f"<body>{body}</body></html>"
    )
