"""Accelerations on object storage: partition files, stages and clean-up under an `s3://` accelerator_dir.

Every byte one task hands to another goes through the store, never through a local disk: a finalize task
writes its partition file in private local scratch (the engine, its stats and the row count back from the
file work as for a local root), uploads it under its write-once name with a conditional create, checks
what the store holds (size and sha256 of the bytes read back) and only then returns the entry; the stage
task uploads the staged files and `_stage.json` under `<accelerator_dir>/_staging/<dataset>/<stamp>/`, and
each finalize task fetches only its own item's files. A failed upload leaves at most unreferenced objects,
which vacuum removes after the grace period, exactly like local orphans.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_partitions.exceptions import RefreshError, StorageError
from airflow_partitions.objectstore import S3Store
from airflow_partitions.objectstore.location import parse_s3_location
from airflow_partitions.refresh.plan import StageMode
from airflow_partitions.refresh.stage_layout import (
    CHANGES_FILE,
    ITEM_COLUMN,
    STAGE_DATA,
    STAGE_MANIFEST,
    StagingSweep,
    read_stage_manifest,
)
from airflow_partitions.storage.remote import upload_partition_files

if TYPE_CHECKING:
    from airflow_partitions.objectstore import ObjectStore, SettingsLike
    from airflow_partitions.spec.model import DatasetSpec
    from airflow_partitions.table import DatasetHandle

__all__ = ["read_stage_manifest", "upload_partition_files"]

ITEM_PREFIX = f"{ITEM_COLUMN}="


def _store(url: str, settings: SettingsLike | None) -> ObjectStore:

    return S3Store.at(parse_s3_location(url, what="accelerator_dir", error=StorageError), settings)


def check_remote_engine(dataset: DatasetSpec) -> None:
    """Refuse the duckdb `tables` mode on object storage: its one shared database file is rewritten in
    place by every commit, which write-once objects cannot do (use `files` mode, parquet or arrow)."""
    if str(dataset.acceleration.partition_mode) == "tables":
        raise StorageError(
            f"dataset {dataset.name!r}: duckdb partition_mode 'tables' keeps every partition in one shared "
            "database file that each commit rewrites in place; objects on S3 are written once, so it cannot "
            "live under an s3:// accelerator_dir. Use partition_mode 'files', or engine parquet or arrow"
        )


def upload_stage(local: Path, url: str, settings: SettingsLike | None = None) -> None:
    """Upload a finished local stage (data files first, `_stage.json` last: a stage without its
    manifest is unfinished to every reader) to `url`, then delete the local copy."""
    store = _store(url, settings)
    files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != STAGE_MANIFEST)
    for path in files:
        relative = path.relative_to(local).as_posix()
        if any(part.startswith((".", "_")) for part in relative.split("/")[2:]):
            continue  # Spark's _SUCCESS and .crc files: finalize never reads them
        store.put(relative, path.read_bytes())
    store.put(STAGE_MANIFEST, (local / STAGE_MANIFEST).read_bytes())
    shutil.rmtree(local, ignore_errors=True)


def fetch_stage(url: str, index: int | None, into: Path, settings: SettingsLike | None = None) -> Path:
    """Download the stage manifest and only item `index`'s staged files (None: the manifest only) into
    `into`; returns the local stage directory, laid out like the remote one."""
    store = _store(url, settings)
    manifest = store.get(STAGE_MANIFEST)
    if manifest is None:
        raise RefreshError(
            f"no finished stage at {url}: {STAGE_MANIFEST} is missing. The stage step failed or was "
            "cleaned up after a commit; run the refresh again"
        )
    into.mkdir(parents=True, exist_ok=True)
    (into / STAGE_MANIFEST).write_bytes(manifest)

    if json.loads(manifest).get("mode") == str(StageMode.CHANGES):
        # A changes stage's one data file: every partition task merges it into its committed rows.
        changes = store.get(CHANGES_FILE)
        if changes is None:
            raise RefreshError(f"staged file {url}/{CHANGES_FILE} is missing; stage again")
        (into / CHANGES_FILE).write_bytes(changes)
    if index is not None:
        prefix = f"{STAGE_DATA}/{ITEM_PREFIX}{index}/"
        for info in store.list(prefix):
            data = store.get(info.key)
            if data is None:
                raise RefreshError(f"staged file {url}/{info.key} vanished while it was read; stage again")
            target = into / info.key
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return into


def sweep_remote_stages(handle: DatasetHandle, *, grace: dt.timedelta, keep: Sequence[str] = ()) -> list[str]:
    """Delete stages under `_staging/<dataset>/` whose newest object is older than `grace` (left by killed
    runs); returns the stage URLs removed."""
    sweep = remote_staging_sweep(handle, grace=grace, keep=keep)
    return list(sweep.removed)


def remote_staging_sweep(
    handle: DatasetHandle,
    *,
    grace: dt.timedelta,
    keep: Sequence[str] = (),
    dry_run: bool = False,
) -> StagingSweep:
    """The stage step's and vacuum's sweep of `<accelerator_dir>/_staging/<dataset>/` on S3: every stage
    whose newest object is older than `grace` is deleted (a dry run only reports it); stages in `keep`
    and younger ones stay. Reports stage URLs and the bytes under the prefix before and after."""
    prefix = handle.stage_location("")
    root = _store(prefix, handle.settings)
    newest: dict[str, dt.datetime] = {}
    keys: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    for info in root.list(""):
        name = info.key.split("/", 1)[0]
        keys.setdefault(name, []).append(info.key)
        sizes[name] = sizes.get(name, 0) + info.size
        newest[name] = max(newest.get(name, info.modified), info.modified)
    cutoff = dt.datetime.now(dt.UTC) - grace
    removed: list[str] = []
    freed = kept_young = 0
    for name, modified in sorted(newest.items()):
        url = handle.stage_location(name)
        if url in keep:
            continue
        if modified >= cutoff:
            kept_young += 1
            continue
        if not dry_run:
            root.delete(keys[name])
        removed.append(url)
        freed += sizes[name]
    before = sum(sizes.values())
    return StagingSweep(
        root=prefix,
        dry_run=dry_run,
        removed=tuple(removed),
        kept_young=kept_young,
        bytes_freed=freed,
        bytes_before=before,
        bytes_after=before - freed,
    )


def remove_local(path: str | os.PathLike[str]) -> None:
    shutil.rmtree(path, ignore_errors=True)
