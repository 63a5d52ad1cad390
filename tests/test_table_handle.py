"""`DatasetHandle` resolves a dataset's bytes once: the same keys through its store and its pyarrow
filesystem, on the local disk and on S3 (moto over HTTP), with the endpoint from the settings alone."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_partitions.objectstore import LocalStore, S3Store
from airflow_partitions.spec import load_spec
from airflow_partitions.table import DatasetHandle, open_handle

ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def write_spec(tmp_path: Path, accelerator_dir: str) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    pq.write_table(pa.table({"region": ["eu", None], "n": [1, 2]}), source / "part.parquet")
    path = tmp_path / "datasets.yaml"
    path.write_text(
        f"accelerator_dir: {accelerator_dir}\n"
        + ("local_scratch_dir: scratch\n" if accelerator_dir.startswith("s3://") else "")
        + "datasets:\n"
        "  - name: items\n"
        f"    from: file:{source}/\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        "      engine: parquet\n"
        "      partition_by:\n"
        "        - region\n",
        encoding="utf-8",
    )
    return path


def roundtrip(handle: DatasetHandle) -> None:
    """A key written through the store reads back through the filesystem, and the other way round."""
    handle.data_store.put("region=eu/a.bin", b"stored")
    with handle.filesystem.open_input_stream("region=eu/a.bin") as stream:
        assert stream.read() == b"stored"
    with handle.filesystem.open_output_stream("region=eu/b.bin") as stream:
        stream.write(b"through arrow")
    assert handle.data_store.get("region=eu/b.bin") == b"through arrow"
    listed = [info.key for info in handle.data_store.list("region=eu/")]
    assert listed == ["region=eu/a.bin", "region=eu/b.bin"]


def test_local_handle_keys_match_the_dataset_directory(tmp_path: Path) -> None:
    project = load_spec(write_spec(tmp_path, str(tmp_path / "acc")))
    handle = open_handle(project, "items")
    assert isinstance(handle.data_store, LocalStore)
    assert handle.data_location == str(handle.local_root)
    assert handle.local_root.parent == Path(project.accelerator_dir)
    roundtrip(handle)
    assert (handle.local_root / "region=eu" / "a.bin").read_bytes() == b"stored"
    assert handle.catalog is handle.catalog  # one catalog object per handle
    assert handle.storage.engine == "parquet"
    scratch = handle.scratch("finalize")
    assert scratch.is_dir()
    assert scratch.parent.name == "_scratch"
    assert scratch != handle.scratch("finalize")


def test_s3_handle_reaches_one_endpoint_for_store_filesystem_and_catalog(
    tmp_path: Path, s3_server: dict[str, str], s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    project = load_spec(write_spec(tmp_path, f"s3://{s3_bucket}/accel"))
    handle = open_handle(project, project.dataset("items"), s3_settings=dict(s3_server))
    assert isinstance(handle.data_store, S3Store)
    assert handle.data_location.startswith(f"s3://{s3_bucket}/accel/")
    roundtrip(handle)
    import boto3

    keys = {o["Key"] for o in boto3.client("s3", **s3_server).list_objects_v2(Bucket=s3_bucket)["Contents"]}
    prefix = handle.data_location.removeprefix(f"s3://{s3_bucket}/")
    assert {f"{prefix}/region=eu/a.bin", f"{prefix}/region=eu/b.bin"} <= keys
    assert handle.catalog.store.describe().startswith(f"s3://{s3_bucket}/accel")
    stage = handle.stage_store("stamp-1")
    stage.put("_stage.json", b"{}")
    assert f"accel/_staging/{'items'}/stamp-1/_stage.json" in {
        o["Key"] for o in boto3.client("s3", **s3_server).list_objects_v2(Bucket=s3_bucket)["Contents"]
    }


def test_settings_are_resolved_once_from_the_environment(
    tmp_path: Path, s3_server: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server["endpoint_url"])
    project = load_spec(write_spec(tmp_path, "s3://some-bucket/accel"))
    handle = open_handle(project, "items", s3_settings={"region_name": "eu-west-1"})
    assert handle.settings is not None
    assert handle.settings.endpoint_url == s3_server["endpoint_url"]
    assert handle.settings.region_name == "eu-west-1"
