"""The checksum-keyed local cache of partition files read from object storage (`read.cache`).

Repeat reads of a version on an `s3://` data root fetch nothing again; a cached copy changed on disk is
fetched anew; the size bound evicts least recently used files but never one a call holds; concurrent
calls fetch a file once; bytes that do not match the recorded checksum are never served.
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_pruning_support import Acceleration, build_acceleration, sort_rows

from airflow_partitions.exceptions import SnapshotIntegrityError, StorageError
from airflow_partitions.objectstore import S3Settings
from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.read.cache import CHECKSUM_DIRECTORY, CachedFile, FileCache

ROWS = 4_000


def _cached(data: bytes, counter: list[int] | None = None, *, name: str = "s3://b/f.parquet") -> CachedFile:
    def fetch() -> bytes:
        if counter is not None:
            counter.append(1)
        return data

    return CachedFile(hashlib.sha256(data).hexdigest(), len(data), ".parquet", name, fetch)


# --- the cache on its own ---------------------------------------------------------------------------


def test_a_file_is_fetched_once_and_reused(tmp_path: Path) -> None:
    cache = FileCache(tmp_path / "cache", max_bytes=1 << 20)
    fetched: list[int] = []
    file = _cached(b"\x00PAR1 hostile \xff bytes", fetched)
    first, release = cache.acquire([file])
    release()
    second, release = cache.acquire([file])
    release()
    assert first == second
    assert Path(first[0]).read_bytes() == b"\x00PAR1 hostile \xff bytes"
    assert len(fetched) == 1


def test_bytes_that_do_not_match_the_checksum_are_never_served(tmp_path: Path) -> None:
    cache = FileCache(tmp_path / "cache", max_bytes=1 << 20)
    good = _cached(b"published bytes")
    swapped = CachedFile(
        good.checksum, good.size, ".parquet", "s3://b/swapped.parquet", lambda: b"other bytes!!!!"
    )
    with pytest.raises(SnapshotIntegrityError, match=r"s3://b/swapped\.parquet"):
        cache.acquire([swapped])
    assert not any((tmp_path / "cache").iterdir()), "nothing of the refused bytes stays in the cache"


def test_a_cached_copy_changed_on_disk_is_fetched_again(tmp_path: Path) -> None:
    cache = FileCache(tmp_path / "cache", max_bytes=1 << 20)
    fetched: list[int] = []
    file = _cached(b"the published partition file", fetched)
    (path,), release = cache.acquire([file])
    release()
    Path(path).write_bytes(b"the published partition fil\x00")  # same size, other bytes, new mtime
    (again,), release = cache.acquire([file])
    release()
    assert Path(again).read_bytes() == b"the published partition file"
    assert len(fetched) == 2


def test_the_bound_evicts_least_recently_used_but_never_a_pinned_file(tmp_path: Path) -> None:
    cache = FileCache(tmp_path / "cache", max_bytes=250)
    a, b, c = (_cached(bytes([n]) * 100) for n in (1, 2, 3))
    (path_a,), release_a = cache.acquire([a])  # held by a call in progress
    (path_b,), release_b = cache.acquire([b])
    release_b()
    (path_c,), release_c = cache.acquire([c])  # 300 bytes: the unpinned, least recent one (b) goes
    assert Path(path_a).exists()
    assert Path(path_c).exists()
    assert not Path(path_b).exists()
    release_c()
    (path_b,), release_b = cache.acquire([b])  # a still pinned: c, the least recent unpinned, goes
    assert Path(path_a).exists()
    assert Path(path_b).exists()
    assert not Path(path_c).exists()
    release_b()
    release_a()
    assert cache.used_bytes <= 250


def test_a_pinned_file_may_exceed_the_bound_until_released(tmp_path: Path) -> None:
    cache = FileCache(tmp_path / "cache", max_bytes=10)
    (path,), release = cache.acquire([_cached(b"x" * 100)])
    assert Path(path).read_bytes() == b"x" * 100
    release()
    assert not Path(path).exists()
    assert cache.used_bytes == 0


def test_concurrent_calls_fetch_a_file_once(tmp_path: Path) -> None:
    cache = FileCache(tmp_path / "cache", max_bytes=1 << 20)
    fetched: list[int] = []
    data = b"shared by many threads" * 1000

    def slow_fetch() -> bytes:
        fetched.append(1)
        time.sleep(0.05)  # keep the others waiting on the first fetch
        return data

    file = CachedFile(hashlib.sha256(data).hexdigest(), len(data), ".parquet", "s3://b/f", slow_fetch)
    barrier = threading.Barrier(8)
    results: list[str] = []

    def call() -> None:
        barrier.wait()
        paths, release = cache.acquire([file])
        results.extend(paths)
        release()

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(fetched) == 1
    assert len(set(results)) == 1
    assert len(results) == 8


def test_a_later_process_verifies_what_an_earlier_one_left(tmp_path: Path) -> None:
    fetched: list[int] = []
    file = _cached(b"left by an earlier process", fetched)
    (path,), release = FileCache(tmp_path / "cache", max_bytes=1 << 20).acquire([file])
    release()
    Path(path).write_bytes(b"tampered by someone elsewh")  # same size
    (again,), release = FileCache(tmp_path / "cache", max_bytes=1 << 20).acquire([file])
    release()
    assert Path(again).read_bytes() == b"left by an earlier process"
    assert len(fetched) == 2


# --- reads on S3 ------------------------------------------------------------------------------------


def _table() -> pa.Table:
    ids = list(range(ROWS))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array([["EU", "US", "ÄPAC 'x'", ""][i % 4] for i in ids]),
            "user_id": pa.array([i % 97 for i in ids], pa.int64()),
            "amount": pa.array([None if i % 11 == 0 else i * 0.5 for i in ids], pa.float64()),
        }
    )


@pytest.fixture(scope="module")
def parquet_acceleration(tmp_path_factory: pytest.TempPathFactory) -> Acceleration:
    return build_acceleration(
        tmp_path_factory.mktemp("cache-parquet"),
        _table(),
        [("region", "region"), ("user_bucket", "bucket(4, user_id)")],
        engine="parquet",
        max_rows_per_file=150,
    )


@pytest.mark.s3
def test_repeat_reads_on_s3_fetch_nothing_again(
    parquet_acceleration: Acceleration,
    s3_server: dict[str, str],
    s3_bucket: str,
    s3_fault_proxy: Any,
    tmp_path: Path,
) -> None:
    import boto3

    acc = parquet_acceleration
    client = boto3.client("s3", **s3_server)
    dataset_root = acc.root / acc.dataset
    for path in dataset_root.rglob("*"):
        if path.is_file() and "_catalog" not in path.parts:
            key = f"accel/{acc.dataset}/{path.relative_to(dataset_root).as_posix()}"
            client.upload_file(str(path), s3_bucket, key)
    filesystem = S3Settings.from_mapping(s3_fault_proxy.through(s3_server)).arrow_filesystem()
    reader = PartitionedDatasetReader(
        acc.spec_path,
        acc.dataset,
        catalog=acc.catalog,
        data_root=f"s3://{s3_bucket}/accel/{acc.dataset}",
        filesystem=filesystem,
        cache_dir=tmp_path / "cache",
    )
    where = "region = 'EU' AND user_id BETWEEN 10 AND 60"
    expected = sort_rows(acc.expected_rows(where, ["id", "amount"]))
    with reader:
        first = reader.read(where, columns=["id", "amount"])
        after_first = s3_fault_proxy.requests
        assert after_first > 0
        second = reader.read(where, columns=["id", "amount"])
        counted = reader.query(
            "SELECT count(*) AS n FROM events WHERE region = 'EU' AND user_id BETWEEN 10 AND 60"
        )
        assert s3_fault_proxy.requests == after_first, "repeat reads of a version fetch nothing again"
        # A cached copy changed on disk is fetched again, and the read still returns the version's rows.
        cached = [p for p in (tmp_path / "cache" / CHECKSUM_DIRECTORY).iterdir() if p.suffix == ".parquet"]
        assert cached
        for path in cached:
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))
        third = reader.read(where, columns=["id", "amount"])
        assert s3_fault_proxy.requests > after_first
    assert sort_rows(first).equals(expected)
    assert sort_rows(second).equals(expected)
    assert sort_rows(third).equals(expected)
    assert counted.column("n")[0].as_py() == expected.num_rows


def test_cache_max_bytes_must_be_positive(parquet_acceleration: Acceleration) -> None:
    import pyarrow.fs as pafs

    acc = parquet_acceleration
    with pytest.raises(StorageError, match="cache_max_bytes"):
        PartitionedDatasetReader(
            acc.spec_path,
            acc.dataset,
            catalog=acc.catalog,
            data_root=str(acc.root / acc.dataset),
            filesystem=pafs.LocalFileSystem(),
            cache_max_bytes=0,
        )


@pytest.mark.s3
@pytest.mark.parametrize("ranged", [False, True], ids=["whole-files", "ranged"])
def test_a_read_of_an_s3_acceleration_survives_transient_faults(
    parquet_acceleration: Acceleration,
    s3_server: dict[str, str],
    s3_bucket: str,
    s3_fault_proxy: Any,
    tmp_path: Path,
    ranged: bool,
) -> None:
    """Every GET of a read meets a fault first (503, reset, body cut short): the read sends it again, as
    the object store does its own requests, and returns the version's rows."""
    import boto3
    from fault_proxy import Fault

    acc = parquet_acceleration
    client = boto3.client("s3", **s3_server)
    prefix = f"faulty-read-{'ranged' if ranged else 'whole'}"
    dataset_root = acc.root / acc.dataset
    for path in dataset_root.rglob("*"):
        if path.is_file() and "_catalog" not in path.parts:
            key = f"{prefix}/{acc.dataset}/{path.relative_to(dataset_root).as_posix()}"
            client.upload_file(str(path), s3_bucket, key)
    filesystem = S3Settings.from_mapping(s3_fault_proxy.through(s3_server)).arrow_filesystem()
    reader = PartitionedDatasetReader(
        acc.spec_path,
        acc.dataset,
        catalog=acc.catalog,
        data_root=f"s3://{s3_bucket}/{prefix}/{acc.dataset}",
        filesystem=filesystem,
        cache_dir=tmp_path / "cache",
        ranged_read_min_bytes=1 if ranged else None,
    )
    where = "region = 'EU' AND user_id BETWEEN 10 AND 60"
    expected = sort_rows(acc.expected_rows(where, ["id", "amount"]))
    before = sum(s3_fault_proxy.injected.values())
    for fault in (Fault.ERROR_503, Fault.RESET_BEFORE, Fault.TRUNCATE, Fault.ERROR_500):
        s3_fault_proxy.inject_next(fault, method="GET", path_contains=prefix, times=3)
    try:
        with reader:
            got = reader.read(where, columns=["id", "amount"])
    finally:
        s3_fault_proxy.clear()
    assert sum(s3_fault_proxy.injected.values()) - before == 12, "every forced fault was met"
    assert sort_rows(got).equals(expected)
