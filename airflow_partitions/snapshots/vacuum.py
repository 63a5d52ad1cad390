"""Snapshot vacuum: expire old published versions and delete the objects no retained version names.

Retention follows the catalog's own vacuum. Retained: the newest published version; the newest
`retain_versions`; versions published within `older_than`; and every version that stopped being the newest
less than `grace` ago (a bootstrap may still be reading it). With neither `retain_versions` nor
`older_than`, versions of the last 7 days are kept. A data object no retained manifest names is deleted
only once older than `grace`: a younger one may belong to a version being published right now (files go up
before their manifest). `latest.json` is never deleted, and neither is the newest manifest.

Manifests go first, then data objects, so at no point does a remaining manifest name a deleted object.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_partitions.catalog.catalog import DEFAULT_GRACE, DEFAULT_RETENTION
from airflow_partitions.exceptions import ObjectStoreError, SnapshotError
from airflow_partitions.objectstore import S3Location, S3Store, SettingsLike
from airflow_partitions.snapshots.layout import SnapshotLayout
from airflow_partitions.snapshots.manifest import fetch_manifest


@dataclass(frozen=True, slots=True)
class SnapshotVacuumReport:
    """What a snapshot vacuum kept and deleted (or, with `dry_run`, would delete)."""

    dataset: str
    location: str
    dry_run: bool
    latest_version: int | None
    retained_versions: tuple[int, ...]
    expired_versions: tuple[int, ...]
    deleted_objects: int
    deleted_bytes: int
    kept_recent_objects: int  # unreferenced, but younger than the grace period

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "location": self.location,
            "dry_run": self.dry_run,
            "latest_version": self.latest_version,
            "retained_versions": list(self.retained_versions),
            "expired_versions": list(self.expired_versions),
            "deleted_objects": self.deleted_objects,
            "deleted_bytes": self.deleted_bytes,
            "kept_recent_objects": self.kept_recent_objects,
        }


def vacuum_snapshots(
    settings: SettingsLike,
    location: str | S3Location,
    dataset: str,
    *,
    retain_versions: int | None = None,
    older_than: dt.timedelta | None = None,
    grace: dt.timedelta = DEFAULT_GRACE,
    dry_run: bool = False,
    now: dt.datetime | None = None,
) -> SnapshotVacuumReport:
    """Expire old snapshot versions of `dataset` under `location` and delete unreferenced objects."""
    if retain_versions is not None and (isinstance(retain_versions, bool) or retain_versions < 1):
        raise SnapshotError(
            f"retain_versions must be at least 1 (the newest version), got {retain_versions!r}"
        )
    for name, value in (("older_than", older_than), ("grace", grace)):
        if value is not None and value < dt.timedelta(0):
            raise SnapshotError(f"{name} must not be negative, got {value}")
    if retain_versions is None and older_than is None:
        older_than = DEFAULT_RETENTION
    layout = SnapshotLayout.of(location, dataset)
    store = layout.store(settings)
    now = now or dt.datetime.now(dt.UTC)
    cutoff = now - grace

    published = _published_manifests(store, layout)
    if not published:
        return SnapshotVacuumReport(
            dataset, layout.uri(layout.dataset_prefix), dry_run, None, (), (), 0, 0, 0
        )
    versions = sorted(published)
    retained = _retained(versions, published, retain_versions, older_than, now, cutoff)
    expired = [v for v in versions if v not in retained]

    referenced: set[str] = set()
    for version in sorted(retained):
        manifest = fetch_manifest(store, layout, version)
        if manifest is None:  # listed a moment ago: only a concurrent vacuum removes manifests
            raise SnapshotError(f"manifest of version {version} of {dataset!r} vanished while vacuuming")
        for entry in manifest.entries:
            referenced.update(layout.data_key(data_file.path) for data_file in entry.files)

    doomed: list[str] = []
    doomed_bytes = 0
    recent = 0
    for item in store.list(layout.data_prefix):
        if item.key in referenced:
            continue
        if item.modified > cutoff:
            recent += 1
            continue
        doomed.append(item.key)
        doomed_bytes += item.size

    if not dry_run:
        # Manifests first: a manifest that stays always finds its files.
        _delete(store, [layout.manifest_key(v) for v in expired])
        # Their digest records after them: a manifest still listed always has its record.
        _delete(store, [layout.manifest_digest_key(v) for v in expired])
        _delete(store, doomed)
    return SnapshotVacuumReport(
        dataset=dataset,
        location=layout.uri(layout.dataset_prefix),
        dry_run=dry_run,
        latest_version=versions[-1],
        retained_versions=tuple(sorted(retained)),
        expired_versions=tuple(expired),
        deleted_objects=len(doomed),
        deleted_bytes=doomed_bytes,
        kept_recent_objects=recent,
    )


def _published_manifests(store: S3Store, layout: SnapshotLayout) -> dict[int, dt.datetime]:
    """Version -> when its manifest was written, for every manifest under the dataset."""
    published: dict[int, dt.datetime] = {}
    for item in store.list(layout.manifest_prefix):
        version = layout.version_of_manifest_key(item.key)
        if version is not None:
            published[version] = item.modified
    return published


def _retained(
    versions: Sequence[int],
    published: dict[int, dt.datetime],
    retain_versions: int | None,
    older_than: dt.timedelta | None,
    now: dt.datetime,
    cutoff: dt.datetime,
) -> set[int]:
    retained = {versions[-1]}
    if retain_versions is not None:
        retained.update(versions[-retain_versions:])
    if older_than is not None:
        retained.update(v for v in versions if published[v] > now - older_than)
    # A version stopped being the newest when the next one was published; readers may still be on it.
    for older, newer in itertools.pairwise(versions):
        if published[newer] > cutoff:
            retained.add(older)
    return retained


def _delete(store: S3Store, keys: Sequence[str]) -> None:
    if not keys:
        return
    try:
        store.delete(keys)
    except ObjectStoreError as err:
        raise SnapshotError(
            f"{err}; nothing a retained version needs was touched, run the vacuum again once fixed"
        ) from err
