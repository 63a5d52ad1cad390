"""Open the catalog of a dataset declared in a spec: where it lives, with the dataset's storage engine.

Layout: partition files under `<accelerator_dir>/<dataset>/<name>=<value>/...`, the catalog next to them in
`<accelerator_dir>/<dataset>/_catalog/`. The catalog can live on S3 instead (shared by several hosts) when
a location is configured, first found wins: the `location` argument, `acceleration.params.catalog_location`
of the dataset, the `AIRFLOW_PARTITIONS_CATALOG_URL` environment variable. An S3 location
`s3://bucket/prefix` holds `<prefix>/<dataset>/_catalog/...`; partition files stay local, and downloaded
checkpoints are cached in `<accelerator_dir>/<dataset>/_catalog_cache/`. It is reached with the S3
settings the caller passes (the Airflow layer resolves them from its AWS connection), else with the
standard AWS environment variables.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.storage import get_storage

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.spec.model import DatasetSpec

from airflow_partitions.catalog.catalog import Catalog
from airflow_partitions.catalog.model import PartitionSpecInfo
from airflow_partitions.exceptions import CatalogError, RefreshError
from airflow_partitions.keys import escape_component
from airflow_partitions.objectstore import (
    LocalStore,
    ObjectStore,
    SettingsLike,
    is_local_location,
    store_from_url,
)

CATALOG_URL_ENV = "AIRFLOW_PARTITIONS_CATALOG_URL"
CATALOG_LOCATION_PARAM = "catalog_location"
CACHE_DIRECTORY = "_catalog_cache"


def dataset_directory(project_spec: Any, dataset_spec: Any) -> Path:
    """`<accelerator_dir>/<dataset>`: the dataset's partition files (and, locally, its catalog)."""
    return Path(project_spec.accelerator_dir) / escape_component(dataset_spec.name)


def catalog_location(dataset_spec: Any, location: str | None = None) -> str | None:
    """The configured remote catalog location of a dataset, or `None` for the local default."""
    if location:
        return location
    params = getattr(dataset_spec.acceleration, "params", None) or {}
    configured = params.get(CATALOG_LOCATION_PARAM)
    if configured is not None and not isinstance(configured, str):
        raise CatalogError(
            f"dataset {dataset_spec.name!r}: acceleration.params.{CATALOG_LOCATION_PARAM} must be a string "
            f"such as s3://bucket/prefix, got {configured!r}"
        )
    return configured or os.environ.get(CATALOG_URL_ENV) or None


def dataset_location(project_spec: Any, dataset_spec: Any) -> str:
    """Where the dataset's partition files live: `<accelerator_dir>/<dataset>`, an `s3://` URL when the
    accelerator_dir is on S3 (the spec says which: `ProjectSpec.accelerator_location`)."""
    return f"{project_spec.accelerator_location.rstrip('/')}/{escape_component(dataset_spec.name)}"


def needs_s3_settings(project_spec: Any, dataset_spec: Any) -> bool:
    """Whether the dataset's catalog or partition files live on S3 (`catalog_location` or an `s3://`
    accelerator_dir): the one test callers holding an AWS connection use to decide to resolve it."""
    places = (catalog_location(dataset_spec), project_spec.accelerator_location)
    return any(place and not is_local_location(place) for place in places)


def open_catalog(
    project_spec: Any,
    dataset_spec: Any,
    *,
    store: ObjectStore | None = None,
    location: str | None = None,
    s3_settings: SettingsLike | None = None,
) -> Catalog:
    """The catalog of `dataset_spec` in `project_spec` (a `ProjectSpec` / `DatasetSpec` pair).

    `store` overrides where the catalog lives; otherwise see the module docstring. `s3_settings` (an
    `S3Settings` or its dict form) reach a catalog on S3; unset, the AWS environment is used. The
    catalog knows the dataset's storage engine and data directory, so `vacuum` also removes
    unreferenced partition files.
    """
    cache_root = dataset_directory(project_spec, dataset_spec)
    files = store_from_url(
        dataset_location(project_spec, dataset_spec), settings=s3_settings, what="accelerator_dir"
    )
    # Files on S3 (`accelerator_dir: s3://...`): the local accelerator_dir is this worker's scratch, which
    # holds only the catalog cache; the catalog defaults to `<accelerator_dir>/<dataset>/_catalog`.
    files_here = isinstance(files, LocalStore)
    if store is None:
        store = store_from_url(
            catalog_location(dataset_spec, location) or project_spec.accelerator_location,
            settings=s3_settings,
            what="catalog location",
        )
    cache_dir = None if isinstance(store, LocalStore) else cache_root / CACHE_DIRECTORY
    return Catalog(
        store,
        dataset_spec.name,
        data_root=cache_root if files_here else None,
        storage=get_storage(dataset_spec.acceleration),
        cache_dir=cache_dir,
        data_store=None if files_here else files,
        check_files=True,
    )


def value_kind_of(arrow_type: pa.DataType) -> str:
    """The `keys.value_kind` name of partition values of `arrow_type` (to decode key paths)."""
    import pyarrow as pa

    if pa.types.is_boolean(arrow_type):
        return "bool"
    if pa.types.is_integer(arrow_type):
        return "int"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "string"
    if pa.types.is_timestamp(arrow_type):
        return "timestamp"
    if pa.types.is_date(arrow_type):
        return "date"
    if pa.types.is_decimal(arrow_type):
        return "decimal"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return "binary"
    return "string"


def partition_spec_info(dataset: DatasetSpec) -> PartitionSpecInfo:
    """The catalog's record of the dataset's partition spec (field names, canonical transforms, kinds)."""
    fields = []
    for field in dataset.acceleration.partition_by:
        kind = value_kind_of(field.transform.result_type) if field.transform.is_bound else None
        fields.append((field.name, field.canonical, kind))
    info = PartitionSpecInfo.from_fields(fields)
    if info.spec_id != dataset.acceleration.partition_spec_id:
        raise RefreshError(
            f"partition spec id mismatch for {dataset.name!r}: catalog computes {info.spec_id}, spec says "
            f"{dataset.acceleration.partition_spec_id}"
        )
    return info
