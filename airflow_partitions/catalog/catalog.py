"""The versioned partition catalog of one dataset: open versions, commit atomically with OCC, vacuum.

Layout under the store (the dataset name is escaped with `keys.escape_component`):

    <dataset>/_catalog/log/<version // 1000>/<version>.json    one commit record per version (immutable)
    <dataset>/_catalog/checkpoints/<version>.arrow             full partition table of some versions
    <dataset>/_catalog/checkpoints/<version>.arrow.sha256      SHA-256 of that checkpoint's bytes
    <dataset>/_catalog/_last_checkpoint                        hint: newest checkpoint version

**Commit protocol.** Version N+1 exists once its commit record exists, and the record is created with
`put_if_absent`, so exactly one writer can create it: a reader sees version N or N+1, never a mix, and a
multi-partition commit is atomic. A writer that loses the race reads the records committed since its base
version; if none of them touched a partition it touches (and none replaced everything or changed the
partition spec), it rebases onto the new head and tries N+2, else it raises `CommitConflictError` naming
the partitions. Nothing is written before the record, so a writer killed at any point leaves the previous
version intact; a record is the only thing that makes a version, so no commit is ever half applied.
Every record carries a commit id (the caller's, else a fresh one), so a writer whose write landed but
whose response was lost recognises its own record and reports its version: it is published exactly once.
A snapshot also remembers the ids of its newest `RECENT_COMMIT_IDS` commits (kept in checkpoints), so a
caller retrying with its commit id after re-planning from a newer base, which already holds the first
attempt, gets that version back instead of a second publication. With `check_files` (set by
`open_catalog`) a commit first checks that every file it newly references exists (one stat, or one HEAD
on S3, per new file): a file vacuumed between its write and the commit refuses the commit.

**Integrity.** Records form a digest chain (see `state`): every record read in full is checked against
its own digest and its predecessor's, and every checkpoint against its `.sha256` object (once per
process for a local file); a mismatch raises `CatalogIntegrityError` naming the version and the repair.

**Reading.** The newest version is found by listing the log after the hint's checkpoint (one list request
on S3; one shard directory locally), then loaded as checkpoint + the few records after it. A `Catalog`
keeps the newest snapshot it has seen and advances it by the records that follow, so planning and
committing in one process read the big checkpoint once. Checkpoints are written after a commit every
`checkpoint_interval` versions (or sooner after many changed partitions), with `put_if_absent`; losing
one costs only speed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from airflow_partitions.catalog.model import (
    PartitionEntry,
    PartitionSpecInfo,
    VacuumReport,
    VersionInfo,
    qualified_key_path,
    split_key_path,
)
from airflow_partitions.catalog.state import (
    CommitRecord,
    PartitionMap,
    Snapshot,
    apply_changes,
    broken_link,
    checkpoint_has_digest,
    decode_checkpoint,
    empty_state_table,
    encode_checkpoint,
    merge_records,
    remember_commit_ids,
)
from airflow_partitions.catalog.tags import (
    TagInfo,
    begin_vacuum,
    decide_vacuum,
    end_vacuum,
    list_tags,
    resolve_tag,
    write_tag,
)
from airflow_partitions.exceptions import (
    CatalogError,
    CatalogIntegrityError,
    CommitConflictError,
    CommitFilesMissingError,
    CommitOutcomeUnknownError,
    ObjectStoreError,
    PartitionSpecChangedError,
    PartitionValueError,
    VersionNotFoundError,
)
from airflow_partitions.keys import escape_component
from airflow_partitions.objectstore import LocalStore, ObjectStore
from airflow_partitions.storage.base import (
    PartitionStorage,
    SharedFileCompaction,
    VacuumedFile,
    vacuum_files,
)
from airflow_partitions.storage.datafile import DataFile
from airflow_partitions.storage.remote import vacuum_remote_files

log = logging.getLogger(__name__)

LOG_SHARD_SIZE = 1000
DEFAULT_CHECKPOINT_INTERVAL = 10
DEFAULT_CHECKPOINT_CHANGES = 5000
DEFAULT_RETENTION = dt.timedelta(days=7)
DEFAULT_GRACE = dt.timedelta(hours=1)
_HEADER_BYTES = 16 * 1024
# Writes of one commit record before a commit gives up (each a conditional write the store may repeat).
_PUBLISH_ATTEMPTS = 3
_FETCH_THREADS = 8
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()
# Local checkpoint files whose bytes matched their digest in this process: (path, size, mtime_ns).
_verified_checkpoints: set[tuple[str, int, int]] = set()


def _shared_executor() -> ThreadPoolExecutor:
    # One pool per process: starting threads on every open costs more than the requests they overlap.
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=_FETCH_THREADS, thread_name_prefix="catalog-fetch")
        return _executor


# Waits between commit attempts after the second lost race: random in [0, min(cap, base * 2**(n-1))].
COMMIT_BACKOFF_BASE_S = 0.01
COMMIT_BACKOFF_CAP_S = 0.5


def commit_backoff(lost: int) -> float:
    """Seconds to wait before the next attempt after losing race number `lost` + 1 (exponential backoff
    with full jitter, as S3 recommends for conditional writes); the first retry goes at once."""
    if lost < 1:
        return 0.0
    return random.uniform(0.0, min(COMMIT_BACKOFF_CAP_S, COMMIT_BACKOFF_BASE_S * 2 ** min(lost - 1, 16)))


def _known_specs(
    base: Snapshot | None,
    partition_spec: PartitionSpecInfo,
    replace_all: bool,
    other_specs: Sequence[PartitionSpecInfo],
) -> dict[str, PartitionSpecInfo]:
    """The specs besides `partition_spec` a commit may write under: the base's (kept unless it replaces
    everything) and `other_specs`."""
    known = dict(base.specs) if base is not None and not replace_all else {}
    for spec in other_specs:
        known.setdefault(spec.spec_id, spec)
    known.pop(partition_spec.spec_id, None)
    return known


# Listings of the checkpoints a read of an old version tries before it calls the version gone (`_rebuild`).
_REBUILD_LISTINGS = 4


class Catalog:
    """Versioned manifest of one dataset's partitions in an `ObjectStore` (local directory or S3)."""

    def __init__(
        self,
        store: ObjectStore,
        dataset: str,
        *,
        data_root: Path | None = None,
        storage: PartitionStorage | None = None,
        checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
        checkpoint_changes: int = DEFAULT_CHECKPOINT_CHANGES,
        cache_dir: Path | None = None,
        data_store: ObjectStore | None = None,
        check_files: bool = False,
    ) -> None:
        if not dataset:
            raise CatalogError("a catalog needs a dataset name")
        if checkpoint_interval < 1:
            raise CatalogError(f"checkpoint_interval must be >= 1, got {checkpoint_interval}")
        self.store = store
        self.dataset = dataset
        self.prefix = f"{escape_component(dataset)}/_catalog"
        if data_root is None and isinstance(store, LocalStore):
            data_root = store.root / escape_component(dataset)
        self.data_root = data_root
        # The dataset's partition files on object storage (an `s3://` accelerator_dir): vacuum lists and
        # deletes there, and readers read there. None for local files.
        self.data_store = data_store
        self.storage = storage
        # Check that the files a commit newly references exist before publishing it (`open_catalog`
        # sets it; a catalog built by hand may describe files it never wrote).
        self.check_files = check_files
        self.checkpoint_interval = checkpoint_interval
        self.checkpoint_changes = checkpoint_changes
        # Remote stores only: checkpoints downloaded once per host, then memory-mapped from here.
        self.cache_dir = None if store.local_path(self._hint_key) is not None else cache_dir
        self._lock = threading.RLock()
        self._newest: Snapshot | None = None
        self._hint: int | None = None  # last `_last_checkpoint` value read; only ever a shortcut
        self._contended = False  # the last commit lost a race: list before writing next time

    def __repr__(self) -> str:
        return f"Catalog({self.store.describe()!r}, dataset={self.dataset!r})"

    # --- keys -------------------------------------------------------------------------------------

    @property
    def _log_prefix(self) -> str:
        return f"{self.prefix}/log/"

    def _log_key(self, version: int) -> str:
        return f"{self.prefix}/log/{version // LOG_SHARD_SIZE:010d}/{version:020d}.json"

    def _checkpoint_key(self, version: int) -> str:
        return f"{self.prefix}/checkpoints/{version:020d}.arrow"

    def _checkpoint_digest_key(self, version: int) -> str:
        return f"{self._checkpoint_key(version)}.sha256"

    @property
    def _hint_key(self) -> str:
        return f"{self.prefix}/_last_checkpoint"

    @staticmethod
    def _version_of(key: str, suffix: str) -> int | None:
        name = key.rsplit("/", 1)[-1]
        if not name.endswith(suffix):
            return None
        stem = name[: -len(suffix)]
        return int(stem) if stem.isdigit() else None

    # --- reading ----------------------------------------------------------------------------------

    def latest(self) -> Snapshot | None:
        """The newest version, or `None` when nothing was committed yet."""
        with self._lock:
            known = self._newest
        if known is not None:
            return self._load(self._last_log_after(known.version) or known.version)
        hint = self._read_hint()
        if hint == 0 or self.store.local_path(self._hint_key) is not None:
            head = self._last_log_after(hint) or hint
            return self._load(head) if head else None
        # Remote store, first open: download the checkpoint while listing and fetching the records after it.
        checkpoint = _shared_executor().submit(self._read_checkpoint, hint)
        head = self._last_log_after(hint) or hint
        try:
            records: list[CommitRecord] | None = self._records(hint, head)
        except VersionNotFoundError:
            records = None
        base = checkpoint.result()
        if base is None or records is None:
            return self._load(head)  # the hinted checkpoint was vacuumed meanwhile: take the general path
        snapshot = self._advance(base, records)
        self._remember(snapshot)
        return snapshot

    def snapshot(self, version: int | None = None) -> Snapshot:
        """Version `version` (newest when `None`); `VersionNotFoundError` if absent or vacuumed."""
        if version is None:
            newest = self.latest()
            if newest is None:
                raise VersionNotFoundError(f"dataset {self.dataset!r} has no committed version yet")
            return newest
        if version < 1:
            raise VersionNotFoundError(f"catalog versions start at 1; got {version}")
        return self._load(version)

    def head_version(self) -> int:
        """The newest committed version number (0 when none), without loading it."""
        return self._head()

    def versions(self, limit: int | None = None) -> list[VersionInfo]:
        """Retained versions, oldest first (only the newest `limit` when given), read from record headers."""
        keys = [
            (v, info.key) for info in self.store.list(self._log_prefix) if (v := self._log_version(info.key))
        ]
        if limit is not None:
            keys = keys[-limit:] if limit > 0 else []
        headers = self._fetch([key for _, key in keys], self._read_header)
        return [self._version_info(header) for header in headers]

    def _log_version(self, key: str) -> int | None:
        return self._version_of(key, ".json")

    def version_stored(self, version: int) -> bool:
        """Whether `version`'s commit record or its checkpoint is stored (read from the store, no cache):
        vacuum deletes both before it deletes the version's files."""
        return self.store.exists(self._log_key(version)) or self.store.exists(self._checkpoint_key(version))

    def version_commit_id(self, version: int) -> str | None:
        """The commit id of `version` (None when its record is expired and only a checkpoint keeps it)."""
        try:
            return self._read_header(self._log_key(version)).commit_id
        except VersionNotFoundError:
            return None

    # --- tags (`catalog/tags.py`) -------------------------------------------------------------------

    def tags(self) -> dict[str, TagInfo]:
        """Every tag of the dataset, by name."""
        return list_tags(self)

    def tag(self, name: str, version: int | None = None) -> TagInfo:
        """Point tag `name` at `version` (default: the newest), creating or moving it atomically."""
        number = version if version is not None else self._head()
        if not number:
            raise VersionNotFoundError(f"dataset {self.dataset!r} has no committed version to tag yet")
        info = write_tag(self, name, number)
        assert info is not None
        return info

    def delete_tag(self, name: str) -> None:
        """Remove tag `name` (its version is vacuumed normally from then on); `UnknownTagError` if absent."""
        write_tag(self, name, None)

    def tagged_version(self, name: str) -> int:
        """The version tag `name` names; `UnknownTagError` (listing the known tags) when it names none."""
        info = resolve_tag(self, name)
        if info.commit_id is not None:
            current = self.version_commit_id(info.version)
            if current is not None and current != info.commit_id:
                raise CatalogIntegrityError(
                    f"dataset {self.dataset!r}: tag {name!r} names version {info.version} of commit "
                    f"{info.commit_id}, but that version's record holds commit {current}; the catalog was "
                    "rebuilt or edited since the tag was written. Tag the intended version again.",
                    dataset=self.dataset,
                    version=info.version,
                    key=self._log_key(info.version),
                )
        return info.version

    def _version_info(self, record: CommitRecord) -> VersionInfo:
        summary = record.summary
        return VersionInfo(
            version=record.version,
            committed_at=record.committed_at,
            operation=record.operation,
            partitions_changed=summary.get("partitions_changed", 0),
            partitions_removed=summary.get("partitions_removed", 0),
            rows=summary.get("rows", 0),
            bytes=summary.get("bytes", 0),
            total_partitions=summary.get("total_partitions", 0),
            total_rows=summary.get("total_rows", 0),
            total_bytes=summary.get("total_bytes", 0),
            replace_all=record.replace_all,
            spec_id=record.partition_spec.spec_id,
            commit_id=record.commit_id,
            conservation=record.conservation,
        )

    def _read_hint(self) -> int:
        data = self.store.get(self._hint_key)
        try:
            hint = 0 if data is None else int(json.loads(data)["version"])
        except (ValueError, KeyError, TypeError):
            hint = 0  # a hint is only a shortcut; a damaged one means "start from the beginning"
        self._hint = hint
        return hint

    def _head(self) -> int:
        with self._lock:
            known = self._newest.version if self._newest is not None else 0
        start = known or self._read_hint()
        return self._last_log_after(start) or start

    def _last_log_after(self, version: int) -> int:
        last = 0
        start_after = self._log_key(version) if version else None
        for info in self.store.list(self._log_prefix, start_after=start_after):
            number = self._log_version(info.key)
            if number is not None and number > last:
                last = number
        return last

    def _read_record(self, key: str) -> CommitRecord:
        data = self.store.get(key)
        if data is None:
            version = self._log_version(key)
            raise VersionNotFoundError(
                f"version {version} of dataset {self.dataset!r} is not retained (vacuumed or never committed)"
            )
        try:
            return CommitRecord.decode(data, where=key)
        except CatalogIntegrityError as err:
            version = self._log_version(key)
            raise self._integrity_error(f"commit record of version {version}", version, key, err) from err

    def _integrity_error(
        self, what: str, version: int | None, key: str, cause: object
    ) -> CatalogIntegrityError:
        return CatalogIntegrityError(
            f"dataset {self.dataset!r}: the {what} ({self.store.describe()}/{key}) is not the one that was "
            f"committed ({cause}); it was edited or damaged, and reading on could return wrong rows. Restore "
            "it from a backup; or move the dataset's _catalog directory aside and rebuild the dataset with a "
            "full refresh (`airflow-partitions refresh SPEC DATASET --full`).",
            dataset=self.dataset,
            version=version,
            key=key,
        )

    def _read_header(self, key: str) -> CommitRecord:
        data = self.store.get_range(key, 0, _HEADER_BYTES)
        if data is None:
            return self._read_record(key)
        return CommitRecord.decode_header(data, where=key) or self._read_record(key)

    def _fetch(self, keys: Sequence[str], read: Any) -> list[Any]:
        # Local reads are microseconds each; remote ones are round trips worth overlapping.
        if len(keys) < 2 or self.store.local_path(keys[0]) is not None:
            return [read(key) for key in keys]
        return list(_shared_executor().map(read, keys))

    def _records(self, after: int, through: int) -> list[CommitRecord]:
        """Commit records `after + 1 .. through`, in order."""
        if through <= after:
            return []
        records: list[CommitRecord] = self._fetch(
            [self._log_key(v) for v in range(after + 1, through + 1)], self._read_record
        )
        return records

    def _load(self, version: int) -> Snapshot:
        with self._lock:
            newest = self._newest
        if newest is not None and newest.version == version:
            return newest
        snapshot: Snapshot | None = None
        if newest is not None and newest.version < version:
            try:
                snapshot = self._advance(newest, self._records(newest.version, version))
            except VersionNotFoundError:
                snapshot = None  # records after the cached version were vacuumed: rebuild from a checkpoint
        if snapshot is None:
            snapshot = self._rebuild(version)
        self._remember(snapshot)
        return snapshot

    def _rebuild(self, version: int) -> Snapshot:
        # A checkpoint whose following records are gone (a stale hint after an interrupted vacuum) is
        # skipped for the next candidate; the last resort replays every record from version 1.
        # When every starting point failed, a vacuum may have run since the listing: it writes the
        # checkpoint at its oldest retained version before it expires the records older ones needed.
        # So list again while the listing changes; only then is the version really gone.
        listed: list[tuple[int, tuple[int, ...]]] = []
        for attempt in range(_REBUILD_LISTINGS):
            if attempt:
                self._hint = None  # read the hint again too
            for base in self._checkpoints_at_or_below(version, listed):
                try:
                    records = self._records(base.version if base is not None else 0, version)
                except VersionNotFoundError:
                    continue
                if records:
                    return self._advance(base, records)
                if base is not None:
                    return base
            if len(listed) >= 2 and listed[-1] == listed[-2]:
                break
        raise self._not_found(version)

    def _not_found(self, version: int) -> VersionNotFoundError:
        retained = [v for info in self.store.list(self._log_prefix) if (v := self._log_version(info.key))]
        if not retained:
            return VersionNotFoundError(f"dataset {self.dataset!r} has no committed version yet")
        if version > retained[-1]:
            return VersionNotFoundError(
                f"version {version} of dataset {self.dataset!r} does not exist; the newest is {retained[-1]}"
            )
        return VersionNotFoundError(
            f"version {version} of dataset {self.dataset!r} was vacuumed; retained versions are "
            f"{retained[0]}..{retained[-1]}"
        )

    def _remember(self, snapshot: Snapshot) -> None:
        with self._lock:
            # Same version again replaces too: it may carry a newer checkpoint position.
            if self._newest is None or snapshot.version >= self._newest.version:
                self._newest = snapshot

    def _checkpoints_at_or_below(
        self, version: int, listed: list[tuple[int, tuple[int, ...]]] | None = None
    ) -> Iterator[Snapshot | None]:
        """Starting points for `version`, best first: the hinted checkpoint, the others newest first, and
        finally `None` (replay from the first record). Lazy: the listing happens only if needed; what it
        found (the hint and the checkpoint versions) is appended to `listed`."""
        hint = self._hint if self._hint is not None else self._read_hint()
        if 0 < hint <= version:
            checkpoint = self._read_checkpoint(hint)
            if checkpoint is not None:
                yield checkpoint
        candidates = [
            v
            for info in self.store.list(f"{self.prefix}/checkpoints/")
            if (v := self._version_of(info.key, ".arrow")) is not None and v <= version and v != hint
        ]
        if listed is not None:
            listed.append((hint, tuple(sorted(candidates))))
        for candidate in sorted(candidates, reverse=True):
            checkpoint = self._read_checkpoint(candidate)
            if checkpoint is not None:
                yield checkpoint
        yield None

    def _read_checkpoint(self, version: int) -> Snapshot | None:
        import pyarrow as pa

        key = self._checkpoint_key(version)
        path = self.store.local_path(key)
        if path is None and self.cache_dir is not None:
            path = self._cached_checkpoint(key)
        if path is not None:
            try:
                source: Any = pa.memory_map(str(path), "r").read_buffer()
                info = path.stat()
            except FileNotFoundError:
                return None
            seen = (str(path), info.st_size, info.st_mtime_ns)
            if seen not in _verified_checkpoints:
                if not self._checkpoint_verified(version, key, source):
                    return None
                _verified_checkpoints.add(seen)
            return decode_checkpoint(source, where=str(path))
        data = self.store.get(key)
        if data is None or not self._checkpoint_verified(version, key, data):
            return None
        return decode_checkpoint(data, where=key)

    def _checkpoint_verified(self, version: int, key: str, data: Any) -> bool:
        """Whether checkpoint bytes `data` may be used: they match their digest object, or predate digests.

        A checkpoint written with digests but without its digest object (its writer stopped in between) is
        skipped, as if absent: the version is rebuilt from an older checkpoint and the records."""
        expected = self.store.get(self._checkpoint_digest_key(version))
        if expected is None:
            if checkpoint_has_digest(data):
                log.warning("dataset %s: checkpoint %s has no digest object; not used", self.dataset, key)
                return False
            return True  # written before digests existed
        actual = hashlib.sha256(memoryview(data)).hexdigest()
        if actual != expected.decode("ascii", "replace").strip():
            raise self._integrity_error(
                f"checkpoint of version {version}",
                version,
                key,
                f"its bytes hash to {actual}, not to the digest written with it",
            )
        return True

    def _cached_checkpoint(self, key: str) -> Path | None:
        """A local copy of a remote checkpoint (immutable, so a copy never goes stale); `None` if absent."""
        assert self.cache_dir is not None
        path = self.cache_dir / key.rsplit("/", 1)[-1]
        if path.exists():
            return path
        data = self.store.get(key)
        if data is None:
            return None
        LocalStore(self.cache_dir).put_if_absent(path.name, data)
        return path

    def _advance(self, base: Snapshot | None, records: Sequence[CommitRecord]) -> Snapshot:
        if not records:
            if base is None:
                raise CatalogError("internal: nothing to build a snapshot from")
            return base
        self._check_chain(base.record_digest if base is not None else None, records)
        changes, reset = merge_records(records)
        table = base.table if base is not None else empty_state_table()

        last = records[-1]
        changed = sum(len(r.upserts) + len(r.removes) for r in records)
        return Snapshot(
            version=last.version,
            partition_spec=last.partition_spec,
            committed_at=last.committed_at,
            operation=last.operation,
            partitions=PartitionMap(apply_changes(table, changes, reset=reset or base is None)),
            checkpoint_version=base.checkpoint_version if base is not None else 0,
            changes_since_checkpoint=(base.changes_since_checkpoint if base is not None else 0) + changed,
            record_digest=last.digest,
            commit_ids=remember_commit_ids(base.commit_ids if base is not None else {}, records),
            other_specs=last.other_specs,
        )

    def _check_chain(self, previous: str | None, records: Sequence[CommitRecord]) -> None:
        broken = broken_link(previous, records)
        if broken is not None:
            raise self._integrity_error(
                f"commit record of version {broken.version}",
                broken.version,
                self._log_key(broken.version),
                f"it names {broken.parent_digest} as its parent's digest and has digest {broken.digest}, "
                f"which does not continue the digest chain from version {broken.version - 1}",
            )

    # --- committing -------------------------------------------------------------------------------

    def commit(
        self,
        *,
        base_version: int | None,
        upserts: Sequence[PartitionEntry],
        removes: Sequence[str] = (),
        partition_spec: PartitionSpecInfo,
        replace_all: bool = False,
        operation: str = "refresh",
        max_retries: int = 50,
        commit_id: str | None = None,
        conservation: Mapping[str, Any] | None = None,
        check_intervening: Callable[[CommitRecord], None] | None = None,
        evolve: bool = False,
        other_specs: Sequence[PartitionSpecInfo] = (),
    ) -> int:
        """Publish `upserts` and `removes` atomically as a new version based on `base_version`; its number.

        `base_version` is the version the changes were planned from (`None` for an empty catalog). Commits
        made since then are fine if they touched other partitions: this one rebases onto them. If one
        touched the same partitions, replaced everything, or changed the partition spec, it raises
        `CommitConflictError` (or `PartitionSpecChangedError`). `replace_all=True` makes `upserts` the whole
        partition set (re-partitioning under a new spec); it must be based on the newest version.
        `commit_id` makes a retried commit idempotent: if a commit with that id landed since
        `base_version`, or is among the newest `RECENT_COMMIT_IDS` commits up to it (a retry re-planned
        from a base that already holds its first attempt), its version is returned instead of committing
        twice. Without one, the commit
        gets a fresh id: after a write whose response was lost, the record found at the version is read
        back, and carrying this id means it is this commit's own (success), not a conflicting one.
        `conservation` (JSON) is recorded in the header as is: the row counts the refresh checked
        (`VersionInfo.conservation`). `check_intervening` is called with each commit made since the base
        that this one rebases onto (after the partition checks), before it is published: it raises (e.g.
        `CommitConflictError`) to refuse the rebase on grounds the catalog cannot see, such as an upsert's
        keys now held by a partition it does not touch.
        With `check_files`, files the base does not reference must exist,
        else `CommitFilesMissingError` and nothing is published.
        `evolve=True` lets the commit change the current partition spec while partitions of the base's
        specs stay (a re-partitioning step, `evolution_changes`): like `replace_all` it must be based on
        the newest version. Entries of a spec other than `partition_spec` carry qualified key paths.
        `other_specs` names specs besides the base's that upserts may be written under (a bootstrap of a
        snapshot published mid-migration into an empty catalog); the version records those still in use.
        """
        token = commit_id if commit_id is not None else uuid.uuid4().hex
        base = self._load(base_version) if base_version else None
        base_number = base_version or 0
        known = _known_specs(base, partition_spec, replace_all, other_specs)
        self._validate_commit(upserts, removes, partition_spec, replace_all, known)
        if commit_id is not None and base is not None and commit_id in base.commit_ids:
            return base.commit_ids[commit_id]  # published by an earlier attempt, before this base
        if not evolve:
            self._check_spec(base, partition_spec, replace_all)
        in_use = ({e.spec_id for e in upserts}) | (
            base.spec_ids_in_use() if base is not None and not replace_all else set()
        )
        other_specs = tuple(spec for spec_id, spec in known.items() if spec_id in in_use)
        if base is not None and not replace_all:
            self._check_removes_in_base(base, removes, base_number)
        return self._publish_commit(
            base=base,
            base_number=base_number,
            token=token,
            upserts=upserts,
            removes=removes,
            partition_spec=partition_spec,
            replace_all=replace_all,
            evolve=evolve,
            operation=operation,
            conservation=conservation,
            other_specs=other_specs,
            check_intervening=check_intervening,
            max_retries=max_retries,
        )

    def _publish_commit(
        self,
        *,
        base: Snapshot | None,
        base_number: int,
        token: str,
        upserts: Sequence[PartitionEntry],
        removes: Sequence[str],
        partition_spec: PartitionSpecInfo,
        replace_all: bool,
        evolve: bool,
        operation: str,
        conservation: Mapping[str, Any] | None,
        other_specs: tuple[PartitionSpecInfo, ...],
        check_intervening: Callable[[CommitRecord], None] | None,
        max_retries: int,
    ) -> int:
        """`commit` once validated: rebase onto the commits since the base and publish the next version,
        retrying a lost race up to `max_retries` times."""
        upsert_json = tuple(entry.to_json() for entry in upserts)
        touched = {entry.key_path for entry in upserts} | set(removes)
        parent = base_number
        parent_totals = (
            (base.partition_count, base.total_rows, base.total_bytes) if base is not None else (0, 0, 0)
        )
        intervening: list[CommitRecord] = []
        parent_digest = base.record_digest if base is not None else None
        if self.check_files:
            self._check_files_exist(base, upserts)
        with self._lock:
            newest_known = self._newest.version if self._newest is not None else 0
        # Planned from the newest version this process has seen and no race lost lately: try N+1 straight
        # away. Under contention a failed conditional write costs more than listing first.
        optimistic = base_number == newest_known and not self._contended
        head = base_number if optimistic else self._head()
        for attempt in range(max_retries + 1):
            if head > parent:
                own, newer = self._rebase_onto(
                    parent,
                    head,
                    parent_digest,
                    token,
                    touched,
                    base_number,
                    partition_spec,
                    replace_all or evolve,
                    check_intervening,
                )
                if own is not None:
                    return own
                intervening.extend(newer)
                parent = head
                parent_digest = newer[-1].digest
                totals = newer[-1].summary
                parent_totals = (totals["total_partitions"], totals["total_rows"], totals["total_bytes"])
            record, data = CommitRecord(
                version=parent + 1,
                committed_at=dt.datetime.now(dt.UTC),
                operation=operation,
                replace_all=replace_all,
                partition_spec=partition_spec,
                commit_id=token,
                base_version=base_number,
                summary=self._summary(base, upserts, removes, replace_all, parent_totals),
                upserts=upsert_json,
                removes=tuple(removes),
                conservation=conservation,
                parent_digest=parent_digest,
                other_specs=other_specs,
            ).seal()
            if self._publish(record, data):
                self._contended = attempt > 0
                self._after_commit(base, intervening, record)
                return record.version
            self._contended = True
            if attempt > 0:
                # Lost again: back off (full jitter) so a writer slower than the others is not starved.
                time.sleep(commit_backoff(attempt))
            head = self._last_log_after(parent) or parent + 1
        raise CommitConflictError(
            f"commit to dataset {self.dataset!r} lost the race {max_retries + 1} times to other commits "
            "(each touching other partitions); retry later or raise max_retries",
            version=head,
        )

    def _check_removes_in_base(self, base: Snapshot, removes: Sequence[str], base_number: int) -> None:
        """Refuse removing a partition the base version does not hold."""
        missing = [key_path for key_path in removes if key_path not in base.partitions]
        if missing:
            raise CatalogError(
                f"cannot remove partition(s) {missing[:5]} of dataset {self.dataset!r}: they are not in "
                f"base version {base_number}"
            )

    def _rebase_onto(
        self,
        parent: int,
        head: int,
        parent_digest: str | None,
        token: str,
        touched: set[str],
        base_number: int,
        partition_spec: PartitionSpecInfo,
        exclusive: bool,
        check_intervening: Callable[[CommitRecord], None] | None,
    ) -> tuple[int | None, list[CommitRecord]]:
        """The commits `parent + 1 .. head`, checked for conflicts with this one; with the version of this
        commit's own record if one of them is it (published earlier with the same id), else `None`."""
        try:
            newer = self._records(parent, head)
        except VersionNotFoundError as err:
            raise CommitConflictError(
                f"base version {base_number} of dataset {self.dataset!r} is too old: versions after "
                "it were vacuumed; plan again from the latest version",
                version=head,
            ) from err
        self._check_chain(parent_digest, newer)
        for record in newer:
            if record.commit_id == token:
                # This commit, published by an earlier call with the caller's commit_id, or by
                # an attempt of this call whose response was lost (see `_publish`).
                return record.version, newer
            self._check_concurrent(record, touched, base_number, partition_spec, exclusive)
            if check_intervening is not None:
                check_intervening(record)
        return None, newer

    def _publish(self, record: CommitRecord, data: bytes) -> bool:
        """Create `record`'s version: `True` if the record there is this commit's, `False` if refused.

        Refused (412) may mean this commit's own earlier attempt: S3 clients send a write whose response
        was lost again, and the record it created refuses it. The caller's next step reads the records
        after its parent anyway, and finds its own by the commit id. A write that fails outright may have
        landed too: then the record at the version is read back here. This commit's id means published,
        another's a lost race, none that the write never landed, so it is sent again.
        """
        assert record.commit_id is not None
        key = self._log_key(record.version)
        failure: ObjectStoreError | None = None
        for _attempt in range(_PUBLISH_ATTEMPTS):
            try:
                return self.store.put_if_absent(key, data)
            except ObjectStoreError as err:
                failure = err
            try:
                existing = self._read_header(key)
            except VersionNotFoundError:
                continue
            except ObjectStoreError as err:
                raise CommitOutcomeUnknownError(
                    f"dataset {self.dataset!r}: the outcome of committing version {record.version} is "
                    f"unknown: writing its record failed ({failure}) and reading it back failed ({err}). "
                    f"Commit again with commit_id={record.commit_id!r}: if this commit was published, "
                    "that returns its version instead of publishing it twice",
                    commit_id=record.commit_id,
                    version=record.version,
                ) from err
            return existing.commit_id == record.commit_id
        assert failure is not None
        raise ObjectStoreError(
            f"dataset {self.dataset!r}: cannot commit version {record.version}: {failure}. Nothing was "
            "published (its record is absent) and the previous version stays current: commit again "
            "once the store is reachable"
        ) from failure

    def _check_files_exist(self, base: Snapshot | None, upserts: Sequence[PartitionEntry]) -> None:
        """Refuse to publish files that are gone (one stat, or one HEAD on S3, per file the base does
        not reference): a vacuum with a short grace may delete a write's files before its commit."""
        previous = {
            file
            for entry in (base.partitions.entries_of(e.key_path for e in upserts) if base is not None else [])
            for file in entry.files
        }
        # Files inside a shared DuckDB file (`table` set) are tables, not paths: their engine owns them.
        new = sorted({f.path for e in upserts for f in e.files if f.table is None and f not in previous})
        if not new:
            return
        if self.data_root is not None:
            root = self.data_root
            missing = [path for path in new if not os.path.isfile(root / path)]
            where = str(root)
        elif self.data_store is not None:
            store = self.data_store
            found = list(_shared_executor().map(store.exists, new))
            missing = [path for path, present in zip(new, found, strict=True) if not present]
            where = store.describe()
        else:
            return
        if missing:
            shown = ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
            raise CommitFilesMissingError(
                f"dataset {self.dataset!r}: {len(missing)} file(s) this commit would publish are missing "
                f"under {where}: {shown}. Nothing was published; the current version stays as it was. They "
                "were deleted after they were written (a vacuum with a grace shorter than the write took?): "
                "write or refresh again, and keep vacuum's grace longer than a write runs",
                missing=tuple(missing),
            )

    def _validate_commit(
        self,
        upserts: Sequence[PartitionEntry],
        removes: Sequence[str],
        partition_spec: PartitionSpecInfo,
        replace_all: bool,
        other_specs: Mapping[str, PartitionSpecInfo],
    ) -> None:
        seen: set[str] = set()
        for entry in upserts:
            if entry.key_path in seen:
                raise CatalogError(f"partition {entry.key_path!r} appears twice in one commit")
            seen.add(entry.key_path)
            names = partition_spec.names
            if entry.spec_id != partition_spec.spec_id:
                other = other_specs.get(entry.spec_id)
                if other is None:
                    raise CatalogError(
                        f"partition {entry.key_path!r} was written under partition spec {entry.spec_id!r} "
                        f"but is committed under {partition_spec.spec_id!r}; refresh it under the current "
                        "spec"
                    )
                names = other.names
            try:
                expected = entry.key.path(names)
                if entry.spec_id != partition_spec.spec_id:
                    expected = qualified_key_path(entry.spec_id, expected)
            except PartitionValueError as err:
                raise CatalogError(f"partition {entry.key_path!r}: {err}") from err
            if entry.key_path != expected:
                raise CatalogError(
                    f"partition entry key_path {entry.key_path!r} does not match its key under the spec's "
                    f"fields {list(names)} ({expected!r}); build it with PartitionKey.path(names)"
                )
        overlap = seen & set(removes)
        if overlap:
            raise CatalogError(f"partition(s) {sorted(overlap)[:5]} are both upserted and removed")
        if len(set(removes)) != len(removes):
            raise CatalogError("a partition is removed twice in one commit")
        if replace_all and removes:
            raise CatalogError("replace_all commits the whole partition set: pass no removes")

    @staticmethod
    def evolution_changes(
        base: Snapshot, spec: PartitionSpecInfo, *, leave: Collection[str] = ()
    ) -> tuple[list[PartitionEntry], list[str]]:
        """The renames that make `spec` current over `base` (commit them with `evolve=True`): every entry
        of another spec under a plain key path moves to its qualified one, and every entry of `spec` under a
        qualified path back to its plain one (a cancelled re-partitioning). Entries in `leave` (key paths
        of `base` the caller removes in the same commit) are not renamed."""
        if base.partition_spec.spec_id == spec.spec_id:
            return [], []
        upserts: list[PartitionEntry] = []
        removes: list[str] = []
        table = base.table
        spec_ids = table.column("spec_id").to_pylist()
        paths = table.column("key_path").to_pylist()
        moving = [
            path
            for path, spec_id in zip(paths, spec_ids, strict=True)
            if path not in leave and (split_key_path(path)[0] is None) != (spec_id == spec.spec_id)
        ]
        for entry in base.partitions.entries_of(moving):
            _, plain = split_key_path(entry.key_path)
            renamed = plain if entry.spec_id == spec.spec_id else qualified_key_path(entry.spec_id, plain)
            upserts.append(replace(entry, key_path=renamed))
            removes.append(entry.key_path)
        # A plain path handed from one spec's partition to another's is replaced, not removed.
        taken = {entry.key_path for entry in upserts}
        return upserts, [path for path in removes if path not in taken]

    @classmethod
    def evolved(cls, base: Snapshot, spec: PartitionSpecInfo) -> Snapshot:
        """`base` as the commit of its `evolution_changes` to `spec` would publish it, with the same version
        number and nothing committed: what the first refresh after a `partition_by` change plans on, whose
        own commit then makes the switch (`table.publish.CommitBuilder.fold_switch`)."""
        upserts, removes = cls.evolution_changes(base, spec)
        if not upserts and not removes and base.partition_spec.spec_id == spec.spec_id:
            return base
        changes: dict[str, Mapping[str, Any] | None] = dict.fromkeys(removes)
        changes.update((entry.key_path, entry.to_json()) for entry in upserts)
        others = tuple(other for spec_id, other in base.specs.items() if spec_id != spec.spec_id)
        return replace(
            base,
            partition_spec=spec,
            partitions=PartitionMap(apply_changes(base.table, changes, reset=False)),
            other_specs=others,
            _keys={},
        )

    def _check_spec(self, base: Snapshot | None, spec: PartitionSpecInfo, replace_all: bool) -> None:
        if base is None or replace_all or base.partition_spec.spec_id == spec.spec_id:
            return
        raise self._spec_changed(base.version, base.partition_spec, spec)

    def _spec_changed(self, version: int, old: PartitionSpecInfo, new: PartitionSpecInfo) -> Exception:
        return PartitionSpecChangedError(
            f"dataset {self.dataset!r}: the partition_by expressions ({new.describe()}) differ from those "
            f"that wrote its existing partitions ({old.describe()}, catalog version {version}); partitions "
            "of different layouts are never mixed. To re-partition, run a full refresh "
            "(`airflow-partitions refresh SPEC DATASET --full`, or the refresh DAG with full_refresh): it "
            "rebuilds every partition under the new expressions and replaces the old ones in one atomic "
            "commit. Or revert partition_by to the old expressions, or point accelerator_dir elsewhere. "
            "If only a source column was renamed, declare it in the dataset instead "
            "(`renamed_columns: {old: new}`): the layout stays and nothing is rewritten."
        )

    def _check_concurrent(
        self,
        record: CommitRecord,
        touched: set[str],
        base_number: int,
        spec: PartitionSpecInfo,
        replace_all: bool,
    ) -> None:
        if replace_all:
            raise CommitConflictError(
                f"dataset {self.dataset!r}: version {record.version} ({record.operation}) was committed "
                f"after base version {base_number}; a commit that replaces every partition or switches the "
                f"current partition spec ({spec.describe()}) must be based on the newest version: plan "
                "again (run the refresh or the repartition step again)",
                partitions=tuple(sorted(record.touched)[:100]),
                version=record.version,
            )
        if record.partition_spec.spec_id != spec.spec_id:
            raise self._spec_changed(record.version, record.partition_spec, spec)
        if record.replace_all:
            raise CommitConflictError(
                f"dataset {self.dataset!r}: version {record.version} ({record.operation}) replaced every "
                f"partition after base version {base_number}; plan again from the latest version",
                partitions=tuple(sorted(touched)[:100]),
                version=record.version,
            )
        overlap = touched & record.touched
        if overlap:
            shown = sorted(overlap)
            raise CommitConflictError(
                f"dataset {self.dataset!r}: partition(s) {', '.join(shown[:10])}"
                f"{' ...' if len(shown) > 10 else ''} changed in version {record.version} "
                f"({record.operation}) after base version {base_number}; refresh them again from the "
                "latest version",
                partitions=tuple(shown),
                version=record.version,
            )

    @staticmethod
    def _summary(
        base: Snapshot | None,
        upserts: Sequence[PartitionEntry],
        removes: Sequence[str],
        replace_all: bool,
        parent_totals: tuple[int, int, int],
    ) -> dict[str, int]:
        rows_written = sum(e.rows for e in upserts)
        bytes_written = sum(e.bytes for e in upserts)
        if replace_all:
            kept = sum(1 for e in upserts if base is not None and e.key_path in base.partitions)
            return {
                "partitions_changed": len(upserts),
                "partitions_removed": (base.partition_count if base is not None else 0) - kept,
                "rows": rows_written,
                "bytes": bytes_written,
                "total_partitions": len(upserts),
                "total_rows": rows_written,
                "total_bytes": bytes_written,
            }
        # Partitions this commit touches are unchanged between base and parent (else it conflicted), so
        # their old sizes come from the base snapshot.
        keys = [*(e.key_path for e in upserts), *removes]
        previous = base.partitions.entries_of(keys) if base is not None else []
        present = {p.key_path for p in previous}
        added = sum(1 for e in upserts if e.key_path not in present)
        partitions, rows, size = parent_totals
        return {
            "partitions_changed": len(upserts),
            "partitions_removed": len(removes),
            "rows": rows_written,
            "bytes": bytes_written,
            "total_partitions": partitions + added - len(removes),
            "total_rows": rows - sum(p.rows for p in previous) + rows_written,
            "total_bytes": size - sum(p.bytes for p in previous) + bytes_written,
        }

    def _after_commit(
        self, base: Snapshot | None, intervening: list[CommitRecord], record: CommitRecord
    ) -> None:
        # The commit has landed; nothing here may fail it. The new snapshot is cached for the next
        # read or commit, and checkpointed when enough records piled up since the last checkpoint.
        try:
            snapshot = self._advance(base, [*intervening, record])
            self._remember(snapshot)
            due = snapshot.version - snapshot.checkpoint_version >= self.checkpoint_interval
            if due or snapshot.changes_since_checkpoint >= self.checkpoint_changes:
                self._remember(self.write_checkpoint(snapshot))
        except Exception as err:  # the version is committed; a checkpoint is only an optimisation
            log.warning(
                "dataset %s: version %d committed, checkpoint skipped: %s", self.dataset, record.version, err
            )

    def write_checkpoint(self, snapshot: Snapshot) -> Snapshot:
        """Store `snapshot` as a checkpoint (if absent) and advance the hint; the same snapshot, re-based."""
        self.write_checkpoint_only(snapshot)
        if self._read_hint() < snapshot.version:
            self.store.put(self._hint_key, json.dumps({"version": snapshot.version}).encode())
        return replace(snapshot, checkpoint_version=snapshot.version, changes_since_checkpoint=0)

    # --- vacuum -----------------------------------------------------------------------------------

    def vacuum(
        self,
        *,
        retain_versions: int | None = None,
        older_than: dt.timedelta | None = None,
        dry_run: bool = False,
        grace: dt.timedelta = DEFAULT_GRACE,
        now: dt.datetime | None = None,
    ) -> VacuumReport:
        """Expire old versions, then delete files no retained version references.

        Retained: the newest version; the newest `retain_versions`; versions committed within
        `older_than`; and every version that stopped being the newest less than `grace` ago (a reader may
        still be on it). With neither `retain_versions` nor `older_than`, versions of the last 7 days are
        kept. Unreferenced files (and leftovers of crashed writes) are deleted only once older than
        `grace`: a younger one may belong to a commit in flight.
        """
        if retain_versions is not None and retain_versions < 1:
            raise CatalogError(
                f"retain_versions must be at least 1 (the newest version), got {retain_versions}"
            )
        if retain_versions is None and older_than is None:
            older_than = DEFAULT_RETENTION
        now = now or dt.datetime.now(dt.UTC)
        cutoff = now - grace
        headers = self._fetch(
            [info.key for info in self.store.list(self._log_prefix) if self._log_version(info.key)],
            self._read_header,
        )
        if not headers:
            return VacuumReport(dry_run=dry_run, latest_version=None, oldest_retained_version=None)
        oldest = self._oldest_retained(headers, retain_versions, older_than, now, cutoff)
        notes: list[str] = []
        expired = [h.version for h in headers if h.version < oldest]
        checkpoints = [
            v
            for info in self.store.list(f"{self.prefix}/checkpoints/")
            if (v := self._version_of(info.key, ".arrow")) is not None
        ]
        retained_snapshot = self._load(oldest)
        if expired and (
            oldest not in checkpoints or not self.store.exists(self._checkpoint_digest_key(oldest))
        ):
            if dry_run:
                notes.append(f"would write a checkpoint at version {oldest} so it stays readable")
            else:
                self.write_checkpoint(retained_snapshot)
        # Announce the expiry before reading the tags, and say which tagged versions stay before deleting
        # anything: a tag written meanwhile is either seen here or refused (`catalog/tags.py`).
        marker = None if dry_run else begin_vacuum(self, oldest)
        try:
            tagged = self._keep_tagged(oldest, checkpoints, dry_run, notes)
            if marker is not None:
                marker = decide_vacuum(self, marker, tagged)
            return self._expire(
                headers, oldest, expired, checkpoints, tagged, retained_snapshot, dry_run, cutoff, notes
            )
        finally:
            if marker is not None:
                end_vacuum(self, marker, now)

    def _expire(
        self,
        headers: Sequence[CommitRecord],
        oldest: int,
        expired: Sequence[int],
        checkpoints: Sequence[int],
        tagged: Mapping[int, Snapshot],
        retained_snapshot: Snapshot,
        dry_run: bool,
        cutoff: dt.datetime,
        notes: list[str],
    ) -> VacuumReport:
        """Vacuum's deletions once it has decided what stays (`vacuum`)."""
        head = headers[-1].version
        expired_checkpoints = [v for v in checkpoints if v < oldest and v not in tagged]
        if not dry_run:
            # Expire versions first: a crash after this point leaves orphan files (removed next time),
            # never a retained version pointing at deleted files.
            for version in expired:
                self.store.delete(self._log_key(version))
            if (expired or oldest in checkpoints) and self._read_hint() < oldest:
                # The hinted checkpoint is about to go: point readers at the one that stays.
                self.store.put(self._hint_key, json.dumps({"version": oldest}).encode())
            for version in expired_checkpoints:
                self.store.delete(self._checkpoint_key(version))
                self.store.delete(self._checkpoint_digest_key(version))
            if self.cache_dir is not None and self.cache_dir.is_dir():
                for cached in self.cache_dir.iterdir():
                    number = self._version_of(cached.name, ".arrow")
                    if number is not None and number < oldest and number not in tagged:
                        cached.unlink(missing_ok=True)
        referenced = self._referenced_files(retained_snapshot, head)
        for snapshot in tagged.values():
            for entry in snapshot.partitions.values():
                referenced.update(entry.files)
        removed_temporaries = self._vacuum_catalog_temporaries(cutoff, dry_run)
        removed_files: list[VacuumedFile] = []
        compactions: list[SharedFileCompaction] = []
        young = 0
        if self.data_root is not None:
            shared_before = self.storage.shared_file_sizes(self.data_root) if self.storage else {}
            result = vacuum_files(
                self.data_root, {f.path for f in referenced}, cutoff=cutoff, dry_run=dry_run
            )
            removed_files.extend(result.removed)
            young = len(result.kept_young)
            if self.storage is not None:
                removed_files.extend(
                    self.storage.remove_unreferenced(
                        self.data_root, referenced, cutoff=cutoff, dry_run=dry_run
                    )
                )
                compactions.extend(
                    self.storage.compact_shared(self.data_root, dry_run=dry_run, sizes_before=shared_before)
                )
        elif self.data_store is not None:
            remote_removed, remote_young = vacuum_remote_files(
                self.data_store, {f.path for f in referenced}, cutoff=cutoff, dry_run=dry_run
            )
            removed_files.extend(remote_removed)
            young = len(remote_young)
        else:
            notes.append("no local data directory known for this catalog: data files were not vacuumed")
        return VacuumReport(
            dry_run=dry_run,
            latest_version=head,
            oldest_retained_version=oldest,
            removed_versions=tuple(expired),
            removed_checkpoints=tuple(expired_checkpoints),
            removed_files=tuple(removed_files),
            removed_catalog_temporaries=removed_temporaries,
            young_files_kept=young,
            notes=tuple(notes),
            shared_files=tuple(compactions),
        )

    def _keep_tagged(
        self, oldest: int, checkpoints: Sequence[int], dry_run: bool, notes: list[str]
    ) -> dict[int, Snapshot]:
        """The tagged versions older than `oldest`, each kept readable by a checkpoint of its own (written
        now when missing), so their records can expire while the versions and their files stay."""
        kept: dict[int, Snapshot] = {}
        for info in list_tags(self).values():
            if info.version >= oldest or info.version in kept:
                continue
            try:
                snapshot = self._load(info.version)
            except VersionNotFoundError:
                notes.append(f"tag {info.name!r} names version {info.version}, which is no longer readable")
                continue
            kept[info.version] = snapshot
            has_digest = self.store.exists(self._checkpoint_digest_key(info.version))
            if info.version in checkpoints and has_digest:
                continue
            if dry_run:
                notes.append(
                    f"would write a checkpoint at tagged version {info.version} so it stays readable"
                )
            else:
                self.write_checkpoint_only(snapshot)
        return kept

    def write_checkpoint_only(self, snapshot: Snapshot) -> None:
        """Store `snapshot` as a checkpoint with its digest (if absent), leaving the hint alone."""
        # LZ4 locally (fast to decompress from page cache), zstd remotely (half the bytes to transfer).
        compression = "lz4" if self.store.local_path(self._hint_key) is not None else "zstd"
        key = self._checkpoint_key(snapshot.version)
        digest_key = self._checkpoint_digest_key(snapshot.version)
        encoded = encode_checkpoint(snapshot, compression=compression)
        data: bytes | None = encoded
        if not self.store.put_if_absent(key, encoded):
            # Another writer made this checkpoint. If it stopped before the digest, vouch for its bytes (a
            # checkpoint appears whole or not at all), so any two digest writers write the same digest.
            data = None if self.store.exists(digest_key) else self.store.get(key)
        if data is not None:
            self.store.put_if_absent(digest_key, hashlib.sha256(data).hexdigest().encode("ascii"))

    @staticmethod
    def _oldest_retained(
        headers: Sequence[CommitRecord],
        retain_versions: int | None,
        older_than: dt.timedelta | None,
        now: dt.datetime,
        cutoff: dt.datetime,
    ) -> int:
        head = headers[-1].version
        oldest = head
        if retain_versions is not None:
            oldest = min(oldest, max(headers[0].version, head - retain_versions + 1))
        if older_than is not None:
            recent = [h.version for h in headers if h.committed_at >= now - older_than]
            if recent:
                oldest = min(oldest, recent[0])
        # A version replaced less than `grace` ago may still be in use by a reader that opened it.
        for current, successor in itertools.pairwise(headers):
            if successor.committed_at >= cutoff:
                oldest = min(oldest, current.version)
                break
        return oldest

    def _referenced_files(self, oldest: Snapshot, head: int) -> set[DataFile]:
        referenced: set[DataFile] = set()
        for entry in oldest.partitions.values():
            referenced.update(entry.files)
        # Include commits that landed while vacuum ran: their files must survive too.
        newest = max(head, self._head())
        for record in self._records(oldest.version, newest):
            for upsert in record.upserts:
                referenced.update(DataFile.from_json(f) for f in upsert["files"])
        return referenced

    def _vacuum_catalog_temporaries(self, cutoff: dt.datetime, dry_run: bool) -> int:
        if not isinstance(self.store, LocalStore):
            return 0
        count = 0
        for info in self.store.temporaries(f"{self.prefix}/"):
            if info.modified < cutoff:
                count += 1
                if not dry_run:
                    (self.store.root / info.key).unlink(missing_ok=True)
        return count

    # --- convenience ------------------------------------------------------------------------------

    def referenced_files(self, versions: Iterable[int] | None = None) -> Collection[DataFile]:
        """Every data file the given versions (default: the newest) reference."""
        numbers = list(versions) if versions is not None else [self._head()]
        files: set[DataFile] = set()
        for number in numbers:
            if number:
                for entry in self.snapshot(number).partitions.values():
                    files.update(entry.files)
        return files
