"""The catalog's records: partition spec, partition entries, version summaries, vacuum reports.

Plain dataclasses with a JSON form; no pyarrow, so the Airflow layer can import them while parsing DAGs.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from airflow_partitions.exceptions import CatalogError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.storage.base import SharedFileCompaction, VacuumedFile
from airflow_partitions.storage.datafile import DataFile

# Key paths of partitions written under a spec other than the catalog's current one carry this prefix and
# their spec id (`@<spec_id>/region=EU`), so partitions of two layouts never share a key path even when
# both specs name their fields alike (`expr0=3` under bucket[8] and under bucket[16]).
SPEC_PATH_PREFIX = "@"


def qualified_key_path(spec_id: str, key_path: str) -> str:
    """The key path of a partition of spec `spec_id` while another spec is current."""
    return f"{SPEC_PATH_PREFIX}{spec_id}/{key_path}"


def split_key_path(key_path: str) -> tuple[str | None, str]:
    """`(spec id, plain key path)` of a qualified key path; `(None, key_path)` of a plain one."""
    if key_path.startswith(SPEC_PATH_PREFIX):
        spec_id, _, plain = key_path[len(SPEC_PATH_PREFIX) :].partition("/")
        return spec_id, plain
    return None, key_path


def file_key_path(key_path: str) -> str:
    """Where a partition's new files go (`spec=<id>/...` for a partition of another spec): a key path
    of `name=value` components, as storage engines lay out directories."""
    spec_id, plain = split_key_path(key_path)
    if spec_id is None:
        return key_path
    return f"spec={spec_id}/{plain}" if plain else f"spec={spec_id}"


class PartitionFieldInfo(NamedTuple):
    """One partition field as the catalog records it: its name, canonical transform and value kind."""

    name: str
    canonical: str
    kind: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionSpecInfo:
    """The partition_by expressions a snapshot's partitions were written with; `spec_id` identifies them."""

    spec_id: str
    fields: tuple[PartitionFieldInfo, ...]

    def __post_init__(self) -> None:
        fields = tuple(PartitionFieldInfo(*f) for f in self.fields)
        object.__setattr__(self, "fields", fields)
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise CatalogError(f"partition spec {self.spec_id!r} repeats a field name: {names}")

    @classmethod
    def from_fields(
        cls, fields: Sequence[tuple[str, str] | tuple[str, str, str | None]]
    ) -> PartitionSpecInfo:
        """A spec whose id is a stable hash of the field names and canonical transforms."""
        infos = tuple(PartitionFieldInfo(*f) for f in fields)
        # The same text and hash as `AccelerationSpec.partition_spec_id`, so ids agree across layers.
        text = json.dumps([[f.name, f.canonical] for f in infos], separators=(",", ":"), ensure_ascii=False)
        return cls(hashlib.sha256(text.encode("utf-8")).hexdigest()[:16], infos)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def describe(self) -> str:
        """`bucket[50](PULocationID) AS b, ...`-style text for messages."""
        return ", ".join(f"{f.name}: {f.canonical}" for f in self.fields) or "(no partition fields)"

    def to_json(self) -> dict[str, Any]:
        return {"spec_id": self.spec_id, "fields": [list(f) for f in self.fields]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PartitionSpecInfo:
        return cls(str(data["spec_id"]), tuple(PartitionFieldInfo(*f) for f in data["fields"]))


@dataclass(frozen=True, slots=True)
class WrittenBy:
    """The Airflow task instance that wrote a partition's files (shown by `status` and the UI page)."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1

    def to_json(self) -> dict[str, Any]:
        return {
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "map_index": self.map_index,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> WrittenBy | None:
        if not data:
            return None
        return cls(
            dag_id=str(data["dag_id"]),
            run_id=str(data["run_id"]),
            task_id=str(data["task_id"]),
            map_index=int(data.get("map_index", -1)),
        )


@dataclass(frozen=True, slots=True)
class RowCertificate:
    """A partition's row count and order-independent row hash, recorded by the commit that wrote it.

    `row_hash` is 16 hex digits: the sum modulo 2**64 of one 64-bit hash per row (`write/row_hash.py`
    defines it), so the certificate of a union of rows is the sum of the parts' and a duplicate row
    counts twice. `algorithm` names the row hash; certificates of different algorithms do not compare.
    """

    rows: int
    row_hash: str
    algorithm: str
    # The files the commit certified, as a digest of their SHA-256s (`row_hash.files_digest`); None:
    # not bound. Only a bound certificate whose files still match may stand in for reading them.
    files: str | None = None

    def plus(self, other: RowCertificate | None) -> RowCertificate | None:
        """The certificate of both row sets together (None when `other` is None or hashed otherwise);
        unbound from files (the commit binds the sum to the files it publishes)."""
        if other is None or other.algorithm != self.algorithm:
            return None
        total = (int(self.row_hash, 16) + int(other.row_hash, 16)) % (1 << 64)
        return RowCertificate(self.rows + other.rows, f"{total:016x}", self.algorithm)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rows": self.rows, "row_hash": self.row_hash, "algorithm": self.algorithm}
        if self.files is not None:
            out["files"] = self.files
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> RowCertificate | None:
        if not data:
            return None
        files = data.get("files")
        return cls(
            rows=int(data["rows"]),
            row_hash=str(data["row_hash"]),
            algorithm=str(data["algorithm"]),
            files=str(files) if files is not None else None,
        )


@dataclass(frozen=True, slots=True)
class PartitionEntry:
    """One partition in one catalog version: its key, files and provenance."""

    key: PartitionKey
    key_path: str
    spec_id: str
    files: tuple[DataFile, ...]
    rows: int
    bytes: int
    source_fingerprint: str | None
    refreshed_at: dt.datetime
    # Which task instance wrote it, when an Airflow task did (None: the CLI, a bootstrap, older versions).
    written_by: WrittenBy | None = None
    # The rows' count and hash as the writing commit computed them from its files (None: written by a
    # path that does not certify, or by an older release). `verify` compares the files with it.
    certificate: RowCertificate | None = None
    # The commit id of the commit that last wrote (upserted) the partition, as its commit record names it;
    # set when a snapshot is built from the records (None: that commit had no id, or a checkpoint of an
    # older release). Provenance, like `refreshed_at` for a reader, but not part of the entry's identity:
    # left out of equality (a bootstrap compares a local entry with the snapshot's) and of `to_json` (a
    # commit record's upserts do not carry it; replaying the record sets it).
    commit_id: str | None = field(default=None, compare=False)
    # `files_digest` of the files a refresh wrote whole from the source (its rows were then exactly the
    # source's rows of its key, nothing kept or appended); None otherwise. Any later change of the rows
    # (a write, an append, a move into it, a compaction) gives the partition other files, so the mark
    # holds only while it equals the digest of the entry's files (`whole_from_source`), whichever path
    # copied the entry along. Derived from the files like `commit_id` is provenance: left out of equality.
    from_source: str | None = field(default=None, compare=False)

    @property
    def whole_from_source(self) -> bool:
        """Whether the partition's files are still those a refresh wrote whole from the source."""
        return self.from_source is not None and self.from_source == files_digest(self.files)

    @classmethod
    def from_files(
        cls,
        key: PartitionKey,
        partition_spec: PartitionSpecInfo,
        files: Sequence[DataFile],
        *,
        source_fingerprint: str | None = None,
        refreshed_at: dt.datetime | None = None,
    ) -> PartitionEntry:
        """An entry for `key` whose rows / bytes are the sums over `files`; refreshed now by default."""
        return cls(
            key=key,
            key_path=key.path(partition_spec.names),
            spec_id=partition_spec.spec_id,
            files=tuple(files),
            rows=sum(f.rows for f in files),
            bytes=sum(f.bytes for f in files),
            source_fingerprint=source_fingerprint,
            refreshed_at=refreshed_at or dt.datetime.now(dt.UTC),
        )

    def with_files(self, files: Sequence[DataFile]) -> PartitionEntry:
        """This entry holding `files` instead (e.g. as the engine published them); rows and bytes summed."""
        return replace(
            self, files=tuple(files), rows=sum(f.rows for f in files), bytes=sum(f.bytes for f in files)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "key_path": self.key_path,
            "key": self.key.to_json(),
            "spec_id": self.spec_id,
            "files": [f.to_json() for f in self.files],
            "rows": self.rows,
            "bytes": self.bytes,
            "source_fingerprint": self.source_fingerprint,
            "refreshed_at": format_time(self.refreshed_at),
            **({"written_by": self.written_by.to_json()} if self.written_by is not None else {}),
            **({"certificate": self.certificate.to_json()} if self.certificate is not None else {}),
            **({"from_source": self.from_source} if self.from_source is not None else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PartitionEntry:
        try:
            return cls(
                key=PartitionKey.from_json(data["key"]),
                key_path=str(data["key_path"]),
                spec_id=str(data["spec_id"]),
                files=tuple(DataFile.from_json(f) for f in data["files"]),
                rows=int(data["rows"]),
                bytes=int(data["bytes"]),
                source_fingerprint=data.get("source_fingerprint"),
                refreshed_at=parse_time(data["refreshed_at"]),
                written_by=WrittenBy.from_json(data.get("written_by")),
                certificate=RowCertificate.from_json(data.get("certificate")),
                commit_id=data.get("commit_id"),
                from_source=data.get("from_source"),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise CatalogError(f"malformed partition entry: {err}") from err


def files_digest(files: Sequence[DataFile]) -> str:
    """A digest of a partition's files (paths and content checksums, in any order): `PartitionEntry
    .from_source` marks a set of files with it."""
    text = "\n".join(sorted(f"{f.path}\t{f.table or ''}\t{f.checksum}" for f in files))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class VersionInfo:
    """What one commit did, and the totals of the snapshot it produced."""

    version: int
    committed_at: dt.datetime
    operation: str
    partitions_changed: int
    partitions_removed: int
    rows: int
    bytes: int
    total_partitions: int
    total_rows: int
    total_bytes: int
    replace_all: bool
    spec_id: str
    commit_id: str | None = None
    # The row counts a refresh checked before this commit: {"partitions_checked", "routed", "written",
    # "source_rows" (None unless the whole source was scanned)}; None for other operations.
    conservation: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "committed_at": format_time(self.committed_at),
            "operation": self.operation,
            "partitions_changed": self.partitions_changed,
            "partitions_removed": self.partitions_removed,
            "rows": self.rows,
            "bytes": self.bytes,
            "total_partitions": self.total_partitions,
            "total_rows": self.total_rows,
            "total_bytes": self.total_bytes,
            "replace_all": self.replace_all,
            "spec_id": self.spec_id,
            "commit_id": self.commit_id,
            "conservation": dict(self.conservation) if self.conservation is not None else None,
        }


@dataclass(frozen=True, slots=True)
class VacuumReport:
    """What vacuum removed (or, in a dry run, would remove) and what it kept."""

    dry_run: bool
    latest_version: int | None
    oldest_retained_version: int | None
    removed_versions: tuple[int, ...] = ()
    removed_checkpoints: tuple[int, ...] = ()
    removed_files: tuple[VacuumedFile, ...] = ()
    removed_catalog_temporaries: int = 0
    young_files_kept: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Shared files (duckdb `tables` mode) with their size before and after vacuum rewrote them.
    shared_files: tuple[SharedFileCompaction, ...] = ()

    @property
    def bytes_freed(self) -> int:
        return sum(f.bytes for f in self.removed_files)

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "latest_version": self.latest_version,
            "oldest_retained_version": self.oldest_retained_version,
            "removed_versions": list(self.removed_versions),
            "removed_checkpoints": list(self.removed_checkpoints),
            "removed_files": [{"path": f.path, "bytes": f.bytes} for f in self.removed_files],
            "removed_catalog_temporaries": self.removed_catalog_temporaries,
            "young_files_kept": self.young_files_kept,
            "bytes_freed": self.bytes_freed,
            "notes": list(self.notes),
            "shared_files": [c.to_json() for c in self.shared_files],
        }


def format_time(value: dt.datetime) -> str:
    """ISO 8601 in UTC with microseconds; naive datetimes are taken as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC).isoformat(timespec="microseconds")


def parse_time(text: str) -> dt.datetime:
    """Inverse of `format_time`; any ISO 8601 time is accepted (`Z` suffix, fewer digits; naive is UTC)."""
    value = dt.datetime.fromisoformat(text)
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
