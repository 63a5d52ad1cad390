"""The finalize step: one partition's staged (or pushed-down) rows become its engine file, stats, checksum.

Each call owns one partition, so one Airflow task per partition can run, retry and report it. The file is
written under a new unique name and nothing points at it until the commit: a failed or repeated finalize
leaves at most an unreferenced file that vacuum removes.

Rows are counted on the way: the rows read must be the rows the stage routed to the partition (its
manifest count; a missing staged directory is not an empty partition), and the rows written, counted back
from the files the engine wrote (not taken from the writer), must be the rows read. A mismatch, or no row
at all for a partition discovery found in the source, is a `ConservationError`.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.catalog.model import PartitionEntry, RowCertificate
from airflow_partitions.exceptions import ConservationError, RefreshError, StorageError
from airflow_partitions.objectstore import LocalStore
from airflow_partitions.refresh import remote
from airflow_partitions.refresh.leftovers import mark_stage_in_use
from airflow_partitions.refresh.modes import rows_since
from airflow_partitions.refresh.plan import (
    DiscoveryKind,
    PartitionResult,
    PartitionWorkItem,
    StageMode,
    StageResult,
)
from airflow_partitions.refresh.stage_layout import (
    STAGE_MANIFEST as STAGE_MANIFEST_NAME,
)
from airflow_partitions.refresh.stage_layout import (
    StageManifest,
    discovered_but_empty,
    read_staged_changes,
    stage_location,
    staged_item_directory,
)
from airflow_partitions.sources import open_dataset_source
from airflow_partitions.sources.files import filter_to_key
from airflow_partitions.sources.pg_cdc import deleted_mask
from airflow_partitions.spec.masking import masked_params
from airflow_partitions.storage import DataFile
from airflow_partitions.storage.remote import fetch_partition_files
from airflow_partitions.table import DatasetHandle
from airflow_partitions.table.partition_writer import PartitionWriter
from airflow_partitions.write.merge import remove_keys
from airflow_partitions.write.routing import route_rows
from airflow_partitions.write.row_hash import certify_rows
from airflow_partitions.write.rows import conform_columns

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.objectstore import ObjectStore
    from airflow_partitions.sources import RowsSince, Source
    from airflow_partitions.spec.model import DatasetSpec
    from airflow_partitions.storage import DataFile, PartitionStorage
    from airflow_partitions.transforms import Transform


def conform_to_schema(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with exactly `schema`'s columns, order and types (Spark may widen or relabel types; other
    columns are left out): `write.rows.conform_columns`, with the errors of staged rows."""
    wanted = set(schema.names)
    result = conform_columns(
        table.select([i for i, n in enumerate(table.column_names) if n in wanted]), schema
    )
    if result.table is not None:
        return result.table
    if result.repeated:
        raise RefreshError(f"staged rows name column(s) {list(result.repeated)} more than once; stage again")
    if result.missing:
        raise RefreshError(
            f"staged rows lack source column(s) {list(result.missing)}; the stage is inconsistent, stage "
            "again"
        )
    name, given, err = result.uncastable[0]
    raise RefreshError(
        f"staged column {name!r} ({given}) cannot be read back as {schema.field(name).type}: {err}"
    ) from err


def read_staged_rows(location: str, index: int, schema: pa.Schema) -> pa.Table:
    """The rows Spark routed to item `index` (an absent directory reads as none: the caller compares the
    count with the stage manifest's, which tells an empty partition from a lost directory)."""
    import pyarrow as pa
    import pyarrow.dataset as pads

    directory = staged_item_directory(location, index)
    if not directory.exists():
        return schema.empty_table()
    try:
        table = pads.dataset(str(directory), format="parquet").to_table()
    except (OSError, pa.ArrowInvalid) as err:
        raise RefreshError(f"cannot read the staged rows in {directory}: {err}") from err
    return conform_to_schema(table, schema)


def verify_partition(
    table: pa.Table, transforms: Sequence[Transform], key: tuple[Any, ...], key_path: str
) -> None:
    """Refuse rows whose partition values are not `key`: a routing bug must not reach the catalog."""
    if table.num_rows == 0:
        return
    matching = filter_to_key(table, transforms, key).num_rows
    if matching != table.num_rows:
        raise RefreshError(
            f"partition {key_path}: {table.num_rows - matching} of {table.num_rows} staged rows belong to "
            "another partition (Spark and Arrow evaluated a partition expression differently); not committed"
        )


def written_entry(
    item: PartitionWorkItem,
    spec_id: str,
    files: Sequence[DataFile],
    certificate: RowCertificate | None = None,
) -> PartitionEntry:
    """The catalog entry of a planned partition refreshed into `files` (rows and bytes from the files),
    with the certificate of the rows written (`row_hash.certify_rows`)."""
    return PartitionEntry(
        key=item.partition_key,
        key_path=item.key_path,
        spec_id=spec_id,
        files=tuple(files),
        rows=sum(f.rows for f in files),
        bytes=sum(f.bytes for f in files),
        source_fingerprint=item.fingerprint,
        refreshed_at=dt.datetime.now(dt.UTC),
        certificate=certificate,
    )


def finalize_partition(
    handle: DatasetHandle,
    stage: StageResult | str | os.PathLike[str],
    item: PartitionWorkItem,
    *,
    storage: PartitionStorage | None = None,
    data_root: str | os.PathLike[str] | None = None,
    verify: bool = True,
) -> PartitionResult:
    """Write one planned partition's engine file(s) from the stage (a `StageResult`, or the directory it
    staged to); returns the partition's future catalog entry.

    `verify` re-evaluates the partition expressions over the rows (vectorised Arrow) and fails on a row that
    belongs elsewhere. Nothing becomes visible to readers until `commit_refresh`.

    When the dataset's files live on S3 (and no `data_root` is given), the file is written in private local
    scratch, counted, uploaded write-once and checked (`refresh.remote`); a stage on S3 is fetched item by
    item. S3 is reached with the handle's settings.
    """
    location = stage_location(stage)
    if not location:
        raise RefreshError("the stage staged nothing (empty plan): there is no partition to finalize")
    written = stage.mode is StageMode.WRITTEN if isinstance(stage, StageResult) else None
    if written or (written is None and _written_stage(handle, location)):
        return finalize_written(handle, location, item)
    stage_here = handle.stage_is_local(location)
    upload = not handle.local_data and data_root is None
    if stage_here and not upload:
        return _finalize(handle, location, item, storage, data_root, verify, None)
    scratch = handle.scratch("finalize")
    try:
        if not stage_here:
            index = _remote_item_index(handle, location, item)
            location = str(remote.fetch_stage(location, index, scratch / "stage", handle.settings))
        if upload:
            remote.check_remote_engine(handle.dataset)
            return _finalize(handle, location, item, storage, scratch / "data", verify, True)
        return _finalize(handle, location, item, storage, data_root, verify, None)
    finally:
        remote.remove_local(scratch)


def _written_stage(handle: DatasetHandle, location: str) -> bool:
    """Whether the stage at `location` (a directory, no `StageResult`) is a WRITTEN one: its manifest
    says so (a small read, no data)."""
    import json

    try:
        if not handle.stage_is_local(location):
            raw = remote.read_stage_manifest(location, handle.settings)
            return raw is not None and json.loads(raw).get("mode") == str(StageMode.WRITTEN)
        return StageManifest.load(location).mode is StageMode.WRITTEN
    except RefreshError:
        return False  # `_finalize` raises the missing-stage error


def finalize_written(handle: DatasetHandle, location: str, item: PartitionWorkItem) -> PartitionResult:
    """A partition of a WRITTEN stage: its catalog entry, from the stage manifest alone.

    The executors wrote the files, counted them back and the stage job checked the counts; this reads no
    partition data. It re-checks the manifest's own numbers and, for a local data root, that every file
    is there with its recorded size (a stat: a file vacuumed or deleted since the stage is refused here,
    not at read time). On S3 the executor read each object back after its upload.
    """
    import json

    dataset = handle.dataset
    started = time.monotonic()
    if not handle.stage_is_local(location):
        raw = remote.read_stage_manifest(location, handle.settings)
        if raw is None:
            raise RefreshError(
                f"no finished stage at {location}: {STAGE_MANIFEST_NAME} is missing. The stage step failed "
                "or was cleaned up after a commit; run the refresh again"
            )
        manifest = StageManifest.from_json(json.loads(raw), where=location)
    else:
        manifest = StageManifest.load(location)
        mark_stage_in_use(location)
    spec_id = dataset.acceleration.partition_spec_id
    if manifest.dataset != dataset.name or manifest.spec_id != spec_id:
        raise RefreshError(
            f"stage {location} was made for {manifest.dataset!r} spec {manifest.spec_id}, not "
            f"{dataset.name!r} spec {spec_id}; stage again"
        )
    if manifest.mode is not StageMode.WRITTEN:
        raise RefreshError(f"stage {location} is a {manifest.mode} stage, not a written one")
    staged = manifest.items.get(item.key_path)
    if staged is None:
        raise RefreshError(f"partition {item.key_path} was not planned in stage {location}; plan again")
    if staged.get("error"):
        if item.changes and handle.local_data:
            # A retry after the cause was fixed: merge the staged changes into the partition here.
            return _finalize(handle, location, item, None, None, True, None)
        if not handle.local_data:
            raise RefreshError(
                f"partition {item.key_path}: the Spark executor could not write its files: "
                f"{staged['error']}. Fix the cause and run the refresh again (a new stage writes it again)"
            )
        # A retry of this task after the cause was fixed: read the partition's rows from the source here.
        return rewrite_failed_item(handle, location, manifest, item, staged, started)
    files = tuple(DataFile.from_json(f) for f in staged.get("files", []))
    routed = int(staged["rows"])
    written = int(staged["written"])
    declared = sum(f.rows for f in files)
    if written != routed or declared != routed:
        raise ConservationError(
            dataset.name,
            {item.key_path: (routed, written if written != routed else declared)},
            expected="rows routed by the stage",
            actual="rows in the files the executors wrote"
            if written != routed
            else "rows the stage manifest lists",
            hint=f"The stage manifest at {location} is inconsistent (edited or truncated); run the "
            "refresh again.",
        )
    # An appended partition may gain nothing, changes may empty one; one written whole was seen with
    # rows by discovery.
    if routed == 0 and manifest.discovery is DiscoveryKind.DYNAMIC and not (item.append or item.changes):
        raise discovered_but_empty(dataset.name, [item.key_path], actual="rows written")
    if handle.local_data:
        root = handle.local_root
        for file in files:
            try:
                size = os.stat(root / file.path).st_size
            except FileNotFoundError:
                size = -1
            if size != file.bytes:
                raise RefreshError(
                    f"partition {item.key_path}: file {file.path} under {root} is "
                    f"{'missing' if size < 0 else f'{size} bytes, not {file.bytes}'} since the stage wrote "
                    "it (deleted by a vacuum with a short grace, or changed); run the refresh again"
                )
    # The executors certified the rows they wrote (this step reads no partition data).
    entry = written_entry(item, spec_id, files, RowCertificate.from_json(staged.get("certificate")))
    changed = staged.get("changed")
    return PartitionResult(
        entry,
        elapsed_s=time.monotonic() - started,
        routed=routed,
        appended=item.append,
        changed_rows=int(changed) if changed is not None else None,
    )


def rewrite_failed_item(
    handle: DatasetHandle,
    location: str,
    manifest: StageManifest,
    item: PartitionWorkItem,
    staged: Mapping[str, Any],
    started: float,
) -> PartitionResult:
    """A partition of a WRITTEN stage whose executor write failed (e.g. its directory was blocked): the
    task reads the partition's rows from the source itself (the whole source, routed by the dataset's
    transforms; for an appended partition only its rows past the watermark), re-checks them, writes and
    counts them back. The source must still hold exactly the rows the stage routed to it, else
    `ConservationError` (the source changed since the stage: run again)."""

    dataset = handle.dataset
    source = staged_source(dataset, manifest, location)
    bound = dataset.bind(manifest.schema)
    transforms = [f.transform for f in bound.acceleration.partition_by]
    routed_rows = route_rows(
        conform_to_schema(source.read_all(), manifest.schema), transforms, dataset=dataset.name
    )
    table = routed_rows.get(item.partition_key, manifest.schema.empty_table())
    since = rows_since(dataset, item)
    if since is not None:
        table = since.filter_table(table)
    routed = int(staged["rows"])
    if table.num_rows != routed:
        raise ConservationError(
            dataset.name,
            {item.key_path: (routed, table.num_rows)},
            expected="rows the stage routed to the partition",
            actual="rows the source holds for it now",
            hint=f"The executor could not write this partition ({staged['error']}) and the source changed "
            "since the stage; run the refresh again.",
        )
    verify_partition(table, transforms, item.partition_key.values, item.key_path)
    writer = PartitionWriter.local(handle.storage, handle.local_root, dataset.name)
    try:
        files = writer.write(
            item.key_path, table, expected=routed, expected_as="rows read", advice=REWRITE_ADVICE
        ).files
    except (StorageError, OSError) as err:
        raise RefreshError(
            f"partition {item.key_path}: the Spark executor could not write its files ({staged['error']}), "
            f"and neither could this retry: {err}. Fix the cause and clear this task again"
        ) from err
    entry = written_entry(item, dataset.acceleration.partition_spec_id, files, certify_rows(table))
    return PartitionResult(entry, elapsed_s=time.monotonic() - started, routed=routed, appended=item.append)


def _remote_item_index(handle: DatasetHandle, location: str, item: PartitionWorkItem) -> int | None:
    """The staged item index of `item` in the stage manifest on S3 (None: not a Spark-staged item)."""
    import json

    raw = remote.read_stage_manifest(location, handle.settings)
    if raw is None:
        return None  # `fetch_stage` raises the missing-stage error
    staged = json.loads(raw).get("items", {}).get(item.key_path) or {}
    return int(staged["index"]) if "rows" in staged else None


def _finalize(
    handle: DatasetHandle,
    location: str,
    item: PartitionWorkItem,
    storage: PartitionStorage | None,
    data_root: str | os.PathLike[str] | None,
    verify: bool,
    upload: bool | None,
) -> PartitionResult:
    dataset = handle.dataset
    started = time.monotonic()
    manifest = StageManifest.load(location)
    mark_stage_in_use(location)  # a sweep by another run or vacuum leaves a stage being read alone
    spec_id = dataset.acceleration.partition_spec_id
    if manifest.dataset != dataset.name or manifest.spec_id != spec_id:
        raise RefreshError(
            f"stage {location} was made for {manifest.dataset!r} spec {manifest.spec_id}, not "
            f"{dataset.name!r} spec {spec_id}; stage again"
        )
    staged = manifest.items.get(item.key_path)
    if staged is None:
        raise RefreshError(f"partition {item.key_path} was not planned in stage {location}; plan again")
    bound = dataset.bind(manifest.schema)
    transforms = [f.transform for f in bound.acceleration.partition_by]
    key = item.partition_key.values
    since = rows_since(dataset, item)
    changed_here: int | None = None
    engine = storage or handle.storage
    root = Path(data_root) if data_root is not None else handle.local_root
    # With `upload`, `root` is private scratch and the files go to the dataset's store on S3.
    store: ObjectStore = handle.data_store if upload else LocalStore(root)
    writer = PartitionWriter(engine, store, root, dataset.name)
    if manifest.mode is StageMode.CHANGES or item.changes:  # (a written stage's failed item: merged here)
        changed = read_staged_changes(location, manifest.schema)
        if writer.uploads and item.base_files:  # the committed files live on S3: fetch them once
            fetch_partition_files(store, root, item.base_files)
        primary_key = dataset.acceleration.primary_key
        table, changed_here = merge_changes(
            dataset.name, primary_key, engine, root, changed, item, transforms, key, manifest.schema
        )
        routed = table.num_rows
    elif manifest.mode is StageMode.PUSHDOWN:
        source = staged_source(dataset, manifest, location)
        if since is None:
            rows = source.read_partition(transforms, key, staged.get("hint"))
        else:
            rows = source.read_partition_since(transforms, key, staged.get("hint"), since)
        table = conform_to_schema(rows, manifest.schema)
        routed = table.num_rows
    else:
        table = read_staged_rows(location, int(staged["index"]), manifest.schema)
        routed = int(staged["rows"]) if staged.get("rows") is not None else table.num_rows
        if table.num_rows != routed:
            raise ConservationError(
                dataset.name,
                {item.key_path: (routed, table.num_rows)},
                expected="rows routed by the stage",
                actual="rows read from the staged directory",
                hint=f"The staged rows under {location} changed after the stage (deleted or rewritten); "
                "run the refresh again.",
            )
        if verify:
            verify_partition(table, transforms, key, item.key_path)
    if since is not None and verify:
        verify_past_watermark(table, since, item.key_path)
    # An appended partition may gain nothing; one written whole was seen with rows by discovery.
    # (Changes may empty a partition: every row of it moved or ... it had none.)
    if routed == 0 and manifest.discovery is DiscoveryKind.DYNAMIC and since is None and not item.changes:
        raise discovered_but_empty(dataset.name, [item.key_path], actual="rows read")
    files = writer.write(
        item.key_path, table, expected=routed, expected_as="rows read", advice=REWRITE_ADVICE
    ).files
    entry = written_entry(item, spec_id, files, certify_rows(table))
    return PartitionResult(
        entry,
        elapsed_s=time.monotonic() - started,
        routed=routed,
        appended=item.append,
        changed_rows=changed_here,
    )


def merge_changes(
    dataset: str,
    primary_key: Sequence[str],
    engine: PartitionStorage,
    root: Path,
    changed: pa.Table,
    item: PartitionWorkItem,
    transforms: Sequence[Transform],
    key: tuple[Any, ...],
    schema: pa.Schema,
) -> tuple[pa.Table, int]:
    """refresh_mode changes: the partition's committed rows minus every changed key (a changed row
    leaves the partition it was in, whether it stays or moves), plus the `changed` rows routed here
    (`write.merge.remove_keys`, the rule upserts follow; the partition is rewritten whole).

    Returns the rows to write and how many of them are changed rows.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = list(primary_key)
    # Change data capture stages keys to delete too (marked; their other columns are NULL): they leave
    # the partition like every changed key, and are routed nowhere.
    deleting = deleted_mask(changed)
    changed = conform_to_schema(changed, schema)

    def read(files: Sequence[DataFile], columns: Sequence[str] | None) -> pa.Table:
        del columns  # the whole partition is read (and rewritten)
        return conform_to_schema(engine.read(root, list(files), schema=schema), schema)

    removal = remove_keys(item.base_files, read, keys, changed.select(keys), keep_untouched=False)
    kept = removal.survivors if removal.survivors is not None else schema.empty_table()
    committed = sum(f.rows for f in item.base_files)
    if kept.num_rows + removal.removed != committed:
        raise ConservationError(
            dataset,
            {item.key_path: (committed, kept.num_rows + removal.removed)},
            expected="rows the catalog records for the partition",
            actual="rows read from its files",
            hint="The partition's committed files changed on disk; run a full refresh.",
        )
    upserted = changed if deleting is None else changed.filter(pc.invert(deleting))
    here = filter_to_key(upserted, transforms, key)
    # Every changed key left the partition (it may have moved); the rows routed here join it.
    table = (
        pa.concat_tables([kept, here])
        if kept.num_rows and here.num_rows
        else (kept if here.num_rows == 0 else here)
    )
    if committed - removal.removed + here.num_rows != table.num_rows:
        raise ConservationError(
            dataset,
            {item.key_path: (committed - removal.removed + here.num_rows, table.num_rows)},
            expected="committed rows - changed or deleted keys + changed rows routed here",
            actual="rows after the merge",
            hint="The merge of the changes lost or duplicated rows; nothing was published. Run the refresh "
            "again.",
        )
    return table, here.num_rows


def verify_past_watermark(table: pa.Table, since: RowsSince, key_path: str) -> None:
    """Refuse appended rows at or below the partition's watermark: they are committed already, and adding
    them again would duplicate them."""
    kept = since.filter_table(table).num_rows
    if kept != table.num_rows:
        raise RefreshError(
            f"partition {key_path}: {table.num_rows - kept} of {table.num_rows} rows to append are not past "
            f"the watermark ({since.column} > {since.after!r}); they would duplicate committed rows. Not "
            "committed"
        )


def staged_source(dataset: DatasetSpec, manifest: StageManifest, location: str) -> Source:
    """The dataset's source as the spec gives it (secrets included: the stage holds none), refused if it
    is not the source the stage planned its reads on."""

    source = open_dataset_source(dataset, schema=manifest.schema)
    # Both sides masked: a manifest of an earlier version still holds its source's secrets.
    if masked_params(manifest.source) != masked_params(source.to_json()):
        raise RefreshError(
            f"stage {location} was made from {manifest.source.get('kind')} source "
            f"{manifest.source.get('location')!r}, but the spec now reads {source.describe()}; the spec "
            "changed since the stage: stage again"
        )
    pg_cdc = sys.modules.get("airflow_partitions.sources.pg_cdc")
    if pg_cdc is not None:  # a first change-capture copy reads every partition at its slot's snapshot
        pg_cdc.adopt_snapshot(source)
    return source


REWRITE_ADVICE = "Check the storage engine and the disk, then run the refresh again."
