"""Per-file facts of a flat file source, learnt once per file and kept between refreshes: which partitions
each file can feed, so that a new, changed or removed file refreshes only those partitions.

When a file is first seen (by its fingerprint line: relative path, size, modification time or ETag) its
partition source columns are read once, under the source schema, and two facts are kept:

* its distinct partition keys (up to `MAX_KEYS_PER_FILE`): discovery is then the union over the files,
  with no scan of unchanged files, and the files of a partition are exactly those holding its key;
* its statistics of the partition source columns (min / max / NULL count, `storage.datafile` semantics),
  used when a file has too many keys to keep: the min..max range of each column is projected through the
  partition transforms by the pruning evaluator (exact for identity, truncate and the date transforms,
  enumerated for bucket and mod over small integer ranges, all partitions otherwise; NULLs feed the NULL
  partition).

A file with neither fact (unreadable statistics, e.g. a column type without an order) can feed every
partition: doubt never prunes. Facts are stored in `<accelerator_dir>/<dataset>/_source_files.json`
(written atomically; it only ever speeds things up: a missing or unreadable state is relearnt), under a
context digest of the source schema and the partition transforms, so a change of either relearns them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import ObjectStoreError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.objectstore import LocalStore
from airflow_partitions.sources.base import KeyTuple, digest
from airflow_partitions.storage.datafile import ColumnStats, compute_column_stats

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.pruning.expressions import Predicate
    from airflow_partitions.transforms import Transform

log = logging.getLogger(__name__)

STATE_FILE = "_source_files.json"
STATE_FORMAT = 1
# Beyond this many distinct keys in one file its keys are not kept: statistics map it instead.
MAX_KEYS_PER_FILE = 10_000
# The most source values a bucket / mod field enumerates over a file's range (more: every partition).
MAX_RANGE_ENUMERATION = 10_000


@dataclass(frozen=True, slots=True)
class FileFacts:
    """What one file holds of the partition columns: its keys (None: too many) and column statistics
    (None for a column: unknown)."""

    rows: int
    keys: tuple[KeyTuple, ...] | None
    stats: Mapping[str, ColumnStats | None]

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "keys": None if self.keys is None else [PartitionKey(k).to_json() for k in self.keys],
            "stats": {name: None if s is None else s.to_json() for name, s in self.stats.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FileFacts:
        keys = data.get("keys")
        return cls(
            rows=int(data["rows"]),
            keys=None if keys is None else tuple(PartitionKey.from_json(k).values for k in keys),
            stats={
                name: None if raw is None else ColumnStats.from_json(raw)
                for name, raw in dict(data["stats"]).items()
            },
        )


def facts_context(schema: pa.Schema, transforms: Sequence[Transform]) -> str:
    """The digest facts are valid under: the source schema and the partition transforms."""
    return digest([*(f"{f.name}\t{f.type}" for f in schema), *(t.canonical for t in transforms)])


def learn_facts(table: pa.Table, transforms: Sequence[Transform]) -> FileFacts:
    """The facts of one file, from its partition source columns read under the source schema."""
    import pyarrow as pa

    columns = sorted({c for t in transforms for c in t.source_columns})
    stats: dict[str, ColumnStats | None] = dict(compute_column_stats(table.select(columns)))
    for name in columns:
        kind = table.schema.field(name).type
        if pa.types.is_floating(kind) or not _ordered(kind):
            stats[name] = None  # NaN and unordered types: a range says nothing reliable
    names = [f"k{i}" for i in range(len(transforms))]
    keys: tuple[KeyTuple, ...] | None = None
    if table.num_rows:
        arrays = [t.apply_table(table) for t in transforms]
        distinct = pa.table(dict(zip(names, arrays, strict=True))).group_by(names).aggregate([])
        if distinct.num_rows <= MAX_KEYS_PER_FILE:
            values = [distinct.column(n).to_pylist() for n in names]
            keys = tuple(zip(*values, strict=True))
    else:
        keys = ()
    return FileFacts(table.num_rows, keys, stats)


class FactsLearner:
    """The facts of one file learnt from its rows as a refresh reads them, batch by batch (`add`), with the
    partition keys the refresh's routing computed for each batch: the same facts `learn_facts` gives for
    the whole file (keys, rows, NULL counts; each column's range the union of the batches' ranges)."""

    def __init__(self, schema: pa.Schema, transforms: Sequence[Transform]) -> None:
        import pyarrow as pa

        self.columns = sorted({c for t in transforms for c in t.source_columns})
        self._ranged = [
            name
            for name in self.columns
            if not pa.types.is_floating(schema.field(name).type) and _ordered(schema.field(name).type)
        ]
        self.rows = 0
        self._keys: set[KeyTuple] | None = set()
        self._parts: list[tuple[int, dict[str, ColumnStats]]] = []

    def add(self, table: pa.Table, keys: Iterable[KeyTuple]) -> None:
        """One batch of the file's rows (under the source schema) and the distinct keys of its rows."""
        if not table.num_rows:
            return
        self.rows += table.num_rows
        if self._keys is not None:
            self._keys.update(keys)
            if len(self._keys) > MAX_KEYS_PER_FILE:
                self._keys = None
        self._parts.append((table.num_rows, compute_column_stats(table.select(self._ranged))))

    def facts(self) -> FileFacts:
        stats: dict[str, ColumnStats | None] = dict.fromkeys(self.columns)
        for name in self._ranged:
            stats[name] = _union([(rows, part[name]) for rows, part in self._parts])
        keys = None if self._keys is None else tuple(self._keys)
        return FileFacts(self.rows, keys, stats)


def _union(parts: Sequence[tuple[int, ColumnStats]]) -> ColumnStats:
    """The stats of a column over several batches (each with its row count): NULLs summed, the widest
    bounds of the batches holding values (unknown if any of theirs is)."""
    nulls = sum(part.null_count for _, part in parts)
    valued = [part for rows, part in parts if part.null_count < rows]
    if not valued:
        return ColumnStats(None, None, nulls)
    low = None if any(p.min is None for p in valued) else min(p.min for p in valued)
    high = None if any(p.max is None for p in valued) else max(p.max for p in valued)
    return ColumnStats(low, high, nulls)


def _ordered(kind: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(
        pa.types.is_integer(kind)
        or pa.types.is_temporal(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_decimal(kind)
        or pa.types.is_boolean(kind)
    )


class FileFactsState:
    """The stored facts of one dataset's source files (`path` None: kept in memory only)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._context: str | None = None
        self._facts: dict[str, FileFacts] = {}

    def load(self, context: str) -> dict[str, FileFacts]:
        """The stored facts by fingerprint line, or none when stored under another context."""
        if self._context == context:
            return dict(self._facts)
        self._context, self._facts = context, {}
        if self.path is None or not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("format") == STATE_FORMAT and data.get("context") == context:
                self._facts = {line: FileFacts.from_json(raw) for line, raw in data["files"].items()}
        except (OSError, ValueError, KeyError, TypeError) as err:
            # Only a cache: relearn rather than fail the refresh.
            log.warning("ignoring unreadable source file state %s (%s); facts are relearnt", self.path, err)
        return dict(self._facts)

    def save(self, context: str, facts: Mapping[str, FileFacts]) -> None:
        """Replace the stored facts with `facts` (those of the files listed now), atomically."""
        self._context, self._facts = context, dict(facts)
        if self.path is None:
            return

        document = {
            "format": STATE_FORMAT,
            "context": context,
            "files": {line: f.to_json() for line, f in sorted(facts.items())},
        }
        data = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        try:
            LocalStore(self.path.parent).put(self.path.name, data)
        except (OSError, ObjectStoreError) as err:
            log.warning(
                "cannot keep source file facts in %s (%s); they are relearnt next time", self.path, err
            )


# --- mapping files to partitions ---------------------------------------------------------------------


def stats_predicate(facts: FileFacts, schema: pa.Schema, columns: Iterable[str]) -> Predicate:
    """The rows a file may hold, as a predicate over the source columns: per column its min..max range
    (when known) or NULL (when it has NULLs); an unknown column constrains nothing."""
    from airflow_partitions.pruning.expressions import (  # lazy: pruning loads pyarrow
        AlwaysFalse,
        AlwaysTrue,
        ColumnRef,
        IsNull,
        Range,
        and_,
        or_,
    )

    if facts.rows == 0:
        return AlwaysFalse()
    parts: list[Predicate] = []
    for name in columns:
        stats = facts.stats.get(name)
        if stats is None:
            continue
        term = ColumnRef(name, schema.field(name).type)
        options: list[Predicate] = []
        if stats.null_count:
            options.append(IsNull(term))
        if stats.null_count < facts.rows:
            if stats.min is None or stats.max is None:
                options.append(AlwaysTrue())  # values without known bounds
            else:
                options.append(Range(term, stats.min, True, stats.max, True))
        parts.append(or_(*options) if options else AlwaysFalse())
    return and_(*parts) if parts else AlwaysTrue()


def files_by_key(
    keys: Sequence[KeyTuple],
    files: Mapping[str, FileFacts | None],
    fields: Sequence[tuple[str, str]],
    schema: pa.Schema,
    transforms: Sequence[Transform],
) -> tuple[dict[KeyTuple, list[str]], int, int]:
    """For each key, the fingerprint lines of the files that may hold its rows; also how many files were
    mapped by statistics and how many could feed every partition (no usable facts)."""
    from airflow_partitions.pruning import PartitionIndex, plan_partitions  # lazy: pruning loads pyarrow

    out: dict[KeyTuple, list[str]] = {tuple(key): [] for key in keys}
    by_stats = 0
    everywhere: list[str] = []
    index = None
    columns = sorted({c for t in transforms for c in t.source_columns})
    for line, facts in files.items():
        if facts is None:
            everywhere.append(line)
            continue
        if facts.keys is not None:
            for key in facts.keys:
                if key in out:
                    out[key].append(line)
            continue
        predicate = stats_predicate(facts, schema, columns)
        if index is None:
            index = PartitionIndex.from_keys(fields, schema, keys)
        plan = plan_partitions(index, predicate, max_enumeration=MAX_RANGE_ENUMERATION)
        by_stats += 1
        for selected in plan.selected:
            out[tuple(keys[selected.position])].append(line)
    for line in everywhere:
        for hits in out.values():
            hits.append(line)
    return out, by_stats, len(everywhere)
