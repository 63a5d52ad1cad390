"""Snapshot operators: upload refreshed partitions to S3, publish committed versions, bootstrap from them.

What each may do follows the dataset's `snapshots.mode`: `enabled` uploads and bootstraps,
`bootstrap_only` only bootstraps (read replicas never overwrite a snapshot they did not produce),
`disabled` does neither; a task that may not act skips. Credentials come from an Airflow AWS connection
(`aws_conn_id`; `endpoint_url` in its extra for MinIO and other S3-compatible stores).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowSkipException

from airflow_partitions.exceptions import OrchestrationError, SourceError
from airflow_partitions.operators.base import DatasetOperator
from airflow_partitions.operators.run_conf import RefreshRunConf
from airflow_partitions.operators.vacuum import RetentionOptions
from airflow_partitions.operators.xcom import partition_result_from_xcom

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_partitions.snapshots.modes import SnapshotActions

UPLOAD_MAP_INDEX_TEMPLATE = "{{ task.upload_label }}"


class SnapshotOperatorBase(DatasetOperator):
    """The dataset's snapshot location (or `location`), its mode, and the S3 settings of `aws_conn_id`."""

    template_fields: Sequence[str] = (*DatasetOperator.template_fields, "location")

    def __init__(self, *, location: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.location = location

    @property
    def actions(self) -> SnapshotActions:
        from airflow_partitions.snapshots.modes import snapshot_actions  # lazy: loads sqlglot

        return snapshot_actions(self.dataset_spec.acceleration.snapshots.mode)

    def snapshot_location(self) -> str:
        location = self.location or self.dataset_spec.acceleration.snapshots.location
        if not location:
            raise OrchestrationError(
                f"dataset {self.dataset!r} has no snapshots.location; set it in the spec "
                "(s3://bucket/prefix) or pass location= to the operator"
            )
        return location

    def skip_unless(self, allowed: bool, action: str) -> None:
        if not allowed:
            mode = self.dataset_spec.acceleration.snapshots.mode
            raise AirflowSkipException(f"snapshots of {self.dataset} are {mode}: no {action}")


class SnapshotUploadOperator(SnapshotOperatorBase):
    """Upload one refreshed partition's files (map it over the refresh results, one partition each; a
    batch refresh task's list of results uploads each of its partitions in turn).

    Checksums are verified before and after sending, large files go up in parts, and a file already
    stored with the same content is skipped, so a retry sends nothing twice. Skips when the dataset's
    mode does not upload or the run's `snapshot` param is false.
    """

    template_fields: Sequence[str] = (*SnapshotOperatorBase.template_fields, "partition_result")
    ui_color = "#e3d9f5"

    def __init__(self, *, partition_result: Any, upload: bool | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("map_index_template", UPLOAD_MAP_INDEX_TEMPLATE)
        super().__init__(**kwargs)
        self.partition_result = partition_result
        self.upload = upload

    @property
    def upload_label(self) -> str:
        """This instance's label in the UI: the partition's key path, or a batch's count and first and
        last key paths (the map index template)."""
        results = self.partition_result
        if isinstance(results, list):
            paths = [str(r.get("key_path")) for r in results if isinstance(r, Mapping)]
            if len(paths) == 1:
                return paths[0]
            label = f"{len(paths)} partitions: {paths[0]} .. {paths[-1]}" if paths else "0 partitions"
            return label if len(label) <= 250 else label[:249] + "…"
        return str(results["key_path"]) if isinstance(results, Mapping) else str(results)

    def execute(self, context: Context) -> dict[str, Any] | list[dict[str, Any]]:
        from airflow_partitions.snapshots import upload_partition_snapshot  # lazy: loads sqlglot
        from airflow_partitions.table import open_handle  # lazy: loads sqlglot

        self.skip_unless(self.actions.upload, "upload")
        if not RefreshRunConf.from_context(context, snapshot=self.upload).snapshot:
            raise AirflowSkipException("snapshot upload is switched off for this run (param `snapshot`)")
        batch = isinstance(self.partition_result, list)
        values = self.partition_result if batch else [self.partition_result]
        location = self.snapshot_location()
        data_root = open_handle(self.project, self.dataset_spec).local_root
        outcomes: list[dict[str, Any]] = []
        for value in values:
            result = partition_result_from_xcom(value)
            uploaded = upload_partition_snapshot(
                self.storage_hook.s3_settings, location, data_root, result.files, dataset=self.dataset
            )
            self.log.info(
                "Partition %s: uploaded %d file(s) (%d bytes), %d already there, to %s",
                result.key_path,
                len(uploaded.uploaded),
                uploaded.uploaded_bytes,
                len(uploaded.skipped),
                uploaded.location,
            )
            outcomes.append({"key_path": result.key_path, **uploaded.to_json()})
        return outcomes if batch else outcomes[0]


class SnapshotPublishOperator(SnapshotOperatorBase):
    """Publish the manifest of a committed catalog version, once all its files are in the snapshot location.

    Files the version references that are not uploaded yet (e.g. from runs with uploads switched off)
    are uploaded first. Skips when nothing was committed, the mode does not upload, or the run's
    `snapshot` param is false.
    """

    template_fields: Sequence[str] = (*SnapshotOperatorBase.template_fields, "commit")
    ui_color = "#d9cdf0"

    def __init__(self, *, commit: Any, upload: bool | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commit = commit
        self.upload = upload

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_partitions.snapshots.manifest import upload_snapshot_manifest  # lazy: loads sqlglot
        from airflow_partitions.storage import get_storage  # lazy: loads sqlglot
        from airflow_partitions.table import open_handle  # lazy: loads sqlglot

        self.skip_unless(self.actions.upload, "upload")
        if not RefreshRunConf.from_context(context, snapshot=self.upload).snapshot:
            raise AirflowSkipException("snapshot upload is switched off for this run (param `snapshot`)")
        version = self.commit.get("version") if isinstance(self.commit, Mapping) else self.commit
        if version is None:
            raise AirflowSkipException("nothing was committed: no version to publish")
        if not isinstance(version, int) or isinstance(version, bool):
            raise OrchestrationError(
                f"commit must be a commit result or a version number, got {self.commit!r}"
            )
        snapshot = self.open_catalog().snapshot(version)
        published = upload_snapshot_manifest(
            self.storage_hook.s3_settings,
            self.snapshot_location(),
            self.dataset,
            snapshot,
            dataset_root=open_handle(self.project, self.dataset_spec).local_root,
            storage=get_storage(self.dataset_spec.acceleration),
        )
        self.log.info(
            "Published %s version %d (%s; %d file(s) checked, %d uploaded first); latest is %d",
            self.dataset,
            published.version,
            "new" if published.created else "already published",
            published.files_checked,
            published.files_uploaded,
            published.latest_version,
        )
        return published.to_json()


class SnapshotBootstrapOperator(SnapshotOperatorBase):
    """Hydrate the local acceleration from the newest published snapshot (or `version`).

    `where` (SQL on partition columns) or `partitions` (canonical keys) fetch only those partitions.
    With `only_if_empty` (the default) it skips when the local catalog already has a version, so it can
    run first in every refresh: a new machine downloads instead of re-reading the source. Skips when the
    dataset's mode does not bootstrap.
    """

    template_fields: Sequence[str] = (*SnapshotOperatorBase.template_fields, "where", "partitions", "version")
    ui_color = "#e3d9f5"

    def __init__(
        self,
        *,
        where: str | None = None,
        partitions: Sequence[str] | None = None,
        version: int | None = None,
        only_if_empty: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if where is not None and partitions is not None:
            raise OrchestrationError("give SnapshotBootstrapOperator either where= or partitions=, not both")
        self.where = where
        self.partitions = partitions
        self.version = version
        self.only_if_empty = only_if_empty

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_partitions.snapshots.bootstrap import (  # lazy: loads sqlglot
            bootstrap_snapshot,
            select_where,
        )
        from airflow_partitions.snapshots.manifest import read_snapshot_manifest  # lazy: loads sqlglot
        from airflow_partitions.table import open_handle  # lazy: loads sqlglot

        # The first task of a DAG with bootstrap: a conf with unknown keys stops the run here.
        RefreshRunConf.from_context(context)
        self.skip_unless(self.actions.bootstrap, "bootstrap")
        catalog = self.open_catalog()
        if self.only_if_empty and catalog.latest() is not None:
            raise AirflowSkipException(f"{self.dataset} already has a local catalog: nothing to bootstrap")
        settings = self.storage_hook.s3_settings
        location = self.snapshot_location()
        manifest = read_snapshot_manifest(settings, location, self.dataset, self.version)
        if manifest is None:
            raise AirflowSkipException(f"no snapshot of {self.dataset} was published at {location} yet")
        where_keys: Any = None
        if self.partitions is not None:
            where_keys = [str(p).strip().strip("/") for p in self.partitions]
        elif self.where:
            where_keys = select_where(manifest, self.filter_schema(), self.where)
        result = bootstrap_snapshot(
            settings,
            location,
            self.dataset,
            open_handle(self.project, self.dataset_spec).local_root,
            catalog=catalog,
            where_keys=where_keys,
            manifest=manifest,
        )
        self.log.info(
            "Bootstrapped %s from snapshot version %s: %d of %d partition(s) selected, %d file(s) downloaded "
            "(%d bytes), %d already local; local version %s",
            self.dataset,
            result.version,
            len(result.partitions_selected),
            result.partitions_total,
            result.files_downloaded,
            result.bytes_downloaded,
            result.files_skipped,
            result.committed_version,
        )
        return result.to_json()

    def filter_schema(self) -> Any:
        """The schema `where` binds to: the spec's `schema:` block, else the source's own schema."""
        from airflow_partitions.sources import open_source  # lazy: loads sqlglot

        declared = self.dataset_spec.declared_schema()
        if declared is not None:
            return declared
        self.prepare_sources()
        try:
            return open_source(self.dataset_spec.source).schema()
        except SourceError as err:
            raise OrchestrationError(
                f"bootstrap of {self.dataset!r} with where= needs the dataset's schema: the spec declares "
                f"none and the source is unreachable ({err}); declare `schema:` in the spec or pass "
                "partitions= (canonical keys) instead"
            ) from err


class SnapshotVacuumOperator(RetentionOptions, SnapshotOperatorBase):
    """Expire old published snapshot versions and delete objects no retained version names.

    Retention as `VacuumOperator`'s: the newest `retain_versions` and/or versions younger than
    `older_than` (default: the last 7 days), and nothing younger than `grace` (default 1 hour), which
    protects a version being published and a bootstrap still reading. Only a dataset whose snapshots are
    `enabled` (the owner) vacuums; `bootstrap_only` replicas skip. `report_only=True` deletes nothing.
    """

    ui_color = "#eeeeee"

    def __init__(
        self,
        *,
        retain_versions: int | None = None,
        older_than: dt.timedelta | None = None,
        grace: dt.timedelta | None = None,
        report_only: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.set_retention(retain_versions, older_than, grace, report_only)

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_partitions.snapshots.vacuum import vacuum_snapshots  # lazy: loads sqlglot

        self.skip_unless(self.actions.upload, "vacuum (only the dataset's owner deletes snapshots)")
        report = vacuum_snapshots(
            self.storage_hook.s3_settings,
            self.snapshot_location(),
            self.dataset,
            dry_run=self.report_only,
            **self.retention(),
        )
        self.log.info(
            "%s snapshots of %s: versions %s expired, %d object(s) (%d bytes) %s; kept %s",
            "Vacuum (dry run) of" if self.report_only else "Vacuumed",
            self.dataset,
            list(report.expired_versions) or "none",
            report.deleted_objects,
            report.deleted_bytes,
            "would be deleted" if self.report_only else "deleted",
            list(report.retained_versions),
        )
        return report.to_json()
