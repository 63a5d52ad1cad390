"""Sweep what killed or abandoned refresh runs left in a dataset's staging root.

A run removes its own stage after the commit (or when it refuses), but a killed process removes nothing:
its stage (possibly half written by Spark) and its spark-submit job files stay. The next stage step and
vacuum remove every such directory whose last activity is older than the grace period, the same notion
catalog vacuum uses for unreferenced files: a younger one may belong to a run in flight. Activity is the
newest modification time of the directory, its direct entries and Spark's `data/_temporary` output (a job
still writing), and finalize tasks mark the stage they read (`mark_stage_in_use`), so a long fan-out of
finalize tasks keeps its stage alive. The grace must exceed the longest pause between two of those steps
of one run (default 1 h).

Only directories that look like stages are considered: they hold a stage manifest or staged `data/`, are
empty, or are spark-submit job files (`.job-*`). Anything else under the staging root is left alone.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_partitions.catalog.catalog import DEFAULT_GRACE
from airflow_partitions.refresh.job_files import JOB_FILES_PREFIX
from airflow_partitions.refresh.remote import remote_staging_sweep
from airflow_partitions.refresh.stage_layout import STAGE_DATA, STAGE_MANIFEST, StagingSweep, staging_root

if TYPE_CHECKING:
    from airflow_partitions.table import DatasetHandle

_SPARK_TEMPORARY = "_temporary"


def sweep_stale_stages(
    root: str | os.PathLike[str],
    *,
    grace: dt.timedelta = DEFAULT_GRACE,
    keep: Collection[str | os.PathLike[str]] = (),
    dry_run: bool = False,
    measure: bool = False,
    now: dt.datetime | None = None,
) -> StagingSweep:
    """Remove the stage and job-file directories under `root` last active more than `grace` ago.

    `keep`: locations never removed (the caller's own stage). A directory that vanishes meanwhile (its
    run committed) is skipped. `measure`: also report the bytes under the whole root before and after.
    """
    base = Path(root)
    if not base.is_dir():
        return StagingSweep(
            str(base), dry_run, bytes_before=0 if measure else None, bytes_after=0 if measure else None
        )
    limit = (now or dt.datetime.now(dt.UTC)).timestamp() - grace.total_seconds()
    kept = {os.path.abspath(location) for location in keep}
    before = _tree_bytes(base) if measure else None
    removed: list[str] = []
    freed = 0
    young = 0
    for candidate in sorted(base.iterdir()):
        if os.path.abspath(candidate) in kept or not _is_stage_leftover(candidate):
            continue
        try:
            active = _last_activity(candidate)
        except FileNotFoundError:
            continue
        if active >= limit:
            young += 1
            continue
        size = _tree_bytes(candidate)
        if not dry_run:
            shutil.rmtree(candidate, ignore_errors=True)
            size -= _tree_bytes(candidate)  # what a concurrent writer put back is not counted as freed
        removed.append(candidate.name)
        freed += size
    after = None
    if before is not None:
        after = before - freed if dry_run else _tree_bytes(base)
    return StagingSweep(
        str(base),
        dry_run,
        removed=tuple(removed),
        kept_young=young,
        bytes_freed=freed,
        bytes_before=before,
        bytes_after=after,
    )


def mark_stage_in_use(location: str | os.PathLike[str]) -> None:
    """Record activity on a stage (a finalize task is reading it) so sweeps leave it alone."""
    with contextlib.suppress(OSError):  # a read-only mount: the stage's own times still count
        os.utime(location)


def _is_stage_leftover(path: Path) -> bool:
    if path.is_symlink() or not path.is_dir():
        return False
    if path.name.startswith(JOB_FILES_PREFIX):
        return True
    if (path / STAGE_MANIFEST).exists() or (path / STAGE_DATA).is_dir():
        return True
    return not any(path.iterdir())  # created, then killed before Spark wrote anything


def _last_activity(stage: Path) -> float:
    """The newest modification time of the stage directory, its entries and Spark's in-flight output."""
    newest = stage.stat().st_mtime
    for entry in os.scandir(stage):
        with contextlib.suppress(FileNotFoundError):
            newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    temporary = stage / STAGE_DATA / _SPARK_TEMPORARY
    if temporary.is_dir():
        for path in _walk(temporary):
            with contextlib.suppress(FileNotFoundError):
                newest = max(newest, path.stat(follow_symlinks=False).st_mtime)
    return newest


def _walk(directory: Path) -> Iterator[os.DirEntry[str]]:
    with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
        for entry in entries:
            yield entry
            if entry.is_dir(follow_symlinks=False):
                yield from _walk(Path(entry.path))


def _tree_bytes(directory: Path) -> int:
    """Bytes of every file under `directory` (0 when it does not exist)."""
    total = 0
    for entry in _walk(directory):
        if entry.is_file(follow_symlinks=False):
            with contextlib.suppress(FileNotFoundError):
                total += entry.stat(follow_symlinks=False).st_size
    return total


def sweep_dataset_staging(
    handle: DatasetHandle, *, grace: dt.timedelta | None = None, dry_run: bool = False
) -> StagingSweep:
    """Vacuum's part: sweep the dataset's staging root (`staging_root`) with vacuum's grace (None: 1 h);
    with the files on S3, the stages under `<accelerator_dir>/_staging/<dataset>/` there (reached with the
    handle's settings)."""
    if not handle.local_data:
        return remote_staging_sweep(handle, grace=DEFAULT_GRACE if grace is None else grace, dry_run=dry_run)
    return sweep_stale_stages(
        staging_root(handle.project, handle.dataset),
        grace=DEFAULT_GRACE if grace is None else grace,
        dry_run=dry_run,
        measure=True,
    )
