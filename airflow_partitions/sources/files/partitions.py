"""Which partitions a file source's files feed: by their Hive directories, else by the per-file facts
kept between refreshes (`sources/file_facts.py`), else by every bucket of an all-bucket partitioning."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_partitions.sources.base import EMPTY_FINGERPRINT, Deadline, KeyTuple, digest, tagged_fingerprint
from airflow_partitions.sources.file_facts import (
    FileFacts,
    FileFactsState,
    facts_context,
    files_by_key,
    learn_facts,
)
from airflow_partitions.sources.files.place import SourceFile
from airflow_partitions.spec.model import bucket_count

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.transforms import Transform

# The most bucket combinations files are mapped onto by their column ranges (more: refresh them all).
STATIC_MAPPING_LIMIT = 100_000

HiveGroups = tuple[tuple[int, ...], dict[KeyTuple, list[SourceFile]]]


def hive_projection(transforms: Sequence[Transform], hive_columns: Sequence[str]) -> tuple[int, ...]:
    """Positions of the partition fields whose source column is a Hive directory column."""
    hive = set(hive_columns)
    return tuple(i for i, t in enumerate(transforms) if all(c in hive for c in t.source_columns))


def hive_groups(
    transforms: Sequence[Transform],
    files: Sequence[SourceFile],
    projection: tuple[int, ...],
    hive_values: Callable[[], Mapping[str, Mapping[str, Any]]],
) -> HiveGroups:
    """(projection, the files by the partial key their directories decide); no groups without one."""
    groups: dict[KeyTuple, list[SourceFile]] = {}
    if not projection:
        return projection, groups
    values = hive_values()
    for f in files:
        hive = values.get(f.path, {})
        partial = tuple(transforms[i].apply_row(hive) for i in projection)
        groups.setdefault(partial, []).append(f)
    return projection, groups


def learn_file_facts(
    state: FileFactsState,
    schema: pa.Schema,
    transforms: Sequence[Transform],
    files: Sequence[SourceFile],
    read_columns: Callable[[SourceFile, list[str]], pa.Table],
    reads: list[str],
    deadline: Deadline | None = None,
) -> dict[str, FileFacts]:
    """The facts of `files` by fingerprint line: kept ones, and the others learnt now (one read of each
    new file's partition columns, its relative path appended to `reads`) and kept, for `files` only."""
    context = facts_context(schema, transforms)
    known = state.load(context)
    current = {f.fingerprint_line(): known.get(f.fingerprint_line()) for f in files}
    missing = [f for f in files if current[f.fingerprint_line()] is None]
    columns = sorted({c for t in transforms for c in t.source_columns})
    for source_file in missing:
        if deadline is not None:
            deadline.check(f"reading the partition columns of {source_file.relative}")
        table = read_columns(source_file, columns)
        reads.append(source_file.relative)
        current[source_file.fingerprint_line()] = learn_facts(table, transforms)
    learnt = {line: facts for line, facts in current.items() if facts is not None}
    if missing or len(learnt) != len(known):
        state.save(context, learnt)
    return learnt


@dataclass
class PendingFacts:
    """A survey whose new or changed files (`files`, by fingerprint line) are not read for their facts:
    the refresh reads every file whole anyway and learns them then (`sources.file_facts.FactsLearner`).
    Until `settle`, each of them can feed every partition (a fingerprint that holds them all: doubt never
    prunes); `settle` keeps them with the others and gives the fingerprints the survey would have given."""

    state: FileFactsState
    context: str
    schema: pa.Schema
    transforms: Sequence[Transform]
    tag: str
    kept: dict[str, FileFacts]  # the facts kept for the other files listed
    files: dict[str, SourceFile]

    @classmethod
    def of(
        cls,
        state: FileFactsState,
        schema: pa.Schema,
        transforms: Sequence[Transform],
        files: Sequence[SourceFile],
        tag: str,
    ) -> PendingFacts | None:
        """The files of `files` without kept facts as pending, or None when every one has them."""
        context = facts_context(schema, transforms)
        known = state.load(context)
        kept = {
            f.fingerprint_line(): known[f.fingerprint_line()] for f in files if f.fingerprint_line() in known
        }
        pending = {f.fingerprint_line(): f for f in files if f.fingerprint_line() not in kept}
        if not pending:
            return None
        return cls(state, context, schema, transforms, tag, kept, pending)

    def fingerprints(
        self, keys: Sequence[KeyTuple], learnt: Mapping[str, FileFacts] | None = None
    ) -> dict[KeyTuple, str]:
        """Per key of `keys`, the fingerprint of the files that can feed it (`map_by_facts`' digests); a
        pending file not in `learnt` feeds every key."""
        facts: dict[str, FileFacts | None] = {**dict.fromkeys(self.files), **self.kept, **(learnt or {})}
        fields = [(f"k{i}", t.canonical) for i, t in enumerate(self.transforms)]
        by_key, _, _ = files_by_key(list(keys), facts, fields, self.schema, self.transforms)
        return {
            key: tagged_fingerprint(self.tag, digest(sorted(lines))) if lines else EMPTY_FINGERPRINT
            for key, lines in by_key.items()
        }

    def settle(self, learnt: Mapping[str, FileFacts], keys: Sequence[KeyTuple]) -> dict[KeyTuple, str] | None:
        """Keep the facts `learnt` of the pending files with the others and give the fingerprints of `keys`
        under them; None (nothing kept) unless every pending file was learnt."""
        if any(line not in learnt for line in self.files):
            return None
        settled = {line: learnt[line] for line in self.files}
        self.state.save(self.context, {**self.kept, **settled})
        return self.fingerprints(keys, settled)


def map_by_facts(
    transforms: Sequence[Transform],
    facts: Mapping[str, FileFacts],
    keys: list[KeyTuple] | None,
    schema: pa.Schema,
    tag: str,
    notes: list[str],
) -> dict[KeyTuple, str] | None:
    """Per-partition fingerprints of the files the facts map to each partition (of `keys`, else of the
    kept keys, else every bucket); None when the partitions are not known (static discovery and a file
    whose keys were not kept, beyond `STATIC_MAPPING_LIMIT`): the whole-source fingerprint then stands
    for every partition."""
    if keys is not None:
        mapped_keys = keys
    elif all(f.keys is not None for f in facts.values()):
        mapped_keys = kept_keys(facts)
    else:
        # Static (bucket-only) discovery and a file whose keys were not kept: map onto every bucket.
        static = static_keys(transforms)
        if static is None:
            notes.append("too many partitions to map files onto: any change refreshes every partition")
            return None
        mapped_keys = static
    fields = [(f"k{i}", t.canonical) for i, t in enumerate(transforms)]
    by_key, by_stats, _ = files_by_key(mapped_keys, facts, fields, schema, transforms)
    if by_stats:
        notes.append(
            f"{by_stats} file(s) hold too many partition keys to keep: mapped to partitions by their "
            "column ranges"
        )
    notes.append("changed files mapped to the partitions they can feed (per-file facts)")
    return {
        key: tagged_fingerprint(tag, digest(sorted(lines))) if lines else EMPTY_FINGERPRINT
        for key, lines in by_key.items()
    }


def kept_keys(facts: Mapping[str, FileFacts]) -> list[KeyTuple]:
    """The union of the files' kept keys, in first-seen order."""
    return list(dict.fromkeys(k for f in facts.values() for k in f.keys or ()))


def files_by_facts(
    state: FileFactsState,
    schema: pa.Schema,
    transforms: Sequence[Transform],
    keys: Sequence[KeyTuple],
    files: list[SourceFile],
) -> list[SourceFile]:
    """The files whose kept facts say they can feed `keys`, plus every file without kept facts."""
    known = state.load(facts_context(schema, transforms))
    facts: dict[str, FileFacts | None] = {
        f.fingerprint_line(): known.get(f.fingerprint_line()) for f in files
    }
    fields = [(f"k{i}", t.canonical) for i, t in enumerate(transforms)]
    by_key, _, _ = files_by_key([tuple(k) for k in keys], facts, fields, schema, transforms)
    wanted = {line for lines in by_key.values() for line in lines}
    return [f for f in files if f.fingerprint_line() in wanted]


def static_keys(transforms: Sequence[Transform]) -> list[KeyTuple] | None:
    """Every key of an all-bucket partitioning (each field's buckets and NULL), or None beyond
    `STATIC_MAPPING_LIMIT` keys or when a field is not a bucket."""
    counts = [bucket_count(t) for t in transforms]
    total = 1
    for count in counts:
        if count is None:
            return None
        total *= count + 1
    if total > STATIC_MAPPING_LIMIT:
        return None
    choices = [[*range(count or 0), None] for count in counts]
    return [tuple(key) for key in itertools.product(*choices)]
