"""Bootstrap a local dataset from a published snapshot: fetch the selected partitions, verify, commit locally.

The manifest is verified against its recorded SHA-256 before it is used (see `manifest.py`); every file
is then downloaded and checked against the manifest's SHA-256 before any is placed (atomically, see
`download.py`), and the partitions are registered in the local catalog with one commit, so reads work as
soon as this returns. A refused bootstrap (an edited manifest, a corrupted object, a file in the way, a
local commit of the same partitions that won the race) leaves the destination as it found it:
temporaries, placed files and created directories are removed.
Running it again changes nothing: identical local files are not fetched and partitions the local catalog
already holds unchanged are not committed again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from airflow_partitions.exceptions import PartitionSpecChangedError, SnapshotError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.objectstore import S3Location, S3Store, SettingsLike
from airflow_partitions.snapshots.download import (
    DownloadAction,
    FileDownload,
    fetch_verified,
    place_verified,
)
from airflow_partitions.snapshots.layout import SnapshotLayout, local_file
from airflow_partitions.snapshots.manifest import SnapshotManifest, fetch_manifest
from airflow_partitions.snapshots.parallel import run_all
from airflow_partitions.snapshots.upload import (
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MULTIPART_CHUNKSIZE,
    DEFAULT_MULTIPART_THRESHOLD,
)
from airflow_partitions.table.publish import CommitBuilder

if TYPE_CHECKING:
    import pyarrow as pa
    from mypy_boto3_s3 import S3Client

    from airflow_partitions.catalog import Catalog, PartitionEntry, Snapshot
    from airflow_partitions.storage import PartitionStorage

KeySelector: TypeAlias = Callable[[PartitionKey], bool] | Collection[str] | None


@dataclass(frozen=True, slots=True)
class BootstrapResult:
    """What a bootstrap fetched and committed; `version` is None when no snapshot was published yet."""

    dataset: str
    location: str
    version: int | None
    committed_version: int | None  # the local catalog version created, None when nothing changed
    partitions_total: int
    partitions_selected: tuple[str, ...]
    partitions_committed: tuple[str, ...]
    partitions_removed: tuple[str, ...]
    # Local partitions refreshed after the snapshot's: bootstrap never rolls local work back.
    partitions_kept_local: tuple[str, ...]
    files_downloaded: int
    files_skipped: int
    bytes_downloaded: int

    @property
    def found(self) -> bool:
        return self.version is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "location": self.location,
            "version": self.version,
            "committed_version": self.committed_version,
            "partitions_total": self.partitions_total,
            "partitions_selected": len(self.partitions_selected),
            "partitions_committed": list(self.partitions_committed),
            "partitions_removed": list(self.partitions_removed),
            "partitions_kept_local": list(self.partitions_kept_local),
            "files_downloaded": self.files_downloaded,
            "files_skipped": self.files_skipped,
            "bytes_downloaded": self.bytes_downloaded,
        }


def select_where(manifest: SnapshotManifest, schema: pa.Schema, where: str) -> list[str]:
    """Key paths of the manifest's partitions that may hold rows matching `where` (for `where_keys`).

    Planned like a read of that version, before anything is downloaded: `where` binds to `schema` (the
    dataset's columns) and may also name partition fields; partition values and the recorded file
    statistics rule partitions out. A filter that cannot bind raises `FilterError`.
    A manifest published mid-migration judges each partition under the spec it was written under.
    """
    from airflow_partitions.pruning import (  # lazy: pruning loads pyarrow; DAG files load snapshots
        PartitionIndex,
        plan_partitions,
    )

    selected: list[str] = []
    for spec_id, spec in manifest.specs.items():
        entries = [entry for entry in manifest.entries if entry.spec_id == spec_id]
        if not entries and spec_id != manifest.partition_spec.spec_id:
            continue
        index = PartitionIndex.from_entries(
            spec,
            entries,
            schema,
            version=manifest.version,
            origin=f"snapshot version {manifest.version}",
        )
        plan = plan_partitions(index, where, dataset=manifest.dataset)
        selected.extend(chosen.key_path for chosen in plan.selected)
    return selected


def bootstrap_snapshot(
    settings: SettingsLike,
    location: str | S3Location,
    dataset: str,
    dest_dataset_root: str | Path,
    *,
    catalog: Catalog,
    where_keys: KeySelector = None,
    version: int | None = None,
    manifest: SnapshotManifest | None = None,
    storage: PartitionStorage | None = None,
    ranged_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
    chunksize: int = DEFAULT_MULTIPART_CHUNKSIZE,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
) -> BootstrapResult:
    """Hydrate `dest_dataset_root` and `catalog` from the snapshot of `dataset` under `location`.

    `where_keys` selects partitions: `None` takes all; a predicate receives each `PartitionKey`; a
    collection of key paths (e.g. `select_where(manifest, schema, where)`) takes exactly those, and
    names one the snapshot lacks is an error. Local partitions the selection covers but the snapshot no
    longer has are removed in the same commit; local partitions refreshed after the snapshot's copy are
    kept as they are (`partitions_kept_local`). `version` picks a published version (default: the
    newest); `manifest` reuses one already read with `read_snapshot_manifest`.
    DuckDB `tables` mode needs `storage` (or `catalog.storage`) to rebuild the shared file's tables.
    """
    layout = SnapshotLayout.of(location, dataset)
    root = Path(dest_dataset_root)
    _check_destination(catalog, dataset, root)
    store = layout.store(settings)
    client = store.client
    manifest = _resolve_manifest(store, layout, manifest, version)
    if manifest is None:
        return BootstrapResult(dataset, layout.location.uri(), None, None, 0, (), (), (), (), 0, 0, 0)
    if manifest.dataset != dataset:
        raise SnapshotError(f"manifest passed is for dataset {manifest.dataset!r}, not {dataset!r}")

    local = catalog.latest()
    _check_same_spec(dataset, local, manifest)
    selected, kept_local = _newer_locally(local, _select(manifest, where_keys))
    storage = storage or catalog.storage
    in_shared_tables, downloads = _plan_downloads(layout, root, local, selected, storage)
    # What this call creates, so a refused bootstrap can take it away again.
    created_directories = _missing_directories(root, downloads)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SnapshotError(f"cannot create the dataset directory {root}: {err}") from err
    fetched: dict[int, Path] = {}
    placed: list[Path] = []
    try:
        # Every file is downloaded and verified before any is placed: a corrupted object refuses the
        # whole bootstrap with nothing installed.
        _fetch_all(client, downloads, fetched, root, ranged_threshold, chunksize, max_concurrency)
        actions = _place_all(downloads, fetched, placed)
        upserts = [
            entry if entry.key_path in in_shared_tables else _published(entry, root, storage)
            for entry in selected
        ]
        changed = [entry for entry in upserts if not _unchanged(local, entry)]
        removed, kept_local = _removed_and_kept(local, manifest, where_keys, kept_local)
        committed_version = _commit_bootstrap(catalog, layout, manifest, local, changed, removed)
    except BaseException:
        _discard(catalog, root, list(fetched.values()), placed, created_directories)
        raise
    downloaded = [
        item for item, action in zip(downloads, actions, strict=True) if action is DownloadAction.DOWNLOADED
    ]
    return BootstrapResult(
        dataset=dataset,
        location=layout.location.uri(),
        version=manifest.version,
        committed_version=committed_version,
        partitions_total=len(manifest.entries),
        partitions_selected=tuple(e.key_path for e in selected),
        partitions_committed=tuple(e.key_path for e in changed),
        partitions_removed=tuple(removed),
        partitions_kept_local=tuple(sorted(kept_local)),
        files_downloaded=len(downloaded),
        files_skipped=sum(len(e.files) for e in selected) - len(downloaded),
        bytes_downloaded=sum(item.size for item in downloaded),
    )


def _check_destination(catalog: Catalog, dataset: str, root: Path) -> None:
    """Refuse a catalog of another dataset, or a destination that is not the catalog's data root."""
    if catalog.dataset != dataset:
        raise SnapshotError(f"catalog is for dataset {catalog.dataset!r}, not {dataset!r}")
    if catalog.data_root is not None and Path(catalog.data_root).resolve() != root.resolve():
        raise SnapshotError(
            f"dest_dataset_root {root} is not the catalog's data root {catalog.data_root}; the files "
            "would be registered where readers do not look"
        )


def _resolve_manifest(
    store: S3Store, layout: SnapshotLayout, manifest: SnapshotManifest | None, version: int | None
) -> SnapshotManifest | None:
    """The manifest passed in (checked against `version`), else the one fetched; `None` if none exists."""
    if manifest is None:
        return fetch_manifest(store, layout, version)
    if version is not None and manifest.version != version:
        raise SnapshotError(
            f"manifest passed is version {manifest.version}, but version {version} was asked for"
        )
    return manifest


def _check_same_spec(dataset: str, local: Snapshot | None, manifest: SnapshotManifest) -> None:
    """Refuse a snapshot written under other partition expressions than the local catalog's."""
    if local is not None and local.partition_spec.spec_id != manifest.partition_spec.spec_id:
        raise PartitionSpecChangedError(
            f"dataset {dataset!r}: the snapshot (version {manifest.version}) was written with partition_by "
            f"{manifest.partition_spec.describe()}, the local catalog (version {local.version}) with "
            f"{local.partition_spec.describe()}. Bootstrap into an empty accelerator_dir, or publish a "
            "snapshot refreshed under the local expressions"
        )


def _plan_downloads(
    layout: SnapshotLayout,
    root: Path,
    local: Snapshot | None,
    selected: Sequence[PartitionEntry],
    storage: PartitionStorage | None,
) -> tuple[set[str], list[FileDownload]]:
    """The partitions kept unchanged in DuckDB's shared tables, and the files to download for the rest."""
    in_shared_file = next((e.key_path for e in selected if any(f.table for f in e.files)), None)
    if in_shared_file is not None and storage is None:
        raise SnapshotError(
            f"partition {in_shared_file!r} lives in tables of DuckDB's shared file; pass the dataset's "
            "storage (get_storage('duckdb', 'tables')) so bootstrap can rebuild those tables"
        )
    # Partitions held unchanged in DuckDB's shared file need no staged copy (it may be gone by design).
    in_shared_tables = {
        e.key_path for e in selected if e.files and all(f.table for f in e.files) and _unchanged(local, e)
    }
    downloads = [
        FileDownload(
            layout.bucket, layout.data_key(f.path), local_file(root, f.path), f.checksum.lower(), f.bytes
        )
        for entry in selected
        if entry.key_path not in in_shared_tables
        for f in entry.files
    ]
    return in_shared_tables, downloads


def _place_all(
    downloads: Sequence[FileDownload], fetched: dict[int, Path], placed: list[Path]
) -> list[DownloadAction]:
    """Place every verified temporary (popped from `fetched`); files placed are appended to `placed`."""
    actions = []
    for index, item in enumerate(downloads):
        temporary = fetched.pop(index, None)
        action = DownloadAction.SKIPPED if temporary is None else place_verified(item, temporary)
        if action is DownloadAction.DOWNLOADED:
            placed.append(item.local)
        actions.append(action)
    return actions


def _removed_and_kept(
    local: Snapshot | None, manifest: SnapshotManifest, where_keys: KeySelector, kept_local: list[str]
) -> tuple[list[str], list[str]]:
    """Local partitions to remove, and `kept_local` extended by those refreshed after the snapshot."""
    removed = _removed(local, manifest, where_keys)
    kept_local += [
        key_path for key_path in removed if _refreshed_after(local, key_path, manifest.committed_at)
    ]
    removed = [key_path for key_path in removed if key_path not in kept_local]
    return removed, kept_local


def _commit_bootstrap(
    catalog: Catalog,
    layout: SnapshotLayout,
    manifest: SnapshotManifest,
    local: Snapshot | None,
    changed: Sequence[PartitionEntry],
    removed: Sequence[str],
) -> int | None:
    """Commit the changed and removed partitions in one local commit; `None` when there is nothing to do."""
    if not (changed or removed):
        return None
    # A refused commit (a local refresh of the same partitions won) takes its downloads back too.
    builder = CommitBuilder(
        catalog,
        "bootstrap",
        local.version if local is not None else None,
        manifest.partition_spec,
        _commit_id(layout, manifest, changed, removed),
    )
    builder.add(changed)
    builder.remove(removed)
    return builder.commit(other_specs=manifest.other_specs)


def _fetch_all(
    client: S3Client,
    downloads: Sequence[FileDownload],
    fetched: dict[int, Path],
    root: Path,
    ranged_threshold: int,
    chunksize: int,
    max_concurrency: int,
) -> None:
    """Download and verify every file to a temporary; `fetched` collects them (also when one fails)."""
    lock = threading.Lock()

    def fetch(index: int) -> None:
        temporary = fetch_verified(
            client,
            downloads[index],
            stop_at=root,
            ranged_threshold=ranged_threshold,
            chunksize=chunksize,
            max_concurrency=max_concurrency,
        )
        if temporary is not None:
            with lock:
                fetched[index] = temporary

    run_all(fetch, range(len(downloads)), max_concurrency)


def _missing_directories(root: Path, downloads: Sequence[FileDownload]) -> list[Path]:
    """Directories (the root and partition directories) a bootstrap would create, deepest first."""
    missing: set[Path] = set()
    for item in downloads:
        directory = item.local.parent
        while not directory.exists() and directory != root.parent:
            missing.add(directory)
            if directory == root:
                break
            directory = directory.parent
    if not root.exists():
        missing.add(root)
    return sorted(missing, key=lambda path: len(path.parts), reverse=True)


def _discard(
    catalog: Catalog,
    root: Path,
    temporaries: Sequence[Path],
    placed: Sequence[Path],
    directories: Sequence[Path],
) -> None:
    """Take back what a refused bootstrap put into the destination; the local catalog was not touched."""
    for temporary in temporaries:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    if placed:
        # A file a committed version names stays, even if this call placed it (a concurrent bootstrap of
        # the same snapshot may have found it here and committed it).
        latest = catalog.latest()
        referenced = (
            {f.path for entry in latest.partitions.values() for f in entry.files}
            if latest is not None
            else set()
        )
        for path in placed:
            if path.relative_to(root).as_posix() not in referenced:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
    for directory in directories:
        with contextlib.suppress(OSError):
            directory.rmdir()  # only when empty: another writer's files stay


def _select(manifest: SnapshotManifest, where_keys: KeySelector) -> list[PartitionEntry]:
    if where_keys is None:
        return list(manifest.entries)
    if callable(where_keys):
        return [entry for entry in manifest.entries if where_keys(entry.key)]
    if isinstance(where_keys, str):
        raise SnapshotError(
            "where_keys must be a collection of key paths, not a single string; wrap it in a list"
        )
    wanted = set(where_keys)
    by_path = {entry.key_path: entry for entry in manifest.entries}
    unknown = sorted(wanted - by_path.keys())
    if unknown:
        raise SnapshotError(
            f"partition(s) {unknown[:5]} are not in snapshot version {manifest.version} of dataset "
            f"{manifest.dataset!r}; key paths look like {next(iter(by_path), 'name=value')!r}"
        )
    return [entry for entry in manifest.entries if entry.key_path in wanted]


def _newer_locally(
    local: Snapshot | None, selected: list[PartitionEntry]
) -> tuple[list[PartitionEntry], list[str]]:
    """Split off selected partitions whose local copy was refreshed after the snapshot's copy."""
    if local is None:
        return selected, []
    keep: list[PartitionEntry] = []
    newer: list[str] = []
    for entry in selected:
        if _refreshed_after(local, entry.key_path, entry.refreshed_at):
            newer.append(entry.key_path)
        else:
            keep.append(entry)
    return keep, newer


def _refreshed_after(local: Snapshot | None, key_path: str, moment: dt.datetime) -> bool:
    if local is None or key_path not in local.partitions:
        return False
    return bool(local.partitions[key_path].refreshed_at > moment)


def _removed(local: Snapshot | None, manifest: SnapshotManifest, where_keys: KeySelector) -> list[str]:
    """Local partitions inside the selection that the snapshot no longer has."""
    if local is None or (where_keys is not None and not callable(where_keys)):
        return []
    remote = {entry.key_path for entry in manifest.entries}
    keys = local.keys()
    return sorted(
        key_path
        for key_path in local.partitions
        if key_path not in remote and (where_keys is None or where_keys(keys[key_path]))
    )


def _published(entry: PartitionEntry, root: Path, storage: PartitionStorage | None) -> PartitionEntry:
    """The entry as the local catalog records it; DuckDB `tables` files are copied into the shared file."""
    if storage is None or not any(f.table is not None for f in entry.files):
        return entry
    staged = [dataclasses.replace(f, table=None) if f.table is not None else f for f in entry.files]
    published = storage.publish(root, staged)
    expected = [f.table for f in entry.files]
    if [f.table for f in published] != expected:
        raise SnapshotError(
            f"rebuilding partition {entry.key_path!r} in DuckDB's shared file named its tables "
            f"{[f.table for f in published]}, the snapshot names {expected}"
        )
    return dataclasses.replace(entry, files=tuple(published))


def _unchanged(local: Snapshot | None, entry: PartitionEntry) -> bool:
    if local is None or entry.key_path not in local.partitions:
        return False
    return bool(local.partitions[entry.key_path] == entry)


def _commit_id(
    layout: SnapshotLayout,
    manifest: SnapshotManifest,
    changed: Sequence[PartitionEntry],
    removed: Sequence[str],
) -> str:
    # A retried bootstrap of the same selection finds its own commit instead of committing twice.
    touched = "\n".join(sorted([e.key_path for e in changed] + [f"-{k}" for k in removed]))
    digest = hashlib.sha256(f"{layout.uri(layout.dataset_prefix)}\n{manifest.sha256}\n{touched}".encode())
    return f"bootstrap:{manifest.version}:{digest.hexdigest()[:24]}"
