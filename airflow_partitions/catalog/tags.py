"""Named tags of catalog versions (`release-2026-01` -> version 42), stored in the catalog itself.

Layout under the store, beside the commit log:

    <dataset>/_catalog/tags/<tag>/<sequence:020>.json    one immutable record per write of the tag

A tag is a log of its own: each write (set, move, delete) creates the next sequence number with
`put_if_absent`, the commit protocol's one conditional write, so two writers of one tag never both
succeed at one position; the loser reads the new state and writes the position after it. The tag's
value is its newest record: `{"tag", "version", "commit_id", "written_at"}`, or `"version": null` once
deleted. A record names the commit id of its version, so a tag never silently follows a version number
whose record was replaced (read refuses it with `CatalogIntegrityError`).

Vacuum keeps every tagged version readable (a checkpoint at that version, never expired) and every
file it references (`Catalog.vacuum`).

A tag written while a vacuum runs. Vacuum and a tag writer each write first and read the other's
write second, so at least one of them sees the other (the store is linearisable: a local directory, or
S3 with its strong read-after-write and list consistency):

    vacuum                                          tag writer
    V1 put  _catalog/vacuuming/<run>.json           T1 check the version is retained
            {"below": oldest, "kept": null}
    V2 read the tags; keep every tagged version     T2 put the tag record
       below `oldest` (checkpoint + its files)
    V3 put  the marker again, "kept": [versions]    T3 list the markers; for each whose "below" is above
    V4 delete expired records, checkpoints, files      the version: wait until it says "kept" and check
    V5 delete the marker                               the version is in it
                                                    T4 check the version's record or checkpoint is
                                                       still stored

If T3 finds no marker of that vacuum, V1 came after T3, so V2 came after T2 and the vacuum keeps the
version; unless V5 came before T3, in which case V4 did too and T4 finds the version gone. If T3 finds
the marker, its "kept" says what V2 decided: V2 saw the tag exactly when the version is in "kept". So
either the vacuum keeps the version, or the writer sees that it will not and retracts its record
(writes the tag's previous value after it) and raises `VersionNotFoundError`: the outcome is the tag
write ordered before the vacuum, or after it. A marker still undecided after `_UNDECIDED_WAIT_S` (a
vacuum killed between V1 and V3) refuses too; the next vacuum removes markers older than
`STALE_VACUUM_MARKER`. A reader resolving a retracted tag in between finds the version or
`VersionNotFoundError`, never other rows.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_partitions.catalog.model import format_time, parse_time
from airflow_partitions.exceptions import TagError, UnknownTagError, VersionNotFoundError
from airflow_partitions.keys import escape_component, unescape_component
from airflow_partitions.objectstore import ObjectStore

TAG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Writes of one tag record before giving up: each lost race means another writer moved the tag meanwhile.
_TAG_WRITE_ATTEMPTS = 50
# How long a tag write waits for a running vacuum to decide which tagged versions it keeps.
_UNDECIDED_WAIT_S = 10.0
# A vacuum marker older than this is from a vacuum that was killed; the next vacuum removes it.
STALE_VACUUM_MARKER = dt.timedelta(days=1)


class TaggedCatalog(Protocol):
    """What tags need of a dataset's catalog (`catalog.Catalog`): its store, where its log lives, and the
    versions it retains."""

    dataset: str
    store: ObjectStore
    prefix: str

    def snapshot(self, version: int | None = None) -> Any: ...

    def version_commit_id(self, version: int) -> str | None: ...

    def version_stored(self, version: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class TagInfo:
    """A tag's current value: the version it names, that version's commit id, and when it was written."""

    name: str
    version: int
    commit_id: str | None
    written_at: dt.datetime
    sequence: int

    def to_json(self) -> dict[str, Any]:
        return {
            "tag": self.name,
            "version": self.version,
            "commit_id": self.commit_id,
            "written_at": format_time(self.written_at),
            "sequence": self.sequence,
        }


def check_tag_name(name: object) -> str:
    """`name` when it is a valid tag name, else `TagError` saying the rule."""
    if not isinstance(name, str) or not TAG_NAME.fullmatch(name):
        raise TagError(
            f"tag name {name!r} is not valid: use 1-128 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit (e.g. release-2026-01)"
        )
    return name


def tags_prefix(catalog: TaggedCatalog) -> str:
    return f"{catalog.prefix}/tags/"


def _tag_prefix(catalog: TaggedCatalog, name: str) -> str:
    return f"{tags_prefix(catalog)}{escape_component(name)}/"


def vacuum_markers_prefix(catalog: TaggedCatalog) -> str:
    return f"{catalog.prefix}/vacuuming/"


def _record_key(catalog: TaggedCatalog, name: str, sequence: int) -> str:
    return f"{_tag_prefix(catalog, name)}{sequence:020d}.json"


def _sequence_of(key: str) -> int | None:
    stem = key.rsplit("/", 1)[-1].removesuffix(".json")
    return int(stem) if stem.isdigit() and key.endswith(".json") else None


def _records(catalog: TaggedCatalog, prefix: str) -> Iterator[tuple[str, int, str]]:
    """(tag name, sequence, key) of every tag record under `prefix`."""
    base = tags_prefix(catalog)
    for info in catalog.store.list(prefix):
        rest = info.key[len(base) :] if info.key.startswith(base) else ""
        escaped, _, _ = rest.partition("/")
        sequence = _sequence_of(info.key)
        if escaped and sequence is not None:
            yield unescape_component(escaped), sequence, info.key


def _decode(name: str, sequence: int, key: str, data: bytes) -> TagInfo | None:
    try:
        record = json.loads(data)
        version = record["version"]
        if version is None:
            return None
        return TagInfo(
            name=name,
            version=int(version),
            commit_id=record.get("commit_id"),
            written_at=parse_time(record["written_at"]),
            sequence=sequence,
        )
    except (ValueError, KeyError, TypeError) as err:
        raise TagError(f"tag record {key} is unreadable ({err}); delete it and write the tag again") from err


def _newest(catalog: TaggedCatalog, name: str) -> tuple[int, TagInfo | None]:
    """The newest sequence number of tag `name` (0: never written) and its value (None: deleted)."""
    newest = max(
        ((sequence, key) for _, sequence, key in _records(catalog, _tag_prefix(catalog, name))), default=None
    )
    if newest is None:
        return 0, None
    sequence, key = newest
    data = catalog.store.get(key)
    if data is None:
        raise TagError(f"tag record {key} vanished while being read; try again")
    return sequence, _decode(name, sequence, key, data)


def list_tags(catalog: TaggedCatalog) -> dict[str, TagInfo]:
    """Every tag of the catalog that names a version (deleted ones left out), by name."""
    newest: dict[str, tuple[int, str]] = {}
    for name, sequence, key in _records(catalog, tags_prefix(catalog)):
        if sequence > newest.get(name, (0, ""))[0]:
            newest[name] = (sequence, key)
    tags: dict[str, TagInfo] = {}
    for name, (sequence, key) in sorted(newest.items()):
        data = catalog.store.get(key)
        info = _decode(name, sequence, key, data) if data is not None else None
        if info is not None:
            tags[name] = info
    return tags


def resolve_tag(catalog: TaggedCatalog, name: str) -> TagInfo:
    """The version tag `name` names; `UnknownTagError` listing the known tags when it names none."""
    check_tag_name(name)
    _, info = _newest(catalog, name)
    if info is None:
        known = tuple(list_tags(catalog))
        raise UnknownTagError(
            f"dataset {catalog.dataset!r} has no tag {name!r}; its tags are "
            f"{', '.join(known) if known else '(none)'}. Tag a version with "
            "`airflow-partitions tag SPEC DATASET NAME [--version V]`",
            tag=name,
            known=known,
        )
    return info


def write_tag(catalog: TaggedCatalog, name: str, version: int | None) -> TagInfo | None:
    """Point tag `name` at `version` (None: delete it); the tag's new value (None when deleted).

    The version must be retained (`VersionNotFoundError` otherwise). Each write appends the tag's next
    record with `put_if_absent`; a writer that loses the race re-reads and writes after the winner, so
    concurrent writes are applied one after the other and the newest record is the tag's value.
    """
    check_tag_name(name)
    commit_id: str | None = None
    if version is not None:
        if version < 1:
            raise VersionNotFoundError(f"catalog versions start at 1; got {version}")
        catalog.snapshot(version)  # retained, else VersionNotFoundError naming the retained range
        commit_id = catalog.version_commit_id(version)
    for _ in range(_TAG_WRITE_ATTEMPTS):
        sequence, current = _newest(catalog, name)
        if version is None and current is None:
            if sequence == 0:
                raise _nothing_to_delete(catalog, name)
            return None  # deleted already
        written_at = dt.datetime.now(dt.UTC)
        record = {
            "tag": name,
            "version": version,
            "commit_id": commit_id,
            "written_at": format_time(written_at),
        }
        data = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if catalog.store.put_if_absent(_record_key(catalog, name, sequence + 1), data):
            if version is None:
                return None
            _confirm_retained(catalog, name, version, sequence + 1, current)
            return TagInfo(name, version, commit_id, written_at, sequence + 1)
    raise TagError(
        f"tag {name!r} of dataset {catalog.dataset!r} was moved by other writers {_TAG_WRITE_ATTEMPTS} times "
        "while this write tried to land; try again"
    )


def _confirm_retained(
    catalog: TaggedCatalog, name: str, version: int, sequence: int, previous: TagInfo | None
) -> None:
    """Steps T3 and T4 of the module docstring: return when every vacuum keeps `version`; otherwise
    retract the record just written at `sequence` and raise `VersionNotFoundError`."""
    reason: str | None = None
    for marker in vacuum_markers(catalog):
        if version >= marker.below:
            continue
        kept = marker.kept
        deadline = time.monotonic() + _UNDECIDED_WAIT_S
        while kept is None and time.monotonic() < deadline:
            time.sleep(0.05)
            current = read_vacuum_marker(catalog, marker.key)
            if current is None:  # that vacuum finished: T4 sees what it deleted
                break
            kept = current.kept
        else:
            if kept is None:
                reason = (
                    f"a vacuum started at {format_time(marker.started_at)} is expiring versions below "
                    f"{marker.below} and has not said which tagged versions it keeps (if it was killed, "
                    f"the next vacuum removes its marker {marker.key} after {STALE_VACUUM_MARKER})"
                )
            elif version not in kept:
                reason = f"a vacuum running now expires versions below {marker.below}"
        if reason is not None:
            break
    if reason is None and not catalog.version_stored(version):
        reason = "a vacuum that ran meanwhile expired it"
    if reason is None:
        return
    retraction = {
        "tag": name,
        "version": previous.version if previous is not None else None,
        "commit_id": previous.commit_id if previous is not None else None,
        "written_at": format_time(dt.datetime.now(dt.UTC)),
        "retracts": sequence,
    }
    # A later write of the tag already replaced this record: nothing to retract.
    catalog.store.put_if_absent(
        _record_key(catalog, name, sequence + 1),
        json.dumps(retraction, separators=(",", ":"), ensure_ascii=False).encode("utf-8"),
    )
    raise VersionNotFoundError(
        f"tag {name!r} of dataset {catalog.dataset!r} was not written: version {version} is no longer "
        f"retained ({reason}). Tag a retained version (`airflow-partitions status` lists them)"
    )


@dataclass(frozen=True, slots=True)
class VacuumMarker:
    """A running vacuum's announcement (module docstring, V1/V3): it expires versions below `below`,
    keeping the tagged ones in `kept` (None until it has read the tags)."""

    key: str
    below: int
    kept: tuple[int, ...] | None
    started_at: dt.datetime


def begin_vacuum(catalog: TaggedCatalog, below: int) -> VacuumMarker:
    """Step V1: announce a vacuum expiring versions below `below`."""
    marker = VacuumMarker(
        key=f"{vacuum_markers_prefix(catalog)}{uuid.uuid4().hex}.json",
        below=below,
        kept=None,
        started_at=dt.datetime.now(dt.UTC),
    )
    _put_marker(catalog, marker)
    return marker


def decide_vacuum(catalog: TaggedCatalog, marker: VacuumMarker, kept: Iterable[int]) -> VacuumMarker:
    """Step V3: record which tagged versions below the marker's bound the vacuum keeps."""
    decided = VacuumMarker(marker.key, marker.below, tuple(sorted(kept)), marker.started_at)
    _put_marker(catalog, decided)
    return decided


def end_vacuum(catalog: TaggedCatalog, marker: VacuumMarker, now: dt.datetime) -> None:
    """Step V5, and the removal of markers of killed vacuums older than `STALE_VACUUM_MARKER`."""
    cutoff = now - STALE_VACUUM_MARKER
    stale = [m.key for m in vacuum_markers(catalog) if m.key != marker.key and m.started_at < cutoff]
    catalog.store.delete([marker.key, *stale])


def _put_marker(catalog: TaggedCatalog, marker: VacuumMarker) -> None:
    record = {
        "below": marker.below,
        "kept": list(marker.kept) if marker.kept is not None else None,
        "started_at": format_time(marker.started_at),
    }
    catalog.store.put(marker.key, json.dumps(record, separators=(",", ":")).encode("utf-8"))


def read_vacuum_marker(catalog: TaggedCatalog, key: str) -> VacuumMarker | None:
    data = catalog.store.get(key)
    if data is None:
        return None
    try:
        record = json.loads(data)
        kept = record["kept"]
        return VacuumMarker(
            key=key,
            below=int(record["below"]),
            kept=tuple(int(v) for v in kept) if kept is not None else None,
            started_at=parse_time(record["started_at"]),
        )
    except (ValueError, KeyError, TypeError) as err:
        raise TagError(f"vacuum marker {key} is unreadable ({err}); delete it") from err


def vacuum_markers(catalog: TaggedCatalog) -> list[VacuumMarker]:
    """The markers of the vacuums running now (and of killed ones not yet removed)."""
    markers = []
    for info in catalog.store.list(vacuum_markers_prefix(catalog)):
        if info.key.endswith(".json"):
            marker = read_vacuum_marker(catalog, info.key)
            if marker is not None:
                markers.append(marker)
    return markers


def _nothing_to_delete(catalog: TaggedCatalog, name: str) -> UnknownTagError:
    known = tuple(list_tags(catalog))
    return UnknownTagError(
        f"dataset {catalog.dataset!r} has no tag {name!r} to delete; its tags are "
        f"{', '.join(known) if known else '(none)'}",
        tag=name,
        known=known,
    )
