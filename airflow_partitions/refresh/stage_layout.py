"""Where a stage lives and what it holds: the stage layout every refresh step reads.

A stage is a directory (or, under an `s3://` accelerator_dir, a prefix) holding `_stage.json` (the
`StageManifest`), the staged rows per planned item under `data/__ap_item=<i>/`, and for a changes stage one
`changes.parquet`. The stage step writes it, finalize and commit read it, the sweeps remove it; this module
is the one place that layout is spelled out, below all of them, so the refresh steps import it in one
direction. Reading a stage's manifest and removing a stage go through the object store, which decides
where the bytes are (a local directory or S3).
"""

from __future__ import annotations

import base64
import collections
import json
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import ConservationError, RefreshError
from airflow_partitions.objectstore import store_from_url
from airflow_partitions.refresh.plan import DiscoveryKind, StageMode, StageResult

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.objectstore import SettingsLike
    from airflow_partitions.spec.model import DatasetSpec, ProjectSpec

STAGE_MANIFEST = "_stage.json"
STAGE_DATA = "data"
ITEM_COLUMN = "__ap_item"
MANIFEST_FORMAT = 1
CHANGES_FILE = "changes.parquet"


def staging_root(project: ProjectSpec, dataset: DatasetSpec) -> Path:
    """Where a dataset's stages live unless told otherwise: `<accelerator_dir>/_staging/<dataset>/`.

    Spark writes here and every finalize task reads here, so in a multi-worker deployment it must be on a
    filesystem all of them share (or set `acceleration.params.staging_dir`).
    """
    configured = dataset.acceleration.params.get("staging_dir")
    if configured and "://" in str(configured):
        # The stage step counts staged rows from the files and writes its manifest with local file calls.
        raise RefreshError(
            f"dataset {dataset.name!r}: staging_dir {configured!r} is a URL; give a directory path the "
            "stage task and its Spark job both see. With accelerator_dir on S3 leave it unset: the stage "
            "task uploads its stage to <accelerator_dir>/_staging/ for the partition tasks"
        )
    if configured:
        base = Path(str(configured)).expanduser()
        if not base.is_absolute() and project.path is not None:
            base = Path(project.path).parent / base
        return base / dataset.name
    return Path(project.accelerator_dir) / "_staging" / dataset.name


def encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str) -> pa.Schema:
    import pyarrow as pa

    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


# Stage manifests loaded by this process, newest last (see `StageManifest.load`).
_MANIFEST_CACHE: collections.OrderedDict[tuple[str, int, int, int], StageManifest] = collections.OrderedDict()
_MANIFEST_CACHE_SIZE = 4


@dataclass(frozen=True)
class StageManifest:
    """The stage's own record: mode, source, schema and, per planned key path, where its rows are.

    `source` is `Source.to_json()`: what the source is, its secrets masked. A stage may outlive a crashed
    run, so it holds no secret; finalize reopens the source from the spec it loads itself.
    """

    dataset: str
    spec_id: str
    mode: StageMode
    source: Mapping[str, Any]
    schema: pa.Schema
    # key path -> {"index": i, "rows": staged rows (spark mode)} or {"index": i, "hint": ...} (pushdown)
    # or {"index": i, "rows": routed, "written": counted back, "files": [DataFile JSON]} (written mode)
    items: Mapping[str, Mapping[str, Any]]
    created_at: str
    # How the planned keys were found: a dynamically discovered key has rows in the source, so finalize
    # refuses to write it empty. None in manifests of older versions.
    discovery: DiscoveryKind | None = None
    source_rows: int | None = None  # rows the Spark job read (spark mode)
    routed_rows: int | None = None  # rows it routed to planned partitions (= sum of the items' rows)
    full_scan: bool = False  # every discovered key was planned, so the job read the whole source
    # "observed": both counts are metrics of the one write job; "recounted": the job returned no metrics
    # and the source was counted by a second job (see `_run_spark_stage`). None in pushdown mode.
    counted_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "dataset": self.dataset,
            "spec_id": self.spec_id,
            "mode": str(self.mode),
            "source": dict(self.source),
            "schema": encode_schema(self.schema),
            "items": {k: dict(v) for k, v in self.items.items()},
            "created_at": self.created_at,
            "discovery": str(self.discovery) if self.discovery is not None else None,
            "source_rows": self.source_rows,
            "routed_rows": self.routed_rows,
            "full_scan": self.full_scan,
            "counted_by": self.counted_by,
        }

    @classmethod
    def load(cls, location: str | os.PathLike[str]) -> StageManifest:
        """The manifest of the stage at `location`. A batch of partition tasks in one process reads the
        same manifest once: loads are cached by (path, inode, size, mtime), which a rewrite changes."""
        path = Path(location) / STAGE_MANIFEST
        try:
            stat = path.stat()
            cache_key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
            cached = _MANIFEST_CACHE.get(cache_key)
            if cached is not None:
                _MANIFEST_CACHE.move_to_end(cache_key)
                return cached
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as err:
            raise RefreshError(
                f"no finished stage at {location}: {STAGE_MANIFEST} is missing. Either the stage step "
                "failed or was cleaned up after a commit (run it again), or this worker does not see the "
                "stage directory: accelerator_dir (or acceleration.params.staging_dir) must be a path "
                "shared by every Airflow worker and Spark executor"
            ) from err
        manifest = cls.from_json(data, where=str(path))
        _MANIFEST_CACHE[cache_key] = manifest
        while len(_MANIFEST_CACHE) > _MANIFEST_CACHE_SIZE:
            _MANIFEST_CACHE.popitem(last=False)
        return manifest

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, where: str = STAGE_MANIFEST) -> StageManifest:
        if data.get("format") != MANIFEST_FORMAT:
            raise RefreshError(f"stage manifest {where} has format {data.get('format')!r}, expected 1")
        return cls(
            dataset=data["dataset"],
            spec_id=data["spec_id"],
            mode=StageMode(data["mode"]),
            source=data["source"],
            schema=decode_schema(data["schema"]),
            items=data["items"],
            created_at=data["created_at"],
            discovery=DiscoveryKind(data["discovery"]) if data.get("discovery") else None,
            source_rows=data.get("source_rows"),
            routed_rows=data.get("routed_rows"),
            full_scan=bool(data.get("full_scan", False)),
            counted_by=data.get("counted_by"),
        )

    def write(self, location: Path) -> None:
        """Atomically, readable by its owner only (0600, like the stage directory's 0700)."""
        temporary = location / f".{STAGE_MANIFEST}.{uuid.uuid4().hex}"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(self.to_json(), separators=(",", ":")))
        os.replace(temporary, location / STAGE_MANIFEST)


def read_staged_changes(location: str | os.PathLike[str], schema: pa.Schema) -> pa.Table:
    import pyarrow.parquet as pq

    path = Path(location) / CHANGES_FILE
    if not path.exists():
        raise RefreshError(f"the stage at {location} holds no {CHANGES_FILE}; stage again")
    return pq.read_table(path)


def discovered_but_empty(dataset: str, key_paths: Sequence[str], *, actual: str) -> ConservationError:
    """The refusal of partitions that dynamic discovery found in the source but that hold no row."""
    nothing: tuple[int | None, int] = (None, 0)
    return ConservationError(
        dataset,
        dict.fromkeys(key_paths, nothing),
        expected="rows (discovery found the partition in the source)",
        actual=actual,
        hint="If the source lost these rows since discovery, run the refresh again: a new plan removes "
        "partitions that are gone.",
    )


def stage_location(stage: StageResult | str | os.PathLike[str] | None) -> str | None:
    """The directory a stage wrote (its manifest and staged rows); None for an empty stage or none."""
    if stage is None:
        return None
    if isinstance(stage, StageResult):
        return stage.location
    return os.fspath(stage)


def staged_item_directory(location: str | os.PathLike[str], index: int) -> Path:
    return Path(location) / STAGE_DATA / f"{ITEM_COLUMN}={index}"


def merge_conservation_errors(dataset: str, errors: Sequence[ConservationError]) -> ConservationError:
    """One error naming every partition the finalize step refused (the first one's wording if only one)."""
    if len(errors) == 1:
        return errors[0]
    partitions: dict[str, tuple[int | None, int]] = {}
    for error in errors:
        partitions.update(error.partitions)
    kinds = sorted({f"{e.expected} vs {e.actual}" for e in errors})
    return ConservationError(
        dataset,
        partitions,
        expected="expected rows",
        actual="rows found",
        hint=f"Compared: {'; '.join(kinds)}. " + errors[0].hint,
    )


@dataclass(frozen=True)
class StagingSweep:
    """What a sweep of one staging root removed (or, in a dry run, would remove) and what it kept."""

    root: str
    dry_run: bool
    removed: tuple[str, ...] = ()  # names of the stage / job-file directories
    kept_young: int = 0  # stages whose last activity is within the grace period
    bytes_freed: int = 0  # bytes of the files removed (in a dry run: that would be)
    # Bytes of every file under the root before and after the sweep (in a dry run: what would remain);
    # None unless measured (`measure=True`: vacuum; a stage step does not walk other runs' stages).
    bytes_before: int | None = None
    bytes_after: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "dry_run": self.dry_run,
            "removed": list(self.removed),
            "kept_young": self.kept_young,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "bytes_freed": self.bytes_freed,
        }


def read_stage_manifest(
    stage: StageResult | str | os.PathLike[str] | None, settings: SettingsLike | None = None
) -> bytes | None:
    """The bytes of a stage's `_stage.json`, wherever the stage lives; None without a stage or manifest."""
    location = stage_location(stage)
    if not location:
        return None
    return store_from_url(location, settings=settings, what="stage location").get(STAGE_MANIFEST)


def remove_stage(
    stage: StageResult | str | os.PathLike[str] | None, settings: SettingsLike | None = None
) -> None:
    """Delete a stage (only one that holds a stage manifest or staged data: never an arbitrary directory
    or prefix), wherever it lives."""
    location = stage_location(stage)
    if not location:
        return
    store = store_from_url(location, settings=settings, what="stage location")
    directory = store.local_path(STAGE_MANIFEST)
    if directory is not None:
        root = directory.parent
        if (root / STAGE_MANIFEST).exists() or (root / STAGE_DATA).exists():
            shutil.rmtree(root, ignore_errors=True)
        return
    keys = [info.key for info in store.list("")]
    if any(k == STAGE_MANIFEST or k.startswith(f"{STAGE_DATA}/") for k in keys):
        store.delete(keys)
