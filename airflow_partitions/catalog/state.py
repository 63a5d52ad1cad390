"""The catalog's on-disk formats and in-memory state: commit records, checkpoints, snapshots.

A **commit record** (one per version, newline-delimited JSON) holds a header line (version, time,
operation, partition spec, summary) and one line per changed partition: `{"u": <entry>}` for an upsert,
`{"r": "<key path>"}` for a removal. Listing versions reads only the header line.

**Digest chain.** The header carries `parent_digest` (the digest of the previous version's record) and,
as its last key, `digest`: the SHA-256 of the record's bytes without that last key. Decoding hashes the
bytes as read (no re-serialisation) and refuses a record whose digest differs; a snapshot carries the
digest of its newest record, and each following record must name it as its parent, so an edited, swapped
or dropped record is refused (`CatalogIntegrityError`). Records written before digests existed have
neither key and load as they are; once a record carries a digest, every later one must continue the chain.

A **checkpoint** is the full partition table of one version as an Arrow IPC file, one row per partition:
`key_path`, `key` (JSON), `spec_id`, `rows`, `bytes`, `refreshed_at`, `source_fingerprint`, `files`
(JSON list of data file descriptors with their per-column statistics), `written_by`, `certificate`,
`commit_id` (of the commit that last upserted the partition) and `from_source` (the digest of the files a
refresh wrote whole from the source; columns added later read as nulls from older checkpoints). It is an
optimisation written after a commit, never needed for correctness: any version is the newest checkpoint at
or below it plus the commit records after it.

A **snapshot** keeps that table as is (a local checkpoint is memory-mapped, so opening costs no copy) and
decodes a `PartitionEntry` only when it is asked for; `Snapshot.keys()` and the columnar `table` serve
planners that look at every partition.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow_partitions.catalog.model import (
    PartitionEntry,
    PartitionSpecInfo,
    RowCertificate,
    WrittenBy,
    format_time,
    parse_time,
)
from airflow_partitions.exceptions import CatalogError, CatalogIntegrityError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.storage.arrow_values import empty_table, int64_array, typed_array
from airflow_partitions.storage.datafile import DataFile

if TYPE_CHECKING:
    import pyarrow as pa

FORMAT_VERSION = 1
CHECKPOINT_METADATA_KEY = b"airflow_partitions.checkpoint"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICROSECOND = dt.timedelta(microseconds=1)
_MAX_CHUNKS = 256
# Checkpoints are LZ4-compressed Arrow IPC in batches, so decompression runs on several threads: at
# 100,000 partitions that is ~17 MB instead of ~57 MB and opens in ~10 ms.
CHECKPOINT_COMPRESSION = "lz4"
CHECKPOINT_BATCH_ROWS = 16 * 1024
# Up to this many point lookups scan the key column; after that a key path -> row dictionary pays off.
_SCAN_LOOKUPS = 16
# Commit ids a snapshot remembers (newest versions), so a retried write whose first attempt landed before
# its new base is recognised; carried over checkpoints.
RECENT_COMMIT_IDS = 1000
DIGEST_KEY = "digest"
# The header's last key, as `CommitRecord.seal` appends it: `,"digest":"<64 hex>"}`.
_DIGEST_PREFIX = f',"{DIGEST_KEY}":"'.encode()
_DIGEST_SUFFIX_LENGTH = len(_DIGEST_PREFIX) + 64 + 2


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def dumps(value: Any) -> str:
    """Compact JSON; one shared encoder, since `json.dumps` with options builds a new one per call."""
    return _ENCODER.encode(value)


# --- commit records -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommitRecord:
    """One version's commit: what changed (`upserts` as raw entry JSON, `removes` as key paths) and totals."""

    version: int
    committed_at: dt.datetime
    operation: str
    replace_all: bool
    partition_spec: PartitionSpecInfo
    commit_id: str | None
    base_version: int
    summary: Mapping[str, int]
    upserts: tuple[Mapping[str, Any], ...] = ()
    removes: tuple[str, ...] = ()
    # Row counts the refresh checked before committing (routed, written, source rows, partitions);
    # absent from records of other operations and of older versions.
    conservation: Mapping[str, Any] | None = None
    # The digest chain (see the module docstring); both None in records written before it existed.
    parent_digest: str | None = None
    digest: str | None = None
    # Specs other than `partition_spec` whose partitions the version still holds (a re-partitioning in
    # progress); absent from records of a single layout and of older releases.
    other_specs: tuple[PartitionSpecInfo, ...] = ()

    @property
    def touched(self) -> set[str]:
        return {str(e["key_path"]) for e in self.upserts} | set(self.removes)

    def header(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "version": self.version,
            "committed_at": format_time(self.committed_at),
            "operation": self.operation,
            "replace_all": self.replace_all,
            "partition_spec": self.partition_spec.to_json(),
            "commit_id": self.commit_id,
            "base_version": self.base_version,
            "summary": dict(self.summary),
            **({"conservation": dict(self.conservation)} if self.conservation is not None else {}),
            **({"other_specs": [s.to_json() for s in self.other_specs]} if self.other_specs else {}),
            "parent_digest": self.parent_digest,
        }

    def seal(self) -> tuple[CommitRecord, bytes]:
        """This record with its digest set, and its bytes (the digest appended as the header's last key)."""
        header = dumps(self.header()).encode("utf-8")
        lines = [dumps({"u": entry}) for entry in self.upserts]
        lines.extend(dumps({"r": key_path}) for key_path in self.removes)
        body = ("".join(line + "\n" for line in lines)).encode("utf-8")
        hasher = hashlib.sha256(header)
        hasher.update(b"\n")
        hasher.update(body)
        digest = hasher.hexdigest()
        sealed = header[:-1] + _DIGEST_PREFIX + digest.encode() + b'"}\n' + body
        return replace(self, digest=digest), sealed

    def encode(self) -> bytes:
        return self.seal()[1]

    @classmethod
    def decode(cls, data: bytes, *, where: str) -> CommitRecord:
        text = data.decode("utf-8")
        first, _, rest = text.partition("\n")
        header = _parse_header(first, where)
        if DIGEST_KEY in header:
            _check_digest(data, str(header[DIGEST_KEY]), where)
        upserts: list[Mapping[str, Any]] = []
        removes: list[str] = []
        if rest.strip():
            try:
                lines = json.loads("[" + ",".join(line for line in rest.split("\n") if line) + "]")
            except json.JSONDecodeError as err:
                raise CatalogError(f"commit record {where} is corrupt: {err}") from err
            for line in lines:
                if "u" in line:
                    upserts.append(line["u"])
                else:
                    removes.append(str(line["r"]))
        return cls._from_header(header, tuple(upserts), tuple(removes))

    @classmethod
    def decode_header(cls, data: bytes, *, where: str) -> CommitRecord | None:
        """The record without its partition lines, from a prefix of its bytes (`None` if cut too short)."""
        first, newline, _ = data.partition(b"\n")
        if not newline:
            return None
        return cls._from_header(_parse_header(first.decode("utf-8"), where), (), ())

    @classmethod
    def _from_header(
        cls, header: Mapping[str, Any], upserts: tuple[Mapping[str, Any], ...], removes: tuple[str, ...]
    ) -> CommitRecord:
        return cls(
            version=int(header["version"]),
            committed_at=parse_time(header["committed_at"]),
            operation=str(header["operation"]),
            replace_all=bool(header["replace_all"]),
            partition_spec=PartitionSpecInfo.from_json(header["partition_spec"]),
            commit_id=header.get("commit_id"),
            base_version=int(header["base_version"]),
            summary={k: int(v) for k, v in header["summary"].items()},
            upserts=upserts,
            removes=removes,
            conservation=header.get("conservation"),
            parent_digest=header.get("parent_digest"),
            digest=header.get(DIGEST_KEY),
            other_specs=tuple(PartitionSpecInfo.from_json(s) for s in header.get("other_specs", ())),
        )


def _check_digest(data: bytes, stated: str, where: str) -> None:
    """Refuse `data` unless the SHA-256 of its bytes without the header's last key (`digest`) is `stated`."""
    end = data.find(b"\n")
    start = end - _DIGEST_SUFFIX_LENGTH
    if end < 0 or start < 0 or data[start : start + len(_DIGEST_PREFIX)] != _DIGEST_PREFIX:
        raise CatalogIntegrityError(f"commit record {where}: its digest is not the header's last key")
    view = memoryview(data)
    hasher = hashlib.sha256(view[:start])
    hasher.update(b"}")
    hasher.update(view[end:])
    actual = hasher.hexdigest()
    if actual != stated:
        raise CatalogIntegrityError(
            f"commit record {where}: its bytes hash to {actual}, not to the digest {stated} written with it"
        )


def broken_link(previous: str | None, records: Iterable[CommitRecord]) -> CommitRecord | None:
    """The first of consecutive `records` that does not continue the digest chain from `previous` (the
    digest of the record before them; None when unknown or written before digests): `None` if all do."""
    for record in records:
        if previous is not None and (record.digest is None or record.parent_digest != previous):
            return record
        previous = record.digest
    return None


def _parse_header(line: str, where: str) -> Mapping[str, Any]:
    try:
        header = json.loads(line)
    except json.JSONDecodeError as err:
        raise CatalogError(f"commit record {where} has a corrupt header: {err}") from err
    if not isinstance(header, dict) or header.get("format") != FORMAT_VERSION:
        raise CatalogError(
            f"commit record {where} has format {header.get('format') if isinstance(header, dict) else '?'}; "
            f"this version of airflow-partitions reads format {FORMAT_VERSION}: upgrade the package"
        )
    return header


# --- the columnar partition table -----------------------------------------------------------------


def state_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("key_path", pa.string(), nullable=False),
            pa.field("key", pa.string(), nullable=False),
            pa.field("spec_id", pa.string(), nullable=False),
            pa.field("rows", pa.int64(), nullable=False),
            pa.field("bytes", pa.int64(), nullable=False),
            pa.field("refreshed_at", pa.timestamp("us", tz="UTC"), nullable=False),
            pa.field("source_fingerprint", pa.string()),
            pa.field("files", pa.string(), nullable=False),
            # JSON of `WrittenBy`; null when no Airflow task wrote the partition. Checkpoints written
            # before the column existed get it as nulls when read.
            pa.field("written_by", pa.string()),
            # JSON of `RowCertificate`; null when the writing commit recorded none.
            pa.field("certificate", pa.string()),
            # The id of the commit that last upserted the partition (null: that commit had none, or a
            # checkpoint written before the column existed).
            pa.field("commit_id", pa.string()),
            # `PartitionEntry.from_source` (null: not written whole from the source, or an older checkpoint).
            pa.field("from_source", pa.string()),
        ]
    )


def empty_state_table() -> pa.Table:
    """The partition table with no rows. `Schema.empty_table` would make pyarrow probe for pandas (and
    import it, ~0.3 s) on a fresh process's first read; an empty batch list does not."""
    return empty_table(state_schema())


def entries_to_table(entries: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows of the partition table from entry JSON (as stored in commit records)."""
    import numpy as np
    import pyarrow as pa

    schema = state_schema()
    refreshed = [(parse_time(e["refreshed_at"]) - _EPOCH) // _MICROSECOND for e in entries]
    columns = [
        typed_array([e["key_path"] for e in entries], pa.string()),
        typed_array([dumps(e["key"]) for e in entries], pa.string()),
        typed_array([e["spec_id"] for e in entries], pa.string()),
        int64_array(np.array([int(e["rows"]) for e in entries], dtype=np.int64)),
        int64_array(np.array([int(e["bytes"]) for e in entries], dtype=np.int64)),
        int64_array(np.array(refreshed, dtype=np.int64)).cast(schema.field("refreshed_at").type),
        typed_array([e.get("source_fingerprint") for e in entries], pa.string()),
        typed_array([dumps(e["files"]) for e in entries], pa.string()),
        typed_array([dumps(e["written_by"]) if e.get("written_by") else None for e in entries], pa.string()),
        typed_array(
            [dumps(e["certificate"]) if e.get("certificate") else None for e in entries], pa.string()
        ),
        typed_array([e.get("commit_id") for e in entries], pa.string()),
        typed_array([e.get("from_source") for e in entries], pa.string()),
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def apply_changes(
    table: pa.Table, changes: Mapping[str, Mapping[str, Any] | None], *, reset: bool
) -> pa.Table:
    """`table` with `changes` applied (key path -> entry JSON, or `None` to remove); `reset` starts empty.

    Unchanged rows are not copied: the result is zero-copy slices of `table` around the changed rows plus
    the new rows, so applying a few records to a 100,000-partition checkpoint costs about a millisecond.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    base = empty_state_table() if reset else table
    pieces: list[pa.Table] = []
    if changes and base.num_rows:
        touched = typed_array(list(changes), pa.string())
        positions = pc.indices_nonzero(pc.is_in(base.column("key_path"), value_set=touched)).to_pylist()
        start = 0
        for position in positions:
            if position > start:
                pieces.append(base.slice(start, position - start))
            start = position + 1
        if start < base.num_rows:
            pieces.append(base.slice(start))
    elif base.num_rows:
        pieces.append(base)
    upserts = [entry for entry in changes.values() if entry is not None]
    if upserts:
        pieces.append(entries_to_table(upserts))
    if not pieces:
        return empty_state_table()
    result = pa.concat_tables(pieces)
    if result.column(0).num_chunks > _MAX_CHUNKS:
        result = result.combine_chunks()  # many small commits in one process: keep scans fast
    return result


def merge_records(records: Iterable[CommitRecord]) -> tuple[dict[str, Mapping[str, Any] | None], bool]:
    """The net change of consecutive records (key path -> entry or `None`) and whether one replaced all."""
    changes: dict[str, Mapping[str, Any] | None] = {}
    reset = False
    for record in records:
        if record.replace_all:
            changes = {}
            reset = True
        for key_path in record.removes:
            changes[key_path] = None
        for entry in record.upserts:
            # The entry carries the id of the commit that wrote it, whatever the upsert's JSON says (an
            # entry carried over from an older version names its own writer).
            if record.commit_id is not None or "commit_id" in entry:
                entry = {**entry, "commit_id": record.commit_id}
            changes[str(entry["key_path"])] = entry
    return changes, reset


# --- checkpoints ----------------------------------------------------------------------------------


def encode_checkpoint(snapshot: Snapshot, *, compression: str | None = CHECKPOINT_COMPRESSION) -> bytes:
    import pyarrow as pa

    metadata = {
        "format": FORMAT_VERSION,
        "version": snapshot.version,
        "committed_at": format_time(snapshot.committed_at),
        "operation": snapshot.operation,
        "partition_spec": snapshot.partition_spec.to_json(),
        # The digest of this version's record (the next record names it as its parent), and the recent
        # commit ids (retries are recognised across the checkpoint). Older checkpoints have neither.
        "record_digest": snapshot.record_digest,
        "commit_ids": [[commit_id, version] for commit_id, version in snapshot.commit_ids.items()],
        **({"other_specs": [s.to_json() for s in snapshot.other_specs]} if snapshot.other_specs else {}),
    }
    table = snapshot.table
    schema = table.schema.with_metadata({CHECKPOINT_METADATA_KEY: dumps(metadata).encode()})
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression, use_threads=True)
    with pa.ipc.new_file(sink, schema, options=options) as writer:
        for batch in table.replace_schema_metadata(schema.metadata).to_batches():
            # Re-cut into even batches: zero-copy slices of the chunks, bounded size for parallel reads.
            for offset in range(0, batch.num_rows, CHECKPOINT_BATCH_ROWS):
                writer.write_batch(batch.slice(offset, CHECKPOINT_BATCH_ROWS))
    return bytes(sink.getvalue().to_pybytes())


def decode_checkpoint(source: Any, *, where: str) -> Snapshot:
    """A snapshot from checkpoint bytes or a memory map (`pa.memory_map`)."""
    import pyarrow as pa

    try:
        buffer = source if isinstance(source, (pa.NativeFile, pa.Buffer)) else pa.py_buffer(source)
        table = pa.ipc.open_file(buffer).read_all()
        metadata = json.loads(table.schema.metadata[CHECKPOINT_METADATA_KEY])
    except (pa.ArrowInvalid, KeyError, json.JSONDecodeError) as err:
        raise CatalogError(f"checkpoint {where} is unreadable: {err}") from err
    if metadata.get("format") != FORMAT_VERSION:
        raise CatalogError(
            f"checkpoint {where} has format {metadata.get('format')}; upgrade airflow-partitions"
        )
    version = int(metadata["version"])
    return Snapshot(
        version=version,
        partition_spec=PartitionSpecInfo.from_json(metadata["partition_spec"]),
        committed_at=parse_time(metadata["committed_at"]),
        operation=str(metadata["operation"]),
        partitions=PartitionMap(_with_current_columns(table.replace_schema_metadata(None))),
        checkpoint_version=version,
        changes_since_checkpoint=0,
        record_digest=metadata.get("record_digest"),
        commit_ids={str(commit_id): int(number) for commit_id, number in metadata.get("commit_ids", [])},
        other_specs=tuple(PartitionSpecInfo.from_json(s) for s in metadata.get("other_specs", ())),
    )


def checkpoint_has_digest(source: Any) -> bool:
    """Whether checkpoint bytes were written with the digest chain (then its digest object must vouch)."""
    import pyarrow as pa

    buffer = source if isinstance(source, (pa.NativeFile, pa.Buffer)) else pa.py_buffer(source)
    try:
        metadata = json.loads(pa.ipc.open_file(buffer).schema.metadata[CHECKPOINT_METADATA_KEY])
    except (pa.ArrowInvalid, KeyError, json.JSONDecodeError):
        return True  # unreadable: never trusted without a digest
    return "record_digest" in metadata


def remember_commit_ids(known: Mapping[str, int], records: Sequence[CommitRecord]) -> dict[str, int]:
    """`known` (commit id -> version) plus the ids of `records`, keeping the newest `RECENT_COMMIT_IDS`."""
    merged = dict(known)  # in version order: the oldest first
    for record in records:
        if record.commit_id is not None:
            merged.pop(record.commit_id, None)
            merged[record.commit_id] = record.version
    for oldest in list(itertools.islice(merged, max(0, len(merged) - RECENT_COMMIT_IDS))):
        del merged[oldest]
    return merged


def _with_current_columns(table: pa.Table) -> pa.Table:
    """A checkpoint table from an older release, given the nullable columns added since (as nulls), its
    columns in the current schema's order (commits' new rows are appended to it column by column)."""
    import pyarrow as pa

    schema = state_schema()
    for schema_field in schema:
        if schema_field.name not in table.column_names:
            table = table.append_column(schema_field, pa.nulls(table.num_rows, schema_field.type))
    return table.select(schema.names)


# --- snapshots ------------------------------------------------------------------------------------


class PartitionMap(Mapping[str, PartitionEntry]):
    """Key path -> `PartitionEntry`, decoded from the columnar table on first access and then cached."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self._index: dict[str, int] | None = None
        self._decoded: dict[int, PartitionEntry] = {}
        self._lookups = 0

    def _positions(self) -> dict[str, int]:
        if self._index is None:
            key_paths = self.table.column("key_path").to_pylist()
            self._index = dict(zip(key_paths, range(len(key_paths)), strict=True))
        return self._index

    def _row(self, key_path: object) -> int | None:
        if not isinstance(key_path, str):
            return None
        if self._index is None and self._lookups < _SCAN_LOOKUPS:
            # A few lookups (a commit's touched partitions, a point read) scan the column in C.
            import pyarrow as pa
            import pyarrow.compute as pc

            self._lookups += 1
            wanted = typed_array([key_path], pa.string())[0]  # a scalar from Python would import pandas
            position = pc.index(self.table.column("key_path"), wanted).as_py()
            return None if position < 0 else int(position)
        return self._positions().get(key_path)

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def __iter__(self) -> Iterator[str]:
        return iter(self._positions())

    def __contains__(self, key_path: object) -> bool:
        return self._row(key_path) is not None

    def __getitem__(self, key_path: str) -> PartitionEntry:
        row = self._row(key_path)
        if row is None:
            raise KeyError(key_path)
        entry = self._decoded.get(row)
        if entry is None:
            entry = self._decode_rows([row])[0]
            self._decoded[row] = entry
        return entry

    def entries_of(self, key_paths: Iterable[str]) -> list[PartitionEntry]:
        """The entries of those of `key_paths` present, in order; rows not decoded yet are decoded in one
        batch (a lookup per key would take from the whole table once per key: a commit of 1,000 changed
        partitions took a thousand takes)."""
        rows = [row for row in (self._row(k) for k in key_paths) if row is not None]
        missing = sorted({row for row in rows if row not in self._decoded})
        if missing:
            for row, entry in zip(missing, self._decode_rows(missing), strict=True):
                self._decoded[row] = entry
        return [self._decoded[row] for row in rows]

    def values(self) -> list[PartitionEntry]:  # type: ignore[override]
        """Every entry, decoded in bulk (one JSON parse per column, not per row)."""
        missing = [row for row in range(len(self)) if row not in self._decoded]
        if missing:
            for row, entry in zip(missing, self._decode_rows(missing), strict=True):
                self._decoded[row] = entry
        return [self._decoded[row] for row in range(len(self))]

    def items(self) -> list[tuple[str, PartitionEntry]]:  # type: ignore[override]
        return [(e.key_path, e) for e in self.values()]

    def _decode_rows(self, rows: Sequence[int]) -> list[PartitionEntry]:
        import numpy as np
        import pyarrow as pa

        if len(rows) == len(self):
            table = self.table
        else:
            table = self.table.take(int64_array(np.asarray(rows, dtype=np.int64)))
        key_paths = table.column("key_path").to_pylist()
        keys = json.loads("[" + ",".join(table.column("key").to_pylist()) + "]")
        files = json.loads("[" + ",".join(table.column("files").to_pylist()) + "]")
        refreshed = table.column("refreshed_at").cast(pa.int64()).to_pylist()
        writers = [
            WrittenBy.from_json(json.loads(w)) if w else None for w in table.column("written_by").to_pylist()
        ]
        certificates = [
            RowCertificate.from_json(json.loads(c)) if c else None
            for c in table.column("certificate").to_pylist()
        ]
        commit_ids = table.column("commit_id").to_pylist()
        marks = table.column("from_source").to_pylist()
        return [
            PartitionEntry(
                key=_key_from_json(key),
                key_path=key_path,
                spec_id=spec_id,
                files=tuple(DataFile.from_json(f) for f in file_list),
                rows=rows_count,
                bytes=size,
                source_fingerprint=fingerprint,
                refreshed_at=_EPOCH + dt.timedelta(microseconds=micros),
                written_by=writer,
                certificate=certificate,
                commit_id=commit_id,
                from_source=mark,
            )
            for (
                key_path,
                key,
                spec_id,
                file_list,
                rows_count,
                size,
                fingerprint,
                micros,
                writer,
                certificate,
                commit_id,
                mark,
            ) in zip(
                key_paths,
                keys,
                table.column("spec_id").to_pylist(),
                files,
                table.column("rows").to_pylist(),
                table.column("bytes").to_pylist(),
                table.column("source_fingerprint").to_pylist(),
                refreshed,
                writers,
                certificates,
                commit_ids,
                marks,
                strict=True,
            )
        ]


def _key_from_json(values: list[Any]) -> PartitionKey:
    # Plain JSON scalars (NULL, bool, int, str) decode to themselves; only tagged values need parsing.
    if not any(isinstance(v, dict) for v in values):
        return PartitionKey(tuple(values))
    return PartitionKey.from_json(values)


@dataclass(frozen=True, eq=False)
class Snapshot:
    """One catalog version: its partition spec and every partition (`partitions`, keyed by key path)."""

    version: int
    partition_spec: PartitionSpecInfo
    committed_at: dt.datetime
    partitions: PartitionMap
    operation: str = ""
    checkpoint_version: int = 0
    changes_since_checkpoint: int = 0
    # The digest of this version's commit record (None: written before digests, or unknown).
    record_digest: str | None = None
    # Commit id -> version of the newest `RECENT_COMMIT_IDS` commits up to this version.
    commit_ids: Mapping[str, int] = field(default_factory=dict, repr=False)
    # Specs other than `partition_spec` that partitions of this version may be written under (a
    # re-partitioning in progress); each such partition's key path is qualified (`model.qualified_key_path`).
    other_specs: tuple[PartitionSpecInfo, ...] = ()
    _keys: dict[str, PartitionKey] = field(default_factory=dict, repr=False)

    @property
    def specs(self) -> dict[str, PartitionSpecInfo]:
        """Spec id -> spec of every layout this version may hold, the current one first."""
        specs = {self.partition_spec.spec_id: self.partition_spec}
        for other in self.other_specs:
            specs.setdefault(other.spec_id, other)
        return specs

    def spec_ids_in_use(self) -> set[str]:
        """The spec ids its partitions are written under (an empty version: none)."""
        import pyarrow.compute as pc

        if not self.partition_count:
            return set()
        return {str(v) for v in pc.unique(self.table.column("spec_id")).to_pylist()}

    def other_layout(self, spec_id: str | None = None) -> tuple[int, int]:
        """(partitions, rows) written under a spec other than `spec_id` (default: the current spec)."""
        import pyarrow.compute as pc

        if not self.partition_count:
            return 0, 0
        current = spec_id or self.partition_spec.spec_id
        import pyarrow as pa

        mask = pc.not_equal(self.table.column("spec_id"), typed_array([current], pa.string())[0])
        zero = typed_array([0], pa.int64())[0]
        rows = pc.sum(pc.if_else(mask, self.table.column("rows"), zero)).as_py() or 0
        return int(pc.sum(mask.cast("int64")).as_py() or 0), int(rows)

    @property
    def table(self) -> pa.Table:
        """The columnar partition table (see the module docstring for its columns)."""
        return self.partitions.table

    @property
    def partition_count(self) -> int:
        return len(self.partitions)

    @property
    def total_rows(self) -> int:
        return _column_sum(self.table, "rows")

    @property
    def total_bytes(self) -> int:
        return _column_sum(self.table, "bytes")

    @property
    def last_refreshed_at(self) -> dt.datetime | None:
        import pyarrow.compute as pc

        if not self.partition_count:
            return None
        value: dt.datetime = pc.max(self.table.column("refreshed_at")).as_py()
        return value

    def keys(self) -> Mapping[str, PartitionKey]:
        """Key path -> `PartitionKey` for every partition, decoded in bulk without decoding files."""
        if len(self._keys) != self.partition_count:
            key_paths = self.table.column("key_path").to_pylist()
            values = json.loads("[" + ",".join(self.table.column("key").to_pylist()) + "]")
            self._keys.update(zip(key_paths, map(_key_from_json, values), strict=True))
        return self._keys


def _column_sum(table: pa.Table, name: str) -> int:
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return 0
    return int(pc.sum(table.column(name)).as_py())
