"""Multi-dataset queries: one read-only SELECT over any number of datasets of a spec, each pruned.

`read.reader.query_datasets` (and `DatasetReader.query`, the hook and the CLI, which come here
when the statement names more than one dataset) plans the statement once (`plan_datasets_query`):

1. every dataset the statement names is read at its own version (`versions=`), at the newest version
   committed at or before one `as_of` time, or at its newest;
2. each is pruned by the conditions that reach it (`pruning.query.dataset_filter`), conditions on a
   column tied by an inner equi-join to another dataset's column included;
3. the join planner (`read.joins`) decides which joins of two datasets run partition-wise.

Running it (`_run`) builds one fresh DuckDB database: `register_dataset_views` makes each dataset a view
over its selected files (the one place a table of the statement is registered, so catalog table
functions can be added next to it), each split join becomes a view of the union of its small joins (of
one window of them at a time when the statement streams, `_run_streamed`), and the database is then
limited and locked exactly as a single-dataset query's (`read.query`): only the selected files
readable, configuration locked, time and memory bounded by `QueryLimits`.

The datasets are read by readers the caller opens (`DatasetReader`, a factory by name): this module
imports no reader, so every dataset of a query is reached the way its caller reaches its own (the same
S3 settings: `read.reader.datasets_query`, `DatasetReader` siblings).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from airflow_partitions.exceptions import FilterError, StorageError, VersionNotFoundError
from airflow_partitions.pruning import check_read_only, dataset_filter, executable_sql
from airflow_partitions.pruning.deep import deep_stack
from airflow_partitions.pruning.expressions import quote_identifier, quote_string, renamed_columns
from airflow_partitions.pruning.limits import check_budget, run_bounded
from airflow_partitions.pruning.query import tables_named_in
from airflow_partitions.pruning.sql_text import parse_one_sql
from airflow_partitions.read.catalog_tables import (
    build_catalog_table,
    catalog_calls,
    mentions_catalog_tables,
    register_catalog_tables,
)
from airflow_partitions.read.joins import (
    GROUPED,
    JoinDecision,
    JoinSplit,
    PairGroup,
    decide_join,
    find_joins,
    rewrite_splits,
    streamed_shape,
)
from airflow_partitions.read.merge_join import (
    MERGE_MIN_ROWS,
    MergedGroups,
    MergeKeys,
    merge_reason,
    merged_groups,
    note_hashed,
)
from airflow_partitions.read.query import (
    QUERY_HINT,
    _scrubbed,
    check_sandboxed,
    duckdb_expression_name,
    parsed_statement,
    sandbox_reference_counts,
)
from airflow_partitions.read.sandbox import (
    QueryLimits,
    SandboxDatabases,
    apply_limits,
    lock_down,
    needs_partition_functions,
    new_duckdb_connection,
)

if TYPE_CHECKING:
    from airflow_partitions.catalog import Catalog, Snapshot
    from airflow_partitions.pruning import PartitionIndex, PrunePlan
    from airflow_partitions.pruning.expressions import Predicate
    from airflow_partitions.read.scan import CallScope, DuckDBScanner
    from airflow_partitions.spec.model import ProjectSpec
    from airflow_partitions.spec.renames import ColumnRenames
    from airflow_partitions.storage import DataFile


class DatasetReader(Protocol):
    """What a multi-dataset query uses of one dataset's reader (`read.reader.PartitionedDatasetReader`)."""

    name: str
    catalog: Catalog
    _scanner: DuckDBScanner
    # The dataset's `renamed_columns`: the statement speaks current names, the files stored ones.
    _renames: ColumnRenames

    def snapshot(self, version: int | None = None, *, tag: str | None = None) -> Snapshot: ...

    def index(self, snapshot: Snapshot) -> PartitionIndex: ...

    def close(self) -> None: ...

    def _schema_of(self, snapshot: Snapshot) -> pa.Schema: ...

    def _plan(self, snapshot: Snapshot, where: Predicate | None) -> PrunePlan: ...

    def _record(self, plan: PrunePlan, kind: str, rows: int | None, started: float) -> None: ...


ReaderFactory = Callable[[str], DatasetReader]
# Below this many bytes of selected files on both sides a join is not split: the pair groups' fixed
# costs (one small join, and with streaming one statement, each) outweigh what splitting saves.
SPLIT_MIN_BYTES = 32 * 1024 * 1024


def datasets_named_in(project: ProjectSpec, sql: str) -> list[str]:
    """The spec's datasets `sql` reads as tables (spec spelling, sorted), else, when it names none, the
    ones its catalog table function calls describe (`ap_partitions('orders')`); `FilterError` when it
    names none either way."""

    check_read_only(sql)  # a query that is not SQL names no table: say that, not "reads none"
    by_name = {name.lower(): name for name in project.names}
    named = sorted({by_name[t] for t in tables_named_in(sql) if t in by_name})
    if not named and mentions_catalog_tables(sql):
        described = {call.dataset.lower() for call in catalog_calls(parsed_statement(sql))}
        named = sorted({by_name[name] for name in described if name in by_name})
    if not named:
        raise FilterError(
            f"the query reads none of the spec's datasets ({', '.join(project.names) or 'none'}); "
            "name one in FROM, e.g. SELECT count(*) FROM <dataset>"
        )
    return named


def version_at(reader: DatasetReader, as_of: dt.datetime) -> int:
    """The newest version of the reader's dataset committed at or before `as_of`."""
    if as_of.tzinfo is None:
        as_of = as_of.replace(tzinfo=dt.UTC)
    committed = [info.version for info in reader.catalog.versions() if info.committed_at <= as_of]
    if not committed:
        raise VersionNotFoundError(
            f"dataset {reader.name!r} has no retained version committed at or before {as_of.isoformat()}; "
            "pass a later as_of, or versions={...} with a version `status` lists"
        )
    return max(committed)


@dataclass(frozen=True)
class StatementWindow:
    """How many pair groups of a split join one DuckDB statement joins when the statement streams
    (`DatasetQuery.window`), and why."""

    groups: int
    source: str  # "threads": the query's DuckDB threads; "groups_per_statement": set by the caller
    memory: str  # the query's memory limit, which a window's groups together must fit in

    def reason(self) -> str:
        if self.source == "threads":
            return (
                f"one per DuckDB thread ({self.groups}): each thread builds one group's hash table while "
                "another probes"
            )
        return f"groups_per_statement={self.groups}"

    def memory_text(self) -> str:
        """The memory limit as people read it: DuckDB's `4294967296B` is `4 GiB`, `1GB` stays."""
        if not (self.memory.endswith("B") and self.memory[:-1].isdigit()):
            return self.memory
        size, unit = float(self.memory[:-1]), "B"
        for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
            if size < 1024 or unit == "TiB":
                break
            size /= 1024
        return f"{size:.4g} {unit}"

    def to_json(self) -> dict[str, Any]:
        return {"groups_per_statement": self.groups, "source": self.source, "memory_limit": self.memory}


@dataclass
class DatasetQueryPlan:
    """A multi-dataset query's plan: each dataset's version and pruning, and each join's decision."""

    sql: str
    executable: str
    plans: dict[str, PrunePlan]
    schemas: dict[str, pa.Schema]
    joins: list[JoinDecision] = field(default_factory=list)
    tree: Any = None
    # How the one split join (when exactly one join is split) runs: its window, and whether the
    # statement streams (one statement per window of pair groups) or runs once over all of them.
    window: StatementWindow | None = None
    streamed: bool = False
    # Why a split join's statement runs once over all its pair groups (empty when it streams).
    whole_reason: str = ""
    # A streamed split join's pair groups merged on these keys (`read.merge_join`), or None: DuckDB's
    # hash join; and why.
    merge: MergeKeys | None = None
    merge_reason: str = ""
    # The join's rows when only loading the merge held it back (`merge_join.note_hashed` after the run).
    merge_deferred_rows: int = 0

    @property
    def splits(self) -> list[JoinDecision]:
        return [decision for decision in self.joins if decision.split]

    @deep_stack
    def explain(self) -> str:
        lines = [f"query over {len(self.plans)} dataset(s): {', '.join(self.plans)}"]
        for name, plan in self.plans.items():
            lines.append(f"dataset {name}, {plan.index.origin}: {plan.summary()}")
            lines.append(f"  filter: {plan.predicate_text or '(none)'}")
        if not self.joins:
            lines.append("joins: none between two datasets")
        for decision in self.joins:
            lines.append(f"join {decision.describe()}")
            for pair in decision.pairs:
                sizes = " x ".join(str(len(side)) for side in pair.partitions)
                lines.append(f"  pair group {', '.join(pair.groups)}: {sizes} partition(s)")
            if decision.split:
                lines.append(f"  {self._statements(decision)}")
                if self.streamed:
                    kind = "sorted merge" if self.merge is not None else "hash join"
                    lines.append(f"  pair joins: {kind}: {self.merge_reason}")
        return "\n".join(lines)

    def _statements(self, decision: JoinDecision) -> str:
        """How the statement over a split join runs: windows of pair groups, or once over all."""
        window = self.window
        if self.streamed and window is not None:
            count = -(-len(decision.pairs) // window.groups)
            limit = window.memory_text()
            return (
                f"statements: {count}, each joining up to {window.groups} pair group(s) ({window.reason()}); "
                f"a statement whose groups together exceed the memory limit ({limit}) joins them one at a "
                "time; a floating-point sum runs once over all groups instead"
            )
        return f"statements: one over all {len(decision.pairs)} pair group(s): {self.whole_reason}"

    @deep_stack
    def to_json(self) -> dict[str, Any]:
        return {
            "sql": self.sql,
            "datasets": {name: plan.to_json(include_decisions=False) for name, plan in self.plans.items()},
            "joins": [decision.to_json() for decision in self.joins],
            **(
                {
                    "split_statements": {
                        "streamed": self.streamed,
                        **(self.window.to_json() if self.window is not None else {}),
                        **({"whole_reason": self.whole_reason} if not self.streamed else {}),
                        **(
                            {
                                "pair_join": "merge" if self.merge is not None else "hash",
                                "pair_join_reason": self.merge_reason,
                            }
                            if self.streamed
                            else {}
                        ),
                    }
                }
                if self.splits
                else {}
            ),
        }


class DatasetQuery:
    """Readers for the datasets of one spec, opened on demand, that multi-dataset queries use.

    `open_reader`: how to open a dataset's reader by name; `readers`: readers to use as they are (by
    dataset name); `close_opened`: `close` closes the readers `open_reader` opened (otherwise its owner
    does). `read.reader.datasets_query` opens one over a spec.
    """

    def __init__(
        self,
        project: ProjectSpec,
        open_reader: ReaderFactory,
        *,
        readers: Mapping[str, DatasetReader] | None = None,
        close_opened: bool = False,
        query_limits: QueryLimits | None = None,
        split_min_bytes: int | None = None,
        groups_per_statement: int | None = None,
        merge_joins: bool = True,
        merge_min_rows: int | None = None,
    ) -> None:
        # Joins whose two sides' selected files hold fewer bytes run as one plain join.
        self.split_min_bytes = SPLIT_MIN_BYTES if split_min_bytes is None else split_min_bytes
        # How many pair groups of a streamed split join one statement joins (None: the query's DuckDB
        # threads, so that each thread has a small join to build while another's hash table is finished).
        self.groups_per_statement = groups_per_statement
        # Whether a streamed split join's pair groups may be merged on sorted keys (`read.merge_join`).
        self.merge_joins = merge_joins
        # Until this process's mergeable joins total this many rows, a process that has not loaded the
        # merge (Polars) keeps the hash join (`merge_join.MERGE_MIN_ROWS`).
        self.merge_min_rows = MERGE_MIN_ROWS if merge_min_rows is None else merge_min_rows
        self.project = project
        self._readers: dict[str, DatasetReader] = dict(readers or {})
        self._owned: list[DatasetReader] = []
        self._open_reader = open_reader
        self._close_opened = close_opened
        self.query_limits = query_limits if query_limits is not None else QueryLimits()
        self._sandboxes = SandboxDatabases(threading.RLock())

    def reader(self, name: str) -> DatasetReader:
        reader = self._readers.get(name)
        if reader is None:
            reader = self._open_reader(name)
            if self._close_opened:
                self._owned.append(reader)
            self._readers[name] = reader
        return reader

    def close(self) -> None:
        self._sandboxes.close()
        owned, self._owned = self._owned, []
        for reader in owned:
            self._readers.pop(reader.name, None)
            reader.close()

    def __enter__(self) -> DatasetQuery:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- planning ---------------------------------------------------------------------------------

    @deep_stack
    def plan(
        self,
        sql: str,
        *,
        versions: Mapping[str, int | None] | None = None,
        as_of: dt.datetime | None = None,
        split_joins: bool = True,
        limits: QueryLimits | None = None,
    ) -> DatasetQueryPlan:
        """How `query` would run `sql`: each dataset's version and pruning, each join's decision."""
        limits = limits or self.query_limits
        with limits.budget(QUERY_HINT):
            return self._plan(sql, versions, as_of, split_joins, limits)

    def _plan(
        self,
        sql: str,
        versions: Mapping[str, int | None] | None,
        as_of: dt.datetime | None,
        split_joins: bool,
        limits: QueryLimits,
    ) -> DatasetQueryPlan:
        names = datasets_named_in(self.project, sql)
        wanted = {key.lower(): value for key, value in (versions or {}).items()}
        unknown = sorted(set(wanted) - {name.lower() for name in self.project.names})
        if unknown:
            raise FilterError(
                f"versions= names {', '.join(unknown)}, not a dataset of the spec "
                f"({', '.join(self.project.names)})"
            )
        snapshots: dict[str, Snapshot] = {}
        for name in names:
            reader = self.reader(name)
            version = wanted.get(name.lower())
            if version is None and as_of is not None:
                version = version_at(reader, as_of)
            snapshots[name] = reader.snapshot(version)
            check_budget()
        # Each dataset under the names its users see (a renamed column by its current name).
        schemas = {
            name: self.reader(name)._renames.to_current(self.reader(name)._schema_of(snapshots[name]))
            for name in names
        }
        lowered = {name.lower(): schema for name, schema in schemas.items()}
        counts = sandbox_reference_counts(sql, names)
        check_budget()
        plans = {}
        for name in names:
            predicate = dataset_filter(sql, name, schemas[name], counts[name.lower()], schemas=lowered)
            renames = self.reader(name)._renames
            if predicate is not None and renames:
                predicate = renamed_columns(predicate, renames.stored)  # pruned on the stored names
            plans[name] = self.reader(name)._plan(snapshots[name], predicate)
            check_budget()
        merged = pa.schema(_merged_fields(schemas.values()))
        executable = executable_sql(sql, merged)
        result = DatasetQueryPlan(sql, executable, plans, schemas)
        tree = _parse(executable)
        if tree is None:
            return result
        candidates = find_joins(tree, lowered, {name.lower(): name for name in names})
        for candidate in candidates:
            decision = decide_join(
                candidate,
                *(plans[side.dataset] for side in candidate.sides),
                renames=[self.reader(side.dataset)._renames for side in candidate.sides],
            )
            if decision.split and not split_joins:
                decision.split, decision.pairs = False, []
                decision.reason = "partition-wise joins are turned off (split_joins=False)"
            if decision.split and self.split_min_bytes > 0:
                selected = sum(
                    file.bytes
                    for side in {side.dataset for side in candidate.sides}
                    for file in plans[side].files
                )
                if selected < self.split_min_bytes:
                    decision.split, decision.pairs = False, []
                    decision.reason = (
                        f"compatible layouts, but the sides' selected files hold {selected:,} bytes, "
                        f"under split_min_bytes ({self.split_min_bytes:,}): one plain join costs less"
                    )
            result.joins.append(decision)
        result.tree = tree
        self._plan_statements(result, limits)
        return result

    def _plan_statements(self, plan: DatasetQueryPlan, limits: QueryLimits) -> None:
        """Record how the statement over the plan's split join runs (`_run` decides the same way)."""
        splits = plan.splits
        if not splits:
            return
        plan.window = window = self.window(limits)
        if len(splits) > 1:
            plan.whole_reason = "more than one join is split: one statement joins them all"
            return
        shape = streamed_shape(plan.tree, JoinSplit(splits[0], "ap_join"))
        if shape is None:
            plan.whole_reason = (
                "the statement needs the whole join at once (it is not a projection or filter of the "
                "join, a GROUP BY of a split key, nor one row of count / sum / min / max)"
            )
        elif len(splits[0].pairs) <= window.groups:
            plan.whole_reason = f"no more pair groups than one statement joins ({window.reason()})"
        else:
            plan.streamed = True
            sides = [side.dataset for side in splits[0].sides]
            rows = sum(file.rows for name in set(sides) for file in plan.plans[name].files)
            choice = merge_reason(
                splits[0],
                [plan.schemas[name] for name in sides],
                rows,
                enabled=self.merge_joins,
                min_rows=self.merge_min_rows,
            )
            plan.merge, plan.merge_reason = choice.keys, choice.reason
            plan.merge_deferred_rows = choice.deferred_rows

    # --- running ----------------------------------------------------------------------------------

    @deep_stack
    def query(
        self,
        sql: str,
        *,
        versions: Mapping[str, int | None] | None = None,
        as_of: dt.datetime | None = None,
        timeout_s: float | None = None,
        memory_limit: str | int | None = None,
        split_joins: bool = True,
    ) -> pa.Table:
        """Run one read-only SELECT in which every dataset of the spec it names is a table.

        `versions`: a version per dataset name (others: newest, or as of `as_of`); `as_of`: read each
        dataset as it was at that time; `split_joins=False` runs every join as one plain join.
        """
        started = time.perf_counter()
        limits = self.query_limits.merged(timeout_s, memory_limit)
        with limits.budget(QUERY_HINT):
            plan = self._plan(sql, versions, as_of, split_joins, limits)
            check_budget()
            table = self._run(plan, limits)
        # One read-statistics record per dataset read, in that dataset's log, with its own pruning (the
        # partitions and files its plan selected, the filter that reached it); rows: the query's result.
        for name, dataset_plan in plan.plans.items():
            self.reader(name)._record(dataset_plan, "query", table.num_rows, started)
        return table

    def _run(self, plan: DatasetQueryPlan, limits: QueryLimits) -> pa.Table:
        import duckdb

        splits = [JoinSplit(d, f"ap_join_{uuid.uuid4().hex[:12]}") for d in plan.splits]
        statement = rewrite_splits(plan.tree, splits, duckdb_expression_name) if splits else plan.executable
        # Whether the statement streams window by window, and how wide a window is, the plan decided
        # (`_plan_statements`, under the same limits).
        shape = streamed_shape(plan.tree, splits[0]) if plan.streamed else None
        window = plan.window.groups if plan.window is not None else 1
        roots = [self.reader(name)._scanner.sandbox_root for name in plan.plans]
        if all(root is not None for root in roots):
            # Local files scanned in place: a cursor of a locked database kept for these directories
            # (opening and configuring one costs more than a small query); its views go with it.
            connection = self._sandboxes.cursor([root for root in roots if root is not None], limits)
            configure = False
        else:
            connection = new_duckdb_connection(functions=needs_partition_functions(statement))
            configure = True
        try:
            tables = [*plan.plans, *(split.view for split in splits)]
            check_sandboxed(connection, statement, tables)
            with contextlib.ExitStack() as stack:
                scopes = {
                    name: stack.enter_context(self.reader(name)._scanner.call_scope(connection))
                    for name in plan.plans
                }
                try:
                    register_catalog_tables(connection, self._catalog_tables(plan))
                    register_dataset_views(self, connection, scopes, plan)
                    relations = [_split_relations(self, connection, scopes, plan, s) for s in splits]
                    branches = [
                        [split.branch_sql(*(f"({r})" for r in group)) for group in groups]
                        for split, groups in zip(splits, relations, strict=True)
                    ]
                    if shape is None:
                        # One statement over the whole union: the views of the split joins (a streamed
                        # join's view holds one window of pair groups at a time, `_run_streamed`).
                        for split, groups in zip(splits, branches, strict=True):
                            _create_view(connection, split.view, groups)
                except (duckdb.Error, StorageError) as err:
                    cause = err.__cause__ if isinstance(err.__cause__, duckdb.Error) else err
                    raise FilterError(
                        f"query failed: {_scrub(str(cause).strip(), connection, scopes)}"
                    ) from err
                if configure:
                    allowed = ", ".join(
                        quote_string(p) for scope in scopes.values() for p in scope.local_files
                    )
                    connection.execute(f"SET allowed_paths = [{allowed}]")
                    apply_limits(connection, limits)
                    lock_down(connection)
                try:
                    if shape is not None:
                        view, groups = splits[0].view, branches[0]
                        merged = (
                            merged_groups(connection, splits[0], plan.merge, relations[0], groups, window)
                            if plan.merge is not None
                            else None
                        )
                        try:
                            result = run_bounded(
                                connection,
                                lambda: _run_streamed(
                                    connection, statement, view, groups, shape, window, merged=merged
                                ),
                                memory=limits.memory,
                            )
                        finally:
                            if merged is not None:
                                merged.close()
                        note_hashed(plan.merge_deferred_rows)
                        return result
                    return run_bounded(
                        connection, lambda: connection.sql(statement).to_arrow_table(), memory=limits.memory
                    )
                except duckdb.Error as err:
                    raise FilterError(
                        f"query failed: {_scrub(str(err).strip(), connection, scopes)}"
                    ) from err
        finally:
            connection.close()

    def window(self, limits: QueryLimits | None = None) -> StatementWindow:
        """How many pair groups of a streamed split join one statement joins under `limits`, and why."""
        limits = limits or self.query_limits
        if self.groups_per_statement:
            return StatementWindow(max(1, self.groups_per_statement), "groups_per_statement", limits.memory)
        return StatementWindow(max(1, limits.thread_count), "threads", limits.memory)

    def _catalog_tables(self, plan: DatasetQueryPlan) -> dict[str, pa.Table]:
        """The tables of the statement's catalog table function calls (`read.catalog_tables`): a dataset
        the query reads at the version it reads, any other at its newest, unless `version :=` pins."""

        if not mentions_catalog_tables(plan.sql):
            return {}
        by_name = {name.lower(): name for name in self.project.names}
        tables: dict[str, pa.Table] = {}
        for call in catalog_calls(parsed_statement(plan.sql)):
            name = by_name.get(call.dataset.lower(), call.dataset)
            self.project.dataset(name)  # DatasetNotFoundError listing the spec's datasets
            reader = self.reader(name)
            read = plan.plans.get(name)
            version = call.version if call.version is not None else (read.version if read else None)
            snapshot = reader.snapshot(version)
            tables[call.table_name] = build_catalog_table(
                call,
                reader.catalog,
                snapshot,
                reader._schema_of(snapshot),
                reader.index(snapshot),
                renames=reader._renames,
            )
            check_budget()
        return tables


def register_dataset_views(
    query: DatasetQuery, connection: Any, scopes: Mapping[str, CallScope], plan: DatasetQueryPlan
) -> None:
    """Make each dataset of the plan a temporary view over its selected files (its schema's columns, in
    order); a dataset with no selected file is its schema's empty table."""
    for name, prune_plan in plan.plans.items():
        relation = _relation(query, connection, scopes[name], name, prune_plan.files, plan.schemas[name])
        connection.execute(f"CREATE TEMP VIEW {quote_identifier(name)} AS {relation}")


def _relation(
    query: DatasetQuery,
    connection: Any,
    scope: CallScope,
    name: str,
    files: Sequence[DataFile],
    schema: pa.Schema,
) -> str:
    """A SELECT of every column of `schema` (current names), in order, over exactly `files` (stored
    names: a renamed column is selected under its current name)."""
    renames = query.reader(name)._renames
    stored = renames.to_stored(schema)
    columns = (
        ", ".join(
            quote_identifier(old) if old == new else f"{quote_identifier(old)} AS {quote_identifier(new)}"
            for old, new in zip(stored.names, schema.names, strict=True)
        )
        or "*"
    )
    if not files:
        empty = f"ap_empty_{uuid.uuid4().hex[:12]}"
        scope.register(connection, empty, stored.empty_table())
        return f"SELECT {columns} FROM {empty}"
    source = query.reader(name)._scanner.relation(connection, scope, files, stored)
    return f"SELECT {columns} FROM {source}"


def _split_relations(
    query: DatasetQuery,
    connection: Any,
    scopes: Mapping[str, CallScope],
    plan: DatasetQueryPlan,
    split: JoinSplit,
) -> list[list[str]]:
    """Each pair group's relation of each side (in FROM order), over the group's files: the small joins
    (`JoinSplit.branch_sql`) join them; the view of their union is made by `_create_view`, over all of
    them, or one window of them at a time when the statement streams."""
    decision = split.decision
    sides = [side.dataset for side in decision.sides]
    pairs: list[PairGroup | None] = list(decision.pairs) or [None]
    relations = []
    for pair in pairs:
        files = pair.files if pair is not None else tuple(() for _ in sides)
        relations.append(
            [
                _relation(query, connection, scopes[name], name, side_files, plan.schemas[name])
                for name, side_files in zip(sides, files, strict=True)
            ]
        )
    return relations


def _create_view(connection: Any, view: str, branches: Sequence[str]) -> None:
    """(Re)define the split join's view as the UNION ALL of `branches` (pair groups' small joins)."""
    union = " UNION ALL ".join(branches)
    connection.execute(f"CREATE OR REPLACE TEMP VIEW {quote_identifier(view)} AS {union}")


def _run_streamed(
    connection: Any,
    statement: str,
    view: str,
    branches: Sequence[str],
    shape: list[str],
    window: int = 1,
    merged: MergedGroups | None = None,
) -> pa.Table:
    """`statement` run once per `window` consecutive pair groups, the split join's view holding only
    their small joins (so at most `window` groups' hash tables are in memory; DuckDB builds them side by
    side, one thread finishing a group's hash table, single-threaded under a million rows, while another
    builds or probes the next), the results combined as `streamed_shape` says: the rows of each (a
    projection / filter, or whole statement groups), or one row of `count` / `sum` / `min` / `max` over
    the partials. A window whose groups together exceed the memory limit runs one group at a time.

    A floating-point sum (or any floating column of grouped rows) depends on the order of addition: only
    the whole join gives its answer, so the statement then runs once over every group. The first window's
    statement, bound before it runs, says so (the types of the whole union are those of any window unless
    the sides' files differ in type across partitions: each window's result is checked as well). So it
    does when a window's result has other types than the first's (a column stored as int32 in some
    partitions' files and int64 in others): the whole union's statement gives the one type.

    `merged`: the pair groups as merge joins (`read.merge_join`): each window's small joins are the
    positional joins of its groups' merged rows, dropped once the window's statement has run. The
    fallbacks that run once over every group use the hash joins of `branches`.
    """
    import duckdb

    parts: list[pa.Table] = []
    for start in range(0, len(branches), window):
        stop = min(start + window, len(branches))
        chunk = merged.branches(start, stop) if merged is not None else branches[start:stop]
        try:
            _create_view(connection, view, chunk)
            relation = connection.sql(statement)
            if start == 0 and _order_dependent(shape, [str(t) for t in relation.types]):
                return _run_groups(connection, statement, view, branches)  # once over every group
            part = relation.to_arrow_table()
        except (duckdb.OutOfMemoryException, MemoryError):
            if len(chunk) == 1:
                raise
            # Their hash tables together exceed the memory limit: one group at a time, as each fits
            # alone (the failed statement returned nothing, so no group is counted twice).
            part = pa.concat_tables([_run_groups(connection, statement, view, [one]) for one in chunk])
        if _order_dependent(shape, [_duckdb_kind(column.type) for column in part.schema]):
            return _run_groups(connection, statement, view, branches)  # once over every group
        if parts and not part.schema.equals(parts[0].schema):
            # The sides' files store a column as different types in different partitions (int32 in
            # some, int64 in others): only the whole union has the statement's type for it.
            return _run_groups(connection, statement, view, branches)  # once over every group
        parts.append(part)
        if merged is not None:
            merged.release(start, stop)
        check_budget()
    return _combined(pa.concat_tables(parts), shape)


def _order_dependent(shape: list[str], types: Sequence[str]) -> bool:
    """Whether the streamed results of columns of these DuckDB types would depend on the order in
    which the pair groups' rows are added up (a floating sum, or floating columns of grouped rows)."""
    floating = [kind in ("DOUBLE", "FLOAT") for kind in types]
    return any(kind == "sum" and f for kind, f in zip(shape, floating, strict=False)) or (
        shape == [GROUPED] and any(floating)
    )


def _duckdb_kind(arrow_type: pa.DataType) -> str:
    """DOUBLE / FLOAT for Arrow's floating types (as `_order_dependent` reads them), else the type."""
    if pa.types.is_floating(arrow_type):
        return "FLOAT" if arrow_type.bit_width < 64 else "DOUBLE"
    return str(arrow_type)


def _combined(whole: pa.Table, shape: list[str]) -> pa.Table:
    """The windows' results (`whole`) combined into the statement's result, as `shape` says."""
    import pyarrow.compute as pc

    if not shape or shape == [GROUPED]:
        return whole  # rows of a projection, or whole statement groups: each in exactly one part
    columns = []
    for kind, column in zip(shape, whole.columns, strict=True):
        if kind == "count":
            value = pc.sum(column)
            value = value if value.is_valid else pa.scalar(0, column.type)
        elif kind == "sum":
            value = pc.sum(column, min_count=1)
        elif kind == "min":
            value = pc.min(column)
        else:
            value = pc.max(column)
        columns.append(pa.array([value.as_py()], column.type))
    return pa.Table.from_arrays(columns, schema=whole.schema)


def _run_groups(connection: Any, statement: str, view: str, branches: Sequence[str]) -> pa.Table:
    """`statement` over the split join's view holding the union of `branches` (pair groups' joins)."""
    _create_view(connection, view, branches)
    return connection.sql(statement).to_arrow_table()


def _scrub(message: str, connection: Any, scopes: Mapping[str, CallScope]) -> str:
    for scope in scopes.values():
        message = _scrubbed(message, connection, scope)
    return message


def _merged_fields(schemas: Any) -> Iterator[pa.Field]:
    """The fields of several schemas, the first of each name (the transforms' rewrite needs column types)."""
    seen: set[str] = set()
    for schema in schemas:
        for item in schema:
            if item.name not in seen:
                seen.add(item.name)
                yield item


def _parse(sql: str) -> Any:
    from sqlglot.errors import SqlglotError

    try:
        return parse_one_sql(sql)
    except (SqlglotError, ValueError):
        return None
