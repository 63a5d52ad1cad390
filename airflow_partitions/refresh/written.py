"""Partition files written by the Spark executors themselves (`StageMode.WRITTEN`).

The stage job routes rows to planned items as before; then, instead of staging them for one Airflow task
per partition to read back, each executor task writes the final engine file(s) of the items it holds with
the project's own writer (`PartitionStorage.write`: sort order, row groups, stats, checksum), counts the
rows back from the written files and returns one small metadata row per item. The driver collects those
rows (a few hundred bytes each), checks conservation and records them in the stage manifest; finalize
then builds each partition's catalog entry from the manifest alone.

Files go straight to their write-once names under the dataset root (or, with an `s3://` accelerator_dir,
are written in the executor's scratch and uploaded write-once): nothing references them until the
commit, and vacuum removes them if the run fails. This module runs on executors: it imports only the
core, and Spark, pyarrow and boto3 inside functions.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.catalog.model import RowCertificate
from airflow_partitions.exceptions import ConservationError, RefreshError, StorageError
from airflow_partitions.objectstore import S3Store
from airflow_partitions.objectstore.location import parse_s3_location
from airflow_partitions.refresh.finalize import (
    conform_to_schema,
    merge_changes,
    verify_partition,
    verify_past_watermark,
)
from airflow_partitions.storage import DataFile, get_storage
from airflow_partitions.storage.remote import fetch_partition_files
from airflow_partitions.table.partition_writer import PartitionWriter
from airflow_partitions.write.row_hash import certify_rows

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.objectstore import S3Settings
    from airflow_partitions.refresh.plan import PartitionWorkItem
    from airflow_partitions.sources.base import RowsSince
    from airflow_partitions.spec.model import AccelerationSpec, DatasetSpec
    from airflow_partitions.storage import DataFile, PartitionStorage
    from airflow_partitions.transforms import Transform

ITEM_COLUMN = "__ap_item"
# What each executor task returns per item it wrote (the DataFiles as one JSON list; `changed`: for a
# changes refresh, how many of the written rows are changed rows merged in).
RESULT_SCHEMA_DDL = (
    "item INT, routed BIGINT, written BIGINT, files STRING, error STRING, changed BIGINT, certificate STRING"
)


def result_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("item", pa.int32()),
            ("routed", pa.int64()),
            ("written", pa.int64()),
            ("files", pa.string()),
            ("error", pa.string()),
            ("changed", pa.int64()),
            ("certificate", pa.string()),  # JSON of the written rows' `RowCertificate`
        ]
    )


def written_mode_refusal(dataset: DatasetSpec) -> str | None:
    """Why the executors cannot write this dataset's final files (None: they can).

    DuckDB `tables` mode keeps every partition in one shared database file that only the committing
    process may change (under a lock): it stays on the staged path. (An append writes new files beside
    the committed ones, so executors write those too; `changes` refreshes are not Spark-staged.)
    """
    acceleration = dataset.acceleration
    if str(acceleration.engine) == "duckdb" and str(acceleration.partition_mode) == "tables":
        return "duckdb partition_mode 'tables' publishes into one shared database file"
    return None


@dataclass(frozen=True)
class ItemWriteJob:
    """Everything an executor needs to write the items it receives (pickled into the Spark job).

    `s3_settings` reach the bucket of an `s3://` accelerator_dir; they travel inside the job's closure
    only (never in a log, the plan or the stage manifest). `sinces` holds, per item, the watermark an
    appended partition's rows must be past (None: the partition is written whole).
    """

    dataset: str
    schema: bytes  # the source's Arrow schema, serialized
    transforms: tuple[Transform, ...]
    keys: tuple[tuple[Any, ...], ...]
    key_paths: tuple[str, ...]
    storage: PartitionStorage
    data_root: str | None  # the local dataset root; None: write in scratch and upload to `upload_url`
    upload_url: str | None = None
    s3_settings: S3Settings | None = None
    verify: bool = True
    sinces: tuple[RowsSince | None, ...] = ()

    def arrow_schema(self) -> pa.Schema:
        import pyarrow as pa

        return pa.ipc.read_schema(pa.py_buffer(self.schema))


def write_items(job: ItemWriteJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The executor side (`mapInArrow`): group the task's rows by item, write each item's final files,
    count them back and yield one metadata row per item."""
    import pyarrow as pa
    import pyarrow.compute as pc

    collected = [batch for batch in batches if batch.num_rows]
    if not collected:
        return
    table = pa.Table.from_batches(collected)
    items = table.column(ITEM_COLUMN)
    # One stable sort by item, then zero-copy slices: rows keep their order within an item.
    if pc.min_max(items)["min"] != pc.min_max(items)["max"]:
        table = table.take(pc.sort_indices(items))
        items = table.column(ITEM_COLUMN)
    runs = pc.run_end_encode(items.combine_chunks())
    ends = runs.run_ends.to_pylist()
    values = runs.values.to_pylist()
    rows = table.drop_columns([ITEM_COLUMN])
    schema = job.arrow_schema()
    results: list[dict[str, Any]] = []
    start = 0
    for index, end in zip(values, ends, strict=True):
        results.append(write_item(job, schema, int(index), rows.slice(start, end - start)))
        start = end
    yield pa.RecordBatch.from_pylist(results, schema=result_schema())


def write_item(
    job: ItemWriteJob, schema: pa.Schema, index: int, rows: pa.Table, *, sync: bool = True
) -> dict[str, Any]:
    """Write one item's rows (conformed, keys re-checked) as final files; the metadata row for them.

    A partition that cannot be written (its rows belong elsewhere, a disk or store error) fails alone,
    as a finalize task would: its row carries the error, which its finalize raises; the others go on.
    `sync=False` (local files): the caller makes the files durable (`storage.base.BackgroundSync`)
    before it reports them.
    """

    if not 0 <= index < len(job.keys):
        raise RefreshError(f"the Spark stage routed rows to unplanned item {index}; plan again")
    key_path = job.key_paths[index]
    files: list[DataFile] = []
    written = 0
    error: str | None = None
    certificate: RowCertificate | None = None
    try:
        table = conform_to_schema(rows, schema)
        since = job.sinces[index] if job.sinces else None
        if job.verify:
            verify_partition(table, job.transforms, job.keys[index], key_path)
            if since is not None:  # an appended row at or below the watermark would be a duplicate
                verify_past_watermark(table, since, key_path)
        files, written = _write_final_files(
            job.dataset, job.storage, table, key_path, job.data_root, job.upload_url, job.s3_settings, sync
        )
        certificate = certify_rows(table)
    except Exception as err:
        error = f"{type(err).__name__}: {err}"[:2000]
    return _result_row(index, rows.num_rows, written, files, error, certificate=certificate)


def _result_row(
    index: int,
    routed: int,
    written: int,
    files: Sequence[DataFile],
    error: str | None,
    changed: int | None = None,
    *,
    certificate: RowCertificate | None = None,
) -> dict[str, Any]:
    """One executor's metadata row for an item (`result_schema`)."""
    return {
        "item": index,
        "routed": routed,
        "written": written,
        "files": json.dumps([f.to_json() for f in files], separators=(",", ":")),
        "error": error,
        "changed": changed,
        "certificate": json.dumps(certificate.to_json()) if certificate is not None else None,
    }


def _write_final_files(
    dataset: str,
    storage: PartitionStorage,
    table: pa.Table,
    key_path: str,
    data_root: str | None,
    upload_url: str | None,
    settings: S3Settings | None,
    sync: bool = True,
) -> tuple[list[DataFile], int]:
    """Write a partition's final files and count their rows back (`PartitionWriter`): under the local
    dataset root, or (no `data_root`) in this executor's private scratch, uploaded write-once to
    `upload_url` (checked; always synced). The driver compares the counts of every item at once."""
    if data_root is not None:
        writer = PartitionWriter.local(storage, data_root, dataset)
        written = writer.write(key_path, table, check=False, sync=sync)
        return written.files, written.rows
    scratch = _scratch()
    try:
        writer = PartitionWriter(storage, _upload_store(upload_url, settings), scratch, dataset)
        written = writer.write(key_path, table, check=False)
        return written.files, written.rows
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@dataclass(frozen=True)
class ItemMergeJob:
    """refresh_mode changes on the executors: each task merges the staged changed rows into the committed
    files of the items it receives (`finalize.merge_changes`) and writes each partition's new files. It
    carries the dataset's name and primary key, not its spec (whose source parameters may hold
    credentials)."""

    dataset: str
    primary_key: tuple[str, ...]
    schema: bytes  # the source's Arrow schema, serialized
    transforms: tuple[Transform, ...]
    items: tuple[PartitionWorkItem, ...]
    storage: PartitionStorage
    changes: bytes  # the staged changed rows (an Arrow IPC stream; the stage read them already)
    data_root: str | None  # the local dataset root; None: fetch from and upload to `upload_url`
    upload_url: str | None = None
    s3_settings: S3Settings | None = None
    verify: bool = True

    def arrow_schema(self) -> pa.Schema:
        import pyarrow as pa

        return pa.ipc.read_schema(pa.py_buffer(self.schema))

    def changed_rows(self) -> pa.Table:
        import pyarrow as pa

        return pa.ipc.open_stream(pa.py_buffer(self.changes)).read_all()


def merge_items(job: ItemMergeJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The executor side of a changes refresh (`mapInArrow` over item numbers): the changed rows are
    decoded once per task, then each item is merged, written, counted back; one metadata row per item."""
    import pyarrow as pa

    indexes = [int(i) for batch in batches for i in batch.column("item").to_pylist()]
    if not indexes:
        return
    schema = job.arrow_schema()
    changed = job.changed_rows()
    results = [merge_item(job, schema, changed, index) for index in indexes]
    yield pa.RecordBatch.from_pylist(results, schema=result_schema())


def merge_item(job: ItemMergeJob, schema: pa.Schema, changed: pa.Table, index: int) -> dict[str, Any]:
    """One partition of a changes refresh: committed rows minus every changed key, plus the changed rows
    routed here, re-checked and written as the partition's new files. Fails alone, like `write_item`."""

    if not 0 <= index < len(job.items):
        raise RefreshError(f"the Spark merge job received unplanned item {index}; plan again")
    item = job.items[index]
    key = item.partition_key.values
    files: list[DataFile] = []
    routed = written = 0
    added: int | None = None
    error: str | None = None
    certificate: RowCertificate | None = None
    # Under an s3:// accelerator_dir the committed files are fetched into private scratch first.
    scratch = _scratch() if job.data_root is None else None
    try:
        if scratch is not None:
            fetch_partition_files(_upload_store(job.upload_url, job.s3_settings), scratch, item.base_files)
        base_root = scratch if scratch is not None else Path(str(job.data_root))
        table, added = merge_changes(
            job.dataset,
            job.primary_key,
            job.storage,
            base_root,
            changed,
            item,
            list(job.transforms),
            key,
            schema,
        )
        routed = table.num_rows
        if job.verify:
            verify_partition(table, job.transforms, key, item.key_path)
        if table.num_rows:
            files, written = _write_final_files(
                job.dataset, job.storage, table, item.key_path, job.data_root, job.upload_url, job.s3_settings
            )
        certificate = certify_rows(table)
    except Exception as err:
        error = f"{type(err).__name__}: {err}"[:2000]
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return _result_row(index, routed, written, files, error, added, certificate=certificate)


def check_merged_changes(
    dataset: str, key_paths: Sequence[str], items: Mapping[int, WrittenItem], landing: Mapping[int, int]
) -> None:
    """Refuse a changes merge that lost or duplicated a changed row: per item, the changed rows merged in
    = the staged changed rows whose partition values are that item's key."""
    differing: dict[str, tuple[int | None, int]] = {}
    for index, key_path in enumerate(key_paths):
        item = items.get(index)
        if item is None or item.error is not None:
            continue  # missing items are refused by `check_written_items`; failed ones fail alone
        if item.changed != landing.get(index, 0):
            differing[key_path] = (landing.get(index, 0), item.changed or 0)
    if differing:
        raise ConservationError(
            dataset,
            differing,
            expected="changed rows routed to the partition",
            actual="changed rows merged into its files",
            hint="A Spark executor's merge did not keep every changed row; nothing was published and the "
            "written files were removed. Run the refresh again.",
        )


def _scratch() -> Path:
    """A private scratch directory on this executor (under AIRFLOW_PARTITIONS_SCRATCH_DIR when set)."""
    base = os.environ.get("AIRFLOW_PARTITIONS_SCRATCH_DIR") or None
    if base:
        Path(base).mkdir(parents=True, exist_ok=True, mode=0o700)
    return Path(tempfile.mkdtemp(prefix="written-", dir=base))


def _upload_store(upload_url: str | None, settings: S3Settings | None) -> Any:

    if upload_url is None:
        raise StorageError("no accelerator_dir URL to upload the partition files to")
    return S3Store.at(parse_s3_location(upload_url, what="accelerator_dir", error=StorageError), settings)


@dataclass(frozen=True)
class WrittenItem:
    """One item as the executors reported it: rows routed to it, rows counted in its files, the files."""

    routed: int
    written: int
    files: tuple[DataFile, ...]
    error: str | None = None  # why the executor could not write the partition (it then fails alone)
    changed: int | None = None  # a changes refresh: changed rows merged into the partition
    certificate: RowCertificate | None = None  # of the rows written (None if a task could not tell)


def merge_item_rows(rows: Sequence[Mapping[str, Any]]) -> dict[int, WrittenItem]:
    """The executors' metadata rows per item (an item split over several tasks has several rows)."""

    merged: dict[int, WrittenItem] = {}
    for row in rows:
        index = int(row["item"])
        files = tuple(DataFile.from_json(f) for f in json.loads(row["files"]))
        known = merged.get(index)
        error = row.get("error")
        changed = row.get("changed")
        certificate = (
            RowCertificate.from_json(json.loads(row["certificate"])) if row.get("certificate") else None
        )
        if known is None:
            merged[index] = WrittenItem(
                int(row["routed"]), int(row["written"]), files, error, changed, certificate
            )
        else:
            merged[index] = WrittenItem(
                known.routed + int(row["routed"]),
                known.written + int(row["written"]),
                known.files + files,
                known.error or error,
                None if known.changed is None and changed is None else (known.changed or 0) + (changed or 0),
                # An item split over several tasks: the row hash of the union is the sum of the parts'.
                known.certificate.plus(certificate) if known.certificate is not None else None,
            )
    return merged


def check_written_items(
    dataset: str, key_paths: Sequence[str], items: Mapping[int, WrittenItem], routed_rows: int
) -> None:
    """Refuse executors' output that lost or invented rows: per item the rows routed to it = the rows
    counted back from its files = the rows its DataFiles declare, and in total the rows the job routed
    = the rows the executors received."""
    differing: dict[str, tuple[int | None, int]] = {}
    recorded_only = True  # every difference is between the files and what the writer recorded
    for index, item in sorted(items.items()):
        if item.error is not None:
            continue  # this partition fails in its finalize with the executor's error
        declared = sum(f.rows for f in item.files)
        if item.written != item.routed or declared != item.routed:
            shown = item.written if item.written != item.routed else declared
            differing[key_paths[index]] = (item.routed, shown)
            recorded_only = recorded_only and item.written == item.routed
    if differing:
        raise ConservationError(
            dataset,
            differing,
            expected="rows read",
            actual="rows the writer recorded" if recorded_only else "rows in the written files",
            hint="A Spark executor's storage writer did not write the rows it was given; nothing was "
            "published and the written files were removed. Check the executors' disks (or the "
            "object store), then run the refresh again.",
        )
    received = sum(item.routed for item in items.values())
    if received != routed_rows:
        raise ConservationError(
            dataset,
            {"[all partitions]": (routed_rows, received)},
            expected="rows routed by the Spark stage job",
            actual="rows the executors wrote",
            hint="A Spark task's output was lost; nothing was published. Run the refresh again.",
        )


def remove_written_files(
    items: Mapping[int, WrittenItem], data_root: str | None, upload_url: str | None, s3_settings: Any
) -> None:
    """Delete files the executors wrote for a refused stage (best effort: vacuum removes the rest)."""
    paths = [f.path for item in items.values() for f in item.files]
    if not paths:
        return
    try:
        if data_root is not None:
            for path in paths:
                Path(data_root, path).unlink(missing_ok=True)
        elif upload_url is not None:
            location = parse_s3_location(upload_url, what="accelerator_dir", error=StorageError)
            S3Store.at(location, s3_settings).delete(paths)
    except Exception:  # unreferenced either way; vacuum removes what is left
        return


def storage_for(acceleration: AccelerationSpec, storage: PartitionStorage | None) -> PartitionStorage:

    return storage if storage is not None else get_storage(acceleration)
