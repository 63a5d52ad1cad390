"""The one partition writer (write, count back, check, upload when the store is remote) and the one commit
builder (the only caller of `Catalog.commit`)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_partitions.catalog import Catalog, PartitionEntry, PartitionSpecInfo
from airflow_partitions.exceptions import ConservationError, StorageError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.objectstore import LocalStore, store_from_url
from airflow_partitions.storage import get_storage
from airflow_partitions.storage.parquet import ParquetStorage
from airflow_partitions.table.partition_writer import PartitionWriter
from airflow_partitions.table.publish import CommitBuilder

SPEC = PartitionSpecInfo.from_fields([("region", "region", "string")])
KEY = PartitionKey(("a/b=%'🙂",))
KEY_PATH = KEY.path(["region"])


def hostile() -> pa.Table:
    return pa.table(
        {
            "id": pa.array([1, None, 3, 4], pa.int64()),
            "region": ["a/b=%'🙂"] * 4,
            "note": ["", None, "quote ' \" and /", "ünïcode"],
        }
    )


def test_local_writer_writes_in_place_and_counts_back(tmp_path: Path) -> None:
    writer = PartitionWriter.local(get_storage("parquet"), tmp_path, "items")
    assert not writer.uploads
    written = writer.write(KEY_PATH, hostile())
    assert written.rows == 4
    assert sum(f.rows for f in written.files) == 4
    for file in written.files:
        assert (tmp_path / file.path).is_file()
    assert writer.publish(written.files) == written.files
    assert writer.write(KEY_PATH, hostile().slice(0, 0)).files == [], "no rows: no file"


def test_a_short_file_is_refused_naming_the_partition_and_both_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ParquetStorage.count_rows

    def one_short(self: Any, root: Path, file: Any) -> int:
        return int(real(self, root, file)) - 1

    monkeypatch.setattr(ParquetStorage, "count_rows", one_short)
    writer = PartitionWriter.local(get_storage("parquet"), tmp_path, "items")
    with pytest.raises(ConservationError) as caught:
        writer.write(KEY_PATH, hostile(), expected_as="rows read")
    assert caught.value.partitions == {KEY_PATH: (4, 3)}
    assert f"{KEY_PATH}: 4 rows read, 3 rows in the written files" in str(caught.value)
    # The caller may compare itself (the Spark driver does): the counts are still taken from the files.
    assert writer.write(KEY_PATH, hostile(), check=False).rows == 3


def test_an_unsynced_write_counts_back_and_is_made_durable_by_sync_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_partitions.storage import base

    synced: list[str] = []
    monkeypatch.setattr(base, "fsync_file", lambda path: synced.append(str(path)))
    writer = PartitionWriter.local(get_storage("parquet", sort_by=("id",)), tmp_path / "items", "items")
    written = writer.write(KEY_PATH, hostile(), sync=False)
    assert written.rows == 4
    assert synced == [], "no fsync while writing"
    base.sync_written(tmp_path / "items", written.files)
    assert synced == [str(tmp_path / "items" / f.path) for f in written.files]
    back = writer.storage.read(tmp_path / "items", written.files)
    assert back.to_pylist() == hostile().sort_by([("id", "ascending")]).to_pylist()
    assert not list((tmp_path / "items").rglob(".tmp-*")), "no temporaries left"
    (tmp_path / "items" / written.files[0].path).unlink()
    monkeypatch.undo()
    with pytest.raises(StorageError, match=r"could not make partition file .* durable"):
        base.sync_written(tmp_path / "items", written.files)


def test_remote_writer_uploads_write_once_and_uploads_nothing_refused(
    tmp_path: Path, s3_server: dict[str, str], s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = store_from_url(f"s3://{s3_bucket}/acc/items", settings=s3_server, what="accelerator_dir")
    scratch = tmp_path / "scratch"
    writer = PartitionWriter(get_storage("parquet"), store, scratch, "items")
    assert writer.uploads
    written = writer.write(KEY_PATH, hostile())
    for file in written.files:
        data = store.get(file.path)
        assert data is not None
        assert hashlib.sha256(data).hexdigest() == file.checksum
    assert writer.publish(written.files) == written.files, "objects on S3 are final once uploaded"
    before = sorted(info.key for info in store.list(""))
    with pytest.raises(ValueError, match="sync=False is for files that stay local"):
        writer.write(KEY_PATH, hostile(), sync=False)
    assert sorted(info.key for info in store.list("")) == before, "nothing written unsynced or uploaded"

    real = ParquetStorage.count_rows
    monkeypatch.setattr(
        ParquetStorage, "count_rows", lambda self, root, file: int(real(self, root, file)) + 1
    )
    with pytest.raises(ConservationError):
        writer.write(KEY_PATH, hostile())
    assert sorted(info.key for info in store.list("")) == before, "a refused write uploads nothing"


def test_commit_builder_names_every_commit_and_refuses_inconsistent_entries(tmp_path: Path) -> None:
    catalog = Catalog(LocalStore(tmp_path), "items")
    writer = PartitionWriter.local(get_storage("parquet"), tmp_path / "items", "items")
    files = writer.write(KEY_PATH, hostile()).files
    entry = PartitionEntry.from_files(KEY, SPEC, files)
    builder = CommitBuilder(catalog, "compact", None, SPEC)
    builder.add(entry)
    builder.count({"partitions_checked": 1})
    version = builder.commit()
    snapshot = catalog.latest()
    assert snapshot is not None
    assert builder.commit_id.startswith("compact-")
    assert snapshot.commit_ids.get(builder.commit_id) == version, "an operation without an id gets one"
    info = next(v for v in catalog.versions() if v.version == version)
    assert info.conservation == {"partitions_checked": 1}

    wrong = PartitionEntry.from_files(KEY, SPEC, files)
    wrong = PartitionEntry.from_json({**wrong.to_json(), "rows": wrong.rows + 1})
    refused = CommitBuilder(catalog, "refresh", version, SPEC, "refresh-1")
    refused.add(wrong)
    with pytest.raises(ConservationError, match="rows the partition entry records"):
        refused.commit()
    assert catalog.head_version() == version, "nothing published"
