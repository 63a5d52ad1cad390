"""The write half of the in-process Arrow refresh, shared by the whole-table path (`arrow_refresh.py`) and
the streaming one (`arrow_stream.py`): each planned partition written by the storage engine through the
partition writer on a small thread pool, counted back from its files, and the files of a refused refresh
removed. On lost or extra rows nothing is published and `ConservationError` names the partitions."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_partitions.exceptions import ConservationError
from airflow_partitions.refresh.finalize import REWRITE_ADVICE, written_entry
from airflow_partitions.refresh.plan import DiscoveryKind, PartitionResult
from airflow_partitions.refresh.stage_layout import discovered_but_empty, merge_conservation_errors
from airflow_partitions.storage.base import BackgroundSync
from airflow_partitions.table.partition_writer import PartitionWriter
from airflow_partitions.write.row_hash import RowTally, certify_rows

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.refresh.plan import PartitionWorkItem, RefreshPlan
    from airflow_partitions.spec.model import DatasetSpec
    from airflow_partitions.storage import DataFile, PartitionStorage

DEFAULT_ARROW_WORKERS = 2


@dataclass(frozen=True)
class ArrowRefreshResult:
    """The partitions written by `arrow_refresh` (not yet published) and the rows counted on the way."""

    results: tuple[PartitionResult, ...]
    source_rows: int  # rows read from the source
    routed_rows: int  # rows routed to planned partitions (== source_rows for a plan of every partition)
    dropped_rows: int  # rows of partitions the plan does not refresh (a selection, or unchanged ones)
    elapsed_s: float
    # Key path -> `Type: message` of each partition whose write failed (only with `keep_going`); their
    # files are removed and they are not in `results`.
    failed: Mapping[str, str] = field(default_factory=dict)


def plans_every_partition(plan: RefreshPlan, selecting: bool) -> bool:
    """True when the plan refreshes every partition of the source: then every row must be routed to one."""
    return not selecting and plan.unchanged == 0


def check_routed_counts(
    dataset: str,
    plan: RefreshPlan,
    *,
    selecting: bool,
    scanned: int,
    routed_total: int,
    unplanned: Mapping[str, int],
    has_rows: Callable[[str], bool],
) -> int:
    """The routing checks of both Arrow paths: no row goes to a partition a full plan lacks, rows scanned =
    rows routed to planned partitions + rows of unplanned ones, and (dynamic discovery) every discovered
    partition got rows (`has_rows(key path)`). `ConservationError` otherwise; the rows dropped."""
    if unplanned and plans_every_partition(plan, selecting):
        raise ConservationError(
            dataset,
            {path: (0, count) for path, count in sorted(unplanned.items())},
            expected="rows planned for the partition (the plan does not contain it)",
            actual="source rows routed to it",
            hint="The source changed between discovery and the read, or discovery and routing disagree "
            "on a partition value; nothing was written. Run the refresh again.",
        )
    dropped = sum(unplanned.values())
    if routed_total + dropped != scanned:
        raise ConservationError(
            dataset,
            {"[all partitions]": (scanned, routed_total + dropped)},
            expected="rows read from the source",
            actual="rows routed to partitions",
            hint="Routing lost or duplicated rows; nothing was written. Report this with the source.",
        )
    if plan.discovery is DiscoveryKind.DYNAMIC:
        empty = [item.key_path for item in plan.items if not has_rows(item.key_path)]
        if empty:
            raise discovered_but_empty(dataset, empty, actual="rows read")
    return dropped


def write_partition(
    dataset: DatasetSpec,
    item: PartitionWorkItem,
    rows: pa.Table,
    engine: PartitionStorage,
    data_root: Path,
    files: list[DataFile],
    tallies: Mapping[str, RowTally],
) -> PartitionResult:
    """Write one planned partition's `rows` with the storage engine (`files` collects what is written, for
    removal on failure), count them back from the files and return its unpublished result. Its certificate
    is its tally in `tallies` (hashed as the rows were read) when that counts the same rows, else it is
    computed from `rows`."""
    mark = time.monotonic()
    writer = PartitionWriter.local(engine, data_root, dataset.name)
    # Made durable with the others' files by `write_planned`, before anything references them.
    written_here = writer.write(item.key_path, rows, check=False, sync=False)
    files.extend(written_here.files)  # removed when the counts are refused
    writer.check(item.key_path, files, written_here.rows, rows.num_rows, "rows read", REWRITE_ADVICE)
    tally = tallies.get(item.key_path)
    certificate = (
        tally.certificate() if tally is not None and tally.rows == rows.num_rows else certify_rows(rows)
    )
    entry = written_entry(item, dataset.acceleration.partition_spec_id, files, certificate)
    return PartitionResult(entry, elapsed_s=time.monotonic() - mark, routed=rows.num_rows)


def write_planned(
    dataset: str,
    items: Sequence[PartitionWorkItem],
    write_one: Callable[[PartitionWorkItem], PartitionResult],
    engine: PartitionStorage,
    data_root: Path,
    written: Mapping[str, Sequence[DataFile]],
    *,
    workers: int | None,
    keep_going: bool,
    rows: Mapping[str, int] | None = None,
) -> tuple[list[PartitionResult], dict[str, Exception]]:
    """Run `write_one` for every planned item on a small thread pool: the results (in `items` order),
    and (only with `keep_going`) the partitions whose write failed other than by losing rows, their files
    removed. `write_partition` writes without fsyncs (`sync=False`): each partition's files are fsynced
    in the background as soon as it is written, and the kept ones waited for (then every directory once)
    before this returns. `rows`: each partition's rows by key path; the largest are started first, so a
    skewed source does not end on one large partition written alone while the other threads idle.

    Lost or extra rows in any partition (or any failure without `keep_going`) remove every file in
    `written` and raise."""
    results: list[PartitionResult] = []
    lost: list[ConservationError] = []
    failures: dict[str, Exception] = {}
    sizes = rows or {}
    # Largest first; a stable sort keeps plan order among equals.
    order = sorted(range(len(items)), key=lambda index: -sizes.get(items[index].key_path, 0))
    with BackgroundSync(data_root) as syncs:

        def write_and_sync(item: PartitionWorkItem) -> PartitionResult:
            result = write_one(item)
            syncs.start(result.files)  # the disk flushes these while the next partitions are encoded
            return result

        with ThreadPoolExecutor(max_workers=max(1, workers or DEFAULT_ARROW_WORKERS)) as pool:
            submitted = {index: pool.submit(write_and_sync, items[index]) for index in order}
            for index, item in enumerate(items):
                try:
                    results.append(submitted[index].result())
                except ConservationError as err:
                    lost.append(err)
                except Exception as err:
                    failures[item.key_path] = err
        if lost or (failures and not keep_going):
            remove_written(engine, data_root, [file for files in written.values() for file in files])
            if lost:
                raise merge_conservation_errors(dataset, lost)
            raise next(iter(failures.values()))
        for key_path in failures:
            remove_written(engine, data_root, written.get(key_path, []))
        kept = [file for key_path, files in written.items() if key_path not in failures for file in files]
        try:
            syncs.finish(kept)  # every kept file durable, then each directory once
        except Exception:
            remove_written(engine, data_root, kept)
            raise
    return results, failures


def remove_written(engine: PartitionStorage, data_root: Path, files: Sequence[DataFile]) -> None:
    """Delete files this refresh wrote and will not publish (shared objects are left to vacuum)."""
    shared = set(engine.shared_objects(files))
    for file in files:
        if file.path in shared:
            continue
        path = Path(data_root) / file.path
        try:
            if path.is_file():
                path.unlink()
        except OSError:
            pass  # unreferenced: vacuum removes it
