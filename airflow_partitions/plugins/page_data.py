"""What the Partitions page shows and does: the refresh DAGs (by their tag), their runs and the partitions
their running task instances write, each dataset's document (`cli.status.dataset_status`, the same core
function `airflow-partitions status --partitions --json` prints) and a partition's history, and refresh
runs of chosen partitions.

Read by the page's routes (`plugins/partitions_api.py`) and the trigger check (`plugins/trigger_check.py`);
the plugin that registers both is `plugins/partitions.py`. Airflow's models are imported inside the
functions: every Airflow process loads plugins, and only the api-server calls these.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_partitions.cli.status import dataset_status
from airflow_partitions.dag_factory import COMMIT_TASK, DISCOVER_TASK, REFRESH_TASK, TAG
from airflow_partitions.exceptions import PartitionValueError
from airflow_partitions.keys import composite_key, names_of_path, parse_path, partition_label

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser


# Task instance states in which a partition counts as being refreshed now.
ACTIVE_TI_STATES = (
    "scheduled",
    "queued",
    "running",
    "up_for_retry",
    "up_for_reschedule",
    "deferred",
    "restarting",
)


@dataclass(frozen=True)
class RefreshDag:
    """A refresh DAG built by `dag_factory` and the spec and dataset its tasks name."""

    dag_id: str
    spec_path: str
    dataset: str
    # The AWS connection its tasks reach a catalog and files on S3 with (None: the operators' default).
    aws_conn_id: str | None = None


def refresh_dags(dag_ids: Iterable[str] | None = None) -> list[RefreshDag]:
    """The refresh DAGs Airflow knows (tagged by `dag_factory`), with the spec and dataset of each.

    The spec path and dataset are read from the serialized DAG's discovery task, so the page needs no
    configuration of its own: it shows what the deployed DAG files refresh.
    """
    from airflow.models.dag import DagModel, DagTag
    from airflow.models.dagbag import DBDagBag
    from airflow.utils.session import create_session
    from sqlalchemy import select

    found: list[RefreshDag] = []
    with create_session() as session:
        query = (
            select(DagModel.dag_id)
            .join(DagTag, DagTag.dag_id == DagModel.dag_id)
            .where(DagTag.name == TAG, ~DagModel.is_stale)
        )
        if dag_ids is not None:
            query = query.where(DagModel.dag_id.in_(list(dag_ids)))
        bag = DBDagBag()
        for dag_id in sorted(session.scalars(query)):
            dag = bag.get_latest_version_of_dag(dag_id, session=session)
            if dag is None or not dag.has_task(DISCOVER_TASK):
                continue
            task = dag.get_task(DISCOVER_TASK)
            spec_path = getattr(task, "spec_path", None)
            dataset = getattr(task, "dataset", None)
            if spec_path and dataset:
                aws_conn_id = getattr(task, "aws_conn_id", None) or None
                found.append(RefreshDag(dag_id, str(spec_path), str(dataset), aws_conn_id))
    return found


def refresh_dag(dag_id: str) -> RefreshDag | None:
    return next(iter(refresh_dags([dag_id])), None)


# The page-only state of a partition whose refresh task finished in a run that has not ended: its files
# are written but the run's commit has not published them yet.
WAITING_FOR_COMMIT = "waiting"
# Run states in which a run may still refresh or commit.
ACTIVE_RUN_STATES = ("queued", "running")


@dataclass(frozen=True)
class RunActivity:
    """What the unfinished runs of a refresh DAG are doing, partitions named as runs name them (task labels,
    conf keys in any form `key_spellings` knows)."""

    refreshing: frozenset[str]
    # Refresh task done, run not ended: shown "refreshed, waiting for commit" until the commit.
    waiting: frozenset[str]


def run_activity(dag_id: str) -> RunActivity:
    """Partitions a queued or running run of `dag_id` is refreshing (partition task instances not finished,
    and partitions its conf names whose task instances do not exist yet) or has refreshed and not yet
    committed (task instance succeeded). A batch task (a run with more partitions than it may map) stands
    for each key path of its batch, read from the discovery's XCom."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    refreshing: set[str] = set()
    waiting: set[str] = set()
    with create_session() as session:
        runs = session.execute(
            select(DagRun.run_id, DagRun.conf).where(
                DagRun.dag_id == dag_id, DagRun.state.in_(ACTIVE_RUN_STATES)
            )
        ).all()
        for run_id, conf in runs:
            instances = session.execute(
                select(TaskInstance.map_index, TaskInstance._rendered_map_index, TaskInstance.state).where(
                    TaskInstance.dag_id == dag_id,
                    TaskInstance.run_id == run_id,
                    TaskInstance.task_id == REFRESH_TASK,
                    TaskInstance.map_index >= 0,
                )
            ).all()
            batches = batch_key_paths(session, dag_id, run_id) if instances else {}
            seen: set[str] = set()
            for map_index, label, state in instances:
                names = set(batches.get(map_index, ())) or ({label} if label else set())
                seen |= names
                if state is None or state in ACTIVE_TI_STATES:
                    refreshing |= names
                elif state == "success":
                    waiting |= names
            named = (conf or {}).get("partitions") or []
            refreshing.update(str(path) for path in named if str(path) not in seen)
    return RunActivity(frozenset(refreshing), frozenset(waiting - refreshing))


def recent_runs(dag_id: str, limit: int = 5) -> dict[str, Any]:
    """Whether the DAG is paused, and its newest runs (any run type, started anywhere) with what each
    did to partitions so far: refreshed (task succeeded), failed, and whether its commit ran.

    Cheap (a few indexed queries, no source survey): the page polls it to follow runs and to notice runs
    started elsewhere (REST, the trigger dialog, the schedule)."""
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        paused = session.scalar(select(DagModel.is_paused).where(DagModel.dag_id == dag_id))
        rows = session.execute(
            select(
                DagRun.run_id, DagRun.state, DagRun.run_type, DagRun.start_date, DagRun.end_date, DagRun.conf
            )
            .where(DagRun.dag_id == dag_id)
            .order_by(DagRun.id.desc())
            .limit(limit)
        ).all()
        runs: list[dict[str, Any]] = []
        for run_id, state, run_type, started, ended, conf in rows:
            counts = dict(
                session.execute(
                    select(TaskInstance.state, func.count())
                    .where(
                        TaskInstance.dag_id == dag_id,
                        TaskInstance.run_id == run_id,
                        TaskInstance.task_id == REFRESH_TASK,
                        TaskInstance.map_index >= 0,
                    )
                    .group_by(TaskInstance.state)
                ).all()
            )
            commit_state = session.scalar(
                select(TaskInstance.state).where(
                    TaskInstance.dag_id == dag_id,
                    TaskInstance.run_id == run_id,
                    TaskInstance.task_id == COMMIT_TASK,
                )
            )
            named = (conf or {}).get("partitions") if isinstance(conf, dict) else None
            runs.append(
                {
                    "run_id": run_id,
                    "state": str(state) if state is not None else None,
                    "run_type": str(run_type),
                    "start_date": started.isoformat() if started else None,
                    "end_date": ended.isoformat() if ended else None,
                    "partitions_named": len(named) if isinstance(named, list) else None,
                    "tasks_refreshed": int(counts.get("success", 0)),
                    "tasks_failed": int(counts.get("failed", 0) + counts.get("upstream_failed", 0)),
                    "tasks_waiting": int(
                        sum(n for st, n in counts.items() if st is None or st in ACTIVE_TI_STATES)
                    ),
                    "commit_state": str(commit_state) if commit_state is not None else None,
                }
            )
    return {"dag_id": dag_id, "is_paused": bool(paused), "runs": runs}


def set_paused(dag_id: str, paused: bool) -> None:
    """Pause or unpause the DAG, as Airflow's toggle (and `PATCH /api/v2/dags/{dag_id}`) does."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id == dag_id).values(is_paused=paused))


def batch_key_paths(session: Any, dag_id: str, run_id: str) -> dict[int, tuple[str, ...]]:
    """map index -> key paths of each batch the run's discovery handed out (`refresh.plan.WorkBatch`);
    empty when it mapped one partition per task (the task labels name them) or returned nothing."""
    from airflow.models.xcom import XComModel

    from airflow_partitions.refresh.plan import WorkBatch, is_batch_json  # lazy: loads sqlglot

    row = session.scalars(
        XComModel.get_many(
            key="return_value", run_id=run_id, dag_ids=dag_id, task_ids=DISCOVER_TASK, map_indexes=-1
        )
    ).first()
    work = XComModel.deserialize_value(row) if row is not None else None
    if not isinstance(work, list):
        return {}
    batches = [WorkBatch.from_json(value) for value in work if is_batch_json(value)]
    return {batch.index: batch.key_paths for batch in batches}


def key_spellings(key_path: str) -> set[str]:
    """The ways a run names the partition at `key_path`: the canonical key string, its task label
    (`keys.partition_label`, the rendered map index) and Airflow's composite key (`keys.composite_key`)."""

    names = names_of_path(key_path)
    try:
        # As text: a value's label and composite key are made from its text (`value_to_text`).
        key = parse_path(key_path, names, ["string"] * len(names))
    except PartitionValueError:
        return {key_path}
    return {key_path, partition_label(names, key), composite_key(key)}


def dataset_document(dag: RefreshDag) -> dict[str, Any]:
    """`status --partitions --json` of the DAG's dataset, refreshing partitions marked, plus `airflow`."""
    from airflow_partitions.refresh.partition_states import PartitionState  # lazy: loads sqlglot

    report = dataset_report(dag)
    activity = run_activity(dag.dag_id)
    counts = report["states"]
    if activity.refreshing or activity.waiting:
        for partition in report["partitions"]:
            spellings = key_spellings(partition["key_path"])
            if activity.refreshing & spellings:
                shown = str(PartitionState.REFRESHING)
            elif activity.waiting & spellings:
                shown = WAITING_FOR_COMMIT
            else:
                continue
            if partition["state"] != shown:
                counts[partition["state"]] -= 1
                counts[shown] = counts.get(shown, 0) + 1
                partition["state"] = shown
    return {
        "spec": dag.spec_path,
        "datasets": [report],
        "airflow": {"dag_id": dag.dag_id, "refresh_task_id": REFRESH_TASK},
    }


# Why a partition is stale or missing, for people (`refresh.plan.Reason`).
REASON_TEXT = {
    "new": "it is in the source but was never refreshed",
    "changed": "its source files changed since its last refresh (the source fingerprint differs)",
    "respec": "the spec's partition_by changed: every partition is rewritten under the new layout",
    "forced": "a refresh was requested for it",
}


def partition_detail(dag: RefreshDag, key_path: str, *, versions: int = 20) -> dict[str, Any]:
    """One partition over the newest `versions` retained catalog versions: each version in which it was
    written (version, commit time and operation, rows, bytes, the run and task that wrote it, its source
    fingerprint), newest first, and why discovery would refresh it now."""
    from airflow_partitions.hooks.snapshot_storage import SnapshotStorageHook  # lazy: loads airflow
    from airflow_partitions.spec import load_spec  # lazy: loads sqlglot
    from airflow_partitions.table import open_handle  # lazy: loads sqlglot

    project = load_spec(dag.spec_path)
    dataset = project.dataset(dag.dataset)
    # The catalog reached as the DAG's tasks reach it (on S3, through their AWS connection).
    settings = SnapshotStorageHook(aws_conn_id=dag.aws_conn_id).dataset_settings(project, dataset)
    catalog = open_handle(project, dataset, s3_settings=settings).catalog
    history: list[dict[str, Any]] = []
    previous: Any = None
    for info in catalog.versions(limit=versions):
        entry = catalog.snapshot(info.version).partitions.get(key_path)
        written = entry is not None and (
            previous is None
            or (entry.refreshed_at, entry.source_fingerprint)
            != (previous.refreshed_at, previous.source_fingerprint)
        )
        if entry is None and previous is not None:
            history.append(
                {
                    "version": info.version,
                    "committed_at": info.committed_at.isoformat(),
                    "operation": info.operation,
                    "change": "removed",
                }
            )
        elif written and entry is not None:
            history.append(
                {
                    "version": info.version,
                    "committed_at": info.committed_at.isoformat(),
                    "operation": info.operation,
                    "change": "written",
                    "rows": entry.rows,
                    "bytes": entry.bytes,
                    "refreshed_at": entry.refreshed_at.isoformat(),
                    "source_fingerprint": entry.source_fingerprint,
                    "written_by": entry.written_by.to_json() if entry.written_by else None,
                }
            )
        previous = entry
    history.reverse()
    return {"key_path": key_path, "history": history, "reasons": REASON_TEXT}


def dataset_report(dag: RefreshDag) -> dict[str, Any]:
    """`status --partitions --json` of the DAG's dataset, its catalog on S3 reached with the connection
    its tasks use (the operators' resolution: `SnapshotStorageHook.dataset_settings`)."""
    from airflow_partitions.hooks.snapshot_storage import SnapshotStorageHook  # lazy: loads airflow
    from airflow_partitions.spec import load_spec  # lazy: loads sqlglot

    project = load_spec(dag.spec_path)
    dataset = project.dataset(dag.dataset)
    settings = SnapshotStorageHook(aws_conn_id=dag.aws_conn_id).dataset_settings(project, dataset)
    return dataset_status(project, dataset, partitions=True, s3_settings=settings)


def partitions_to_refresh(document: dict[str, Any]) -> list[str]:
    """What "refresh everything that failed or is stale" selects (missing partitions too)."""
    from airflow_partitions.refresh.partition_states import NEEDS_REFRESH  # lazy: loads sqlglot

    wanted = {str(state) for state in NEEDS_REFRESH}
    return [p["key_path"] for p in document["datasets"][0]["partitions"] if p["state"] in wanted]


def trigger_refresh(dag_id: str, partitions: Sequence[str], user: BaseUser) -> str:
    """A manual run of the refresh DAG for exactly `partitions`, recorded as the user's, from the UI;
    its run id. Raises `ValueError` when Airflow refuses the run."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.utils.types import DagRunTriggeredByType

    run = trigger_dag(
        dag_id,
        triggered_by=DagRunTriggeredByType.UI,
        triggering_user_name=user.get_name(),
        conf={"partitions": list(partitions)},
        note=f"Partitions page: refresh {len(partitions)} partition(s)",
    )
    if run is None:
        raise ValueError(f"DAG {dag_id!r} not found")
    return str(run.run_id)
