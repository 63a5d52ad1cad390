"""Pruned reads of an acceleration: plan, read to Arrow, DuckDB SQL over the pruned partitions, Spark.

`PartitionedDatasetReader` is the Airflow-free core behind `PartitionedDatasetHook`. Every call pins one
catalog version (the newest unless `version=` is given), so it never mixes partitions of two commits.
It prunes with `pruning.plan_partitions`, then opens only the selected files:

* `read` scans them with DuckDB (which pushes the projection and the residual filter into the scan),
  applying the residual only to files that are not exact, and returns exactly the asked columns with the
  dataset's Arrow types;
* `query` runs one read-only SELECT in a fresh, locked-down DuckDB database where the dataset name is a
  view over the files its WHERE clauses can need (external file access disabled except those files);
* `to_spark` returns a Spark DataFrame over the same files, with the residual as a Spark condition.

Files under an `s3://` data root are read through a pyarrow `FileSystem` (DuckDB cannot open remote
files here): selected Parquet files are fetched whole, one request each, concurrently, for the call;
Arrow IPC and DuckDB files are copied to a local cache keyed by checksum (they are immutable).

Versions are immutable, so the pruning index of a version and the plan of a (version, filter) are cached
per reader: repeated reads pay only for resolving the newest version and scanning.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from airflow_partitions.exceptions import CatalogError, FilterError, StorageError
from airflow_partitions.keys import escape_component
from airflow_partitions.pruning import (
    MAX_RANGE_ENUMERATION,
    FilterBinder,
    FilterInput,
    PartitionIndex,
    PrunePlan,
    build_index,
    check_read_only,
    dataset_filter,
    executable_sql,
    plan_partitions,
)
from airflow_partitions.pruning.deep import deep_stack
from airflow_partitions.pruning.expressions import Predicate, quote_identifier, walk
from airflow_partitions.s3 import S3Settings
from airflow_partitions.storage import get_storage
from airflow_partitions.storage.base import conform

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from airflow_partitions.catalog import Catalog, Snapshot
    from airflow_partitions.spec.model import DatasetSpec, ProjectSpec
    from airflow_partitions.storage import DataFile

# Versions whose pruning index (partition values, decoded files) stays cached per reader.
CACHED_VERSIONS = 4
# Plans kept per reader, keyed by (version, filter): versions are immutable, so a plan never goes stale.
CACHED_PLANS = 256
# Residual filters with more nodes than this are applied above the scan instead of inside it.
MAX_PUSHED_FILTER_NODES = 256
# Immutable per-partition DuckDB files stay attached between reads, up to this many open at once.
MAX_ATTACHED_FILES = 256


def open_project(project: ProjectSpec | str | Path) -> ProjectSpec:
    """A loaded spec: `project` itself, or the spec file it names."""
    if isinstance(project, str | Path):
        from airflow_partitions.spec import load_spec

        return load_spec(project)
    return project


def dataset_named_in(project: ProjectSpec | str | Path, sql: str) -> str:
    """The one dataset of the spec that `sql` reads; `FilterError` when it names none or several."""
    from airflow_partitions.pruning.query import tables_named_in

    spec = open_project(project)
    by_name = {name.lower(): name for name in spec.names}
    named = sorted({by_name[t] for t in tables_named_in(sql) if t in by_name})
    if len(named) == 1:
        return named[0]
    if not named:
        raise FilterError(
            f"the query reads none of the spec's datasets ({', '.join(spec.names) or 'none'}); "
            "name one in FROM, e.g. SELECT count(*) FROM <dataset>"
        )
    raise FilterError(
        f"the query reads several datasets ({', '.join(named)}); a query reads one dataset at a time"
    )


class PartitionedDatasetReader:
    """Pruned reads of one dataset of a project spec (see the module docstring)."""

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
        max_enumeration: int = MAX_RANGE_ENUMERATION,
    ) -> None:
        self.project = open_project(project)
        self.dataset: DatasetSpec = self.project.dataset(dataset)
        self.name = self.dataset.name
        self.storage = get_storage(self.dataset.acceleration)
        if catalog is None:
            from airflow_partitions.catalog import open_catalog

            catalog = open_catalog(self.project, self.dataset)
        self.catalog = catalog
        self._remote_root: str | None = None
        self._local_root: Path | None = None
        self._filesystem = filesystem
        self._resolve_root(data_root)
        self._schema_override = schema
        self._cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.max_enumeration = max_enumeration
        self._lock = threading.RLock()
        self._indexes: collections.OrderedDict[int, PartitionIndex] = collections.OrderedDict()
        self._plans: collections.OrderedDict[tuple[int, Any], PrunePlan] = collections.OrderedDict()
        self._local = threading.local()
        self._schemas: dict[int, pa.Schema] = {}
        self._connection: Any = None
        self._functions_ready = False
        self._duckdb_lock = threading.Lock()

    def __repr__(self) -> str:
        root = self._remote_root or str(self._local_root)
        return f"PartitionedDatasetReader(dataset={self.name!r}, root={root!r})"

    # --- locations ----------------------------------------------------------------------------

    def _resolve_root(self, data_root: str | Path | None) -> None:
        if data_root is None:
            data_root = self.catalog.data_root
            if data_root is None:
                store = self.catalog.store
                describe = store.describe()
                if describe.startswith("s3://"):
                    data_root = f"{describe.rstrip('/')}/{escape_component(self.name)}"
        if data_root is None:
            raise CatalogError(
                f"cannot tell where the files of dataset {self.name!r} live; pass data_root= (a local "
                "directory or an s3://bucket/prefix URL)"
            )
        text = str(data_root)
        if text.startswith("s3://"):
            self._remote_root = text.rstrip("/")
            if self._filesystem is None:
                # Endpoint and region from the usual AWS environment variables, credentials from the
                # AWS default chain: the same S3 settings every other part of the package uses.
                self._filesystem = S3Settings.from_source_params({}).arrow_filesystem()
        elif self._filesystem is not None:
            self._remote_root = text.rstrip("/")
        else:
            self._local_root = Path(text)

    @property
    def data_root(self) -> str:
        """Where the partition files live (local directory or URL)."""
        return self._remote_root if self._remote_root is not None else str(self._local_root)

    def _remote_path(self, file: DataFile) -> str:
        from airflow_partitions.storage.base import data_file_path

        assert self._remote_root is not None
        relative = data_file_path(Path("."), file).as_posix()  # refuses absolute and `..` paths
        root = self._remote_root.removeprefix("s3://")
        return f"{root}/{relative}"

    # --- versions, schema, index ------------------------------------------------------------------

    def snapshot(self, version: int | None = None) -> Snapshot:
        """The catalog version `version` (newest when None); raises `VersionNotFoundError`."""
        return self.catalog.snapshot(version)

    def schema(self, version: int | None = None) -> pa.Schema:
        """The dataset's Arrow schema as of `version`."""
        return self._schema_of(self.snapshot(version))

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
            raise CatalogError(
                f"dataset {self.name!r} has no partition file in catalog version {snapshot.version} and "
                "its spec declares no schema: refresh it first, or add a schema: block to the spec"
            )
        with self._lock:
            self._schemas[snapshot.version] = schema
            while len(self._schemas) > CACHED_VERSIONS:
                self._schemas.pop(min(self._schemas))
        return schema

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
        if self._local_root is not None:
            return self.storage.file_schema(self._local_root, file)
        if file.format == "parquet":
            import pyarrow.parquet as pq

            from airflow_partitions.storage.parquet import ParquetStorage

            with self._open_remote(file) as handle:
                return ParquetStorage._original_schema(pq.read_schema(handle))
        local_root = self._cache_files([file])
        return self.storage.file_schema(local_root, file)

    def index(self, snapshot: Snapshot) -> PartitionIndex:
        """The pruning index of a version (cached: versions are immutable)."""
        with self._lock:
            cached = self._indexes.get(snapshot.version)
            if cached is not None:
                self._indexes.move_to_end(snapshot.version)
                return cached
        index = build_index(snapshot, self._schema_of(snapshot))
        with self._lock:
            self._indexes[snapshot.version] = index
            while len(self._indexes) > CACHED_VERSIONS:
                self._indexes.popitem(last=False)
        return index

    # --- planning ---------------------------------------------------------------------------------

    @deep_stack
    def plan(self, where: FilterInput = None, version: int | None = None) -> PrunePlan:
        """Which partitions and files of `version` a read with `where` opens, and why."""
        return self._plan(self.snapshot(version), where)

    def _plan(self, snapshot: Snapshot, where: FilterInput) -> PrunePlan:
        key = _filter_key(where)
        if key is not None:
            with self._lock:
                cached = self._plans.get((snapshot.version, key))
                if cached is not None:
                    self._plans.move_to_end((snapshot.version, key))
                    return cached
        index = self.index(snapshot)
        plan = plan_partitions(index, where, dataset=self.name, max_enumeration=self.max_enumeration)
        if key is not None:
            with self._lock:
                self._plans[(snapshot.version, key)] = plan
                while len(self._plans) > CACHED_PLANS:
                    self._plans.popitem(last=False)
        return plan

    # --- read -------------------------------------------------------------------------------------

    @deep_stack
    def read(
        self,
        where: FilterInput = None,
        columns: Sequence[str] | None = None,
        version: int | None = None,
    ) -> pa.Table:
        """Rows matching `where` as an Arrow table of `columns` (all when None), from pruned files only."""
        plan = self.plan(where, version)
        return self.read_plan(plan, columns)

    def read_plan(self, plan: PrunePlan, columns: Sequence[str] | None = None) -> pa.Table:
        """Execute a plan made by this reader: read its files, apply its residual where inexact."""
        schema = plan.index.schema
        wanted = self._resolve_columns(schema, columns)
        target = pa.schema([schema.field(name) for name in wanted])
        exact, inexact = plan.exact_files, plan.inexact_files
        if not exact and not inexact:
            return target.empty_table()
        residual = plan.residual
        residual_sql = residual.sql() if residual is not None else "TRUE"
        # Every column: `*` (DuckDB binds it faster than a list); files may order columns differently,
        # so the parts then combine by name, and `conform` puts the schema's order back.
        everything = wanted == list(schema.names)
        projection = "*" if everything else ", ".join(quote_identifier(name) for name in wanted)
        if needs_partition_functions(residual_sql):
            self._ensure_functions()
        with self._cursor() as cursor:
            parts = []
            if exact:
                parts.append(f"SELECT {projection} FROM {self._relation(cursor, exact, schema)}")
            if inexact:
                source = self._relation(cursor, inexact, schema)
                if residual is not None and _node_count(residual) > MAX_PUSHED_FILTER_NODES:
                    # DuckDB pushes a WHERE into its Parquet scan at a cost that grows faster than the
                    # filter (4,000 ANDed comparisons: 8.4 s pushed, 0.4 s fenced): filter above the scan.
                    source = f"(SELECT * FROM {source} OFFSET 0)"
                parts.append(f"SELECT {projection} FROM {source} WHERE {residual_sql}")
            sql = (" UNION ALL BY NAME " if everything else " UNION ALL ").join(parts)
            table = self._execute(cursor, sql)
        return conform(table, target)

    def _resolve_columns(self, schema: pa.Schema, columns: Sequence[str] | None) -> list[str]:
        if columns is None:
            return list(schema.names)
        if isinstance(columns, str):
            raise FilterError(f"columns must be a list of names, not the string {columns!r}")
        if not columns:
            raise FilterError("columns is empty; pass None for every column, or at least one column name")
        binder = FilterBinder(schema)
        resolved = [binder.resolve(name).name for name in columns]
        if len(set(resolved)) != len(resolved):
            raise FilterError(f"columns {list(columns)} name the same column twice")
        return resolved

    def _relation(self, cursor: Any, files: Sequence[DataFile], schema: pa.Schema) -> str:
        """A relation over exactly `files` with every schema column, that DuckDB scans without error.

        Parquet statistics leave NaN out of a float column's min / max, and DuckDB prunes row groups
        with them, so a filter such as `f != 1.5` (TRUE for NaN in DuckDB) would lose NaN rows. Files
        whose float columns may hold NaN are therefore scanned behind `OFFSET 0`, which keeps filters
        above the scan; all other files keep full filter pushdown.
        """
        floats = [field.name for field in schema if pa.types.is_floating(field.type)]
        fenced: list[DataFile] = []
        plain: list[DataFile] = []
        for file in files:
            (fenced if floats and _nan_in_parquet_statistics(file, floats) else plain).append(file)
        parts = []
        if plain:
            parts.append(self._scan(cursor, plain, schema))
        if fenced:
            parts.append(f"(SELECT * FROM {self._scan(cursor, fenced, schema)} OFFSET 0)")
        if len(parts) == 1:
            return parts[0]
        return "(" + " UNION ALL BY NAME ".join(f"SELECT * FROM {part}" for part in parts) + ")"

    def _scan(self, cursor: Any, files: Sequence[DataFile], schema: pa.Schema) -> str:
        """A relation scanning `files`, completed with NULL columns for schema columns none of them has."""
        # Writers record statistics for every column they write: all present means nothing is missing.
        complete = all(all(name in f.stats for name in schema.names) for f in files)
        if self.storage.format == "parquet":
            relation = self._parquet_scan(self._parquet_paths(files), union_by_name=not complete)
        else:
            relation = quote_identifier(self._register(cursor, files, schema))
        if complete:
            return relation
        present = {row[0] for row in cursor.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()}
        if all(name in present for name in schema.names):
            return relation
        filler = f"ap_schema_{uuid.uuid4().hex[:12]}"
        self._register_object(cursor, filler, schema.empty_table())
        return f"(SELECT * FROM {relation} UNION ALL BY NAME SELECT * FROM {filler})"

    def _parquet_paths(self, files: Sequence[DataFile]) -> list[str]:
        """Local paths DuckDB reads `files` from: in place, or fetched from object storage for this call.

        On object storage every request costs a round trip: each selected (immutable, already pruned)
        file is fetched whole with one GET, concurrently, into a per-call temporary directory, where
        DuckDB's own Parquet reader (late materialisation, filter pushdown) takes over.
        """
        scope = self._scope()
        if self._local_root is not None:
            root = str(self._local_root)
            paths = [os.path.join(root, _checked_relative(f.path)) for f in files]
        else:
            paths = self._fetch_remote(files, scope)
        scope.parquet_paths.extend(paths)
        return paths

    def _fetch_remote(self, files: Sequence[DataFile], scope: _CallScope) -> list[str]:
        assert self._filesystem is not None
        filesystem = self._filesystem
        directory = tempfile.mkdtemp(prefix=f"ap-{self.name}-", dir=_scratch_directory())
        scope.temporary.append(directory)

        def fetch(numbered: tuple[int, DataFile]) -> str:
            number, file = numbered
            remote = self._remote_path(file)
            local = os.path.join(directory, f"{number:06d}.parquet")
            try:
                # The catalog knows the size: asking for exactly that many bytes is a single GET.
                with filesystem.open_input_stream(remote) as stream:
                    data = stream.read(file.bytes)
            except (OSError, pa.ArrowException) as err:
                raise StorageError(f"cannot read {remote}: {err}") from err
            if len(data) != file.bytes:
                raise StorageError(
                    f"{remote} holds {len(data)} bytes, the catalog recorded {file.bytes}: it is not the "
                    "file this version references; read another version or refresh the partition"
                )
            with open(local, "wb") as handle:
                handle.write(data)
            return local

        if len(files) == 1:
            return [fetch((0, files[0]))]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(16, len(files))) as pool:
            return list(pool.map(fetch, enumerate(files)))

    @staticmethod
    def _parquet_scan(paths: Sequence[str], *, union_by_name: bool) -> str:
        """`read_parquet(...)` over local files, inline (a view would make DuckDB bind the files twice)."""
        listed = ", ".join(_sql_string(path) for path in paths)
        # Partition files sit in `name=value` directories: DuckDB's Hive auto-detection would overwrite
        # columns with the (escaped, untyped) directory values, so it is switched off explicitly.
        options = "hive_partitioning = false" + (", union_by_name = true" if union_by_name else "")
        return f"read_parquet([{listed}], {options})"

    @staticmethod
    def _execute(cursor: Any, sql: str) -> pa.Table:
        import duckdb

        try:
            return cursor.sql(sql).to_arrow_table()
        except duckdb.Error as err:
            raise StorageError(f"reading the selected partitions failed: {str(err).strip()}") from err

    # --- DuckDB plumbing --------------------------------------------------------------------------

    def _base_connection(self) -> Any:
        """One in-memory DuckDB database per reader (creating one costs tens of ms); calls use cursors."""
        with self._lock:
            if self._connection is None:
                self._connection = new_duckdb_connection(functions=False)
                self._functions_ready = False
            return self._connection

    def _ensure_functions(self) -> None:
        connection = self._base_connection()
        with self._lock:
            if not self._functions_ready:
                from airflow_partitions.transforms.duckdb_functions import register_duckdb_functions

                register_duckdb_functions(connection)
                self._functions_ready = True

    @contextlib.contextmanager
    def _cursor(self) -> Iterator[Any]:
        if self.storage.format == "duckdb":
            # DuckDB files are attached database-wide: a fresh cursor per call, attach / detach serialised.
            with self._duckdb_lock:
                cursor = self._base_connection().cursor()
                try:
                    with self._call_scope(cursor):
                        yield cursor
                finally:
                    self._release_attachments(cursor)
                    cursor.close()
            return
        # Parquet and Arrow reads leave nothing attached: each thread keeps one cursor (opening one per
        # call costs more than a small read), and drops what the call registered.
        base = self._base_connection()
        cursor = getattr(self._local, "cursor", None)
        if cursor is None or getattr(self._local, "base", None) is not base:
            cursor = base.cursor()
            self._local.cursor, self._local.base = cursor, base
        with self._call_scope(cursor):
            yield cursor

    def _release_attachments(self, cursor: Any) -> None:
        """Detach the shared DuckDB file of `tables` mode, and everything once too much is attached.

        Per-partition DuckDB files are immutable and never written again, so they stay attached for the
        next read (attaching costs more than a small scan). The shared file is detached at once: a
        lingering read lock on it would block the next publish.
        """
        from airflow_partitions.storage.duckdb_engine import SHARED_FILE

        rows = cursor.execute(
            "SELECT database_name, path FROM duckdb_databases() WHERE NOT internal"
        ).fetchall()
        attached = [(name, path or "") for name, path in rows if name != "memory"]
        release_all = len(attached) > MAX_ATTACHED_FILES
        for name, path in attached:
            if release_all or os.path.basename(path) == SHARED_FILE:
                with contextlib.suppress(Exception):
                    cursor.execute(f"DETACH {quote_identifier(name)}")

    @contextlib.contextmanager
    def _call_scope(self, connection: Any) -> Iterator[_CallScope]:
        """Track what one read or query registers and fetches; undo all of it when the call ends."""
        scope = _CallScope()
        self._local.scope = scope
        try:
            yield scope
        finally:
            self._local.scope = None
            for name in scope.registered:
                with contextlib.suppress(Exception):
                    connection.unregister(name)
                with contextlib.suppress(Exception):
                    connection.execute(f"DROP VIEW IF EXISTS {quote_identifier(name)}")
            for directory in scope.temporary:
                shutil.rmtree(directory, ignore_errors=True)

    def _scope(self) -> _CallScope:
        scope = getattr(self._local, "scope", None)
        if scope is None:
            raise StorageError("internal: partition files were registered outside of a read or query")
        return scope

    def _register_object(self, cursor: Any, name: str, value: Any) -> None:
        """`cursor.register`, undone when the call that registered it ends."""
        cursor.register(name, value)
        self._scope().registered.append(name)

    def _register(self, cursor: Any, files: Sequence[DataFile], schema: pa.Schema) -> str:
        """A temporary view over exactly `files`; returns its name."""
        view = f"ap_files_{uuid.uuid4().hex[:12]}"
        root = self._local_root if self._local_root is not None else self._cache_files(files)
        self.storage.register_duckdb(cursor, root, files, view, schema=schema)
        self._scope().registered.append(view)
        return view

    @contextlib.contextmanager
    def _open_remote(self, file: DataFile) -> Iterator[Any]:
        assert self._filesystem is not None
        with self._filesystem.open_input_file(self._remote_path(file)) as handle:
            yield handle

    def _cache_files(self, files: Sequence[DataFile]) -> Path:
        """Copy remote files (immutable, keyed by path and checksum) to the local cache; its root."""
        import pyarrow.fs as pafs

        assert self._filesystem is not None
        if self._cache_dir is None:
            self._cache_dir = Path(tempfile.mkdtemp(prefix=f"ap-{self.name}-"))
        root = self._cache_dir
        wanted: list[tuple[str, Path]] = []
        for file in files:
            local = root / file.path
            marker = local.with_name(local.name + f".{file.checksum[:16]}.ok")
            if not marker.exists():
                wanted.append((self._remote_path(file), local))
        shared = getattr(self.storage, "partition_mode", None) == "tables" and any(f.table for f in files)
        if shared:
            from airflow_partitions.storage.duckdb_engine import SHARED_FILE

            wanted.append((f"{self._remote_root.removeprefix('s3://')}/{SHARED_FILE}", root / SHARED_FILE))  # type: ignore[union-attr]
        for remote, local in wanted:
            local.parent.mkdir(parents=True, exist_ok=True)
            temporary = local.with_name(f".tmp-{uuid.uuid4().hex}-{local.name}")
            try:
                pafs.copy_files(remote, str(temporary), source_filesystem=self._filesystem)
            except (OSError, pa.ArrowException) as err:
                raise StorageError(f"cannot download {remote}: {err}") from err
            temporary.replace(local)
        for file in files:
            local = root / file.path
            local.with_name(local.name + f".{file.checksum[:16]}.ok").touch()
        return root

    # --- query ------------------------------------------------------------------------------------

    @deep_stack
    def query(self, sql: str, version: int | None = None) -> pa.Table:
        """Run one read-only SELECT where the dataset name is a table; only pruned files are opened."""
        check_read_only(sql)
        snapshot = self.snapshot(version)
        schema = self._schema_of(snapshot)
        plan = self._plan(snapshot, dataset_filter(sql, self.name, schema))
        statement = executable_sql(sql, schema)

        connection = new_duckdb_connection(functions=needs_partition_functions(statement))
        try:
            with self._call_scope(connection) as scope:
                return self._run_query(connection, scope, plan.files, schema, statement)
        finally:
            connection.close()

    def _run_query(
        self, connection: Any, scope: _CallScope, files: Sequence[DataFile], schema: pa.Schema, statement: str
    ) -> pa.Table:
        import duckdb

        if files:
            relation = self._relation(connection, files, schema)
            connection.execute(f"CREATE TEMP VIEW {quote_identifier(self.name)} AS SELECT * FROM {relation}")
        else:
            connection.register(self.name, schema.empty_table())
        # Only the selected Parquet files stay readable (other engines are attached or in memory).
        allowed = ", ".join(_sql_string(path) for path in scope.parquet_paths)
        connection.execute(f"SET allowed_paths = [{allowed}]")
        connection.execute("SET enable_external_access = false")
        connection.execute("SET lock_configuration = true")
        try:
            return connection.sql(statement).to_arrow_table()
        except duckdb.Error as err:
            raise FilterError(f"query failed: {str(err).strip()}") from err

    @deep_stack
    def plan_query(self, sql: str, version: int | None = None) -> PrunePlan:
        """The pruning plan `query(sql)` would use."""
        check_read_only(sql)
        snapshot = self.snapshot(version)
        return self._plan(snapshot, dataset_filter(sql, self.name, self._schema_of(snapshot)))

    # --- Spark ------------------------------------------------------------------------------------

    @deep_stack
    def to_spark(
        self,
        spark: Any,
        where: FilterInput = None,
        version: int | None = None,
        columns: Sequence[str] | None = None,
    ) -> Any:
        """A Spark DataFrame over the pruned partitions, the residual applied where not exact."""
        from airflow_partitions.pruning.spark_filter import spark_condition

        plan = self.plan(where, version)
        schema = plan.index.schema
        wanted = self._resolve_columns(schema, columns)
        if not plan.files:
            return spark.createDataFrame(pa.schema([schema.field(n) for n in wanted]).empty_table())
        if self._local_root is None or self.storage.format != "parquet":
            # Spark reads neither DuckDB nor Arrow IPC files, nor s3 here: hand it the pruned Arrow rows.
            return spark.createDataFrame(self.read_plan(plan, wanted))
        from airflow_partitions.storage.base import data_file_path

        def frame(files: Sequence[DataFile]) -> Any:
            paths = [str(data_file_path(self._local_root, f)) for f in files]  # type: ignore[arg-type]
            return spark.read.option("mergeSchema", "true").parquet(*paths)

        parts = []
        if plan.exact_files:
            parts.append(frame(plan.exact_files))
        if plan.inexact_files:
            inexact = frame(plan.inexact_files)
            residual = plan.residual
            parts.append(inexact.where(spark_condition(residual)) if residual is not None else inexact)
        result = parts[0]
        for part in parts[1:]:
            result = result.unionByName(part, allowMissingColumns=True)
        return result.select(*[_spark_column(name) for name in wanted])

    # --- lifecycle --------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the reader's DuckDB database (a later call opens a new one)."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def __enter__(self) -> PartitionedDatasetReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def new_duckdb_connection(*, functions: bool = True) -> Any:
    """An in-memory DuckDB database in UTC, with the partition transforms' UDFs when `functions`.

    Registering the UDFs costs far more than opening the database, so callers ask only when the SQL
    they will run calls them (`needs_partition_functions`).
    """
    import duckdb

    connection = duckdb.connect()
    connection.execute("SET GLOBAL TimeZone = 'UTC'")
    # Partition files are immutable (unique names, never rewritten): their footers can be cached.
    connection.execute("SET GLOBAL parquet_metadata_cache = true")
    if functions:
        from airflow_partitions.transforms.duckdb_functions import register_duckdb_functions

        register_duckdb_functions(connection)
    return connection


def needs_partition_functions(sql: str) -> bool:
    """Whether DuckDB SQL (after `executable_sql` / `duckdb_expression`) calls the transforms' UDFs."""
    lowered = sql.lower()
    return "ap_bucket_" in lowered or "ap_truncate_" in lowered


@dataclass
class _CallScope:
    """What one read or query registered in DuckDB and fetched to local disk, undone when it ends."""

    registered: list[str] = field(default_factory=list)
    parquet_paths: list[str] = field(default_factory=list)  # local files DuckDB may open
    temporary: list[str] = field(default_factory=list)  # per-call directories of fetched files


def _scratch_directory() -> str | None:
    """Memory-backed /dev/shm for fetched files when the machine has it, else the default temp dir."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


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


def _checked_relative(path: str) -> str:
    """A data file path that stays inside the dataset root (refuses absolute paths and `..`)."""
    if path.startswith("/") or "\\" in path or any(part in ("", ".", "..") for part in path.split("/")):
        raise StorageError(f"data file path {path!r} must be relative and stay inside the dataset directory")
    return path


def _nan_in_parquet_statistics(file: DataFile, float_columns: Sequence[str]) -> bool:
    """Whether a Parquet file's float columns may hold NaN (our statistics then leave `max` unknown)."""
    if file.format != "parquet":
        return False
    for name in float_columns:
        stats = file.stats.get(name)
        if stats is None or (stats.max is None and stats.null_count < file.rows):
            return True
    return False


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _spark_column(name: str) -> Any:
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _node_count(predicate: Predicate) -> int:
    return sum(1 for _ in walk(predicate))
