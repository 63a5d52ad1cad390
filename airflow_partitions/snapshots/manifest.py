"""Snapshot manifests: publish a catalog version to S3 once all its files are there, and read it back.

A manifest is one JSON object per catalog version: the partition spec and every partition with its files,
checksums and statistics (the catalog's own entry JSON). A version published while a re-partitioning is in
progress also lists the other specs its partitions were written under (`other_specs`, the catalog's
own); a manifest without that key (every single-layout version, and every earlier release) has one spec.
It is published with `If-None-Match: *`, so a version's manifest is written once and never changes, and
only after every file it names was found in the snapshot location with the recorded size: a reader that
sees the manifest can fetch all its files.
`latest.json` then points at the newest manifest; it only moves forward (compare-and-swap on its ETag)
and is a shortcut, since a reader also lists manifests newer than the one it names.

Every manifest's SHA-256 is recorded in a write-once `v<version>.json.sha256` object, written before the
manifest itself (so a visible manifest always has its record), and repeated in `latest.json`. Every read
(the newest version or a named one) checks the manifest's bytes against each recorded digest before
anything is decoded, and refuses with `SnapshotIntegrityError` when one differs or none was recorded:
the manifest carries the statistics pruning trusts, so one edited digit would hide rows.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.catalog.model import PartitionEntry, PartitionSpecInfo, format_time, parse_time
from airflow_partitions.exceptions import CatalogError, SnapshotError, SnapshotIntegrityError
from airflow_partitions.objectstore import S3Location, S3Store, SettingsLike
from airflow_partitions.snapshots.layout import SnapshotLayout, safe_relative_path
from airflow_partitions.snapshots.upload import (
    DEFAULT_MULTIPART_CHUNKSIZE,
    DEFAULT_MULTIPART_THRESHOLD,
    upload_partition_snapshot,
)

if TYPE_CHECKING:
    from airflow_partitions.catalog import Snapshot
    from airflow_partitions.storage import PartitionStorage

MANIFEST_FORMAT = "airflow-partitions/snapshot-manifest"
MANIFEST_FORMAT_VERSION = 1
_LATEST_ATTEMPTS = 20
JSON = "application/json"
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class SnapshotManifest:
    """One published catalog version, as read back from object storage."""

    dataset: str
    version: int
    committed_at: dt.datetime
    operation: str
    partition_spec: PartitionSpecInfo
    entries: tuple[PartitionEntry, ...]
    key: str
    sha256: str
    # Specs other than `partition_spec` that some entries were written under (a re-partitioning in
    # progress when the version was published); each such entry has a qualified key path.
    other_specs: tuple[PartitionSpecInfo, ...] = ()

    @property
    def specs(self) -> dict[str, PartitionSpecInfo]:
        """Spec id -> spec of every layout the manifest's entries are written under, the current first."""
        specs = {self.partition_spec.spec_id: self.partition_spec}
        for other in self.other_specs:
            specs.setdefault(other.spec_id, other)
        return specs

    @property
    def total_rows(self) -> int:
        return sum(e.rows for e in self.entries)

    @property
    def total_bytes(self) -> int:
        return sum(e.bytes for e in self.entries)


@dataclass(frozen=True, slots=True)
class ManifestUploadResult:
    """What publishing one version did."""

    dataset: str
    version: int
    key: str
    created: bool  # False: the same manifest was already published (a retry)
    latest_version: int  # what `latest.json` points at afterwards
    files_checked: int
    files_uploaded: int

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "version": self.version,
            "key": self.key,
            "created": self.created,
            "latest_version": self.latest_version,
            "files_checked": self.files_checked,
            "files_uploaded": self.files_uploaded,
        }


# --- encoding -------------------------------------------------------------------------------------


def encode_manifest(dataset: str, snapshot: Snapshot) -> bytes:
    """The manifest bytes of `snapshot`: deterministic, so a retried publish produces identical bytes."""
    entries = sorted(snapshot.partitions.values(), key=lambda e: e.key_path)
    document = {
        "format": MANIFEST_FORMAT,
        "format_version": MANIFEST_FORMAT_VERSION,
        "dataset": dataset,
        "version": snapshot.version,
        "committed_at": format_time(snapshot.committed_at),
        "operation": snapshot.operation,
        "partition_spec": snapshot.partition_spec.to_json(),
        # Only while several layouts are in use: a single-layout manifest keeps its earlier bytes.
        **_other_specs_json(snapshot, entries),
        "partition_count": len(entries),
        "total_rows": sum(e.rows for e in entries),
        "total_bytes": sum(e.bytes for e in entries),
        "partitions": [entry.to_json() for entry in entries],
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _other_specs_json(snapshot: Snapshot, entries: Sequence[PartitionEntry]) -> dict[str, Any]:
    in_use = {entry.spec_id for entry in entries}
    others = [
        spec.to_json()
        for spec_id, spec in snapshot.specs.items()
        if spec_id != snapshot.partition_spec.spec_id and spec_id in in_use
    ]
    return {"other_specs": others} if others else {}


def decode_manifest(data: bytes, *, dataset: str, key: str, expected_version: int | None) -> SnapshotManifest:
    """Parse and check a manifest read from object storage (untrusted input: every path is checked)."""
    where = f"snapshot manifest {key}"
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SnapshotError(
            f"{where} is not valid JSON ({err}); it was not written by airflow-partitions"
        ) from err
    if not isinstance(document, dict) or document.get("format") != MANIFEST_FORMAT:
        raise SnapshotError(f"{where} is not an airflow-partitions snapshot manifest")
    if document.get("format_version") != MANIFEST_FORMAT_VERSION:
        raise SnapshotError(
            f"{where} has format version {document.get('format_version')}; this airflow-partitions reads "
            f"version {MANIFEST_FORMAT_VERSION}: upgrade the package"
        )
    if document.get("dataset") != dataset:
        raise SnapshotError(f"{where} belongs to dataset {document.get('dataset')!r}, not {dataset!r}")
    try:
        version = int(document["version"])
        spec = PartitionSpecInfo.from_json(document["partition_spec"])
        other_specs = tuple(PartitionSpecInfo.from_json(raw) for raw in document.get("other_specs", ()))
        entries = tuple(PartitionEntry.from_json(raw) for raw in document["partitions"])
        committed_at = parse_time(document["committed_at"])
        operation = str(document.get("operation", ""))
    except (CatalogError, KeyError, TypeError, ValueError) as err:
        raise SnapshotError(f"{where} is malformed: {err}") from err
    if expected_version is not None and version != expected_version:
        raise SnapshotError(f"{where} holds version {version}, expected {expected_version}")
    specs = {spec.spec_id: spec for spec in (spec, *other_specs)}
    seen: set[str] = set()
    for entry in entries:
        if entry.key_path in seen:
            raise SnapshotError(f"{where} lists partition {entry.key_path!r} twice")
        seen.add(entry.key_path)
        if entry.spec_id not in specs:
            raise SnapshotError(
                f"{where}: partition {entry.key_path!r} is written under partition spec {entry.spec_id!r}, "
                f"which the manifest does not list (it lists {sorted(specs)}); it was not written by this "
                "airflow-partitions release or was edited. Publish the version again with this release"
            )
        for data_file in entry.files:
            safe_relative_path(data_file.path)
    return SnapshotManifest(
        dataset=dataset,
        version=version,
        committed_at=committed_at,
        operation=operation,
        partition_spec=spec,
        entries=entries,
        key=key,
        sha256=hashlib.sha256(data).hexdigest(),
        other_specs=other_specs,
    )


# --- publishing -----------------------------------------------------------------------------------


def upload_snapshot_manifest(
    settings: SettingsLike,
    location: str | S3Location,
    dataset: str,
    catalog_snapshot: Snapshot,
    *,
    dataset_root: str | Path | None = None,
    multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
    multipart_chunksize: int = DEFAULT_MULTIPART_CHUNKSIZE,
    storage: PartitionStorage | None = None,
) -> ManifestUploadResult:
    """Publish the manifest of `catalog_snapshot` once every file it references is in the snapshot location.

    Files are checked by listing `<dataset>/data/` (key and size). A missing file is an error naming it,
    unless `dataset_root` is given: then missing files are uploaded from there first (useful when
    snapshots are enabled for a dataset that already has partitions). Publishing a version again is a
    no-op when the manifest is identical, and a `SnapshotError` when another snapshot of that version
    (another catalog sharing the location) was published. With `storage` and `dataset_root`, staged
    copies the storage kept only for this upload (DuckDB `tables` mode) are released once published.
    """
    layout = SnapshotLayout.of(location, dataset)
    store = layout.store(settings)
    entries = list(catalog_snapshot.partitions.values())
    missing = _missing_files(store, layout, entries)
    uploaded = 0
    if missing:
        if dataset_root is None:
            names = ", ".join(sorted(f.path for f in missing)[:5]) + (", ..." if len(missing) > 5 else "")
            raise SnapshotError(
                f"cannot publish version {catalog_snapshot.version} of dataset {dataset!r}: {len(missing)} "
                f"of its files are not in {layout.uri(layout.data_prefix)} ({names}). Upload every "
                "refreshed partition first, or pass dataset_root to upload missing files"
            )
        result = upload_partition_snapshot(
            settings,
            layout.location,
            dataset_root,
            missing,
            dataset=dataset,
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_chunksize,
        )
        uploaded = len(result.uploaded)

    body = encode_manifest(dataset, catalog_snapshot)
    sha256 = hashlib.sha256(body).hexdigest()
    key = layout.manifest_key(catalog_snapshot.version)
    existing = store.get(key)
    if existing is not None and existing != body:
        raise _other_catalog_error(layout, key)
    # The digest record goes first: a manifest readers can see always has one (a retry, or a manifest
    # published before digests were recorded, gets it here too).
    _record_digest(store, layout, catalog_snapshot.version, sha256)
    created = existing is None and _put_once(store, layout, key, body)
    latest = _advance_latest(store, layout, catalog_snapshot.version, sha256)
    if storage is not None and dataset_root is not None:
        # Every file of the version is in object storage now: local staged copies are not needed.
        storage.release_staged(Path(dataset_root), [f for entry in entries for f in entry.files])
    return ManifestUploadResult(
        dataset=dataset,
        version=catalog_snapshot.version,
        key=key,
        created=created,
        latest_version=latest,
        files_checked=sum(len(e.files) for e in entries),
        files_uploaded=uploaded,
    )


def _missing_files(store: S3Store, layout: SnapshotLayout, entries: Sequence[PartitionEntry]) -> list[Any]:
    wanted = {layout.data_key(f.path): f for entry in entries for f in entry.files}
    if not wanted:
        return []
    present = {item.key: item.size for item in store.list(layout.data_prefix) if item.key in wanted}
    return [f for key, f in wanted.items() if present.get(key) != f.bytes]


def _put_once(store: S3Store, layout: SnapshotLayout, key: str, body: bytes) -> bool:
    if store.put_if_absent(key, body, content_type=JSON):
        return True
    if store.get(key) == body:
        return False
    raise _other_catalog_error(layout, key)


def _other_catalog_error(layout: SnapshotLayout, key: str) -> SnapshotError:
    return SnapshotError(
        f"{layout.uri(key)} already holds a different snapshot of this version: another catalog of dataset "
        f"{layout.dataset!r} publishes to the same location (or the object was edited). Give each catalog "
        "its own snapshot location"
    )


def _record_digest(store: S3Store, layout: SnapshotLayout, version: int, sha256: str) -> None:
    """Write the manifest's digest record once; an existing record must name the same digest."""
    key = layout.manifest_digest_key(version)
    body = _digest_record(layout, version, sha256)
    if store.put_if_absent(key, body, content_type=JSON):
        return
    existing = store.get(key)
    recorded = _recorded_sha256(existing) if existing is not None else None
    if recorded == sha256:
        return
    raise SnapshotError(
        f"{layout.uri(key)} records sha256 {recorded} for version {version}, not {sha256}: another catalog "
        f"of dataset {layout.dataset!r} publishes to the same location. Give each catalog its own snapshot "
        "location"
    )


def _digest_record(layout: SnapshotLayout, version: int, sha256: str) -> bytes:
    document = {"version": version, "manifest": layout.manifest_key(version), "sha256": sha256}
    return json.dumps(document, sort_keys=True).encode("utf-8")


def _recorded_sha256(data: bytes) -> str | None:
    """The SHA-256 hex a digest record or `latest.json` holds; None when it holds none (or no valid one)."""
    try:
        value = json.loads(data)["sha256"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(value, str) or not _SHA256_HEX.fullmatch(value.lower()):
        return None
    return value.lower()


def _advance_latest(store: S3Store, layout: SnapshotLayout, version: int, sha256: str) -> int:
    """Point `latest.json` at `version` unless it already points at a newer one; the version it names."""
    pointer = json.dumps(
        {"version": version, "manifest": layout.manifest_key(version), "sha256": sha256},
        sort_keys=True,
    ).encode("utf-8")
    for _attempt in range(_LATEST_ATTEMPTS):
        current = store.get_with_etag(layout.latest_key)
        if current is None:
            written = store.put_if_absent(layout.latest_key, pointer, content_type=JSON)
        else:
            current_version = _pointer_version(current[0])
            if current_version is not None and current_version >= version:
                return current_version
            written = store.put_if_match(layout.latest_key, pointer, current[1], content_type=JSON)
        if written:
            return version
    raise SnapshotError(
        f"{layout.uri(layout.latest_key)} kept changing under {_LATEST_ATTEMPTS} attempts to advance it to "
        f"version {version}; the manifest itself is published, so readers still find it"
    )


def _pointer_version(data: bytes) -> int | None:
    try:
        document = json.loads(data)
        return int(document["version"])
    except (ValueError, KeyError, TypeError):
        return None  # an unreadable pointer is replaced; manifests are the source of truth


# --- reading --------------------------------------------------------------------------------------


def list_snapshot_versions(settings: SettingsLike, location: str | S3Location, dataset: str) -> list[int]:
    """Every published version of `dataset` under `location`, oldest first."""
    layout = SnapshotLayout.of(location, dataset)
    return _listed_versions(layout.store(settings), layout, start_after=None)


def _listed_versions(store: S3Store, layout: SnapshotLayout, *, start_after: str | None) -> list[int]:
    listed = (
        layout.version_of_manifest_key(item.key) for item in store.list(layout.manifest_prefix, start_after)
    )
    return sorted(version for version in listed if version is not None)


def _read_pointer(store: S3Store, layout: SnapshotLayout) -> tuple[int | None, str | None]:
    """The version `latest.json` names and the manifest SHA-256 it records (None when absent)."""
    pointer = store.get(layout.latest_key)
    if pointer is None:
        return None, None
    return _pointer_version(pointer), _recorded_sha256(pointer)


def _newest(
    store: S3Store, layout: SnapshotLayout, pointer: tuple[int | None, str | None]
) -> tuple[int | None, str | None]:
    """The newest version, with the pointer's digest when the pointer names that version."""
    pointed, sha256 = pointer
    start_after = layout.manifest_key(pointed) if pointed is not None else None
    newer = _listed_versions(store, layout, start_after=start_after)
    if newer:
        return newer[-1], None
    return pointed, sha256


def read_snapshot_manifest(
    settings: SettingsLike, location: str | S3Location, dataset: str, version: int | None = None
) -> SnapshotManifest | None:
    """The manifest of `version` (the newest when `None`); `None` when no snapshot was ever published.

    A specific `version` that was not published is a `SnapshotError`; a manifest whose bytes differ from
    its recorded SHA-256, or that has none recorded, is a `SnapshotIntegrityError`.
    """
    layout = SnapshotLayout.of(location, dataset)
    return fetch_manifest(layout.store(settings), layout, version)


def fetch_manifest(store: S3Store, layout: SnapshotLayout, version: int | None) -> SnapshotManifest | None:
    """The verified manifest of `version` (the newest when None); None when nothing was published."""
    requested = version
    pointer_sha256: str | None = None
    if version is None:
        version, pointer_sha256 = _newest(store, layout, _read_pointer(store, layout))
        if version is None:
            return None
    else:
        pointed, sha256 = _read_pointer(store, layout)
        pointer_sha256 = sha256 if pointed == version else None
    key = layout.manifest_key(version)
    found = store.get(key)
    if found is None:
        if requested is None:
            raise SnapshotError(
                f"{layout.uri(layout.latest_key)} points at version {version}, whose manifest is missing; "
                "the snapshot location was modified by hand. Publish the dataset's snapshot again"
            )
        published = _listed_versions(store, layout, start_after=None)
        raise SnapshotError(
            f"no snapshot of version {version} of dataset {layout.dataset!r} in "
            f"{layout.uri(layout.manifest_prefix)}; published versions: {_describe_versions(published)}"
        )
    verify_manifest_digest(store, layout, version, found, pointer_sha256=pointer_sha256)
    return decode_manifest(found, dataset=layout.dataset, key=key, expected_version=version)


def verify_manifest_digest(
    store: S3Store, layout: SnapshotLayout, version: int, data: bytes, *, pointer_sha256: str | None
) -> None:
    """Raise `SnapshotIntegrityError` unless `data` has every SHA-256 recorded for the version's manifest.

    The write-once digest record is the digest of every version; `latest.json`'s copy (`pointer_sha256`,
    only when it names this version) must agree with it. A manifest with neither cannot be trusted.
    """
    uri = layout.uri(layout.manifest_key(version))
    actual = hashlib.sha256(data).hexdigest()
    record_key = layout.manifest_digest_key(version)
    record = store.get(record_key)
    recorded = _recorded_sha256(record) if record is not None else None
    if record is not None and recorded is None:
        raise SnapshotIntegrityError(
            f"{layout.uri(record_key)} does not hold a sha256, so snapshot manifest {uri} cannot be "
            "verified; it was edited by hand. Nothing was downloaded. Delete both objects and publish "
            f"version {version} again from the catalog that wrote it, or bootstrap another version",
            uri=uri,
            expected=None,
            actual=actual,
        )
    expected = [(layout.uri(record_key), recorded), (layout.uri(layout.latest_key), pointer_sha256)]
    known = [(where, digest) for where, digest in expected if digest is not None]
    if not known:
        raise SnapshotIntegrityError(
            f"snapshot manifest {uri} (sha256 {actual}) has no recorded digest ({layout.uri(record_key)} is "
            "missing and latest.json does not name this version), so it cannot be verified: it was published "
            "by an older airflow-partitions or the record was deleted. Nothing was downloaded. Publish "
            f"version {version} again from the catalog that wrote it (upload_snapshot_manifest records the "
            "digest of an identical manifest), or bootstrap the newest version",
            uri=uri,
            expected=None,
            actual=actual,
        )
    for where, digest in known:
        if digest != actual:
            raise SnapshotIntegrityError(
                f"snapshot manifest {uri} has sha256 {actual}, but {where} recorded {digest} when it was "
                "published: the manifest was changed afterwards, so its file list and statistics cannot be "
                "trusted. Nothing was downloaded and the local catalog is unchanged. Restore the original "
                f"object, or delete it and publish version {version} again from the catalog that wrote it, "
                "or bootstrap another version",
                uri=uri,
                expected=digest,
                actual=actual,
            )


def _describe_versions(versions: Sequence[int]) -> str:
    if not versions:
        return "none"
    if len(versions) <= 10:
        return ", ".join(map(str, versions))
    return f"{', '.join(map(str, versions[:3]))}, ..., {', '.join(map(str, versions[-3:]))}"
