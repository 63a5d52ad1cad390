"""Builds one refresh DAG per dataset of a spec file.

Each DAG runs `[bootstrap] → discover → stage → per partition [refresh → upload] → commit → [publish]`:
the bootstrap and snapshot tasks exist only when the dataset's snapshot mode asks for them. The per
partition task group is mapped over the discovery output, one instance per partition, labelled in the UI
with the partition's canonical key; beyond `[airflow_partitions] max_mapped_tasks` (or `[core]
max_map_length`, if smaller) one instance per batch of contiguous partitions, labelled with its count and
first and last keys. The DAG's params (`partitions`, `where`, `full_refresh`, `snapshot`)
make the UI's trigger form and the REST API's run conf drive a refresh. Nothing here imports pyspark,
pyarrow, duckdb, pandas or boto3: DAG files stay fast to parse.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import OrchestrationError

if TYPE_CHECKING:
    from airflow.sdk import DAG, Asset

    from airflow_partitions.operators.discovery import FreshnessMissCallback
    from airflow_partitions.spec import DatasetSpec, ProjectSpec

DAG_ID_PREFIX = "refresh_"
SPEC_PATH_ENV = "AIRFLOW_PARTITIONS_SPEC"
DEFAULT_SPEC_FILE = "datasets.yaml"
DEFAULT_START_DATE = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
TAG = "airflow-partitions"

# Task ids, stable so that runs, the backfill CLI and tests can name them.
BOOTSTRAP_TASK = "bootstrap_snapshot"
DISCOVER_TASK = "discover"
STAGE_TASK = "stage"
PARTITION_GROUP = "partition"
REFRESH_TASK = f"{PARTITION_GROUP}.refresh"
UPLOAD_TASK = f"{PARTITION_GROUP}.upload_snapshot"
COMMIT_TASK = "commit"
PUBLISH_TASK = "publish_snapshot"


# What refresh tasks import when they run. With LocalExecutor (and Celery's prefork) task processes are
# forked from a long-lived Airflow process; importing these there first, from `airflow_local_settings.py`,
# saves every task the cold imports (seconds each: pyarrow.dataset pulls in pandas). A task process also
# parses its DAG file again before it runs, so what parsing loads counts as much as what the task does.
TASK_PRELOAD_MODULES: tuple[str, ...] = (
    "pyarrow.dataset",
    "pyarrow.parquet",
    "pyarrow.compute",
    "pyarrow.acero",
    "pyarrow.csv",
    "pyarrow.json",
    "duckdb",
    "sqlglot",
    # sqlglot loads a dialect (a few hundred ms) on the first parse that names it.
    "sqlglot.dialects.duckdb",
    "airflow_partitions.spec",
    "airflow_partitions.transforms",
    "airflow_partitions.transforms.arrow_support",
    "airflow_partitions.storage.parquet",
    "airflow_partitions.storage.arrow_ipc",
    "airflow_partitions.storage.duckdb_engine",
    "airflow_partitions.pruning",
    "airflow_partitions.pruning.plan",
    "airflow_partitions.snapshots",
    "airflow_partitions.hooks.connections",
    "airflow_partitions.refresh",
    "airflow_partitions.refresh.finalize",
    "airflow_partitions.refresh.commit",
    "airflow_partitions.operators",
)
# Parsed and built once by `preload_task_modules`, so the Airflow modules a refresh DAG's construction
# loads lazily (task groups, params, assets, timetables) and sqlglot's first-parse work are done too.
_WARM_UP_SPEC = """\
accelerator_dir: .
datasets:
  - name: preload
    from: file:.
    params: {file_format: parquet}
    acceleration:
      partition_by:
        - region: region
        - day: "date_trunc('day', ts)"
        - bucket(4, id)
"""


# `[airflow_partitions] preload_specs`: the spec files whose refresh DAGs the preload builds.
PRELOAD_SPECS_OPTION = "preload_specs"
CONFIG_SECTION = "airflow_partitions"


@dataclass(frozen=True)
class _PreloadedDags:
    """The refresh DAGs `preload_refresh_dags` built from one spec, in process `pid`."""

    pid: int
    project: ProjectSpec
    dags: dict[str, DAG]


# By resolved spec path. Only a process forked after the preload takes them (once): see build_refresh_dags.
_PRELOADED_DAGS: dict[str, _PreloadedDags] = {}


def preload_task_modules(*, build_dag: bool = True) -> None:
    """Import `TASK_PRELOAD_MODULES` now; call it from `airflow_local_settings.py` (see the README).

    With `build_dag`, one refresh DAG is also built from a small spec in memory (nothing is written or
    registered), its params checked and a template rendered, so forked task processes find what parsing
    their DAG file and starting a task need already loaded; then the specs of `preload_spec_paths()` are
    parsed and their refresh DAGs built (`preload_refresh_dags`). A failure of that warm-up is logged
    and ignored: preloading only saves time and must never stop an Airflow process from starting.
    """
    import importlib
    import logging

    for module in TASK_PRELOAD_MODULES:
        importlib.import_module(module)
    if not build_dag:
        return
    try:
        from airflow_partitions.spec.loader import parse_spec  # lazy: loads sqlglot

        project = parse_spec(_WARM_UP_SPEC, path=Path("/nonexistent/airflow-partitions-preload.yaml"))
        dag = build_refresh_dag(project, "preload")
        # A task's start validates the DAG params (JSON schema) and renders its templates with Jinja:
        # their first use in a process compiles the meta-schema's and the lexer's rules.
        dag.params.validate()
        dag.get_template_env().from_string("{{ task_id }}").render(task_id="preload")
        # What the refresh task's metrics import (Airflow's own module: its name may move).
        importlib.import_module("airflow.sdk.observability.stats")
    except Exception as err:  # an optimisation only: Airflow must start without it
        logging.getLogger(__name__).warning("airflow-partitions: preload warm-up skipped: %s", err)
        return
    for spec_path in preload_spec_paths():
        try:
            preload_refresh_dags(spec_path)
        except Exception as err:  # a broken spec is the DAG file's import error, not Airflow's
            logging.getLogger(__name__).warning(
                "airflow-partitions: preload of the spec %s skipped: %s", spec_path, err
            )


def preload_spec_paths() -> list[Path]:
    """The spec files the preload parses: `[airflow_partitions] preload_specs` (comma-separated paths),
    else the one the example DAG file loads: `$AIRFLOW_PARTITIONS_SPEC`, else `datasets.yaml` in
    `[core] dags_folder` when it exists."""
    from airflow.configuration import conf

    configured = conf.get(CONFIG_SECTION, PRELOAD_SPECS_OPTION, fallback="") or ""
    if configured.strip():
        return [Path(part.strip()).expanduser() for part in configured.split(",") if part.strip()]
    if os.environ.get(SPEC_PATH_ENV):
        return [Path(os.environ[SPEC_PATH_ENV]).expanduser()]
    folder = conf.get("core", "dags_folder", fallback="") or ""
    candidate = Path(folder).expanduser() / DEFAULT_SPEC_FILE
    return [candidate] if folder and candidate.is_file() else []


def preload_refresh_dags(spec_path: str | os.PathLike[str]) -> list[str]:
    """Parse the spec at `spec_path` (as the DAG file does, and with types, as its tasks do) and build its
    refresh DAGs with `build_refresh_dags`' defaults; returns their ids.

    A process forked from this one (a LocalExecutor or Celery task, a DAG processor's parse) then finds
    the parsed spec in `load_spec`'s cache, and its first `build_refresh_dags(spec_path)` call with the
    default arguments takes these DAGs instead of building them again, while the spec file's text is
    unchanged. This process itself never uses them: here every call builds anew.
    """
    from airflow_partitions.spec import load_spec  # lazy: loads sqlglot

    path = Path(spec_path).expanduser().resolve()
    project = load_spec(path, check_types=False)
    load_spec(path)  # the tasks' load, with types
    dags = _build_dags(project, only_dag_id=None, options=_default_build_options())
    _PRELOADED_DAGS[str(path)] = _PreloadedDags(pid=os.getpid(), project=project, dags=dags)
    return sorted(dags)


def refresh_dag_id(dataset_name: str) -> str:
    """The id of a dataset's refresh DAG."""
    return f"{DAG_ID_PREFIX}{dataset_name}"


def default_spec_path(dag_file: str | os.PathLike[str]) -> Path:
    """The spec a DAG file loads: `$AIRFLOW_PARTITIONS_SPEC`, else `datasets.yaml` beside the DAG file."""
    configured = os.environ.get(SPEC_PATH_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path(dag_file).resolve().with_name(DEFAULT_SPEC_FILE)


def dataset_asset(project: ProjectSpec, dataset: DatasetSpec | str) -> Asset:
    """The Airflow asset a dataset's refresh DAG updates: named after the dataset, URI = its directory.

    Downstream DAGs schedule on it (`PartitionedAssetTimetable(assets=...)` runs once per refreshed
    partition key) or refer to it as `Asset.ref(name="<dataset>")`.
    """
    from airflow.sdk import Asset

    from airflow_partitions.table import open_handle  # lazy: loads sqlglot

    handle = open_handle(project, dataset)
    return Asset(name=handle.name, uri=handle.asset_uri, group="airflow-partitions")


def run_params(dataset: DatasetSpec | None = None) -> dict[str, Any]:
    """The DAG params behind the trigger form, from the run options' JSON schemas.

    With `dataset`, the `partitions` param shows that dataset's key format and its items must name the
    dataset's partition fields in order (the REST API refuses other keys when the run is triggered).
    """
    from airflow.sdk import Param

    from airflow_partitions.operators.run_conf import (  # lazy: loads airflow
        PARTITIONS,
        RUN_PARAM_SCHEMAS,
        partitions_schema,
    )

    params: dict[str, Any] = {}
    for name, schema in RUN_PARAM_SCHEMAS.items():
        fields = partitions_schema(dataset) if dataset is not None and name == PARTITIONS else dict(schema)
        default = fields.pop("default")
        description = fields.pop("description", None)
        params[name] = Param(default, description=description, **fields)
    return params


def schedule_options(schedule: str | None) -> dict[str, Any]:
    """`schedule` and `start_date` of a refresh DAG: unpausing it starts no run by itself.

    A cron schedule (or preset) runs at its ticks, in UTC, from the first tick after the DAG is first
    unpaused: no `start_date`, no catchup, and a trigger timetable that never runs the tick just passed.
    Airflow's defaults would create a run for the latest tick (or interval) the moment the DAG is
    unpaused, and for a new dataset that run is a full build racing the run the user triggered (the
    trigger dialog unpauses too). Unpausing a DAG that already ran still runs the one latest missed tick,
    as `catchup=False` does. `@once` keeps a start date: its one run is the point of it.

    Without a schedule the DAG is a partitioned DAG in Airflow's sense (3.2+),
    `timetables.TriggeredPartitionTimetable` (Airflow's `PartitionedAtRuntime` that also reports itself
    partitioned, so the trigger dialog shows its Partition Key field): a run triggered with a
    `partition_key` (REST API, the UI's trigger dialog) refreshes exactly that partition and the run
    carries the key (Partition Key column and filter, `airflow dags clear --partition-key`); it schedules no
    run of its own. Airflow accepts a trigger-time key only on partitioned timetables, and its cron
    partition timetable would give every scheduled run a date key of its own: a cron-scheduled refresh DAG
    keeps its cron and takes partitions through the `partitions` / `where` params.
    """
    if schedule is None:
        from airflow_partitions.timetables import TriggeredPartitionTimetable  # lazy: loads airflow

        return {"schedule": TriggeredPartitionTimetable(), "start_date": DEFAULT_START_DATE}
    if schedule in ("@once", "@continuous"):
        return {"schedule": schedule, "start_date": DEFAULT_START_DATE}
    from airflow.sdk import CronTriggerTimetable

    # run_immediately=0: even right after a tick, the first run waits for the next one.
    timetable = CronTriggerTimetable(schedule, timezone="UTC", run_immediately=dt.timedelta(0))
    return {"schedule": timetable, "start_date": None}


def describe_for_ui(dataset: DatasetSpec) -> str:
    """Markdown shown on the DAG's page: what the DAG refreshes and how."""
    acceleration = dataset.acceleration
    fields = "\n".join(f"  - `{f.name}`: `{f.expression}`" for f in acceleration.partition_by)
    snapshots = acceleration.snapshots
    where = f" at `{snapshots.location}`" if snapshots.location else ""
    return (
        f"### Refresh of `{dataset.name}`\n\n"
        f"- source: `{dataset.source.uri}`\n"
        f"- engine: `{acceleration.engine}` ({acceleration.mode}, {acceleration.partition_mode})\n"
        f"- partition_by:\n{fields}\n"
        f"- schedule: `{acceleration.refresh.schedule or 'manual'}` (UTC; unpausing starts no run: the "
        "first scheduled run is the first tick after the DAG is first unpaused)\n"
        f"- snapshots: `{snapshots.mode}`{where}\n\n"
        "Trigger with params to refresh chosen partitions (`partitions`), those matching a filter "
        "(`where`), or everything (`full_refresh`). A failed partition can be cleared and re-run alone."
    )


def build_refresh_dag(
    project: ProjectSpec,
    dataset: DatasetSpec | str,
    *,
    spark_conn_id: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
    aws_conn_id: str | None = None,
    stage: bool = True,
    dag_id: str | None = None,
    default_args: Mapping[str, Any] | None = None,
    dag_kwargs: Mapping[str, Any] | None = None,
    strategy: str = "auto",
    on_freshness_miss: FreshnessMissCallback | None = None,
) -> DAG:
    """The refresh DAG of one dataset (see the module docstring for its shape).

    `spark_conn_id`: None runs Spark in-process (or per `[airflow_partitions] spark_conn_id`); a `spark`
    connection uses spark-submit, a `spark_connect` one a Spark Connect server. `spark_conf`: extra Spark
    settings for every Spark task (session config, or `--conf` of spark-submit). `aws_conn_id`: the S3
    connection of snapshots and of a catalog on S3. `stage=False` drops the shared stage: each partition
    task then stages its own partition (worth it only when the source reads one partition without
    scanning the rest). `dag_id` defaults to `refresh_<dataset>`; set it to build a second DAG over the
    same dataset. `strategy` (stage task): "auto" writes the partitions in the stage task with the
    in-process Arrow path when the source fits the worker's memory budget and no Spark connection is
    configured, else stages with Spark; "arrow" / "spark" force one (`SparkStageOperator`).
    `on_freshness_miss(miss, context)`: called by the discover task when partitions of the newest version
    are older than the dataset's `freshness` SLA (`operators.discovery.FreshnessMiss`).
    """
    from airflow.sdk import DAG, TriggerRule, XComArg

    from airflow_partitions.operators import (  # lazy: loads airflow
        PartitionDiscoveryOperator,
        SnapshotBootstrapOperator,
        SparkStageOperator,
    )
    from airflow_partitions.operators.discovery import PLAN_XCOM_KEY  # lazy: loads airflow
    from airflow_partitions.snapshots.modes import snapshot_actions  # lazy: loads sqlglot

    spec = project.dataset(dataset) if isinstance(dataset, str) else dataset
    if project.path is None:
        raise OrchestrationError(
            "build_refresh_dag needs a spec loaded from a file (tasks re-read it when they run)"
        )
    spec_path = str(Path(project.path).resolve())
    common: dict[str, Any] = {"spec_path": spec_path, "dataset": spec.name, "aws_conn_id": aws_conn_id}
    actions = snapshot_actions(spec.acceleration.snapshots.mode)
    asset = dataset_asset(project, spec)
    options = _dag_options(spec, default_args, dag_kwargs)
    with DAG(dag_id=dag_id or refresh_dag_id(spec.name), **options) as dag:
        discover = PartitionDiscoveryOperator(
            task_id=DISCOVER_TASK,
            # Runs after a bootstrap that skipped because the local copy exists.
            trigger_rule=TriggerRule.NONE_FAILED,
            on_freshness_miss=on_freshness_miss,
            **common,
        )
        if actions.bootstrap and spec.acceleration.snapshots.location:
            SnapshotBootstrapOperator(task_id=BOOTSTRAP_TASK, **common) >> discover
        plan = XComArg(discover, key=PLAN_XCOM_KEY)
        staged = None
        if stage:
            staged = SparkStageOperator(
                task_id=STAGE_TASK,
                plan=plan,
                work_items=discover.output,
                spark_conn_id=spark_conn_id,
                spark_conf=spark_conf,
                strategy=strategy,
                **common,
            )
        partitions = _partition_tasks(
            discover,
            staged,
            plan,
            upload=actions.upload,
            spark_conn_id=spark_conn_id,
            spark_conf=spark_conf,
            common=common,
        )
        _commit_tasks(dag, discover, staged, plan, partitions, asset, publish=actions.upload, common=common)
    return dag


def _dag_options(
    spec: DatasetSpec, default_args: Mapping[str, Any] | None, dag_kwargs: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The `DAG(...)` arguments of a dataset's refresh DAG; `dag_kwargs` override the defaults."""
    options: dict[str, Any] = {
        **schedule_options(spec.acceleration.refresh.schedule),
        "catchup": False,
        # One refresh per dataset at a time: two would only fight over the same catalog commit.
        "max_active_runs": 1,
        "params": run_params(spec),
        "tags": [TAG, spec.name],
        "doc_md": describe_for_ui(spec),
        "description": f"Refresh the partitioned acceleration of {spec.name}",
        "default_args": dict(default_args or {}),
    }
    options.update(dag_kwargs or {})
    return options


def _partition_tasks(
    discover: Any,
    staged: Any,
    plan: Any,
    *,
    upload: bool,
    spark_conn_id: str | None,
    spark_conf: Mapping[str, str] | None,
    common: dict[str, Any],
) -> Any:
    """The per partition task group (refresh, then upload when snapshots are uploaded), mapped over the
    discovery output and run after the stage task when there is one."""
    from airflow.sdk import task_group

    from airflow_partitions.operators import (  # lazy: loads airflow
        SnapshotUploadOperator,
        SparkPartitionRefreshOperator,
    )

    @task_group(group_id=PARTITION_GROUP)
    def per_partition(work_item: Any) -> None:
        refreshed = SparkPartitionRefreshOperator(
            task_id="refresh",
            work_item=work_item,
            stage=staged.output if staged is not None else None,
            plan=None if staged is not None else plan,
            spark_conn_id=spark_conn_id,
            spark_conf=spark_conf,
            **common,
        )
        if upload:
            SnapshotUploadOperator(
                task_id="upload_snapshot",
                partition_result=refreshed.output,
                **common,
            )

    partitions = per_partition.expand(work_item=discover.output)
    if staged is not None:
        staged >> partitions
    return partitions


def _commit_tasks(
    dag: DAG,
    discover: Any,
    staged: Any,
    plan: Any,
    partitions: Any,
    asset: Asset,
    *,
    publish: bool,
    common: dict[str, Any],
) -> None:
    """The commit task after every partition task, and the snapshot publish after it when asked for."""
    from airflow.sdk import TriggerRule

    from airflow_partitions.operators import (  # lazy: loads airflow
        PartitionCommitOperator,
        SnapshotPublishOperator,
    )

    commit = PartitionCommitOperator(
        task_id=COMMIT_TASK,
        plan=plan,
        work_items=discover.output,
        results=dag.get_task(REFRESH_TASK).output,
        stage=staged.output if staged is not None else None,
        outlets=[asset],
        # Skipped partition tasks (nothing to refresh) must not skip the commit of removals.
        trigger_rule=TriggerRule.NONE_FAILED,
        **common,
    )
    partitions >> commit
    discover >> commit
    if publish:
        SnapshotPublishOperator(task_id=PUBLISH_TASK, commit=commit.output, **common)


def build_refresh_dags(
    spec_path: str | os.PathLike[str],
    *,
    spark_conn_id: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
    aws_conn_id: str | None = None,
    stage: bool = True,
    default_args: Mapping[str, Any] | None = None,
    dag_kwargs: Mapping[str, Any] | None = None,
    strategy: str = "auto",
    on_freshness_miss: FreshnessMissCallback | None = None,
) -> dict[str, DAG]:
    """One refresh DAG per enabled dataset of the spec at `spec_path`, keyed by DAG id (the arguments as
    for `build_refresh_dag`).

    A DAG file exposes them with `globals().update(build_refresh_dags(...))`. A broken spec raises
    `SpecValidationError` listing every problem, which Airflow shows as the file's import error.

    In a task process, which parses its DAG file again before it runs, only the DAG of that task is built
    (Airflow's parsing context names it): every mapped partition task would otherwise build the refresh
    DAG of every dataset in the spec. In a process forked after `preload_refresh_dags` of this spec file,
    unchanged since, the first call with the default arguments takes the preloaded DAGs instead.
    """
    from airflow.sdk import get_parsing_context

    from airflow_partitions.spec import load_spec  # lazy: loads sqlglot

    # Type checks need pyarrow; tasks re-load the spec with them, DAG parsing stays light.
    project = load_spec(Path(spec_path), check_types=False)
    wanted = get_parsing_context().dag_id
    options: dict[str, Any] = {
        "spark_conn_id": spark_conn_id,
        "spark_conf": spark_conf,
        "aws_conn_id": aws_conn_id,
        "stage": stage,
        "default_args": default_args,
        "dag_kwargs": dag_kwargs,
        "strategy": strategy,
        "on_freshness_miss": on_freshness_miss,
    }
    preloaded = _take_preloaded(spec_path, project) if options == _default_build_options() else None
    if preloaded is not None:
        dags = {dag_id: dag for dag_id, dag in preloaded.items() if wanted is None or dag_id == wanted}
        for dag in dags.values():
            # What building a DAG does on leaving its `with DAG(...)` block: register it with the DAG
            # file being parsed (Airflow's DagContext), for files that do not put it in their globals.
            with dag:
                pass
        return dags
    return _build_dags(project, only_dag_id=wanted, options=options)


def _default_build_options() -> dict[str, Any]:
    """`build_refresh_dags`' keyword arguments at their defaults (what `preload_refresh_dags` builds)."""
    import inspect

    parameters = inspect.signature(build_refresh_dags).parameters
    return {name: p.default for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _take_preloaded(spec_path: str | os.PathLike[str], project: ProjectSpec) -> dict[str, DAG] | None:
    """The DAGs a parent process preloaded from this spec, if this is a forked process and the spec's text
    is the one they were built from (`load_spec`'s cache then hands back the very same parsed spec);
    taken once, so a second parse in this process builds anew."""
    key = str(Path(spec_path).expanduser().resolve())
    entry = _PRELOADED_DAGS.get(key)
    if entry is None or entry.pid == os.getpid() or entry.project is not project:
        return None
    del _PRELOADED_DAGS[key]
    return entry.dags


def _build_dags(
    project: ProjectSpec, *, only_dag_id: str | None, options: Mapping[str, Any]
) -> dict[str, DAG]:
    """The refresh DAG of every enabled dataset of `project` (only the named one, given a DAG id)."""
    dags: dict[str, DAG] = {}
    for spec in project.datasets:
        if not spec.acceleration.enabled:
            continue
        if only_dag_id is not None and refresh_dag_id(spec.name) != only_dag_id:
            continue
        dag = build_refresh_dag(project, spec, **options)
        dags[dag.dag_id] = dag
    return dags
