"""`verify`: prove a dataset's acceleration still equals its source, partition by partition, and repair it.

Per partition, the row count and row hash (`write/row_hash.py`) are computed on the source side (one
DuckDB aggregate grouped by partition over the whole source: Parquet files read by DuckDB itself, other
sources as the connector's typed Arrow rows; one partition's predicate pushed down where the source can
prune; keys computed by the dataset's transforms) and on the acceleration side (a partition whose files'
bytes still match the catalog's SHA-256s is known by the certificate its commit bound to those files;
otherwise, or with `deep`, the files are read back, grouped by the catalog entry that holds them, so a
row filed under the wrong partition is seen, and compared with their certificate). Each partition is
`equal`, `drifted`, `missing` (rows in the source, none in the acceleration) or `extra` (rows in the
acceleration, none in the source). During a re-partitioning the acceleration side spans both layouts:
each partition of an older spec is read back, its rows tallied under the current spec's keys (computed as
on the source side), and added to the current partitions they belong to, so each current partition is its
source rows against its current-layout files plus its rows still in old partitions. `repair` refreshes
exactly the partitions that are not equal, in one commit, and verifies again.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.catalog.model import format_time, parse_time, qualified_key_path, split_key_path
from airflow_partitions.exceptions import RefreshError, StorageError
from airflow_partitions.keys import escape_component
from airflow_partitions.quoting import quote_identifier
from airflow_partitions.refresh.failures import STATE_DIRECTORY
from airflow_partitions.refresh.pipeline import (
    bind_dataset,
    load_project,
    plan_refresh,
    refresh_dataset,
    resolve_dataset,
)
from airflow_partitions.sources import open_dataset_source
from airflow_partitions.sources.files import FileSource
from airflow_partitions.sources.postgres import PostgresSource
from airflow_partitions.storage import get_storage
from airflow_partitions.storage.datafile import file_checksum
from airflow_partitions.storage.remote import fetch_partition_files
from airflow_partitions.table import open_handle
from airflow_partitions.write.repartition import repartition
from airflow_partitions.write.routing import partition_groups
from airflow_partitions.write.row_hash import (
    RowTally,
    algorithm,
    certificates_equal,
    duckdb_types,
    files_digest,
    hash_connection,
    hash_ready,
    tally_by_partition,
    tally_parquet_files,
    tally_relation_by_partition,
    tally_rows,
    tally_table_by_partition,
)

if TYPE_CHECKING:
    from airflow_partitions.catalog import Catalog, PartitionEntry, PartitionSpecInfo
    from airflow_partitions.sources import Source
    from airflow_partitions.spec.model import DatasetSpec, ProjectSpec

# The last verify result of a dataset, kept beside its catalog (status and the UI show it).
LAST_VERIFY_NAME = "last_verify.json"


class Verdict(enum.StrEnum):
    EQUAL = "equal"
    DRIFTED = "drifted"
    MISSING = "missing"  # rows in the source, no partition (or an empty one) in the acceleration
    EXTRA = "extra"  # a partition with rows in the acceleration, none in the source


@dataclass(frozen=True)
class PartitionCheck:
    """One partition's verdict, with both sides' counts and hashes and the certificate's."""

    key_path: str
    verdict: Verdict
    source_rows: int
    source_hash: str | None
    acceleration_rows: int
    acceleration_hash: str | None
    # True / False: the files match / differ from the certificate their commit recorded; None: none.
    certificate_matches: bool | None = None
    reason: str = ""
    # How the acceleration side was known: "certificate" (the files' bytes match their catalog SHA-256s
    # and the certificate bound to them), "recomputed" (read and hashed), "" (no files).
    checked_by: str = ""
    # During a re-partitioning: the partitions of older specs (qualified key paths) holding rows of this
    # one, and how many (counted in `acceleration_rows` / `acceleration_hash`).
    old_layout: tuple[str, ...] = ()
    old_layout_rows: int = 0
    # A partition of an older spec: its rows whose own key under that spec is another partition's
    # (reads pruned by that spec would miss them).
    misfiled_rows: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "key_path": self.key_path,
            "verdict": str(self.verdict),
            "source_rows": self.source_rows,
            "source_hash": self.source_hash,
            "acceleration_rows": self.acceleration_rows,
            "acceleration_hash": self.acceleration_hash,
            "certificate_matches": self.certificate_matches,
            "reason": self.reason,
            "checked_by": self.checked_by,
            "old_layout_partitions": list(self.old_layout),
            "old_layout_rows": self.old_layout_rows,
            "misfiled_rows": self.misfiled_rows,
        }


@dataclass(frozen=True)
class VerifyProgress:
    """One progress tick: phase ("source" | "acceleration" | "compare" | "repair" | "done")."""

    phase: str
    done: int
    total: int
    rows: int
    elapsed_s: float


ProgressCallback = Callable[[VerifyProgress], None]


@dataclass
class VerifyReport:
    """What `verify_dataset` found, JSON-ready for `--json`, XCom and the last-verify record."""

    dataset: str
    version: int | None
    partitions: list[PartitionCheck]
    verified_at: dt.datetime
    elapsed_s: float
    selection: str | None = None
    # After `repair`: the refresh's new version and the report of the verify that followed it.
    repaired_version: int | None = None
    repaired: list[str] = field(default_factory=list)
    after_repair: VerifyReport | None = None
    # How the source was read ("duckdb", "arrow-stream", "arrow", "per partition"), and whether every
    # partition's files were read even where a certificate could stand for them (`deep`).
    source_read: str | None = None
    deep: bool = False
    # During a re-partitioning: the partitions of older specs read and routed under the current
    # partition_by, and their rows.
    old_partitions: int = 0
    old_rows: int = 0

    def checked_by(self) -> dict[str, int]:
        """Partitions whose acceleration side was known by certificate, and recomputed from files."""
        out = {"certificate": 0, "recomputed": 0}
        for check in self.partitions:
            if check.checked_by in out:
                out[check.checked_by] += 1
        return out

    def old_layout_json(self) -> dict[str, Any]:
        """The partitions of older specs this verify read, and the partitions that had rows in them."""
        held = [c.key_path for c in self.partitions if c.old_layout]
        return {
            "partitions": self.old_partitions,
            "rows": self.old_rows,
            "partitions_with_old_rows": held,
        }

    def counts(self) -> dict[str, int]:
        out = {str(v): 0 for v in Verdict}
        for check in self.partitions:
            out[str(check.verdict)] += 1
        return out

    @property
    def differing(self) -> list[PartitionCheck]:
        return [c for c in self.partitions if c.verdict is not Verdict.EQUAL]

    @property
    def ok(self) -> bool:
        """Equal everywhere (after a repair: the verify that followed it)."""
        if self.after_repair is not None:
            return self.after_repair.ok
        return not self.differing

    @property
    def result(self) -> str:
        if self.after_repair is not None:
            return "repaired" if self.after_repair.ok else "drifted"
        return "equal" if not self.differing else "drifted"

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "version": self.version,
            "verified_at": format_time(self.verified_at),
            "result": self.result,
            "ok": self.ok,
            "selection": self.selection,
            "counts": self.counts(),
            "checked_by": self.checked_by(),
            "source_read": self.source_read,
            "deep": self.deep,
            "old_layout": self.old_layout_json(),
            "source_rows": sum(c.source_rows for c in self.partitions),
            "acceleration_rows": sum(c.acceleration_rows for c in self.partitions),
            "elapsed_s": round(self.elapsed_s, 3),
            "partitions": [c.to_json() for c in self.partitions],
            "repaired": list(self.repaired),
            "repaired_version": self.repaired_version,
            "after_repair": self.after_repair.to_json() if self.after_repair is not None else None,
        }

    def summary_json(self) -> dict[str, Any]:
        """The small record kept as the dataset's last verify (no per-partition rows but the differing)."""
        final = self.after_repair or self
        return {
            "dataset": self.dataset,
            "version": final.version,
            "verified_at": format_time(final.verified_at),
            "result": self.result,
            "counts": final.counts(),
            "differing": [c.key_path for c in final.differing][:50],
            "repaired": list(self.repaired),
        }


def verify_dataset(
    project: ProjectSpec | str | os.PathLike[str],
    dataset: DatasetSpec | str,
    *,
    partitions: Sequence[str] | None = None,
    where: str | None = None,
    repair: bool = False,
    progress: ProgressCallback | None = None,
    source: Source | None = None,
    catalog: Catalog | None = None,
    record: bool = True,
    strategy: str = "auto",
    deep: bool = False,
) -> VerifyReport:
    """Compare the dataset's latest catalog version with its source, partition by partition.

    `partitions` (key strings as `refresh --partitions` takes them) or `where` (SQL over partition values
    or source columns, as `refresh --where`) narrow the check; the source is then read one partition at a
    time where it can prune (Hive files, Postgres with monotonic transforms). `repair` refreshes every
    partition that is not equal in one commit and verifies them again (`after_repair`). The result is
    recorded next to the catalog (`record`) for `status` and the Partitions page. `strategy` is the
    repair refresh's (`refresh_dataset`). A partition whose files still hash to the SHA-256s the catalog
    records, and whose certificate is bound to those files, is known by its certificate without decoding
    a row (`checked_by`); `deep` reads and hashes every partition's files anyway. During a
    re-partitioning, a partition's acceleration side is its current-layout files plus its rows still in
    partitions of older specs, which are always read (`PartitionCheck.old_layout`).
    """

    started = time.monotonic()
    project = load_project(project)
    spec = resolve_dataset(project, dataset)
    source = source or open_dataset_source(spec)
    bound = bind_dataset(spec, source)
    catalog = catalog or open_handle(project, spec).catalog
    schema = source.schema()

    def tick(phase: str, done: int, total: int, rows: int) -> None:
        if progress is not None:
            progress(VerifyProgress(phase, done, total, rows, time.monotonic() - started))

    snapshot = catalog.latest()
    # During a re-partitioning (or after a partition_by change no batch has moved yet), partitions of
    # other specs hold rows of the current partitions: they are read and routed under the current spec.
    # The dataset's own partitions are keyed by their plain key paths, as the source side's (qualified
    # while a reverted partition_by has not yet been made current again).
    spec_id = bound.acceleration.partition_spec_id
    stored = dict(snapshot.partitions.items()) if snapshot is not None else {}
    entries = {split_key_path(p)[1]: entry for p, entry in stored.items() if entry.spec_id == spec_id}
    old = [entry for entry in stored.values() if entry.spec_id != spec_id]
    transforms = [f.transform for f in bound.acceleration.partition_by]
    names = bound.acceleration.partition_names
    selecting = partitions is not None or where is not None
    tick("source", 0, 0, 0)
    certified: dict[str, RowTally] | None = None
    wanted: set[str] | None = None
    if selecting:
        source_read = "per partition"
        source_tallies, wanted = _selected_source_tallies(
            project, spec, source, transforms, names, partitions, where, tick
        )
        entries = {path: entry for path, entry in entries.items() if path in wanted}
    else:
        # The files' checksums are read while DuckDB reads the source: both wait on I/O and release
        # the GIL, and neither needs the other.
        certifying = None if deep else _certify_in_background(project, spec, catalog, entries)
        try:
            by_key, source_read = _tally_whole_source(source, schema, transforms)
        finally:
            certified = certifying.result() if certifying is not None else None
        source_tallies = {key.path(names): tally for key, tally in by_key.items()}
    tick("source", len(source_tallies), len(source_tallies), sum(t.rows for t in source_tallies.values()))

    layouts = _OldLayouts(old, transforms, names, wanted, snapshot.specs if snapshot is not None else {})
    checks = _compare(project, spec, catalog, entries, source_tallies, schema, tick, deep, certified, layouts)
    report = VerifyReport(
        dataset=spec.name,
        version=snapshot.version if snapshot is not None else None,
        partitions=checks,
        verified_at=dt.datetime.now(dt.UTC),
        elapsed_s=time.monotonic() - started,
        selection=_selection_text(partitions, where),
        source_read=source_read,
        deep=deep,
        old_partitions=len(old),
        old_rows=sum(entry.rows for entry in old),
    )
    if repair and report.differing:
        report = _repair(project, spec, report, catalog, progress, tick, strategy)
    tick("done", len(checks), len(checks), sum(c.source_rows for c in checks))
    report.elapsed_s = time.monotonic() - started
    if record:
        record_last_verify(catalog, report)
    return report


def _selected_source_tallies(
    project: ProjectSpec,
    spec: DatasetSpec,
    source: Source,
    transforms: Sequence[Any],
    names: Sequence[str],
    partitions: Sequence[str] | None,
    where: str | None,
    tick: Callable[[str, int, int, int], None],
) -> tuple[dict[str, RowTally], set[str]]:
    """Source tallies of the selected partitions, and the key paths selected on either side (discovery
    names the source's; the catalog's selected partitions gone from the source are in `plan.removed`)."""

    plan = plan_refresh(
        project, spec, partitions=partitions, where=where, full=True, source=source, siblings=False
    )
    keys = {item.key_path: item.partition_key for item in plan.items}
    wanted = set(keys) | set(plan.removed)
    schema = source.schema()
    tallies: dict[str, RowTally] = {}
    if source.can_read_partition(transforms) or _pushes_predicates(source, transforms):
        rows = 0

        for done, (key_path, key) in enumerate(sorted(keys.items()), start=1):
            with hash_connection() as connection:
                if isinstance(source, PostgresSource):  # batch by batch: a partition need not fit in memory
                    batches = source.read_batches(transforms=transforms, key=key.values)
                    streamed = tally_table_by_partition(
                        _ready_stream(batches, schema), schema, [], connection
                    )
                    tally = next(iter(streamed.values()), RowTally())
                else:
                    tally = tally_rows(
                        source.read_partition(transforms, key.values, None), schema, connection
                    )
            if tally.rows:
                tallies[key_path] = tally
            rows += tally.rows
            tick("source", done, len(keys), rows)
    else:
        for key, tally in _tally_whole_source(source, schema, transforms)[0].items():
            if key.path(names) in keys:
                tallies[key.path(names)] = tally
    return tallies, wanted


def _tally_source(table: Any, schema: Any, transforms: Sequence[Any]) -> dict[Any, RowTally]:
    with hash_connection() as connection:
        return tally_table_by_partition(table, schema, transforms, connection)


def _tally_whole_source(
    source: Source, schema: Any, transforms: Sequence[Any]
) -> tuple[dict[Any, RowTally], str]:
    """Count and row hash per partition key of every source row, and how the source was read.

    Parquet files (local, no Hive directories) are read by DuckDB itself, each group of files with one
    physical schema cast to the source schema column by column (only casts DuckDB and Arrow perform
    alike: `_same_cast`); CSV, JSON, Hive layouts and object stores stream the connector's own typed
    Arrow batches into DuckDB; other sources (Postgres, Spark) hand over their typed Arrow rows. Each way
    ends in one DuckDB aggregate grouped by partition (`tally_relation_by_partition`)."""
    import duckdb

    if not _grouped_in_sql(schema, transforms):
        # A partition field not over one source column: routed by the refresh's own code instead.
        with hash_connection() as connection:
            return tally_by_partition(source.read_all(), schema, transforms, connection), "arrow"
    if isinstance(source, FileSource):
        with hash_connection() as connection:
            connection.execute("SET TimeZone = 'UTC'")  # naive <-> tz-aware casts as Arrow does them
            relation = _parquet_relation(source, schema, connection)
            if relation is not None:
                try:
                    sql, columns = relation
                    tallies = tally_relation_by_partition(sql, schema, transforms, connection, columns)
                    return tallies, "duckdb"
                except duckdb.Error:
                    pass  # a value DuckDB cannot cast as Arrow would: the connector's read names it
            try:
                return tally_table_by_partition(
                    _file_batches(source, schema), schema, transforms, connection
                ), "arrow-stream"
            except (duckdb.Error, OSError, ValueError):
                pass  # the connector's whole read below raises its own error, naming the file

    if isinstance(source, PostgresSource):
        # Postgres' rows stream batch by batch into the one aggregate: the table need not fit in memory.
        batches = source.read_batches()
        with hash_connection() as connection:
            return tally_table_by_partition(
                _ready_stream(batches, schema), schema, transforms, connection
            ), "postgres-stream"
    return _tally_source(source.read_all(), schema, transforms), "arrow"


def _ready_stream(batches: Any, schema: Any) -> Any:
    """A stream of batches conformed to the hash (`hash_ready`), one batch at a time."""
    import pyarrow as pa

    ready_schema = hash_ready(schema.empty_table(), schema).schema

    def ready() -> Any:
        for batch in batches:
            if batch.num_rows:
                yield from hash_ready(pa.Table.from_batches([batch]), schema).to_batches()

    return pa.RecordBatchReader.from_batches(ready_schema, ready())


def _parquet_relation(source: Any, schema: Any, connection: Any) -> tuple[str, list[str]] | None:
    """DuckDB SQL reading a local, non-Hive Parquet source as the connector does (`FileSource._dataset`
    under the source schema): a `read_parquet` per group of files of one physical schema, each column
    cast to the schema's type, a column a file lacks as NULL; None when any file needs a cast DuckDB may
    perform otherwise than Arrow (or holds a type the DuckDB read may map otherwise)."""
    if source.file_format != "parquet" or source.is_s3 or source.hive_columns:
        return None
    if any(_nested(field.type) for field in schema):
        return None
    files = source.list_files()
    try:
        types = duckdb_types(schema, connection)
    except Exception:
        return None
    if any(set(f.path) & _DUCKDB_GLOB for f in files):
        return None  # DuckDB would expand the name as a pattern
    groups: dict[Any, list[str]] = {}
    for path, own in source.file_schemas(files).items():
        groups.setdefault(own, []).append(path)
    branches: list[str] = []
    names = [quote_identifier(field.name) for field in schema]
    for own, paths in groups.items():
        if not _reads_as(connection, paths[0], own):
            return None
        columns: list[str] = []
        for target, name, sql_type in zip(schema, names, types, strict=True):
            if target.name not in own.names:
                columns.append(f"CAST(NULL AS {sql_type}) AS {name}")
                continue
            if not _same_cast(own.field(target.name).type, target.type):
                return None
            columns.append(f"CAST({name} AS {sql_type}) AS {name}")
        listed = ", ".join("'" + path.replace("'", "''") + "'" for path in paths)
        branches.append(f"SELECT {', '.join(columns)} FROM read_parquet([{listed}])")
    return "(" + " UNION ALL ".join(branches) + ")", names


_DUCKDB_GLOB = frozenset("*?[]{}")


def _reads_as(connection: Any, path: str, own: Any) -> bool:
    """Whether DuckDB reads the Parquet file's columns as the types Arrow's reading of it maps to (not so
    for e.g. INT96 timestamps, which Arrow reads in nanoseconds and DuckDB in microseconds)."""
    try:
        expected = dict(zip(own.names, duckdb_types(own, connection), strict=True))
        listed = "'" + path.replace("'", "''") + "'"
        described = connection.execute(f"DESCRIBE SELECT * FROM read_parquet([{listed}])").fetchall()
    except Exception:
        return False
    return all(_read_type_holds(expected.get(str(row[0])), str(row[1])) for row in described)


# DuckDB's timestamp types, coarsest first, naive and with time zone.
_TIMESTAMP_UNITS = (
    ("TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP", "TIMESTAMP_NS"),
    ("TIMESTAMP WITH TIME ZONE",),
)


def _read_type_holds(expected: str | None, read: str) -> bool:
    """DuckDB reads a column as `expected`, or as a timestamp at least as fine (Parquet millisecond
    timestamps come back in microseconds: the same instants)."""
    if expected == read:
        return True
    for family in _TIMESTAMP_UNITS:
        if expected in family and read in family:
            return family.index(read) >= family.index(expected)
    return False


def _nested(data_type: Any) -> bool:
    import pyarrow as pa

    return bool(
        pa.types.is_nested(data_type)
        or pa.types.is_float16(data_type)
        or pa.types.is_decimal256(data_type)
        or (pa.types.is_dictionary(data_type) and _nested(data_type.value_type))
    )


def _same_cast(own: Any, target: Any) -> bool:
    """Whether DuckDB casting a Parquet column of Arrow type `own` to `target` gives the values pyarrow's
    cast gives (or fails where it fails): the identity, lossless widenings, string and timestamp forms
    (with the connection's TimeZone UTC, as Arrow reads a naive timestamp as UTC)."""
    import pyarrow as pa

    if pa.types.is_dictionary(own):
        own = own.value_type
    if pa.types.is_dictionary(target):
        target = target.value_type
    if own == target:
        return True
    strings = (pa.types.is_string, pa.types.is_large_string)
    binaries = (pa.types.is_binary, pa.types.is_large_binary)
    for family in (strings, binaries):
        if any(f(own) for f in family) and any(f(target) for f in family):
            return True
    if pa.types.is_integer(own) and pa.types.is_integer(target):
        return True  # equal where both succeed; both fail on overflow
    if pa.types.is_integer(own) and pa.types.is_floating(target):
        return own.bit_width <= 32 and target.bit_width == 64
    if pa.types.is_floating(own) and pa.types.is_floating(target):
        return own.bit_width == 32 and target.bit_width == 64
    if pa.types.is_date(own) and pa.types.is_date(target):
        return True
    if pa.types.is_timestamp(own) and pa.types.is_timestamp(target):
        units = ["s", "ms", "us", "ns"]
        return units.index(own.unit) <= units.index(target.unit)
    if pa.types.is_decimal(own) and pa.types.is_decimal(target):
        return own.scale == target.scale and own.precision <= target.precision
    return False


def _file_batches(source: Any, schema: Any) -> Any:
    """The connector's own read of every file (`FileSource._dataset` and `_typed`, as `read_files`), as
    a stream of batches conformed to the hash (`hash_ready`), never held whole."""
    import pyarrow as pa

    files = source.list_files()
    dataset = source._dataset(files, schema)
    ready_schema = hash_ready(schema.empty_table(), schema).schema

    def batches() -> Any:
        for batch in dataset.to_batches(batch_size=1 << 17):
            if batch.num_rows:
                table = hash_ready(pa.Table.from_batches([source._typed(batch, schema)]), schema)
                yield from table.to_batches()

    return pa.RecordBatchReader.from_batches(ready_schema, batches())


def _pushes_predicates(source: Source, transforms: Sequence[Any]) -> bool:
    """A Postgres source takes a partition's WHERE whenever every transform has a preimage (monotonic),
    index or not: a verify reads the selected partitions only, not the table once per partition."""
    return (
        source.kind == "postgres"
        and bool(transforms)
        and all(getattr(t, "monotonic", False) for t in transforms)
    )


def _compare(
    project: ProjectSpec,
    spec: DatasetSpec,
    catalog: Catalog,
    entries: dict[str, PartitionEntry],
    source_tallies: dict[str, RowTally],
    schema: Any,
    tick: Callable[[str, int, int, int], None],
    deep: bool = False,
    certified: dict[str, RowTally] | None = None,
    layouts: _OldLayouts | None = None,
) -> list[PartitionCheck]:
    """Each partition judged; `certified`: the partitions `_certified_entries` already found intact;
    `layouts`: partitions of older specs, whose rows count towards the current partitions they route to."""
    checks: list[PartitionCheck] = []
    rows = 0
    with _acceleration_files(project, spec, catalog) as (storage, root, fetch), ExitStack() as stack:
        if certified is None:
            certified = {} if deep else _certified_entries(entries, root, fetch)
        to_read = {path: entry for path, entry in entries.items() if path not in certified}
        old = layouts.entries if layouts is not None else ()
        # A DuckDB connection only for files to read (opening one costs tens of milliseconds).
        connection = stack.enter_context(hash_connection()) if to_read or old else None
        by_file = _parquet_tallies(spec, storage, root, fetch, to_read, schema, connection) if to_read else {}
        held: dict[str, _OldRows] = {}
        unreadable: dict[str, tuple[int, str]] = {}
        if layouts is not None and old:
            held, unreadable = _old_layout_tallies(layouts, storage, root, fetch, schema, connection)
        paths = sorted(set(entries) | set(source_tallies) | set(held))
        for done, path in enumerate(paths, start=1):
            want = source_tallies.get(path, RowTally())
            got, certificate, reason, checked_by = _current_side(
                entries.get(path), certified.get(path), storage, root, fetch, by_file, schema, connection
            )
            moved = held.get(path)
            if moved is not None and got.rows >= 0:
                got.add(moved.tally.rows, moved.tally.total)
                checked_by = "recomputed"  # its rows in old partitions were read and hashed
            rows += max(got.rows, 0)
            checks.append(_judge(path, want, got, certificate, reason, checked_by, moved))
            tick("compare", done, len(paths), rows)
    checks.extend(
        PartitionCheck(
            name,
            Verdict.DRIFTED,
            0,
            None,
            held_rows,
            None,
            reason=why,
            old_layout=(name,),
            old_layout_rows=held_rows,
        )
        for name, (held_rows, why) in sorted(unreadable.items())
    )
    misfiled = {name: counts for rows in held.values() for name, counts in rows.misfiled.items()}
    checks.extend(
        _misfiled_check(name, rows, wrong, layouts) for name, (rows, wrong) in sorted(misfiled.items())
    )
    return checks


def _misfiled_check(name: str, rows: int, wrong: int, layouts: _OldLayouts | None) -> PartitionCheck:
    """The verdict of an old-layout partition holding rows of other partitions under its own spec."""
    spec = layouts.specs.get(split_key_path(name)[0] or "") if layouts is not None else None
    described = f" ({spec.describe()})" if spec is not None else ""
    return PartitionCheck(
        name,
        Verdict.DRIFTED,
        0,
        None,
        rows,
        None,
        reason=f"{wrong:,} of its {rows:,} row(s) belong to other partitions under the partition_by it was "
        f"written with{described}: reads pruned by it would miss them; `verify --repair` moves the "
        "partition into the current partition_by, each row by its own values",
        checked_by="recomputed",
        old_layout=(name,),
        old_layout_rows=rows,
        misfiled_rows=wrong,
    )


def _current_side(
    entry: PartitionEntry | None,
    known: RowTally | None,
    storage: Any,
    root: Path,
    fetch: Callable[[Sequence[Any]], None],
    by_file: dict[str, RowTally] | None,
    schema: Any,
    connection: Any,
) -> tuple[RowTally, bool | None, str, str]:
    """A current-layout entry's rows: its tally (`known`: by its certificate; else read back; rows -1:
    unreadable), whether it matches the entry's certificate, why it could not be read, how it was known."""
    if known is not None:  # copied: rows in old partitions may be added to it
        return RowTally(known.rows, known.total), True, "", "certificate"
    if entry is None or not entry.files:
        return RowTally(), None, "", ""
    if by_file is not None:
        got = RowTally()
        for file in entry.files:
            part = by_file[str(root / file.path)]
            got.add(part.rows, part.total)
        return got, certificates_equal(entry.certificate, got), "", "recomputed"
    try:
        fetch(entry.files)
        got = tally_rows(storage.read(root, entry.files), schema, connection)
    except StorageError as err:
        reason = f"the acceleration's files cannot be read as the source's rows: {err}"
        return RowTally(-1), None, reason, "recomputed"
    return got, certificates_equal(entry.certificate, got), "", "recomputed"


@dataclass(frozen=True)
class _OldLayouts:
    """Partitions written under other specs than the current one, and the current spec's transforms and
    field names their rows are routed by; `wanted`: the current key paths a selection checks (None: all)."""

    entries: Sequence[PartitionEntry]
    transforms: Sequence[Any]
    names: Sequence[str]
    wanted: set[str] | None = None
    specs: Mapping[str, PartitionSpecInfo] = field(default_factory=dict)  # by spec id: each entry's own


@dataclass
class _OldRows:
    """A current partition's rows held by partitions of older specs: their tally, those partitions
    (qualified key paths) and whether they all match their certificates (None: none to compare)."""

    tally: RowTally = field(default_factory=RowTally)
    partitions: set[str] = field(default_factory=set)
    certificate: bool | None = None
    # Those of `partitions` holding rows of other partitions under their own spec: (rows, misfiled rows).
    misfiled: dict[str, tuple[int, int]] = field(default_factory=dict)


def _all_match(first: bool | None, second: bool | None) -> bool | None:
    """Certificate matches of two parts of a partition: False if either differs, None if neither has one."""
    if first is None or second is None:
        return second if first is None else first
    return first and second


def _old_layout_tallies(
    layouts: _OldLayouts,
    storage: Any,
    root: Path,
    fetch: Callable[[Sequence[Any]], None],
    schema: Any,
    connection: Any,
) -> tuple[dict[str, _OldRows], dict[str, tuple[int, str]]]:
    """Per current key path, the rows old-layout partitions hold for it. Each old partition's files are read
    back (as a re-partitioning batch reads them) and tallied per current partition key in one DuckDB
    aggregate with the keys the source side computes (`_tally_by_key`); its whole tally is compared with
    its certificate. Also the old partitions (qualified key paths) whose files cannot be read as the
    source's rows, with the rows their entries record and why (reported as drifted themselves: the
    current partitions their rows belong to then differ too)."""
    held: dict[str, _OldRows] = {}
    unreadable: dict[str, tuple[int, str]] = {}
    for entry in layouts.entries:
        if not entry.files:
            continue
        name = qualified_key_path(entry.spec_id, split_key_path(entry.key_path)[1])
        try:
            fetch(entry.files)
            table = storage.read(root, entry.files)
            by_key = _tally_by_key(table, schema, layouts.transforms, connection)
        except StorageError as err:
            unreadable[name] = (
                entry.rows,
                "the files of this partition of an older partition_by cannot be read as the source's rows, "
                f"so its rows cannot be routed under the current one: {err}",
            )
            continue
        whole = RowTally()
        for tally in by_key.values():
            whole.add(tally.rows, tally.total)
        certificate = certificates_equal(entry.certificate, whole)
        misfiled = _misfiled_rows(table, entry, layouts.specs.get(entry.spec_id))
        for key, tally in by_key.items():
            path = key.path(layouts.names)
            if layouts.wanted is not None and path not in layouts.wanted:
                continue
            rows = held.setdefault(path, _OldRows())
            rows.tally.add(tally.rows, tally.total)
            rows.partitions.add(name)
            rows.certificate = _all_match(rows.certificate, certificate)
            if misfiled:
                rows.misfiled[name] = (whole.rows, misfiled)
    return held, unreadable


def _misfiled_rows(table: Any, entry: PartitionEntry, spec: PartitionSpecInfo | None) -> int:
    """The rows of `table` (an old-layout partition's) whose key under the partition's own spec is not
    the partition's key; 0 when a field of that spec cannot be computed over the stored columns."""
    if spec is None or not table.num_rows:
        return 0
    from airflow_partitions.pruning import bind_fields  # lazy: loads pyarrow

    bound = bind_fields([(info.name, info.canonical) for info in spec.fields], table.schema)
    if len(bound) != len(spec.fields):
        return 0  # a column renamed, dropped or retyped since: the key cannot be recomputed here
    import numpy as np  # lazy: loads numpy

    group, keys = partition_groups(table, [field.transform for field in bound])
    counts = np.bincount(group.to_numpy(zero_copy_only=False), minlength=len(keys)).tolist()
    own = split_key_path(entry.key_path)[1]
    return sum(rows for key, rows in zip(keys, counts, strict=True) if key.path(spec.names) != own)


def _tally_by_key(table: Any, schema: Any, transforms: Sequence[Any], connection: Any) -> dict[Any, RowTally]:
    """Count and row hash per partition key of `table` (keys as the source side computes them: in one
    DuckDB aggregate when every field reads source columns, else routed by the refresh's own code)."""
    if _grouped_in_sql(schema, transforms):
        return tally_table_by_partition(table, schema, transforms, connection)
    return tally_by_partition(table, schema, transforms, connection)


def _grouped_in_sql(schema: Any, transforms: Sequence[Any]) -> bool:
    """Whether every partition field reads columns of `schema` (DuckDB can group by their pre-keys)."""
    return all(all(c in schema.names for c in t.source_columns) for t in transforms)


def _certify_in_background(
    project: ProjectSpec, spec: DatasetSpec, catalog: Catalog, entries: dict[str, PartitionEntry]
) -> Any:
    """A future of `_certified_entries` over local files (None for an `s3://` accelerator_dir, whose
    files are fetched when compared)."""
    handle = open_handle(project, spec)
    if not handle.local_data:
        return None
    from concurrent.futures import ThreadPoolExecutor

    root = Path(catalog.data_root or handle.local_root)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify-certificates")
    try:
        return pool.submit(_certified_entries, entries, root, lambda files: None)
    finally:
        pool.shutdown(wait=False)


def _certified_entries(
    entries: dict[str, PartitionEntry], root: Path, fetch: Callable[[Sequence[Any]], None]
) -> dict[str, RowTally]:
    """The partitions whose certificate stands for their files, with its count and hash: certified by
    this release's row hash, bound to exactly the catalog's files (`files_digest`), and every file's
    bytes still hash to the SHA-256 the catalog records. Hashing bytes costs a fraction of decoding and
    hashing rows; the certificate was computed from those rows when they were written."""
    from concurrent.futures import ThreadPoolExecutor

    candidates = {
        path: entry
        for path, entry in entries.items()
        if entry.files
        and entry.certificate is not None
        and entry.certificate.algorithm == algorithm()
        and entry.certificate.files == files_digest(entry.files)
    }
    files = [file for entry in candidates.values() for file in entry.files]
    if not files:
        return {}
    try:
        fetch(files)
    except StorageError:
        return {}  # each partition is then read through its engine, which names what is wrong

    def intact(file: Any) -> bool:
        local = root / file.path
        try:
            return bool(
                local.is_file()
                and local.stat().st_size == file.bytes
                and file_checksum(local) == file.checksum
            )
        except OSError:
            return False

    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1, len(files))) as pool:
        good = {id(file) for file, ok in zip(files, pool.map(intact, files), strict=True) if ok}
    out: dict[str, RowTally] = {}
    for path, entry in candidates.items():
        certificate = entry.certificate
        if certificate is not None and all(id(file) in good for file in entry.files):
            out[path] = RowTally(certificate.rows, int(certificate.row_hash, 16))
    return out


def _parquet_tallies(
    spec: DatasetSpec,
    storage: Any,
    root: Path,
    fetch: Callable[[Sequence[Any]], None],
    entries: dict[str, PartitionEntry],
    schema: Any,
    connection: Any,
) -> dict[str, RowTally] | None:
    """Per-file tallies of every entry's files in one DuckDB scan, for the parquet engine (its files are
    plain Parquet); None for other engines, or when that scan fails (then each partition is read through
    its engine, which names what is wrong)."""
    from airflow_partitions.storage.parquet import (  # lazy: pyarrow; Airflow tasks import refresh/ light
        ParquetStorage,
    )

    if not isinstance(storage, ParquetStorage):
        return None
    files = [file for entry in entries.values() for file in entry.files]
    try:
        fetch(files)
    except StorageError:
        return None
    return tally_parquet_files([str(root / file.path) for file in files], schema, connection)


def _judge(
    path: str,
    want: RowTally,
    got: RowTally,
    certificate: bool | None,
    reason: str,
    checked_by: str = "",
    old: _OldRows | None = None,
) -> PartitionCheck:
    """One partition's verdict; `old`: its rows in partitions of older specs (counted in `got`). Only
    `certificate`, its current-layout files', turns equal rows into drift: an old partition's certificate
    covers rows of other partitions too, each of which is judged by its rows."""
    reported = _all_match(certificate, old.certificate) if old is not None else certificate
    unreadable = got.rows < 0
    got_rows = max(got.rows, 0)
    if not unreadable and want == got:
        verdict = Verdict.EQUAL
        if certificate is False:
            # The rows equal the source again (changed back?) but not what the commit certified.
            verdict, reason = Verdict.DRIFTED, "the files do not hold the rows their commit certified"
    elif got_rows == 0 and not unreadable:
        verdict, reason = Verdict.MISSING, f"{want.rows:,} source row(s), none in the acceleration"
    elif want.rows == 0:
        verdict = Verdict.EXTRA
        reason = reason or f"{got_rows:,} row(s) in the acceleration, none in the source"
    else:
        verdict = Verdict.DRIFTED
        if not reason:
            reason = (
                f"{want.rows:,} source row(s) vs {got_rows:,} in the acceleration"
                if want.rows != got_rows
                else "same count, different rows (a value changed, or rows moved between partitions)"
            )
        if reported is False:
            reason += "; the files also differ from their commit's certificate"
    old_layout = tuple(sorted(old.partitions)) if old is not None else ()
    if old is not None and verdict is not Verdict.EQUAL:
        reason += (
            f"; {old.tally.rows:,} of the acceleration's rows are in {len(old_layout)} partition(s) of an "
            f"older partition_by: {', '.join(old_layout[:5])}" + (", ..." if len(old_layout) > 5 else "")
        )
    return PartitionCheck(
        key_path=path,
        verdict=verdict,
        source_rows=want.rows,
        source_hash=want.row_hash if want.rows else None,
        acceleration_rows=got_rows,
        acceleration_hash=got.row_hash if got.rows > 0 else None,
        certificate_matches=reported,
        reason=reason if verdict is not Verdict.EQUAL else "",
        checked_by=checked_by,
        old_layout=old_layout,
        old_layout_rows=old.tally.rows if old is not None else 0,
    )


class _acceleration_files:
    """The dataset's storage, a local root its files can be read under, and a function that makes sure a
    partition's files are there (an `s3://` accelerator_dir: fetched, checked, into scratch)."""

    def __init__(self, project: ProjectSpec, spec: DatasetSpec, catalog: Catalog) -> None:
        self.project, self.spec, self.catalog = project, spec, catalog
        self._scratch: Any = None

    def __enter__(self) -> tuple[Any, Path, Callable[[Sequence[Any]], None]]:

        storage = self.catalog.storage or get_storage(self.spec.acceleration)
        handle = open_handle(self.project, self.spec)
        if handle.local_data:
            root = Path(self.catalog.data_root or handle.local_root)
            return storage, root, lambda files: None
        import tempfile

        self._scratch = tempfile.TemporaryDirectory(prefix="verify-")
        root = Path(self._scratch.name)
        store = self.catalog.data_store or handle.data_store
        return storage, root, lambda files: fetch_partition_files(store, root, files)

    def __exit__(self, *exc: object) -> None:
        if self._scratch is not None:
            self._scratch.cleanup()


def _repair(
    project: ProjectSpec,
    spec: DatasetSpec,
    report: VerifyReport,
    catalog: Catalog,
    progress: ProgressCallback | None,
    tick: Callable[[str, int, int, int], None],
    strategy: str,
) -> VerifyReport:
    """Refresh exactly the partitions that are not equal (one commit), then verify those again."""

    paths = [c.key_path for c in report.differing]
    misfiled = {c.key_path for c in report.differing if c.misfiled_rows}
    unroutable = [path for path in paths if split_key_path(path)[0] is not None and path not in misfiled]
    if unroutable:
        raise RefreshError(
            f"dataset {spec.name!r}: {len(unroutable)} partition(s) of an older partition_by cannot be read "
            f"({', '.join(unroutable[:5])}), so a refresh of the partitions their rows belong to cannot move "
            f"them; nothing was repaired. Rebuild every partition under the current partition_by: "
            f"`airflow-partitions refresh SPEC {spec.name} --full`"
        )
    tick("repair", 0, len(paths), 0)
    if misfiled:
        # Moved into the current partition_by first, each row routed by its own values (one checked
        # commit); the current partitions their rows belong to are verified again below.
        moved = repartition(
            open_handle(project, spec),
            catalog=catalog,
            only=[(str(split_key_path(p)[0]), split_key_path(p)[1]) for p in sorted(misfiled)],
        )
        report.repaired_version = moved.version
    refreshed = [p for p in paths if p not in misfiled]
    if refreshed:
        # Partitions the source no longer has are removed by the same selected refresh (`plan.removed`).
        # The source is reopened: a file source caches its listing, and the repair must see the source as
        # it is. `full`: each partition is rewritten whole from the source, whatever the refresh mode (an
        # append would read past the watermark only and miss the very rows verify found).
        summary = refresh_dataset(project, spec, partitions=refreshed, full=True, strategy=strategy)
        if summary.failed:
            raise RefreshError(
                f"repairing {len(refreshed)} partition(s) of {spec.name!r} failed; nothing was committed: "
                + "; ".join(f"{p}: {m}" for p, m in list(summary.failed.items())[:5])
            )
        report.repaired_version = summary.version
    report.repaired = paths
    # Extra partitions were removed: they can no longer be named, so check that they are gone.
    extra = {c.key_path: c for c in report.differing if c.verdict is Verdict.EXTRA}
    held = {
        c.key_path for c in report.partitions if misfiled & set(c.old_layout) and c.key_path not in misfiled
    }
    recheck = sorted({p for p in refreshed if p not in extra} | held)
    if recheck:
        after = verify_dataset(
            project,
            spec,
            partitions=recheck,
            progress=progress,
            catalog=catalog,
            record=False,
            strategy=strategy,
            deep=report.deep,
        )
    else:
        after = VerifyReport(
            spec.name, None, [], dt.datetime.now(dt.UTC), 0.0, selection="(removed partitions)"
        )
    snapshot = catalog.latest()
    remaining = snapshot.partitions if snapshot is not None else {}
    after.partitions.extend(check for path, check in extra.items() if path in remaining)
    after.version = snapshot.version if snapshot is not None else None
    report.after_repair = after
    return report


def _selection_text(partitions: Sequence[str] | None, where: str | None) -> str | None:
    if partitions is not None:
        return "partitions " + ", ".join(partitions)
    if where is not None:
        return f"where {where}"
    return None


# --- the last verify, kept next to the catalog ----------------------------------------------------


def _last_verify_key(catalog: Catalog) -> str:

    return f"{escape_component(catalog.dataset)}/{STATE_DIRECTORY}/{LAST_VERIFY_NAME}"


def record_last_verify(catalog: Catalog, report: VerifyReport) -> None:
    """Keep the report's summary as the dataset's last verify (`status`, the Partitions page)."""
    data = json.dumps(report.summary_json(), sort_keys=True).encode("utf-8")
    catalog.store.put(_last_verify_key(catalog), data)


def last_verify(catalog: Catalog) -> dict[str, Any] | None:
    """The dataset's last verify summary, or None (never verified, or unreadable)."""
    try:
        raw = catalog.store.get(_last_verify_key(catalog))
    except Exception:  # a missing or unreachable record only hides the field
        return None
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        parse_time(str(data["verified_at"]))
    except (ValueError, KeyError, TypeError):
        return None
    return dict(data)
