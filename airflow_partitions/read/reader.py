"""`PartitionedDatasetReader`: pruned reads of one dataset, each call pinned to one catalog version.

It resolves the spec and the catalog, caches what versions make immutable (schema, pruning index,
plans per (version, filter)), plans with `pruning.plan_partitions` and hands the selected files to the
scan (`read.scan`), the sandboxed query (`read.query`) or Spark. Where the files live is a
`LocalFiles` directory or `RemoteFiles` on object storage (`read.remote`).
"""

from __future__ import annotations

import collections
import datetime as dt
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from airflow_partitions.catalog.open import dataset_directory
from airflow_partitions.exceptions import AirflowPartitionsError, CatalogError, SparkLayoutError, StorageError
from airflow_partitions.keys import escape_component
from airflow_partitions.objectstore import (
    LocalStore,
    S3Store,
    SettingsLike,
    parse_s3_location,
    remote_filesystem,
)
from airflow_partitions.pruning import (
    MAX_RANGE_ENUMERATION,
    FilterInput,
    PartitionIndex,
    PrunePlan,
    plan_partitions,
)
from airflow_partitions.pruning.deep import deep_stack
from airflow_partitions.pruning.expressions import renamed_columns
from airflow_partitions.pruning.filters import bind_filter
from airflow_partitions.pruning.limits import check_budget
from airflow_partitions.read.catalog_tables import build_catalog_table, catalog_calls, mentions_catalog_tables
from airflow_partitions.read.locations import LocalFiles
from airflow_partitions.read.query import (
    QUERY_HINT,
    READ_HINT,
    parsed_statement,
    run_query,
    sandbox_references,
)
from airflow_partitions.read.ranged import RANGED_READ_MIN_BYTES
from airflow_partitions.read.read_stats import ReadStatsRecorder, stats_directory
from airflow_partitions.read.remote import RemoteFiles
from airflow_partitions.read.sandbox import QueryLimits
from airflow_partitions.read.scan import DuckDBScanner, resolve_columns
from airflow_partitions.spec import load_spec
from airflow_partitions.spec.renames import renames_of
from airflow_partitions.storage import get_storage
from airflow_partitions.table import open_handle
from airflow_partitions.transforms.bucket import BucketTransform

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from airflow_partitions.catalog import Catalog, Snapshot
    from airflow_partitions.pruning.expressions import Predicate
    from airflow_partitions.read.multi import DatasetQuery, DatasetQueryPlan
    from airflow_partitions.spec.model import DatasetSpec, ProjectSpec
    from airflow_partitions.storage import DataFile
    from airflow_partitions.table import DatasetHandle

# Versions whose pruning index (partition values, decoded files) stays cached per reader.
CACHED_VERSIONS = 4
# Plans kept per reader, keyed by (version, filter): versions are immutable, so a plan never goes stale.
CACHED_PLANS = 256


def open_project(project: ProjectSpec | str | Path) -> ProjectSpec:
    """A loaded spec: `project` itself, or the spec file it names."""
    if isinstance(project, str | Path):
        return load_spec(project)
    return project


def dataset_named_in(project: ProjectSpec | str | Path, sql: str) -> str:
    """The first (by name) of the spec's datasets that `sql` reads, as a table or, when it names none,
    through a catalog table function call (`ap_partitions('orders')`); `FilterError` when it names
    none, `UnsafeQueryError` when it is not one valid SELECT. A reader of it queries all of them."""
    from airflow_partitions.read.multi import datasets_named_in  # lazy: sqlglot

    return datasets_named_in(open_project(project), sql)[0]


class PartitionedDatasetReader:
    """Pruned reads of one dataset of a project spec (see the `read` package docstring)."""

    def __init__(
        self,
        project: ProjectSpec | str | Path,
        dataset: str,
        *,
        catalog: Catalog | None = None,
        data_root: str | Path | None = None,
        filesystem: pafs.FileSystem | None = None,
        schema: pa.Schema | None = None,
        cache_dir: str | Path | None = None,
        cache_max_bytes: int | None = None,
        ranged_read_min_bytes: int | None = RANGED_READ_MIN_BYTES,
        max_enumeration: int = MAX_RANGE_ENUMERATION,
        query_limits: QueryLimits | None = None,
        s3_settings: SettingsLike | None = None,
    ) -> None:
        self.project = open_project(project)
        self.dataset: DatasetSpec = self.project.dataset(dataset)
        self.name = self.dataset.name
        self.storage = get_storage(self.dataset.acceleration)
        # Source columns renamed since they were stored: calls speak current names, files stored ones.
        self._renames = renames_of(self.dataset)
        if catalog is None:
            catalog = open_handle(self.project, self.dataset, s3_settings=s3_settings).catalog
        self.catalog = catalog
        # The S3 settings this reader reaches its bytes with (those of its catalog's store when a catalog
        # is given); readers of the spec's other datasets are opened with the same.
        self.s3_settings: SettingsLike | None = (
            s3_settings if s3_settings is not None else self._store_settings()
        )
        self._local_root: Path | None = None
        self._remote: RemoteFiles | None = None
        location: LocalFiles | RemoteFiles
        root = self._resolve_root(data_root)
        if cache_max_bytes is not None and (isinstance(cache_max_bytes, bool) or cache_max_bytes <= 0):
            raise StorageError(
                f"cache_max_bytes is {cache_max_bytes!r}; give a positive number of bytes (or None for the "
                "default: 2 GiB or a tenth of the cache directory's free space)"
            )
        store: S3Store | None = None
        if filesystem is None:
            filesystem = self._store_filesystem(root)  # None: a local directory, read in place
            # Files reached with the reader's own settings are read by ranged GETs (`objectstore.ranges`);
            # a filesystem given by the caller is used as it is.
            store = self._data_store(root) if filesystem is not None else None
        if filesystem is not None:
            location = self._remote = RemoteFiles(
                root,
                filesystem,
                dataset=self.name,
                cache_dir=Path(cache_dir) if cache_dir is not None else None,
                cache_max_bytes=cache_max_bytes,
                ranged_read_min_bytes=ranged_read_min_bytes,
                store=store,
            )
        else:
            self._local_root = Path(root)
            location = LocalFiles(self._local_root)
        self._schema_override = schema
        self.max_enumeration = max_enumeration
        # The time, memory and thread limits of `query` when a call does not give its own.
        self.query_limits = query_limits if query_limits is not None else QueryLimits()
        self._lock = threading.RLock()
        self._indexes: collections.OrderedDict[int, PartitionIndex] = collections.OrderedDict()
        self._plans: collections.OrderedDict[tuple[int, Any], PrunePlan] = collections.OrderedDict()
        # A checked query's filter and executable SQL, by (SQL text, dataset schema).
        self._queries: collections.OrderedDict[tuple[str, pa.Schema], tuple[Predicate, str]] = (
            collections.OrderedDict()
        )
        self._schemas: dict[int, pa.Schema] = {}
        self._scanner = DuckDBScanner(self.storage, location, self._lock)
        # Read statistics: one line per read in `<accelerator_dir>/<dataset>/_read_stats/` (a local
        # directory even when the files are on S3: there it is this worker's scratch).

        self.read_stats = ReadStatsRecorder(
            self.name,
            stats_directory(dataset_directory(self.project, self.dataset)),
            self.dataset.acceleration.params,
        )
        self._file_totals: dict[int, int] = {}
        # The spec's datasets a query's SQL names, by SQL text; readers of the other datasets its queries
        # and catalog tables named.
        self._named: collections.OrderedDict[str, list[str]] = collections.OrderedDict()
        self._siblings: dict[str, PartitionedDatasetReader] = {}
        self._multi: DatasetQuery | None = None
        # How to open a reader of another dataset of the spec (the hook passes its connections' settings).
        self.open_sibling: Callable[[str], PartitionedDatasetReader] | None = None

    @classmethod
    def from_handle(cls, handle: DatasetHandle, **options: Any) -> PartitionedDatasetReader:
        """A reader of the dataset `handle` resolved: its catalog, and its files reached with the same
        S3 settings; `options` as for the constructor (`data_root`, `filesystem`, `cache_dir`, ...)."""
        return cls(
            handle.project, handle.name, catalog=handle.catalog, s3_settings=handle.settings, **options
        )

    def __repr__(self) -> str:
        return f"PartitionedDatasetReader(dataset={self.name!r}, root={self.data_root!r})"

    # --- locations ----------------------------------------------------------------------------

    def _resolve_root(self, data_root: str | Path | None) -> str:
        if data_root is None:
            data_root = self.catalog.data_root
            data_store = getattr(self.catalog, "data_store", None)
            if data_root is None and data_store is not None:
                data_root = data_store.describe()  # files on S3 (`accelerator_dir: s3://...`)
            if data_root is None:
                store = self.catalog.store
                if not isinstance(store, LocalStore):  # a catalog on S3 beside its files
                    data_root = f"{store.describe().rstrip('/')}/{escape_component(self.name)}"
        if data_root is None:
            raise CatalogError(
                f"cannot tell where the files of dataset {self.name!r} live; pass data_root= (a local "
                "directory or an s3://bucket/prefix URL)"
            )
        return str(data_root)

    def _store_filesystem(self, root: str) -> pafs.FileSystem | None:
        """The pyarrow filesystem that reaches `root` (None for a local directory), built from the same
        resolved S3 settings as the boto3 client of the catalog's store, so catalog and files come from
        one endpoint (none on S3: the AWS environment)."""
        return remote_filesystem(root, settings=self.s3_settings)

    def _data_store(self, root: str) -> S3Store:
        """The S3 store over `root` (an `s3://` URL), reached with the same settings as the filesystem."""
        return S3Store.at(
            parse_s3_location(root, what="data_root", error=StorageError, strict=False), self.s3_settings
        )

    def _store_settings(self) -> SettingsLike | None:
        """The settings of the catalog's S3 store (its data store first), None for a local catalog."""
        return next(
            (
                store.settings
                for store in (getattr(self.catalog, "data_store", None), self.catalog.store)
                if isinstance(store, S3Store)
            ),
            None,
        )

    @property
    def data_root(self) -> str:
        """Where the partition files live (local directory or URL)."""
        return self._remote.root if self._remote is not None else str(self._local_root)

    # --- versions, schema, index ------------------------------------------------------------------

    def snapshot(self, version: int | None = None, *, tag: str | None = None) -> Snapshot:
        """The catalog version `version`, or the one tag `tag` names (newest when neither); raises
        `VersionNotFoundError` (`UnknownTagError`, listing the dataset's tags, for an unknown tag)."""
        return self.catalog.snapshot(self._version(version, tag))

    def _version(self, version: int | None, tag: str | None) -> int | None:
        if tag is None:
            return version
        tagged = self.catalog.tagged_version(tag)
        if version is not None and version != tagged:
            raise CatalogError(
                f"version {version} and tag {tag!r} (version {tagged}) name different versions of "
                f"{self.name!r}; give one of them"
            )
        return tagged

    def schema(self, version: int | None = None, *, tag: str | None = None) -> pa.Schema:
        """The dataset's Arrow schema as of `version` (or tag `tag`), under the current column names."""
        return self._renames.to_current(self._schema_of(self.snapshot(version, tag=tag)))

    def _schema_of(self, snapshot: Snapshot) -> pa.Schema:
        if self._schema_override is not None:
            return self._schema_override
        with self._lock:
            cached = self._schemas.get(snapshot.version)
        if cached is not None:
            return cached
        schema = self._file_schema(snapshot)
        if schema is None:
            schema = self.dataset.bound_schema or self.dataset.declared_schema()
        if schema is None:
            schema = self._source_schema(snapshot)
        with self._lock:
            self._schemas[snapshot.version] = schema
            while len(self._schemas) > CACHED_VERSIONS:
                self._schemas.pop(min(self._schemas))
        return schema

    def _source_schema(self, snapshot: Snapshot) -> pa.Schema:
        """A version without files (never refreshed, or emptied by a delete) reads as 0 rows of the schema
        its first write would use: the source's (as `acceleration_schema` takes it for writes)."""
        from airflow_partitions.sources import open_dataset_source  # lazy: connectors, SQL parsing

        try:
            return open_dataset_source(self.dataset).schema()
        except AirflowPartitionsError as err:
            raise CatalogError(
                f"dataset {self.name!r} has no partition file in catalog version {snapshot.version}, its "
                f"spec declares no schema and its source's schema cannot be read ({err}): make the source "
                "reachable, or add a schema: block to the spec"
            ) from err

    def _file_schema(self, snapshot: Snapshot) -> pa.Schema | None:
        """Schema of a file of the most recently refreshed partition (newest columns included)."""
        import pyarrow.compute as pc

        table = snapshot.table
        if table.num_rows == 0:
            return None
        newest = int(pc.index(table.column("refreshed_at"), pc.max(table.column("refreshed_at"))).as_py())
        order = [newest, *range(table.num_rows)]
        for position in order[:64]:
            files = snapshot.partitions[table.column("key_path")[position].as_py()].files
            if files:
                return self._read_file_schema(files[0])
        return None

    def _read_file_schema(self, file: DataFile) -> pa.Schema:
        if self._remote is not None:
            return self.storage.remote_file_schema(self._remote, file)
        assert self._local_root is not None
        return self.storage.file_schema(self._local_root, file)

    def index(self, snapshot: Snapshot) -> PartitionIndex:
        """The pruning index of a version (cached: versions are immutable)."""
        with self._lock:
            cached = self._indexes.get(snapshot.version)
            if cached is not None:
                self._indexes.move_to_end(snapshot.version)
                return cached
        index = PartitionIndex.from_snapshot(snapshot, self._schema_of(snapshot))
        with self._lock:
            self._indexes[snapshot.version] = index
            while len(self._indexes) > CACHED_VERSIONS:
                self._indexes.popitem(last=False)
        return index

    # --- planning ---------------------------------------------------------------------------------

    @deep_stack
    def plan(
        self, where: FilterInput = None, version: int | None = None, *, tag: str | None = None
    ) -> PrunePlan:
        """Which partitions and files of `version` (or of the version tag `tag` names) a read with `where`
        opens, and why (within the reader's `query_limits`: binding the filter and pruning count against
        its time)."""
        with self.query_limits.budget(READ_HINT):
            return self._plan(self.snapshot(version, tag=tag), where)

    def _plan(self, snapshot: Snapshot, where: FilterInput) -> PrunePlan:
        """The one place plans are made, cached per (version, filter)."""
        key = _filter_key(where)
        if key is not None:
            with self._lock:
                cached = self._plans.get((snapshot.version, key))
                if cached is not None:
                    self._plans.move_to_end((snapshot.version, key))
                    return cached
        index = self.index(snapshot)
        if self.read_stats.enabled:
            self._count_files(snapshot)
        filter_text = where if isinstance(where, str) else None
        column_names = None
        if self._renames:
            # Pruned on the stored names; the plan explains itself under the current ones.
            where = self._stored_filter(where, index.schema)
            column_names = self._renames.current
        plan = plan_partitions(
            index,
            where,
            dataset=self.name,
            max_enumeration=self.max_enumeration,
            filter_text=filter_text,
            column_names=column_names,
        )
        if key is not None:
            with self._lock:
                self._plans[(snapshot.version, key)] = plan
                while len(self._plans) > CACHED_PLANS:
                    self._plans.popitem(last=False)
        return plan

    def _stored_filter(self, where: FilterInput, schema: pa.Schema) -> Predicate:
        """`where`, written with the current column names, bound and made to read the stored ones."""
        return renamed_columns(bind_filter(where, self._renames.to_current(schema)), self._renames.stored)

    def _stored_columns(self, schema: pa.Schema, columns: Sequence[str] | None) -> list[str]:
        """The stored names of `columns` (current names; all when None), checked against the schema."""
        wanted = resolve_columns(self._renames.to_current(schema), columns)
        return self._renames.stored_names(wanted)

    # --- read -------------------------------------------------------------------------------------

    @deep_stack
    def read(
        self,
        where: FilterInput = None,
        columns: Sequence[str] | None = None,
        version: int | None = None,
        *,
        tag: str | None = None,
    ) -> pa.Table:
        """Rows matching `where` as an Arrow table of `columns` (all when None), from pruned files only,
        of `version` or of the version tag `tag` names (newest when neither).

        Planning and reading together stay within the reader's `query_limits` (`QueryLimitError`).
        """
        started = time.perf_counter()
        with self.query_limits.budget(READ_HINT):
            plan = self.plan(where, version, tag=tag)
            return self._read_and_record(plan, columns, started)

    def read_plan(self, plan: PrunePlan, columns: Sequence[str] | None = None) -> pa.Table:
        """Execute a plan made by this reader: read its files, apply its residual where inexact."""
        return self._read_and_record(plan, columns, time.perf_counter())

    def _read_and_record(self, plan: PrunePlan, columns: Sequence[str] | None, started: float) -> pa.Table:
        with self.query_limits.budget(READ_HINT):
            table = self._scanner.read(plan, self._stored_columns(plan.index.schema, columns))
            table = self._renames.to_current(table)
        self._record(plan, "read", table.num_rows, started)
        return table

    def _record(self, plan: PrunePlan, kind: str, rows: int | None, started: float) -> None:
        """Add the call to the read statistics (`read.read_stats`), unless they are switched off."""
        if not self.read_stats.enabled:
            return
        self.read_stats.record(
            plan,
            kind=kind,
            rows=rows,
            elapsed_s=time.perf_counter() - started,
            files_total=self._files_total(plan.version),
        )

    def _files_total(self, version: int | None) -> int | None:
        """Files of a catalog version, as `_count_files` noted them when a plan of it was made."""
        with self._lock:
            return self._file_totals.get(version) if version is not None else None

    def _count_files(self, snapshot: Snapshot) -> None:
        """Note the files of a version (read statistics' `files_total`), counted in the manifest text once
        per version: each file's compact JSON holds one `"checksum":` key, and a value never ends in `":`."""
        with self._lock:
            if snapshot.version in self._file_totals:
                return
        import pyarrow.compute as pc

        total = int(pc.sum(pc.count_substring(snapshot.table.column("files"), '"checksum":')).as_py() or 0)
        with self._lock:
            self._file_totals[snapshot.version] = total
            while len(self._file_totals) > CACHED_VERSIONS:
                self._file_totals.pop(min(self._file_totals))

    # --- query ------------------------------------------------------------------------------------

    @deep_stack
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
        """Run one read-only SELECT where the dataset name is a table; only pruned files are opened.

        `version` or `tag` (a version tag) pins this dataset's version (newest when neither); the catalog
        table functions (`ap_partitions`, `ap_files`, `ap_versions`, see `read.catalog_tables`) describe
        it and the spec's other datasets. The statement may name other datasets of the spec too
        (`read.multi`): each is a table, read at `versions[name]` or as of `as_of` (else its newest;
        `version` / `tag` pin this reader's dataset only), joins of two datasets partitioned compatibly on
        the join key running partition-wise unless `split_joins` is False (`read.joins`).

        `timeout_s` and `memory_limit` (e.g. "8GB") override the reader's `query_limits` for this call;
        a query past either raises `QueryLimitError`.
        """
        started = time.perf_counter()
        limits = self.query_limits.merged(timeout_s, memory_limit)
        # The time limit covers parsing, checking and pruning the statement, not only running it.
        with limits.budget(QUERY_HINT):
            if as_of is not None or versions or self._datasets_named(sql) != [self.name]:
                pinned = self._version(version, tag)
                return self._datasets_query().query(
                    sql,
                    versions={**(versions or {}), **({self.name: pinned} if pinned is not None else {})},
                    as_of=as_of,
                    timeout_s=timeout_s,
                    memory_limit=memory_limit,
                    split_joins=split_joins,
                )
            snapshot = self.snapshot(version, tag=tag)
            schema = self._schema_of(snapshot)
            where, executable = self._prepared_query(sql, self._renames.to_current(schema))
            plan = self._plan(snapshot, where)
            check_budget()
            tables = self._catalog_tables(sql, snapshot, schema)
            check_budget()
            table = run_query(
                self._scanner,
                self.name,
                plan.files,
                schema,
                executable,
                limits,
                tables,
                renames=self._renames.pairs,
            )
        self._record(plan, "query", table.num_rows, started)
        return table

    def _catalog_tables(self, sql: str, snapshot: Snapshot, schema: pa.Schema) -> dict[str, pa.Table]:
        """The tables of the statement's catalog table function calls (`read.catalog_tables`): the
        query's own dataset at the version it reads, others at their newest, unless `version :=` pins."""

        if not mentions_catalog_tables(sql):
            return {}

        tables: dict[str, pa.Table] = {}
        for call in catalog_calls(parsed_statement(sql)):
            reader = self._reader_of(call.dataset)
            described = snapshot if reader is self and call.version is None else reader.snapshot(call.version)
            described_schema = schema if described is snapshot else reader._schema_of(described)
            index = reader.index(described)
            tables[call.table_name] = build_catalog_table(
                call, reader.catalog, described, described_schema, index, renames=reader._renames
            )
        return tables

    def _reader_of(self, dataset: str) -> PartitionedDatasetReader:
        """This reader for its own dataset, else a reader of another dataset of the spec (kept)."""
        by_name = {name.lower(): name for name in self.project.names}
        name = by_name.get(dataset.lower(), dataset)
        if name == self.name:
            return self
        self.project.dataset(name)  # DatasetNotFoundError listing the spec's datasets
        return self._sibling(name)

    def _prepared_query(self, sql: str, schema: pa.Schema) -> tuple[Predicate, str]:
        """`sql` checked read-only, the rows of the dataset it can look at, and its executable form.

        Parsing costs more than a small pruned query: a reader repeating a query parses it once.
        """
        key = (sql, schema)
        with self._lock:
            prepared = self._queries.get(key) if isinstance(sql, str) else None
            if prepared is not None:
                self._queries.move_to_end(key)
                return prepared
        from airflow_partitions.pruning.query import (  # lazy: sqlglot; reads need no SQL parser
            check_read_only,
            dataset_filter,
            executable_sql,
        )

        check_read_only(sql)
        check_budget()
        # DuckDB's count of the names meaning the dataset: pruning that finds another reads everything.
        references = sandbox_references(sql, self.name)
        check_budget()
        predicate = dataset_filter(sql, self.name, schema, references)
        check_budget()
        prepared = (predicate, executable_sql(sql, schema))
        with self._lock:
            self._queries[key] = prepared
            while len(self._queries) > CACHED_PLANS:
                self._queries.popitem(last=False)
        return prepared

    @deep_stack
    def plan_query(self, sql: str, version: int | None = None, *, tag: str | None = None) -> PrunePlan:
        """The pruning plan `query(sql)` would use (for this dataset; `plan_datasets_query` for all)."""
        if self._datasets_named(sql) != [self.name]:
            pinned = self._version(version, tag)
            return self.plan_datasets_query(sql, {self.name: pinned}).plans[self.name]
        snapshot = self.snapshot(version, tag=tag)
        schema = self._renames.to_current(self._schema_of(snapshot))
        return self._plan(snapshot, self._prepared_query(sql, schema)[0])

    @deep_stack
    def plan_datasets_query(
        self,
        sql: str,
        versions: Mapping[str, int | None] | None = None,
        *,
        as_of: dt.datetime | None = None,
        split_joins: bool = True,
    ) -> DatasetQueryPlan:
        """The plan of `query(sql)` over every dataset it names: pruning per dataset, join decisions."""
        return self._datasets_query().plan(sql, versions=versions, as_of=as_of, split_joins=split_joins)

    def _datasets_named(self, sql: str) -> list[str]:
        """The spec's datasets `sql` names, this one included (cached per SQL text: parsing costs more
        than a small query)."""
        with self._lock:
            named = self._named.get(sql) if isinstance(sql, str) else None
        if named is None:
            # Lenient: a statement naming no dataset (or not SQL) takes the single-dataset path, whose
            # checks say what is wrong with it.
            from airflow_partitions.pruning.query import tables_named_in  # lazy: sqlglot

            by_name = {name.lower(): name for name in self.project.names}
            tables = tables_named_in(sql) if isinstance(sql, str) else set()
            named = sorted({by_name[t] for t in tables if t in by_name} | {self.name})
            with self._lock:
                self._named[sql] = named
                while len(self._named) > CACHED_PLANS:
                    self._named.popitem(last=False)
        return named

    def _datasets_query(self) -> DatasetQuery:
        """Multi-dataset queries through this reader and the spec's other datasets' readers (kept with
        the reader: its sandbox databases are reused)."""
        from airflow_partitions.read.multi import DatasetQuery  # lazy: sqlglot

        with self._lock:
            if self._multi is None:
                self._multi = DatasetQuery(
                    self.project,
                    self._sibling,
                    readers={self.name: self},
                    query_limits=self.query_limits,
                )
            return self._multi

    def _sibling(self, name: str) -> PartitionedDatasetReader:
        """A reader of another dataset of the spec, kept (and closed) with this one."""
        with self._lock:
            reader = self._siblings.get(name)
            if reader is None:
                factory = self.open_sibling
                reader = (
                    factory(name)
                    if factory is not None
                    else PartitionedDatasetReader(
                        self.project, name, query_limits=self.query_limits, s3_settings=self.s3_settings
                    )
                )
                self._siblings[name] = reader
            return reader

    # --- Spark ------------------------------------------------------------------------------------

    @deep_stack
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
        """A Spark DataFrame over the pruned partitions, the residual applied where not exact.

        `bucketed`: the frame is hash-partitioned by Spark on the column of the dataset's (first)
        `bucket(N, col)` field into N partitions, sorted by it within each, and materialised
        (`localCheckpoint`), so Spark knows its partitioning and order: a join (or aggregation) on that
        column with another such frame of the same N plans no `Exchange` (and a sort-merge join no
        `Sort`). Spark is not told the dataset's own buckets: from Python, without a JVM
        connector, no source can report its partitioning (see `bucketed_frame`); the one shuffle happens
        here, once per frame, instead of in every join. `SparkLayoutError` when the version has no
        bucket field or `columns` leaves its column out.
        """
        plan = self.plan(where, version, tag=tag)
        self._record(plan, "spark", None, time.perf_counter())
        wanted = self._stored_columns(plan.index.schema, columns)
        if bucketed:
            column, buckets = bucket_layout(plan.index, wanted, self.name)
            frame = bucketed_frame(spark, self._spark_frame(spark, plan, wanted), column, buckets)
        else:
            frame = self._spark_frame(spark, plan, wanted)
        for old, new in self._renames.pairs:
            if old in wanted:
                frame = frame.withColumnRenamed(old, new)
        return frame

    def _spark_frame(self, spark: Any, plan: PrunePlan, wanted: list[str]) -> Any:
        """The plan's rows as a Spark DataFrame of the `wanted` columns, the residual applied if inexact."""
        from airflow_partitions.pruning.spark_filter import spark_condition  # lazy: sqlglot

        schema = plan.index.schema
        if not plan.files:
            return spark.createDataFrame(pa.schema([schema.field(n) for n in wanted]).empty_table())
        root = self._local_root
        if root is None or not self.storage.spark_reads_files:
            # Spark reads neither this engine's files nor object storage here: hand it the pruned rows.
            rows = self.read_plan(plan, self._renames.current_names(wanted))
            return spark.createDataFrame(self._renames.to_stored(rows))
        parts = []
        if plan.exact_files:
            parts.append(self.storage.spark_frame(spark, root, plan.exact_files))
        if plan.inexact_files:
            inexact = self.storage.spark_frame(spark, root, plan.inexact_files)
            residual = plan.residual
            parts.append(inexact.where(spark_condition(residual)) if residual is not None else inexact)
        result = parts[0]
        for part in parts[1:]:
            result = result.unionByName(part, allowMissingColumns=True)
        return result.select(*[_spark_column(name) for name in wanted])

    # --- lifecycle --------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the reader's DuckDB database and read statistics log (a later call opens them again)
        and the readers of other datasets its queries opened."""
        with self._lock:
            siblings, self._siblings = list(self._siblings.values()), {}
            multi, self._multi = self._multi, None
        if multi is not None:
            multi.close()
        for reader in siblings:
            reader.close()
        self.read_stats.close()
        self._scanner.close()

    def __enter__(self) -> PartitionedDatasetReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _filter_key(where: FilterInput) -> Any:
    """A hashable identity of a filter for the plan cache, or None when it has none."""
    key: Any
    if where is None:
        key = ("none",)
    elif isinstance(where, str):
        key = ("sql", where)
    elif isinstance(where, list | tuple):
        key = ("dnf", repr(where))
    else:
        key = ("predicate", where)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def bucket_layout(index: PartitionIndex, columns: Sequence[str], dataset: str) -> tuple[str, int]:
    """The column and bucket count of the first `bucket(N, col)` field of a version's partition spec."""

    for field in index.fields:
        transform = field.transform
        if isinstance(transform, BucketTransform):
            if transform.source_column not in columns:
                raise SparkLayoutError(
                    f"to_spark(bucketed=True) of {dataset!r} partitions the frame by its bucket column "
                    f"{transform.source_column!r}; include it in columns="
                )
            return transform.source_column, transform.num_buckets
    fields = ", ".join(f"{f.name}: {f.canonical}" for f in index.fields) or "none"
    raise SparkLayoutError(
        f"to_spark(bucketed=True): {dataset!r} has no bucket(N, column) partition field in this version "
        f"(fields: {fields}), so there is no layout to hand Spark; call to_spark() and let Spark shuffle "
        "for the join, or partition the dataset by bucket(N, <join key>)"
    )


def bucketed_frame(spark: Any, frame: Any, column: str, buckets: int) -> Any:
    """`frame` hash-partitioned by Spark on `column` into `buckets` partitions, materialised so that
    Spark plans later joins and aggregations on `column` against that partitioning.

    Spark 4 reads a layout it did not write only through a DataSource V2 reporting
    `KeyGroupedPartitioning` (storage-partitioned joins), a JVM interface the Python Data Source API does
    not expose (its readers have `partitions()` and `read()`, nothing that reports partitioning); and a
    Spark bucketed table would tell Spark our files follow Spark's own hash (Murmur3 with seed 42),
    which they do not (bucket() is Iceberg's hash): Spark would prune and co-partition them wrongly. So
    the rows are shuffled once by Spark's hash here, and sorted by `column` within each partition, which
    the checkpoint also keeps: a sort-merge join of two such frames then neither shuffles nor sorts.
    `localCheckpoint` keeps the partitioning in the plan only when the plan it checkpoints is not
    adaptive, so AQE is off while it runs (a session setting, restored after).
    """
    conf = spark.conf
    previous = conf.get("spark.sql.adaptive.enabled", None)
    conf.set("spark.sql.adaptive.enabled", "false")
    try:
        key = _spark_column(column)
        return frame.repartition(buckets, key).sortWithinPartitions(key).localCheckpoint(eager=True)
    finally:
        if previous is None:
            conf.unset("spark.sql.adaptive.enabled")
        else:
            conf.set("spark.sql.adaptive.enabled", previous)


def _spark_column(name: str) -> Any:
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def datasets_query(
    project: ProjectSpec | str | Path,
    *,
    s3_settings: SettingsLike | None = None,
    query_limits: QueryLimits | None = None,
    split_min_bytes: int | None = None,
    groups_per_statement: int | None = None,
    merge_joins: bool = True,
    merge_min_rows: int | None = None,
) -> DatasetQuery:
    """Multi-dataset queries over the spec's datasets, each read through its handle with `s3_settings`
    (None: the AWS environment); closing it closes the readers it opened. The last four arguments are
    `DatasetQuery`'s (how split joins run)."""
    from airflow_partitions.read.multi import DatasetQuery  # lazy: sqlglot

    spec = open_project(project)

    def open_reader(name: str) -> PartitionedDatasetReader:
        handle = open_handle(spec, name, s3_settings=s3_settings)
        return PartitionedDatasetReader.from_handle(handle, query_limits=query_limits)

    return DatasetQuery(
        spec,
        open_reader,
        close_opened=True,
        query_limits=query_limits,
        split_min_bytes=split_min_bytes,
        groups_per_statement=groups_per_statement,
        merge_joins=merge_joins,
        merge_min_rows=merge_min_rows,
    )


def query_datasets(
    project: ProjectSpec | str | Path,
    sql: str,
    *,
    versions: Mapping[str, int | None] | None = None,
    as_of: dt.datetime | None = None,
    timeout_s: float | None = None,
    memory_limit: str | int | None = None,
    split_joins: bool = True,
    query_limits: QueryLimits | None = None,
) -> pa.Table:
    """`datasets_query(project).query(sql, ...)`, closing the readers it opened."""
    with datasets_query(project, query_limits=query_limits) as query:
        return query.query(
            sql,
            versions=versions,
            as_of=as_of,
            timeout_s=timeout_s,
            memory_limit=memory_limit,
            split_joins=split_joins,
        )
