"""`DatasetHandle`: everything needed to read or write one dataset's acceleration, resolved once.

Where the bytes live is decided here and nowhere above: the partition files of a local project are under
`<accelerator_dir>/<dataset>/`, those of a project whose `accelerator_dir` is `s3://bucket/prefix` under
`s3://bucket/prefix/<dataset>/`. Either way they are reached through `data_store` (an `ObjectStore`) and
`filesystem` (a pyarrow filesystem built from the same resolved S3 settings, so boto3 and pyarrow reach
one endpoint), and the catalog is opened with those same settings. `local_root` is the dataset's local
directory: its data for a local project, this worker's private scratch for a remote one.

Heavy libraries (pyarrow, boto3, duckdb) load only when the part that needs them is first used, so the
Airflow layer can build a handle while parsing DAGs.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.catalog.open import dataset_directory, open_catalog
from airflow_partitions.keys import escape_component
from airflow_partitions.objectstore import (
    ObjectStore,
    S3Settings,
    SettingsLike,
    as_settings,
    is_s3_url,
    store_from_url,
)
from airflow_partitions.storage import get_storage

if TYPE_CHECKING:
    from airflow_partitions.catalog import Catalog
    from airflow_partitions.spec.model import DatasetSpec, ProjectSpec
    from airflow_partitions.storage import PartitionStorage

SCRATCH = "_scratch"
STAGING = "_staging"


@dataclass(frozen=True, eq=False)
class DatasetHandle:
    """One dataset of one project with the S3 settings that reach its bytes (None: the AWS environment).

    Parts are built on first use and kept: one catalog object, one storage engine, one store, one
    filesystem per handle. A handle is cheap to build; build one per task or call, not per partition.
    """

    project: ProjectSpec
    dataset: DatasetSpec
    settings: S3Settings | None = None

    @property
    def name(self) -> str:
        return self.dataset.name

    @cached_property
    def storage(self) -> PartitionStorage:
        """The dataset's storage engine (parquet, duckdb files or tables, arrow)."""
        return get_storage(self.dataset.acceleration)

    @cached_property
    def catalog(self) -> Catalog:
        """The dataset's catalog, on the local disk or S3, reached with this handle's settings."""
        return open_catalog(self.project, self.dataset, s3_settings=self.settings)

    @property
    def local_root(self) -> Path:
        """`<accelerator_dir>/<dataset>`: the partition files of a local project; this worker's private
        directory (catalog cache, scratch) when the files live on S3."""
        return dataset_directory(self.project, self.dataset)

    @property
    def local_data(self) -> bool:
        """Whether the partition files are in `local_root` (else on object storage, reached through
        `data_store`, with `local_root` as this worker's scratch)."""
        return self.project.accelerator_url is None

    @property
    def data_location(self) -> str:
        """Where the partition files live: `s3://bucket/prefix/<dataset>` or the local directory."""
        url = self.project.accelerator_url
        if url:
            return f"{url.rstrip('/')}/{escape_component(self.dataset.name)}"
        return str(self.local_root)

    @property
    def asset_uri(self) -> str:
        """The URI naming the dataset's files as an Airflow asset: `data_location` on S3, else the local
        directory's absolute `file://` URI."""
        if not self.local_data:
            return self.data_location
        return (Path(self.project.accelerator_dir).resolve() / escape_component(self.name)).as_uri()

    @cached_property
    def data_store(self) -> ObjectStore:
        """The partition files, keyed by `DataFile.path` (`<key path>/part-...`)."""
        return store_from_url(self.data_location, settings=self.settings, what="accelerator_dir")

    @cached_property
    def filesystem(self) -> Any:
        """A pyarrow filesystem over `data_store`'s root, built from the same settings (loads pyarrow)."""
        return self.data_store.arrow_filesystem()

    def stage_location(self, name: str) -> str:
        """Where stage `name` lives in the accelerator_dir: `<accelerator_dir>/_staging/<dataset>/<name>`
        (an `s3://` URL when the accelerator_dir is on S3); `name=""` gives the dataset's staging prefix."""
        url = self.project.accelerator_url or str(self.project.accelerator_dir)
        return f"{url.rstrip('/')}/{STAGING}/{escape_component(self.dataset.name)}/{name}"

    def stage_needs_upload(self, location: str) -> bool:
        """Whether a stage at `location` must be uploaded to `stage_location` for partition tasks on
        other workers to read it: the files live on object storage and the stage on this worker's disk."""
        return not self.local_data and not is_s3_url(location)

    def stage_is_local(self, location: str) -> bool:
        """Whether the stage at `location` is a directory on this worker (else it is on object storage and
        read through `stage_store_at`)."""
        return not is_s3_url(location)

    def stage_store_at(self, location: str) -> ObjectStore:
        """The store of the stage at `location` (a local directory or an `s3://` URL), reached with this
        handle's settings."""
        return store_from_url(location, settings=self.settings, what="stage location")

    def stage_store(self, name: str) -> ObjectStore:
        """The store of one stage: `<accelerator_dir>/_staging/<dataset>/<name>/` on the disk or S3."""
        return store_from_url(self.stage_location(name), settings=self.settings, what="accelerator_dir")

    def scratch(self, what: str) -> Path:
        """A fresh private local directory for `what` (removed by the caller when done)."""
        base = Path(self.project.accelerator_dir) / SCRATCH
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        return Path(tempfile.mkdtemp(prefix=f"{what}-", dir=base))


def open_handle(
    project: ProjectSpec, dataset: DatasetSpec | str, *, s3_settings: SettingsLike | None = None
) -> DatasetHandle:
    """The handle of `dataset` (a spec or a name) in `project`; `s3_settings` as an `S3Settings` or its
    dict form (an Airflow AWS connection's), resolved once against the AWS environment."""
    spec = project.dataset(dataset) if isinstance(dataset, str) else dataset
    settings = None if s3_settings is None else as_settings(s3_settings).resolved()
    return DatasetHandle(project, spec, settings)
