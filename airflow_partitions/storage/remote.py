"""Partition files on object storage: write-once upload, local copies for rewrites, vacuum of orphans."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_partitions.exceptions import StorageError
from airflow_partitions.objectstore.base import TEMP_PREFIX
from airflow_partitions.storage.base import FILE_PREFIX, VacuumedFile

if TYPE_CHECKING:
    from airflow_partitions.objectstore import ObjectStore
    from airflow_partitions.storage.datafile import DataFile


def vacuum_remote_files(
    store: ObjectStore, referenced: set[str], *, cutoff: dt.datetime, dry_run: bool
) -> tuple[list[VacuumedFile], list[str]]:
    """Delete partition objects (`part-*`, `.tmp-*`) no retained version references and older than
    `cutoff`; the catalog's own objects are never touched. Returns (removed, kept because young)."""
    removed: list[VacuumedFile] = []
    young: list[str] = []
    doomed: list[str] = []
    for info in store.list(""):
        name = info.key.rsplit("/", 1)[-1]
        if info.key.startswith("_") or not name.startswith((FILE_PREFIX, TEMP_PREFIX)):
            continue
        if info.key in referenced:
            continue
        if info.modified >= cutoff:
            young.append(info.key)
            continue
        removed.append(VacuumedFile(info.key, info.size))
        doomed.append(info.key)
    if doomed and not dry_run:
        store.delete(doomed)
    return removed, young


def upload_partition_files(store: ObjectStore, local_root: Path, files: Sequence[DataFile]) -> None:
    """Upload written files under their write-once names and check what the store then holds.

    `put_if_absent` never replaces an object: names are unique, so an existing one means a name clash or
    a tampered store, and is refused rather than trusted. Each object is read back and must have the
    file's size and checksum before anything references it.
    """
    for file in files:
        data = (local_root / file.path).read_bytes()
        if len(data) != file.bytes or hashlib.sha256(data).hexdigest() != file.checksum:
            raise StorageError(
                f"local file {file.path} changed between its write and its upload; nothing was uploaded"
            )
        if not store.put_if_absent(file.path, data):
            raise StorageError(
                f"{store.describe()}/{file.path} already exists; partition file names are unique, so "
                "another writer used the same name. Nothing references it; run the refresh again"
            )
        stored = store.get(file.path)
        if stored is None or len(stored) != file.bytes or hashlib.sha256(stored).hexdigest() != file.checksum:
            raise StorageError(
                f"{store.describe()}/{file.path} does not hold the bytes uploaded (size "
                f"{None if stored is None else len(stored)} vs {file.bytes}); not referenced, vacuum removes "
                "it. Run the refresh again"
            )


def fetch_partition_files(store: ObjectStore, local_root: Path, files: Sequence[DataFile]) -> None:
    """Copy `files` from the store under `local_root` (once: a copy already there is kept), each checked
    against its recorded size and checksum, so a rewrite reads exactly the bytes the catalog names."""
    for file in files:
        target = local_root / file.path
        if target.exists():
            continue
        data = store.get(file.path)
        if data is None or len(data) != file.bytes or hashlib.sha256(data).hexdigest() != file.checksum:
            raise StorageError(
                f"{store.describe()}/{file.path} is missing or does not hold the bytes the catalog records; "
                "the acceleration is damaged there: refresh the partition"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f"{TEMP_PREFIX}{target.name}")
        temporary.write_bytes(data)
        temporary.replace(target)
