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
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_partitions.catalog.model import format_time, parse_time
from airflow_partitions.exceptions import TagError, UnknownTagError, VersionNotFoundError
from airflow_partitions.keys import escape_component, unescape_component
from airflow_partitions.objectstore import ObjectStore

TAG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Writes of one tag record before giving up: each lost race means another writer moved the tag meanwhile.
_TAG_WRITE_ATTEMPTS = 50


class TaggedCatalog(Protocol):
    """What tags need of a dataset's catalog (`catalog.Catalog`): its store, where its log lives, and the
    versions it retains."""

    dataset: str
    store: ObjectStore
    prefix: str

    def snapshot(self, version: int | None = None) -> Any: ...

    def version_commit_id(self, version: int) -> str | None: ...


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
            return TagInfo(name, version, commit_id, written_at, sequence + 1)
    raise TagError(
        f"tag {name!r} of dataset {catalog.dataset!r} was moved by other writers {_TAG_WRITE_ATTEMPTS} times "
        "while this write tried to land; try again"
    )


def _nothing_to_delete(catalog: TaggedCatalog, name: str) -> UnknownTagError:
    known = tuple(list_tags(catalog))
    return UnknownTagError(
        f"dataset {catalog.dataset!r} has no tag {name!r} to delete; its tags are "
        f"{', '.join(known) if known else '(none)'}",
        tag=name,
        known=known,
    )
