"""The in-process Arrow refresh in bounded memory: the source streamed in batches, routed per batch, spilled
per partition to local scratch, each partition written from its spill.

`arrow_refresh` hands a source that reads in batches (files: `FileSource.read_batches`; Postgres:
`PostgresSource.read_batches`, ADBC batches) to `streamed_refresh`. Each batch is conformed to the source
schema, its partition values computed by the dataset's own transforms (`routing.partition_groups`, the
vectorised code every path routes with; NULL a value like any other), its rows grouped by partition (one
stable sort, one take) and appended to the partition's buffer, and its rows hashed per partition (the one
row hash, `write/row_hash.py`, on a thread of its own while the next batch is routed) into each
partition's running tally. When the buffers hold more than the spill budget, every buffer is written to
one Arrow IPC spill file in the scratch directory (each partition's rows one contiguous run of record
batches) and released. Rows of partitions the plan does not
refresh (a selection, unchanged partitions) are counted and dropped on the way.

After the scan, each planned partition is read back from its spill runs and its buffer, in the order the
rows were read (so the rows, their sort and their files are what the whole-table path writes) and written
by `arrow_write.write_partition` on the same small pool, largest first: the storage engine writes, sorts
and checksums it, its rows are counted back from the files, and its files are fsynced in the background
while the next partitions are written. Memory is the spill budget during the scan, and then a few
partitions at a time (one per writer thread).

Rows are conserved and checked at every step: rows scanned == rows routed (planned + dropped), each
partition's rows read back from its spill == rows routed to it, and each partition's written rows == its
routed rows (counted back from the files); the certificate is the tally of the rows as they were read. On
any mismatch nothing is published: the files written so far are removed and `ConservationError` names the
partitions and both counts. The scratch directory is removed in every case.

The spill budget: `AP_ARROW_SPILL_BUDGET` or `[airflow_partitions] arrow_spill_budget` (env
`AIRFLOW__AIRFLOW_PARTITIONS__ARROW_SPILL_BUDGET`), bytes with an optional unit; default half the Arrow
memory budget, at most 1 GiB. The scratch directory: `AP_ARROW_SPILL_DIR`, default
`<accelerator_dir>/_scratch` (next to the data it becomes).
"""

from __future__ import annotations

import dataclasses
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Generator, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_partitions.exceptions import ConservationError, RefreshError
from airflow_partitions.quoting import quote_identifier
from airflow_partitions.refresh.arrow_budget import (
    SPILL_DIR_ENV,
    SPILL_ENV,
    arrow_spill_budget,
    spill_base,
)
from airflow_partitions.refresh.arrow_write import (
    ArrowRefreshResult,
    check_routed_counts,
    write_partition,
    write_planned,
)
from airflow_partitions.refresh.finalize import conform_to_schema
from airflow_partitions.sources.file_facts import FactsLearner
from airflow_partitions.sources.files import FileSource
from airflow_partitions.sources.postgres import PostgresSource
from airflow_partitions.sources.renamed import RenamedSource
from airflow_partitions.write.routing import partition_groups
from airflow_partitions.write.row_hash import RowTally, hash_connection, hash_ready, row_expression

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.refresh.plan import PartitionResult, PartitionWorkItem, RefreshPlan
    from airflow_partitions.sources import Source
    from airflow_partitions.spec.model import DatasetSpec
    from airflow_partitions.storage import DataFile, PartitionStorage
    from airflow_partitions.transforms import Transform

# Rows per batch read from a file source: large enough that the per-batch routing and hashing cost little
# beside the rows themselves, small enough to be a sliver of any budget.
BATCH_ROWS = 256 * 1024
# Batches read ahead of the router, on a thread of their own.
PREFETCH_BATCHES = 2
_GROUP_COLUMN = "__stream_group"
Item = TypeVar("Item")
_TABLE = "__stream_rows"


def prefetched(batches: Iterator[Item], depth: int) -> Generator[Item, None, None]:
    """`batches` read on a thread of their own, at most `depth` ahead of the consumer (pyarrow decodes
    without the GIL, so reading overlaps routing); the reader's error is raised here, in order."""
    done = object()
    slots: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for batch in batches:
                while not stop.is_set():
                    try:
                        slots.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            slots.put(done)
        except BaseException as err:  # handed to the consumer, raised there
            slots.put(err)

    reader = threading.Thread(target=produce, name="arrow-stream-read", daemon=True)
    reader.start()
    try:
        while True:
            item = slots.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while reader.is_alive():  # unblock a reader waiting on a full queue, then let it finish
            try:
                slots.get_nowait()
            except queue.Empty:
                pass
            reader.join(timeout=0.1)


def streams(source: Source) -> bool:
    """True when `source` reads in batches (files, Postgres): then the Arrow refresh streams it."""

    if isinstance(source, RenamedSource):
        return streams(source.inner)
    return isinstance(source, FileSource | PostgresSource)


def source_batches(source: Source) -> Iterator[pa.Table]:
    """The rows of `source` as a stream of tables, never held whole."""

    if isinstance(source, RenamedSource):
        for batch in source_batches(source.inner):
            yield source.renames.to_stored(batch)
    elif isinstance(source, FileSource):
        yield from source.read_batches(batch_rows=BATCH_ROWS)
    elif isinstance(source, PostgresSource):
        import pyarrow as pa

        for batch in source.read_batches():
            yield pa.Table.from_batches([batch])
    else:  # not reached through `arrow_refresh` (it streams only what `streams` accepts)
        yield source.read_all()


@dataclass
class _Run:
    """One spill file: each partition's rows as a contiguous run of its record batches."""

    path: Path
    batches: dict[str, tuple[int, int]] = field(default_factory=dict)  # key path -> (first, count)


class PartitionSpill:
    """Per-partition buffers of routed rows, spilled to Arrow IPC files in `directory` past `budget` bytes.

    `held` is what the buffers hold now, `peak_held` the most they held at once (after the batch that
    pushed them past the budget was added, before the spill released them).
    """

    def __init__(self, directory: Path, schema: pa.Schema, budget: int) -> None:
        self.directory = directory
        self.schema = schema
        self.budget = budget
        self.buffers: dict[str, list[pa.Table]] = {}
        self.rows: dict[str, int] = {}
        self.runs: list[_Run] = []
        self.held = 0
        self.peak_held = 0
        self.spilled_bytes = 0
        self.from_memory = 0  # partitions written (partly) from rows still buffered at the end
        self._lock = threading.Lock()

    def add(self, parts: dict[str, pa.Table], nbytes: int) -> None:
        """Buffer one batch's rows per partition (`nbytes`: the batch's buffers, which the parts share)."""
        for key_path, part in parts.items():
            self.buffers.setdefault(key_path, []).append(part)
            self.rows[key_path] = self.rows.get(key_path, 0) + part.num_rows
        self.held += nbytes
        self.peak_held = max(self.peak_held, self.held)
        if self.held > self.budget:
            self.spill()

    def spill(self) -> None:
        """Write every buffer to a new spill file, each partition's rows as one record batch, and release
        them."""
        import pyarrow as pa

        if not self.buffers:
            return
        run = _Run(self.directory / f"run-{len(self.runs):05d}.arrow")
        index = 0
        try:
            with pa.OSFile(str(run.path), "wb") as sink, pa.ipc.new_file(sink, self.schema) as writer:
                for key_path, parts in self.buffers.items():
                    combined = pa.concat_tables(parts).combine_chunks()
                    batches = [batch for batch in combined.to_batches() if batch.num_rows]
                    for batch in batches:
                        writer.write_batch(batch)
                    run.batches[key_path] = (index, len(batches))
                    index += len(batches)
            self.spilled_bytes += run.path.stat().st_size
        except OSError as err:
            raise RefreshError(
                f"cannot write the Arrow refresh's spill file {run.path} ({self.spilled_bytes:,} bytes "
                f"spilled so far): {err}; nothing was written to the dataset. Point {SPILL_DIR_ENV} at a "
                f"local disk with room for the source's rows, or raise {SPILL_ENV} so fewer rows spill"
            ) from err
        self.runs.append(run)
        self.buffers = {}
        self.held = 0

    def table(self, key_path: str) -> pa.Table:
        """Every row routed to `key_path`, in the order they were read: its spill runs, then its buffer."""
        import pyarrow as pa

        batches: list[pa.RecordBatch] = []
        for run in self.runs:
            first, count = run.batches.get(key_path, (0, 0))
            if count:
                reader = pa.ipc.open_file(pa.memory_map(str(run.path), "r"))
                batches.extend(reader.get_batch(first + offset) for offset in range(count))
        with self._lock:
            buffered = self.buffers.pop(key_path, [])
            self.from_memory += 1 if buffered else 0
        tables = [pa.Table.from_batches(batches, schema=self.schema)] if batches else []
        tables += buffered
        return pa.concat_tables(tables) if tables else self.schema.empty_table()


class _Router:
    """Routes batches to their partitions: counts, per-partition tallies and the spill."""

    def __init__(
        self,
        dataset: DatasetSpec,
        plan: RefreshPlan,
        schema: pa.Schema,
        spill: PartitionSpill,
    ) -> None:

        self.dataset = dataset
        self.schema = schema
        self.transforms: list[Transform] = [f.transform for f in dataset.acceleration.partition_by]
        self.names = plan.partition_names
        self.planned = {item.key_path for item in plan.items}
        self.spill = spill
        self.scanned = 0
        self.dropped: dict[str, int] = {}
        self.tallies: dict[str, RowTally] = {}
        self._hash_ready = hash_ready
        self._row_sql = row_expression(hash_ready(schema.empty_table(), schema).schema)
        self._connection = hash_connection()
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arrow-stream-hash")
        self._tallying: Future[None] | None = None  # the last batch's tally, still running
        # Facts of the files the survey left pending, learnt from the rows routed (`route`'s `origin`).
        self.learners: dict[str, FactsLearner] = {}

    def close(self) -> None:
        self._hasher.shutdown(wait=True)
        self._connection.close()

    def route(self, table: pa.Table, origin: str | None = None) -> None:
        """Route one batch; `origin`: the fingerprint line of its file, whose facts are learnt on the way
        (its keys are those the routing computed)."""
        learner = None
        if origin is not None:
            learner = self.learners.setdefault(origin, FactsLearner(self.schema, self.transforms))
        if table.num_rows == 0:
            return
        self.scanned += table.num_rows
        group, keys = partition_groups(table, self.transforms)
        if learner is not None:
            learner.add(table, [key.values for key in keys])
        paths = [key.path(self.names) for key in keys]
        counts = self._counted(table, group, paths)
        table, group = self._planned_rows(table, group, counts)
        # The hash runs in DuckDB (its own threads, no GIL) while this thread groups these rows and
        # routes the next batch: the previous batch's tally is waited for only after this one's grouping.
        behind, self._tallying = self._tallying, self._hasher.submit(self._tally, table, group, paths)
        try:
            self._group(table, group, paths, counts)
        finally:
            if behind is not None:
                behind.result()

    def finish(self) -> None:
        """Wait for the last batch's tally (its error, if any, raised here)."""
        pending, self._tallying = self._tallying, None
        if pending is not None:
            pending.result()

    def _counted(self, table: pa.Table, group: pa.Array, paths: list[str]) -> Any:
        """The batch's rows per group of a planned partition (0 for the others, whose rows are counted
        as dropped); every row of the batch in exactly one group, or `ConservationError`."""
        import numpy as np

        counts = np.bincount(group.to_numpy(zero_copy_only=False), minlength=len(paths))
        self._conserved(
            table.num_rows, int(counts.sum()), "rows read in a batch", "rows grouped by partition"
        )
        planned = np.array([path in self.planned for path in paths], dtype=bool)
        for path, rows, kept in zip(paths, counts.tolist(), planned.tolist(), strict=True):
            if not kept:
                self.dropped[path] = self.dropped.get(path, 0) + rows
        return np.where(planned, counts, 0)

    def _conserved(self, expected: int, actual: int, expected_what: str, actual_what: str) -> None:
        """`ConservationError` (nothing written) unless a batch's two counts agree."""
        if expected != actual:
            raise ConservationError(
                self.dataset.name,
                {"[batch]": (expected, actual)},
                expected=expected_what,
                actual=actual_what,
                hint="Routing lost or duplicated rows; nothing was written. Report this with the source.",
            )

    def _planned_rows(self, table: pa.Table, group: pa.Array, counts: Any) -> tuple[pa.Table, pa.Array]:
        """The rows of planned partitions only (a selective refresh neither sorts nor hashes the others'),
        with their group codes; the batch itself when every row is planned. `counts`: `_counted`'s."""
        import pyarrow as pa

        if int(counts.sum()) == table.num_rows:
            return table, group
        keep = pa.array((counts > 0)[group.to_numpy(zero_copy_only=False)])
        return table.filter(keep), group.filter(keep)

    def _group(self, table: pa.Table, group: pa.Array, paths: list[str], counts: Any) -> None:
        """Each planned partition's rows of the batch (`table`: those rows only) into the spill, in
        their order; `counts`: `_counted`'s (rows per group, 0 for unplanned ones)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        self._conserved(
            int(counts.sum()), table.num_rows, "rows of planned partitions in a batch", "rows kept for them"
        )
        if table.num_rows == 0:
            return
        # One stable sort: each partition's rows keep their order.
        ordered = table if len(paths) == 1 else table.take(pc.sort_indices(group))
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
        parts: dict[str, pa.Table] = {}
        for path, start, rows in zip(paths, starts, counts.tolist(), strict=True):
            if path not in self.planned:
                continue
            part = ordered.slice(start, rows)
            # Two groups share a path only if the encoding told apart values that compare equal.
            parts[path] = pa.concat_tables([parts[path], part]) if path in parts else part
        if parts:
            self.spill.add(parts, ordered.get_total_buffer_size())

    def _tally(self, table: pa.Table, group: pa.Array, paths: list[str]) -> None:
        """Count and row hash of the batch's rows per partition (planned ones), into the running tallies."""
        import pyarrow as pa

        if table.num_rows == 0:
            return

        prepared = self._hash_ready(table, self.schema)
        prepared = prepared.append_column(_GROUP_COLUMN, pa.array(group, pa.int64()))
        column = quote_identifier(_GROUP_COLUMN)
        self._connection.register(_TABLE, prepared)
        try:
            result = self._connection.execute(
                f"SELECT {column}, count(*)::BIGINT, sum({self._row_sql})::HUGEINT FROM {_TABLE} "
                f"GROUP BY {column}"
            ).fetchall()
        finally:
            self._connection.unregister(_TABLE)
        for code, rows, total in result:
            path = paths[int(code)]
            if path in self.planned:
                self.tallies.setdefault(path, RowTally()).add(int(rows), int(total))

    @property
    def routed_rows(self) -> int:
        return sum(self.spill.rows.values())


@dataclass(frozen=True)
class SpillFacts:
    """What the streaming refresh held and spilled (for the summary, the logs and the memory test)."""

    budget: int
    peak_held: int  # the most bytes the router's buffers held at once
    spills: int  # spill files written
    spilled_bytes: int
    spilled_partitions: int  # partitions with rows in a spill file
    written_from_memory: int  # partitions written (partly) from rows never spilled


# The facts of the last streamed refresh in this process (tests and benchmarks read them).
last_spill: SpillFacts | None = None


def spill_directory(data_root: Path) -> Path:
    """A fresh private directory for one refresh's spill files (`data_root`: the dataset's data
    directory, `<accelerator_dir>/<dataset>`)."""
    base = spill_base(Path(data_root).parent)
    try:
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        return Path(tempfile.mkdtemp(prefix="arrow-spill-", dir=base))
    except OSError as err:
        raise RefreshError(
            f"cannot create the Arrow refresh's spill directory under {base}: {err}; set {SPILL_DIR_ENV} to "
            "a writable local directory with room for the source's rows"
        ) from err


def streamed_refresh(
    dataset: DatasetSpec,
    plan: RefreshPlan,
    source: Source,
    data_root: Path,
    *,
    selecting: bool,
    engine: PartitionStorage,
    workers: int | None,
    keep_going: bool,
    budget: int | None = None,
    started: float | None = None,
) -> ArrowRefreshResult:
    """`arrow_refresh` for a source that reads in batches: stream, route, spill, then write each partition
    from its spill. Same arguments, same result, same checks; `budget`: the spill budget (bytes), default
    `arrow_spill_budget()`."""
    global last_spill

    started = time.monotonic() if started is None else started
    limit = arrow_spill_budget() if budget is None else budget
    if limit <= 0:
        raise RefreshError(f"the Arrow spill budget must be positive bytes, got {limit}")
    schema = source.schema()
    scratch = spill_directory(data_root)
    try:
        spill = PartitionSpill(scratch, schema, limit)
        router = _route_source(dataset, plan, source, schema, spill)
        routed_total, dropped = _check_routed(dataset, plan, router, spill, selecting=selecting)
        plan = settled_plan(plan, source, router.learners)

        written: dict[str, list[DataFile]] = {}

        def write_one(item: PartitionWorkItem) -> PartitionResult:
            rows = spill.table(item.key_path)
            expected = spill.rows.get(item.key_path, 0)
            if rows.num_rows != expected:
                raise ConservationError(
                    dataset.name,
                    {item.key_path: (expected, rows.num_rows)},
                    expected="rows routed to the partition",
                    actual="rows read back from its spill",
                    hint=f"The spill files under {scratch} did not hold the rows routed to the partition; "
                    "nothing was published. Check the scratch disk, then run the refresh again.",
                )
            files = written.setdefault(item.key_path, [])
            return write_partition(dataset, item, rows, engine, data_root, files, router.tallies)

        results, failures = write_planned(
            dataset.name,
            plan.items,
            write_one,
            engine,
            data_root,
            written,
            workers=workers,
            keep_going=keep_going,
            rows=spill.rows,
        )
        last_spill = _spill_facts(spill, limit)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return ArrowRefreshResult(
        tuple(results),
        router.scanned,
        routed_total,
        dropped,
        time.monotonic() - started,
        failed={path: f"{type(err).__name__}: {err}" for path, err in failures.items()},
    )


def _route_source(
    dataset: DatasetSpec, plan: RefreshPlan, source: Source, schema: pa.Schema, spill: PartitionSpill
) -> _Router:
    """Stream the source's batches through a router into `spill`; returns the closed router."""
    router = _Router(dataset, plan, schema, spill)
    learning = isinstance(source, FileSource) and source.pending_facts is not None
    read: Iterator[tuple[str | None, pa.Table]]
    if isinstance(source, FileSource) and learning:
        read = source.read_batches_by_file(batch_rows=BATCH_ROWS)
    else:
        read = ((None, batch) for batch in source_batches(source))
    try:
        batches = prefetched(read, PREFETCH_BATCHES)
        with closing(batches):  # an error here stops the reader thread too
            for origin, batch in batches:
                router.route(conform_to_schema(batch, schema), origin)
        router.finish()
    finally:
        router.close()
    return router


def learn_facts_in_read(source: Source, learn: bool = True) -> None:
    """Let a file source's survey leave the facts of new or changed files to the streamed read that
    follows (`FileSource.defer_file_facts`), for a refresh whose items do not depend on them (forced: a
    selection, or every partition); `settled_plan` then gives the items their fingerprints. `learn`
    False: its next surveys read them again (once the forced refresh is planned)."""
    if isinstance(source, FileSource):
        source.defer_file_facts = learn


def settled_plan(
    plan: RefreshPlan, source: Source, learners: Mapping[str, FactsLearner] | None
) -> RefreshPlan:
    """`plan` with its items' fingerprints under the facts of the files its survey left pending (a file
    source's `pending_facts`): those the read `learners` learnt, or (None) read now as a survey would;
    `plan` itself when none were pending or the read did not learn them all (its fingerprints hold them)."""
    if not isinstance(source, FileSource) or source.pending_facts is None:
        return plan
    learnt = None if learners is None else {line: learner.facts() for line, learner in learners.items()}
    fingerprints = source.settle_pending_facts(learnt, [item.partition_key.values for item in plan.items])
    return plan if fingerprints is None else plan.with_fingerprints(fingerprints)


def _check_routed(
    dataset: DatasetSpec, plan: RefreshPlan, router: _Router, spill: PartitionSpill, *, selecting: bool
) -> tuple[int, int]:
    """Every row read was routed, to a planned partition, and every discovered partition got rows:
    (rows routed to planned partitions, rows of unplanned ones)."""
    routed_total = router.routed_rows
    dropped = check_routed_counts(
        dataset.name,
        plan,
        selecting=selecting,
        scanned=router.scanned,
        routed_total=routed_total,
        unplanned=dict(router.dropped),
        has_rows=lambda path: bool(spill.rows.get(path)),
    )
    return routed_total, dropped


def _spill_facts(spill: PartitionSpill, limit: int) -> SpillFacts:
    return SpillFacts(
        budget=limit,
        peak_held=spill.peak_held,
        spills=len(spill.runs),
        spilled_bytes=spill.spilled_bytes,
        spilled_partitions=len({path for run in spill.runs for path in run.batches}),
        written_from_memory=spill.from_memory,
    )


def spill_facts() -> dict[str, Any] | None:
    """The last streamed refresh's spill facts as JSON (None before any)."""
    facts = last_spill
    if facts is None:
        return None
    return dataclasses.asdict(facts)
