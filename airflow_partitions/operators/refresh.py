"""Spark refresh operators: stage the source once, then write one partition per mapped task instance.

`SparkStageOperator` runs the one Spark job of a refresh (scan the source once, route rows to the planned
partitions). `SparkPartitionRefreshOperator` turns one partition's staged rows into its engine file and
returns the partition's descriptor for the commit; without a stage task it stages its own partition first
(one Spark job per partition: for sources that read a partition without scanning the rest). Both run
Spark where the connection says: in-process local Spark (default), `spark-submit` through a `spark`
connection, or a Spark Connect server through a `spark_connect` connection.
"""

from __future__ import annotations

import datetime as dt
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import ConservationError, OrchestrationError, PartitionsFailedError
from airflow_partitions.hooks.connections import resolve_postgres_connection
from airflow_partitions.hooks.spark_refresh import (
    LOCAL,
    SparkMode,
    SparkRefreshHook,
    configured_arrow_memory_budget,
)
from airflow_partitions.keys import names_of_path, partition_label
from airflow_partitions.operators.base import DatasetOperator
from airflow_partitions.operators.metrics import Outcome, record_partition, record_stage
from airflow_partitions.operators.xcom import mapped_work_from_xcom, plan_from_xcom, stage_from_xcom

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_partitions.refresh.plan import (
        PartitionResult,
        PartitionWorkItem,
        RefreshPlan,
        StageResult,
        WorkBatch,
    )
    from airflow_partitions.spec import DatasetSpec, ProjectSpec

# The label of each mapped refresh instance in the UI: its partition's readable key
# (`region=Zürich/day=2026-01-01T00:00:00`, `keys.partition_label`), which the `partitions` option accepts;
# for a batch, its count and first and last keys (`WorkBatch.label`).
REFRESH_MAP_INDEX_TEMPLATE = "{{ task.partition_label }}"
# XCom a failed batch task leaves: which of its partitions were refreshed and which failed (and why).
BATCH_OUTCOME_XCOM_KEY = "batch_outcome"
# How many failed partitions a batch task's error names before it says "and N more".
FAILED_NAMES_SHOWN = 20


def _stage_in_session(
    operator: SparkOperatorBase, project: ProjectSpec, dataset: DatasetSpec, plan: RefreshPlan
) -> StageResult:
    from airflow_partitions.refresh.stage import stage_refresh  # lazy: loads sqlglot

    return stage_refresh(operator.dataset_handle(), plan, spark=operator.spark_hook.session())


def _stage_with_spark_submit(
    operator: SparkOperatorBase, project: ProjectSpec, dataset: DatasetSpec, plan: RefreshPlan
) -> StageResult:
    from airflow_partitions.refresh.job_files import stage_job_files  # lazy: loads sqlglot
    from airflow_partitions.refresh.stage_layout import staging_root  # lazy: loads sqlglot

    root = staging_root(project, dataset)
    root.mkdir(parents=True, exist_ok=True)
    location = root / f"submit-{uuid.uuid4().hex[:12]}"
    with stage_job_files(root) as job:
        job.write_plan(plan)
        operator.spark_hook.submit(
            job.job_args(
                spec_path=os.path.abspath(operator.spec_path), dataset=dataset.name, location=str(location)
            ),
            env=operator.submit_env(dataset),
            name=f"airflow-partitions-stage-{dataset.name}",
        )
        return job.read_stage_result()


def open_stage_source(project: ProjectSpec, dataset: DatasetSpec) -> Any:
    """The dataset's source as the stage reads it (keeping the per-file facts of a file source)."""
    from airflow_partitions.catalog.open import dataset_directory  # lazy: loads sqlglot
    from airflow_partitions.sources import keep_file_facts, open_dataset_source  # lazy: loads sqlglot

    return keep_file_facts(open_dataset_source(dataset), dataset_directory(project, dataset))


# The stage task's strategies: auto picks per run (`refresh.strategy`), arrow and spark force one.
DAG_STRATEGIES = ("auto", "arrow", "spark")


# How each Spark mode stages: in a session of this process (local or Spark Connect), or by spark-submit.
_STAGE_RUNNERS: dict[SparkMode, Callable[[Any, Any, Any, Any], StageResult]] = {
    SparkMode.LOCAL: _stage_in_session,
    SparkMode.CONNECT: _stage_in_session,
    SparkMode.SUBMIT: _stage_with_spark_submit,
}


class SparkOperatorBase(DatasetOperator):
    """Spark connection handling shared by the stage and the per-partition refresh."""

    def __init__(
        self, *, spark_conn_id: str | None = None, spark_conf: Mapping[str, str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.spark_conn_id = spark_conn_id
        self.spark_conf = dict(spark_conf or {})

    @cached_property
    def spark_hook(self) -> SparkRefreshHook:
        return SparkRefreshHook(spark_conn_id=self.spark_conn_id, spark_conf=self.spark_conf)

    def submit_env(self, dataset: DatasetSpec) -> dict[str, str]:
        """Environment for a spark-submit driver: the Postgres source's connection as AIRFLOW_CONN_<ID>,
        and the S3 settings of an `s3://` accelerator_dir (`job_files.S3_SETTINGS_ENV`).

        The driver runs outside Airflow's task process, so it cannot ask Airflow for connections; the
        resolved settings travel in the environment (never on the command line, which `ps` shows).
        """
        from airflow_partitions.spec import SourceScheme  # lazy: loads sqlglot

        env: dict[str, str] = {}
        source = dataset.source
        if source.scheme is SourceScheme.POSTGRES and source.connection_id:
            env[f"AIRFLOW_CONN_{source.connection_id.upper()}"] = resolve_postgres_connection(
                source.connection_id
            )
        settings = self.data_s3_settings  # None unless accelerator_dir is on S3
        if settings is not None:
            from airflow_partitions.refresh.job_files import s3_settings_environment  # lazy: loads sqlglot

            # The job's executors write the partition files to the s3:// accelerator_dir themselves.
            env.update(s3_settings_environment(settings))
        return env

    def run_stage(self, plan: RefreshPlan) -> StageResult:
        self.prepare_sources()
        runner = _STAGE_RUNNERS[self.spark_hook.mode]
        self.log.info(
            "Staging %d partition(s) of %s with Spark (%s)",
            len(plan.items),
            self.dataset,
            self.spark_hook.mode,
        )
        return runner(self, self.project, self.dataset_spec, plan)

    def on_kill(self) -> None:
        self.spark_hook.on_kill()


class SparkStageOperator(SparkOperatorBase):
    """Read the source once and route the planned partitions' rows to a staging location.

    Returns the stage result (location and mode) that `SparkPartitionRefreshOperator` reads; when
    discovery planned nothing to refresh, an empty one, without starting Spark. `strategy` "auto"
    (default) runs the in-process Arrow path in this task when the source fits this worker's memory
    budget and no Spark connection is configured (`refresh.strategy`): it writes the partition files and
    the partition tasks only build their entries; "arrow" forces that, "spark" the Spark stage (which
    reads partitions straight from a source that can prune). The log and the XCom (`strategy`,
    `strategy_reason`) say which ran and why.
    """

    template_fields: Sequence[str] = (*DatasetOperator.template_fields, "plan", "work_items")
    ui_color = "#fde9c8"

    def __init__(
        self,
        *,
        plan: Any,
        work_items: Any,
        spark_conn_id: str | None = None,
        strategy: str = "auto",
        **kwargs: Any,
    ) -> None:
        super().__init__(spark_conn_id=spark_conn_id, **kwargs)
        if strategy not in DAG_STRATEGIES:
            raise OrchestrationError(
                f"strategy {strategy!r} is not one of {', '.join(DAG_STRATEGIES)} (auto: in-process Arrow "
                "when the source fits this worker, else Spark)"
            )
        self.plan = plan
        self.work_items = work_items
        self.strategy = strategy

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_partitions.refresh.stage import stage_refresh  # lazy: loads sqlglot
        from airflow_partitions.refresh.strategy import choose_strategy  # lazy: loads sqlglot

        plan = plan_from_xcom(self.plan, self.work_items)
        if not plan.items:
            # An empty stage (no Spark started): the partition tasks skip, the commit applies removals.
            self.log.info("Nothing to refresh in %s: no stage needed", self.dataset)
            return stage_refresh(self.dataset_handle(), plan).to_json()
        self.prepare_sources()
        configured = self.spark_hook.spark_conn_id
        choice = choose_strategy(
            self.project,
            plan,
            open_stage_source(self.project, self.dataset_spec),
            strategy=self.strategy,
            spark_given=f"Spark connection {configured!r}" if configured not in (None, "", LOCAL) else None,
            budget=configured_arrow_memory_budget(),
        )
        self.log.info("Refreshing %s with %s: %s", self.dataset, choice.engine, choice.reason)
        if choice.uses_arrow:
            stage = stage_refresh(self.dataset_handle(), plan, strategy="arrow")
            record_stage(self.dataset, elapsed_s=stage.elapsed_s, source_rows=stage.source_rows)
            self.log.info(
                "Wrote %d partition(s) of %s in process in %.2fs; rows read %s, routed %s",
                stage.partitions,
                self.dataset,
                stage.elapsed_s,
                stage.source_rows,
                stage.routed_rows,
            )
            return {**stage.to_json(), "strategy": choice.engine, "strategy_reason": choice.reason}
        stage = self.run_stage(plan)
        record_stage(self.dataset, elapsed_s=stage.elapsed_s, source_rows=stage.source_rows)
        if stage.location and self.dataset_handle().stage_needs_upload(stage.location):
            stage = self.upload_stage(stage)
        self.log.info(
            "Staged %d partition(s) at %s (%s, Spark on %s) in %.2fs; rows read %s, routed %s",
            stage.partitions,
            stage.location,
            stage.mode,
            stage.spark or "none",
            stage.elapsed_s,
            stage.source_rows,
            stage.routed_rows,
        )
        return {**stage.to_json(), "strategy": choice.engine, "strategy_reason": choice.reason}

    def upload_stage(self, stage: StageResult) -> StageResult:
        """Move a local stage to `<accelerator_dir>/_staging/<dataset>/<stamp>/` on S3, so partition tasks
        on any worker fetch their own item from there (no shared local disk); stale stages of killed
        runs there are swept first, as locally."""
        from airflow_partitions.refresh import remote  # lazy: loads sqlglot
        from airflow_partitions.refresh.leftovers import DEFAULT_GRACE  # lazy: loads sqlglot

        assert stage.location is not None
        handle = self.dataset_handle()
        url = handle.stage_location(Path(stage.location).name)
        swept = remote.sweep_remote_stages(handle, grace=DEFAULT_GRACE)
        if swept:
            self.log.info("Removed %d stale stage(s) on S3: %s", len(swept), swept)
        remote.upload_stage(Path(stage.location), url, self.data_s3_settings)
        return replace(stage, location=url)


class SparkPartitionRefreshOperator(SparkOperatorBase):
    """Refresh one partition: write its engine file from the staged rows and return its descriptor.

    Map it over the discovery output (`work_item=XComArg`), one task instance per partition; a failed
    partition can be cleared and re-run alone while the stage is kept. Given a batch of work items
    (discovery's output beyond `max_mapped_tasks`), it refreshes each in turn and returns the list of
    their descriptors; a partition that fails does not stop the others: each failure is recorded, then the
    task fails naming the failed partitions. Nothing is visible to readers
    until `PartitionCommitOperator` commits. With `stage=None` the task stages its own partition first,
    through the Spark connection (`plan` then comes from the discovery task's `plan` XCom).
    """

    template_fields: Sequence[str] = (*DatasetOperator.template_fields, "work_item", "stage", "plan")
    ui_color = "#fbd79b"

    def __init__(
        self,
        *,
        work_item: Any,
        stage: Any = None,
        plan: Any = None,
        spark_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("map_index_template", REFRESH_MAP_INDEX_TEMPLATE)
        super().__init__(spark_conn_id=spark_conn_id, **kwargs)
        self.work_item = work_item
        self.stage = stage
        self.plan = plan

    @property
    def partition_label(self) -> str:
        """The readable key of this instance's partition (its label in the UI); the map index template.

        A batch is labelled by its partition count and first and last keys (`WorkBatch.label`)."""
        from airflow_partitions.refresh.plan import WorkBatch, item_label  # lazy: loads sqlglot

        work = mapped_work_from_xcom(self.work_item)
        return work.label if isinstance(work, WorkBatch) else item_label(work)

    def execute(self, context: Context) -> dict[str, Any] | list[dict[str, Any]]:
        from airflow_partitions.refresh.plan import WorkBatch  # lazy: loads sqlglot

        work = mapped_work_from_xcom(self.work_item)
        if isinstance(work, WorkBatch):
            return self.refresh_batch(context, work)
        return self.refresh_partition(context, work).to_json()

    def refresh_batch(self, context: Context, batch: WorkBatch) -> list[dict[str, Any]]:
        """Refresh every partition of the batch, in order; fail afterwards if any of them failed."""
        from airflow_partitions.refresh.failures import describe_error  # lazy: loads sqlglot

        started = time.perf_counter()
        results: list[PartitionResult] = []
        failed: dict[str, str] = {}
        for item in batch.items:
            try:
                results.append(self.refresh_partition(context, item))
            except Exception as err:
                # Recorded in the failure store by refresh_partition; the batch goes on.
                failed[item.key_path] = describe_error(err)
                self.log.error("Partition %s failed: %s", item.key_path, failed[item.key_path])
        self.log.info(
            "Batch %d: %d of %d partition(s) refreshed in %.2fs, %d failed",
            batch.index,
            len(results),
            len(batch.items),
            time.perf_counter() - started,
            len(failed),
        )
        if failed:
            context["ti"].xcom_push(
                key=BATCH_OUTCOME_XCOM_KEY,
                value={"refreshed": [r.key_path for r in results], "failed": failed},
            )
            named = ", ".join(list(failed)[:FAILED_NAMES_SHOWN])
            more = f" and {len(failed) - FAILED_NAMES_SHOWN} more" if len(failed) > FAILED_NAMES_SHOWN else ""
            raise PartitionsFailedError(
                f"{len(failed)} of {len(batch.items)} partition(s) of batch {batch.index} of {self.dataset} "
                f"failed: {named}{more} (each error is in the log and in `status --partitions`); the "
                f"other {len(results)} were refreshed but nothing is committed. Fix the cause, then clear "
                "this task, or trigger the DAG with the failed partitions (`airflow-partitions refresh "
                "SPEC DATASET --failed` refreshes them outside Airflow)",
                failed,
            )
        return [result.to_json() for result in results]

    def refresh_partition(self, context: Context, item: PartitionWorkItem) -> PartitionResult:
        """Refresh one partition and return its descriptor, naming this task instance as its writer; a
        failure is recorded in the failure store and re-raised."""
        from airflow_partitions.catalog.model import WrittenBy  # lazy: loads sqlglot

        started = time.perf_counter()
        try:
            result = self._refresh(item)
        except Exception as err:
            outcome = Outcome.CONSERVATION_REFUSED if isinstance(err, ConservationError) else Outcome.FAILED
            record_partition(self.dataset, outcome, elapsed_s=time.perf_counter() - started)
            self.remember_failure(context, item.key_path, err)
            raise
        record_partition(
            self.dataset,
            Outcome.SUCCESS,
            elapsed_s=time.perf_counter() - started,
            rows=result.rows,
            size=result.bytes,
        )
        self.log.info(
            "Partition %s (%s): %s rows routed, %d rows in %d file(s), %d bytes, in %.2fs",
            partition_label(names_of_path(item.key_path), item.partition_key),
            item.reason,
            result.routed,
            result.rows,
            len(result.files),
            result.bytes,
            result.elapsed_s,
        )
        # The entry names this task instance, so status and the Partitions page can link to it.
        ti = context.get("ti")
        if ti is not None:
            map_index = ti.map_index if ti.map_index is not None else -1
            writer = WrittenBy(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, map_index=map_index)
            result = replace(result, entry=replace(result.entry, written_by=writer))
        return result

    def remember_failure(self, context: Context, key_path: str, err: BaseException) -> None:
        """Record the failure beside the catalog (`refresh --failed`, `status`, the Partitions page).

        Best effort: an unreachable store must not hide the task's own error, which is re-raised.
        """
        from airflow_partitions.refresh.failures import (  # lazy: loads sqlglot
            FailureStore,
            PartitionFailure,
            describe_error,
        )

        ti = context.get("ti")
        failure = PartitionFailure(
            key_path=key_path,
            error=describe_error(err),
            failed_at=dt.datetime.now(dt.UTC),
            dag_id=getattr(ti, "dag_id", None),
            run_id=getattr(ti, "run_id", None),
            task_id=getattr(ti, "task_id", None),
            map_index=getattr(ti, "map_index", None),
        )
        try:
            FailureStore.for_catalog(self.open_catalog()).record(failure)
        except Exception as store_err:
            self.log.warning("Could not remember the failure of %s: %s", key_path, store_err)

    def _refresh(self, item: PartitionWorkItem) -> PartitionResult:
        from airflow_partitions.refresh.commit import remove_stage  # lazy: loads sqlglot
        from airflow_partitions.refresh.finalize import finalize_partition  # lazy: loads sqlglot

        stage = stage_from_xcom(self.stage)
        own_stage: StageResult | None = None
        if stage is None:
            if self.plan is None:
                raise OrchestrationError(
                    "SparkPartitionRefreshOperator without a stage needs plan=discover.output['plan'] to "
                    "stage its own partition"
                )
            own_stage = self.run_stage(replace(plan_from_xcom(self.plan, []), items=(item,)))
            stage = own_stage
        self.prepare_sources()
        try:
            return finalize_partition(self.dataset_handle(), stage, item)
        finally:
            if own_stage is not None:
                remove_stage(own_stage, self.data_s3_settings)
