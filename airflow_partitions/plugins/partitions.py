"""The Partitions page: an Airflow plugin (a FastAPI app under /partitions plus nav and DAG-tab views).

Its JSON API serves, per refresh DAG, the document `airflow-partitions status SPEC DATASET --partitions
--json` prints (the same core function: `cli.status.dataset_status`), with partitions a running task
instance writes now marked `refreshing`, and triggers refresh runs of chosen partitions. Every endpoint
applies Airflow's auth manager to the caller (the UI's session cookie, or a bearer token): reading a
dataset needs read access to its refresh DAG, refreshing needs permission to create runs of it. The
routes are `plugins/partitions_api.py`, what they read and do `plugins/page_data.py`.
"""

from __future__ import annotations

import threading
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_partitions.plugins.trigger_check import TriggerKeyCheck
from airflow_partitions.timetables import TriggeredPartitionTimetable

URL_PREFIX = "/partitions"


class LazyPartitionsApp:
    """The page's ASGI app, built on its first request.

    Every Airflow process loads plugins (task processes too), but only the api-server serves them: the
    FastAPI app and Airflow's API security are imported when a request arrives, not at plugin load.
    """

    def __init__(self) -> None:
        self._app: Any = None
        self._lock = threading.Lock()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            with self._lock:
                if self._app is None:
                    # lazy: fastapi and Airflow's API security load at the first request, not at plugin load
                    from airflow_partitions.plugins.partitions_api import create_app  # lazy: see above

                    self._app = create_app()
        await self._app(scope, receive, send)


class PartitionsPlugin(AirflowPlugin):
    """The Partitions page: in the nav bar (every dataset) and as a tab of each refresh DAG."""

    name = "airflow_partitions"
    fastapi_apps = [{"app": LazyPartitionsApp(), "url_prefix": URL_PREFIX, "name": "Partitions"}]
    # Unscheduled refresh DAGs use it (`dag_factory.schedule_options`); Airflow deserialises it by this
    # registration.
    timetables = [TriggeredPartitionTimetable]
    # A refresh DAG's trigger request with a malformed partition key is answered in words, not with
    # jsonschema's dump (`plugins/trigger_check.py`).
    fastapi_root_middlewares = [
        {"middleware": TriggerKeyCheck, "args": [], "kwargs": {}, "name": "Partition key check"}
    ]
    external_views = [
        {
            "name": "Partitions",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "url_route": "partitions",
        },
        {
            "name": "Partitions",
            "href": f"{URL_PREFIX}/?dag_id={{DAG_ID}}",
            "destination": "dag",
            "url_route": "partitions-of-dag",
        },
    ]
