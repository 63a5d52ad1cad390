"""An Airflow hook for pruned reads of one accelerated dataset (plan, read to Arrow, SQL query, Spark) and
for writes to it (append, upsert, delete; each one atomic catalog commit).

The hook is thin: it finds the spec (the `spec_path` argument, else the `spec_path` in the extra of an
`airflow_partitions` connection) and, for files on S3, the credentials of an AWS connection, then
delegates every read to `airflow_partitions.read.PartitionedDatasetReader` and every write to
`airflow_partitions.write`. Building the hook reads
nothing; the reader (spec, catalog, DuckDB) is created on first use. pyarrow, DuckDB and pyspark load
only then, so DAG files can import this module cheaply.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from airflow_partitions.exceptions import OrchestrationError, UnknownPartitionError
from airflow_partitions.hooks.connections import (
    get_connection,
    install_connection_resolver,
    install_secret_masker,
)
from airflow_partitions.hooks.snapshot_storage import SnapshotStorageHook
from airflow_partitions.hooks.stats import install_read_metrics
from airflow_partitions.keys import PartitionKey, partition_label
from airflow_partitions.objectstore import S3Settings, is_local_location

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.pruning import FilterInput, PrunePlan
    from airflow_partitions.read import PartitionedDatasetReader
    from airflow_partitions.spec import ProjectSpec
    from airflow_partitions.table import DatasetHandle
    from airflow_partitions.write.commit import WriteResult


class PartitionedDatasetHook(BaseHook):
    """Pruned reads of `dataset` from the spec at `spec_path` (see the module docstring).

    Connection (type `airflow_partitions`), all optional: extra `spec_path` (used when the argument is
    not given), `data_root` (where partition files live, e.g. `s3://bucket/prefix/<dataset>`) and
    `aws_conn_id` (the AWS connection for an `s3://` data root), `cache_dir` and `cache_max_bytes` (where
    and how many bytes of files fetched from S3 are kept locally, keyed by checksum; default a temporary
    directory of the process and 2 GiB or a tenth of its free space, whichever is less). The first
    filtered read of a Parquet file of at least `ranged_read_min_bytes` (argument; default 8 MiB) that is
    not cached reads only its footer and the row groups the filter may need. `tag` (argument) pins every
    read to the version a tag names (`airflow-partitions tag`), unless a call names a version or tag:
    a DAG pins a release by passing a templated tag to the task that builds the hook. The connection
    form (one field per extra key, Host / Login / Password hidden) is declared in `provider_info.py`.
    """

    conn_name_attr = "partitions_conn_id"
    default_conn_name = "airflow_partitions_default"
    conn_type = "airflow_partitions"
    hook_name = "Airflow Partitions"

    def __init__(
        self,
        *,
        dataset: str,
        spec_path: str | None = None,
        partitions_conn_id: str | None = None,
        data_root: str | None = None,
        aws_conn_id: str | None = None,
        cache_dir: str | None = None,
        cache_max_bytes: int | None = None,
        ranged_read_min_bytes: int | None = None,
        tag: str | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(dataset, str) or not dataset:
            raise OrchestrationError("PartitionedDatasetHook needs dataset=<name of a dataset in the spec>")
        self.dataset = dataset
        self.spec_path = spec_path
        self.partitions_conn_id = partitions_conn_id
        self.data_root = data_root
        self.aws_conn_id = aws_conn_id
        self.cache_dir = cache_dir
        self.cache_max_bytes = cache_max_bytes
        self.ranged_read_min_bytes = ranged_read_min_bytes
        # A version tag every read of the hook pins unless the call names a version or a tag itself:
        # a DAG pins a release by passing a (templated) tag to the task that builds the hook.
        self.tag = tag or None

    # --- configuration ------------------------------------------------------------------------

    @cached_property
    def connection_extra(self) -> dict[str, Any]:
        """The extra of the hook's connection; empty when none is configured and none is needed."""

        if self.partitions_conn_id is None and self.spec_path is not None:
            return {}
        conn_id = self.partitions_conn_id or self.default_conn_name
        try:
            connection = get_connection(conn_id)
        except OrchestrationError:
            if self.partitions_conn_id is not None:
                raise
            raise OrchestrationError(
                f"PartitionedDatasetHook for dataset {self.dataset!r} got no spec_path and no connection "
                f"{conn_id!r} exists; pass spec_path=... or create a connection of type "
                f"{self.conn_type} whose extra holds spec_path"
            ) from None
        return dict(connection.extra_dejson or {})

    def _setting(self, name: str, given: str | None) -> str | None:
        if given is not None:
            return given
        value = self.connection_extra.get(name)
        return str(value) if value not in (None, "") else None

    @cached_property
    def reader(self) -> PartitionedDatasetReader:
        """The core reader, built on first use (loads the spec, opens the catalog lazily).

        Files under an `s3://` data root and a catalog on S3 are both reached with the AWS connection;
        a query naming other datasets of the spec reads them with readers built the same way (their
        files where their catalogs say, since `data_root` is this dataset's).
        """
        from airflow_partitions.spec import load_spec  # lazy: loads sqlglot

        spec_path = self._setting("spec_path", self.spec_path)
        if spec_path is None:
            raise OrchestrationError(
                f"PartitionedDatasetHook for dataset {self.dataset!r}: connection extra has no spec_path; "
                "pass spec_path=... or add it to the connection's extra"
            )
        install_secret_masker()
        install_read_metrics()
        project = load_spec(spec_path)
        reader = self._build_reader(project, self.dataset, self._setting("data_root", self.data_root))
        reader.open_sibling = lambda name: self._build_reader(project, name, None)
        return reader

    def _build_reader(
        self, project: ProjectSpec, name: str, data_root: str | None
    ) -> PartitionedDatasetReader:
        from airflow_partitions.read import PartitionedDatasetReader  # lazy: loads numpy, pyarrow, sqlglot
        from airflow_partitions.table import open_handle  # lazy: loads sqlglot

        dataset = project.dataset(name)
        # One resolution of the AWS connection serves the catalog and the files: the reader reaches an
        # s3:// data_root (or the catalog store's, `accelerator_dir: s3://`) with the handle's settings,
        # by ranged GETs of the sizes the catalog recorded (`objectstore.ranges`).
        hook = self._storage_hook()
        settings = hook.dataset_settings(project, dataset)
        if data_root is not None and not is_local_location(data_root):
            settings = hook.s3_settings
        handle = open_handle(project, dataset, s3_settings=settings)
        max_bytes = self.cache_max_bytes
        if max_bytes is None and (extra := self._setting("cache_max_bytes", None)) is not None:
            if not extra.isdigit() or int(extra) <= 0:
                raise OrchestrationError(
                    f"PartitionedDatasetHook for dataset {self.dataset!r}: cache_max_bytes in the connection "
                    f"extra is {extra!r}; give a positive whole number of bytes"
                )
            max_bytes = int(extra)
        from airflow_partitions.read.ranged import (  # lazy: loads numpy, pyarrow, sqlglot
            RANGED_READ_MIN_BYTES,
        )

        return PartitionedDatasetReader.from_handle(
            handle,
            data_root=data_root,
            cache_dir=self._setting("cache_dir", self.cache_dir),
            cache_max_bytes=max_bytes,
            ranged_read_min_bytes=(
                RANGED_READ_MIN_BYTES if self.ranged_read_min_bytes is None else self.ranged_read_min_bytes
            ),
        )

    def _storage_hook(self) -> SnapshotStorageHook:
        """The AWS connection of the hook (argument, else the connection extra's `aws_conn_id`)."""

        return SnapshotStorageHook(aws_conn_id=self._setting("aws_conn_id", self.aws_conn_id))

    # --- reads ----------------------------------------------------------------------------------

    def _tag(self, version: int | None, tag: str | None) -> str | None:
        """The tag a read pins: its own, else the hook's unless the read names a version."""
        if tag is not None:
            return tag
        return self.tag if version is None else None

    def plan(
        self, where: FilterInput = None, version: int | None = None, *, tag: str | None = None
    ) -> PrunePlan:
        """Which partitions a read with `where` opens, and why (`.selected`, `.total`, `.explain()`)."""
        return self.reader.plan(where, version, tag=self._tag(version, tag))

    def read(
        self,
        where: FilterInput = None,
        columns: Sequence[str] | None = None,
        version: int | None = None,
        *,
        tag: str | None = None,
    ) -> pa.Table:
        """Rows matching `where` (SQL condition or DNF list) as a pyarrow Table of `columns`, of `version`
        or of the version tag `tag` names (default: the hook's `tag`, else the newest version)."""
        return self.reader.read(where, columns, version, tag=self._tag(version, tag))

    def read_partitions(
        self,
        partitions: Sequence[str],
        columns: Sequence[str] | None = None,
        version: int | None = None,
    ) -> pa.Table:
        """Exactly the partitions named, as a pyarrow Table of `columns`: each key in any spelling (the
        label `region=Zürich/day=2026-01-01`, the comma form `region=Zürich, day=2026-01-01`, Airflow's
        partition key `Zürich|2026-01-01`, the escaped key path). A key that names no partition of the
        version raises `UnknownPartitionError` (nothing is read)."""
        import copy

        from airflow_partitions.refresh.discovery import select_keys  # lazy: loads sqlglot

        reader = self.reader
        snapshot = reader.snapshot(version, tag=self._tag(version, None))
        names = snapshot.partition_spec.names
        # Keys name partitions of the current partition_by (a run's asset events do); partitions of an older
        # layout, left by a re-partitioning in progress, are named by no such key.
        current = snapshot.partition_spec.spec_id
        keys = [entry.key.values for entry in snapshot.partitions.values() if entry.spec_id == current]
        chosen, unknown = select_keys(names, keys, list(partitions))
        if unknown:
            sample = ", ".join(partition_label(names, PartitionKey(key)) for key in keys[:3])
            raise UnknownPartitionError(
                f"{', '.join(repr(text) for text in unknown)} names no partition of {self.dataset} version "
                f"{snapshot.version}; its keys look like {sample or '(it has no partition)'}: check the key "
                "(and whether the refresh that writes it has committed)"
            )
        wanted = {PartitionKey(key).path(names) for key in chosen}
        plan = reader.plan(None, snapshot.version)
        # The unfiltered plan holds every partition; keep the named ones (all of their rows).
        subset = copy.copy(plan)
        subset.selected = tuple(part for part in plan.selected if part.key_path in wanted)
        return reader.read_plan(subset, columns)

    def run_partition_keys(self, context: Mapping[str, Any]) -> list[str]:
        """The partition keys of this dataset the task's run is for: those of the dataset's asset events
        that triggered it (a run scheduled on the asset), else the run's own `partition_key` (a run
        triggered with one, Airflow 3.2+).

        The events come first: they carry the dataset's own keys, while an asset-triggered run's
        `partition_key` is what the DAG's partition mapper made of them (`US|2026-01` from
        `US|2026-01-01T00:00:00` under a `StartOfMonthMapper`), which names no partition of the dataset.
        """
        keys: list[str] = []
        for asset, events in (context.get("triggering_asset_events") or {}).items():
            if getattr(asset, "name", None) not in (self.dataset, None):
                continue
            keys.extend(key for event in events if (key := getattr(event, "partition_key", None)))
        if keys:
            return list(dict.fromkeys(keys))
        own = run_partition_key(context)
        return [own] if own is not None else []

    def read_run_partitions(
        self, context: Mapping[str, Any], columns: Sequence[str] | None = None
    ) -> pa.Table:
        """The rows of exactly this run's partitions (`run_partition_keys`), newest version; raises
        `OrchestrationError` when the run carries no partition key."""
        keys = self.run_partition_keys(context)
        if not keys:
            raise OrchestrationError(
                f"this run of {context.get('dag_run')!r} carries no partition key of {self.dataset}: "
                "schedule the DAG on the dataset's asset with a PartitionedAssetTimetable, trigger it with a "
                "partition key, or call read_partitions(keys) / read(where) instead"
            )
        return self.read_partitions(keys, columns)

    def query(
        self,
        sql: str,
        version: int | None = None,
        *,
        timeout_s: float | None = None,
        memory_limit: str | int | None = None,
        versions: Mapping[str, int | None] | None = None,
        as_of: dt.datetime | None = None,
        split_joins: bool = True,
        tag: str | None = None,
    ) -> pa.Table:
        """One read-only DuckDB SELECT in which the dataset name is a table of its pruned partitions, and
        `ap_partitions('<dataset>')`, `ap_files(...)`, `ap_versions(...)` describe the catalog.

        It may name other datasets of the spec too, each a table at `versions[name]`, as of `as_of`, or
        at its newest (`version` / `tag`, default the hook's `tag`, pin the hook's dataset only); joins of
        datasets partitioned compatibly on the join key run partition-wise unless `split_joins` is False.
        `timeout_s` (default 300) and `memory_limit` (e.g. "8GB"; default 4 GB or half the machine's
        memory) bound it; past either it raises `QueryLimitError`.
        """
        return self.reader.query(
            sql,
            version,
            timeout_s=timeout_s,
            memory_limit=memory_limit,
            versions=versions,
            as_of=as_of,
            split_joins=split_joins,
            tag=self._tag(version, tag),
        )

    def to_spark(
        self,
        spark: Any,
        where: FilterInput = None,
        version: int | None = None,
        columns: Sequence[str] | None = None,
        *,
        tag: str | None = None,
        bucketed: bool = False,
    ) -> Any:
        """A Spark DataFrame over the pruned partitions (for reads beyond one machine); `bucketed`: hash
        partitioned on the bucket column, so joins of two such frames need no exchange (see the reader)."""
        return self.reader.to_spark(
            spark, where, version, columns, tag=self._tag(version, tag), bucketed=bucketed
        )

    def tags(self) -> dict[str, Any]:
        """The dataset's version tags: name -> `TagInfo` (version, commit id, written_at)."""
        return dict(self.reader.catalog.tags())

    # --- writes ---------------------------------------------------------------------------------

    def append(self, data: Any, *, write_through: bool = False, commit_id: str | None = None) -> WriteResult:
        """Add rows (pyarrow Table / RecordBatch / RecordBatchReader / batches, pandas or Spark DataFrame)
        to the partitions they route to, in one atomic commit.

        `write_through` (Postgres sources): insert them into the source table in one transaction first.
        `commit_id` (every write): a write retried with the id of one already published returns that
        version and writes nothing again.
        """
        return self._write("append", data, write_through=write_through, commit_id=commit_id)

    def upsert(
        self,
        data: Any,
        keys: Sequence[str] | None = None,
        *,
        write_through: bool = False,
        commit_id: str | None = None,
    ) -> WriteResult:
        """Insert rows, replacing existing rows with the same `keys` (default the spec's
        `acceleration.primary_key`), in one atomic commit; a row whose partition changed moves."""
        return self._write("upsert", data, keys=keys, write_through=write_through, commit_id=commit_id)

    def delete(self, where: FilterInput, *, commit_id: str | None = None) -> WriteResult:
        """Delete the rows matching `where` (SQL condition or DNF list), in one atomic commit."""
        from airflow_partitions.write.commit import delete  # lazy: loads sqlglot

        handle = self._write_handle()
        try:
            return delete(handle, where, commit_id=commit_id)
        finally:
            self._after_write()

    def _write(
        self,
        operation: str,
        data: Any,
        *,
        keys: Sequence[str] | None = None,
        write_through: bool = False,
        commit_id: str | None = None,
    ) -> WriteResult:
        from airflow_partitions.write import commit  # lazy: loads sqlglot

        handle = self._write_handle()
        try:
            if write_through:
                from airflow_partitions.write.write_through import (  # lazy: loads sqlglot
                    write_through as through,
                )

                install_connection_resolver()
                return through(handle, data, operation=operation, keys=keys, commit_id=commit_id)
            if operation == "upsert":
                return commit.upsert(handle, data, keys=keys, commit_id=commit_id)
            return commit.append(handle, data, commit_id=commit_id)
        finally:
            self._after_write()

    def _write_handle(self) -> DatasetHandle:
        """The dataset's handle for a write, with the S3 settings of a catalog on S3."""
        from airflow_partitions.spec import load_spec  # lazy: loads sqlglot
        from airflow_partitions.table import open_handle  # lazy: loads sqlglot

        spec_path = self._setting("spec_path", self.spec_path)
        if spec_path is None:
            raise OrchestrationError(
                f"PartitionedDatasetHook for dataset {self.dataset!r}: connection extra has no spec_path; "
                "pass spec_path=... or add it to the connection's extra"
            )
        data_root = self._setting("data_root", self.data_root)
        if data_root is not None and not is_local_location(data_root):
            raise OrchestrationError(
                f"PartitionedDatasetHook for dataset {self.dataset!r}: writes go to the accelerator_dir the "
                f"spec names, not to the data_root {data_root}; use a hook without data_root to write"
            )
        install_secret_masker()
        project = load_spec(spec_path)
        dataset = project.dataset(self.dataset)
        settings = self._storage_hook().dataset_settings(project, dataset)
        return open_handle(
            project, dataset, s3_settings=S3Settings.from_mapping(settings) if settings is not None else None
        )

    def _after_write(self) -> None:
        # A reader of this hook pinned the version before the write: reads after it start afresh.
        if "reader" in self.__dict__:
            self.reader.close()
            del self.__dict__["reader"]

    def close(self) -> None:
        """Release the reader's DuckDB database, if one was opened."""
        if "reader" in self.__dict__:
            self.reader.close()


def run_partition_key(context: Mapping[str, Any]) -> str | None:
    """The `partition_key` of the task's run (Airflow 3.2+ partitioned runs), or None."""
    key = context.get("partition_key")
    if key is None:
        dag_run = context.get("dag_run")
        key = getattr(dag_run, "partition_key", None)
    return key if isinstance(key, str) and key else None
