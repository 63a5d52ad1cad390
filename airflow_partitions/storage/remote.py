"""Partition files on object storage: vacuum of the objects no catalog version references."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from airflow_partitions.objectstore.base import TEMP_PREFIX
from airflow_partitions.storage.base import FILE_PREFIX, VacuumedFile

if TYPE_CHECKING:
    from airflow_partitions.objectstore import ObjectStore


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
