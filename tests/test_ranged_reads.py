"""Ranged first reads of large Parquet partition files on S3 (`read.ranged`).

The first filtered read of a large file that is not cached fetches the footer and only the row groups
whose statistics may hold a matching row; the rows returned must be exactly DuckDB's answer over the
source, on hostile data (NULLs in every column, offsets, NaN, unicode, `/ = %`, quotes, empty strings).
A second read of the same file fetches it whole into the cache.
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from fault_proxy import Fault
from matrix_support import multiset_difference
from test_pruning_support import Acceleration, build_acceleration, duckdb_filter_rows

from airflow_partitions.exceptions import StorageError
from airflow_partitions.objectstore import S3Settings
from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.read.ranged import row_groups_to_read
from airflow_partitions.storage.parquet import forget_footers

ROWS = 3_000
UTC = dt.UTC
TEXTS = ["é/=%", "", "a'b\"c", "zone 7", None, "日本", "x=1/y"]


def _table(rows: int = ROWS) -> pa.Table:
    ids = list(range(rows))
    base = dt.datetime(2024, 3, 1, tzinfo=UTC)
    return pa.table(
        {
            "id": pa.array([None if i % 97 == 5 else i for i in ids], pa.int64()),
            "zone": pa.array([None if i % 53 == 0 else i % 7 for i in ids], pa.int32()),
            "ts": pa.array(
                [None if i % 41 == 0 else base + dt.timedelta(minutes=37 * i) for i in ids],
                pa.timestamp("us", tz="UTC"),
            ),
            "local": pa.array(
                [None if i % 43 == 0 else dt.datetime(2024, 1, 1) + dt.timedelta(hours=i) for i in ids],
                pa.timestamp("ns"),
            ),
            "day": pa.array(
                [None if i % 47 == 0 else dt.date(2023, 1, 1) + dt.timedelta(days=i) for i in ids]
            ),
            "text": pa.array([TEXTS[i % len(TEXTS)] for i in ids]),
            "amount": pa.array(
                [None if i % 31 == 0 else float("nan") if i % 29 == 0 else i * 0.25 for i in ids],
                pa.float64(),
            ),
            "price": pa.array(
                [None if i % 37 == 0 else decimal.Decimal(i) / 4 for i in ids], pa.decimal128(12, 2)
            ),
            "flag": pa.array([None if i % 19 == 0 else i % 3 == 0 for i in ids], pa.bool_()),
        }
    )


FILTERS = [
    "id = 1234",
    "id BETWEEN 100 AND 180",
    "id IS NULL",
    "id > 2990 OR id < 3",
    "ts >= TIMESTAMPTZ '2024-03-10 00:00:00+00' AND ts < TIMESTAMPTZ '2024-03-11 00:00:00+00'",
    "ts IS NULL AND zone = 3",
    "local = TIMESTAMP '2024-01-05 05:00:00'",
    "day = DATE '2025-06-01'",
    "text = 'é/=%' AND id < 400",
    "text = '' AND id > 2500",
    "amount > 700 AND id < 2900",
    "amount != 1.5 AND id < 60",
    "price = 250.25",
    "flag AND id BETWEEN 1000 AND 1100",
    "NOT (id >= 50) AND zone IS NOT NULL",
    "zone IN (2, 5) AND id < 300",
]


@pytest.fixture(scope="module")
def acceleration(tmp_path_factory: pytest.TempPathFactory) -> Acceleration:
    return build_acceleration(
        tmp_path_factory.mktemp("ranged"),
        _table(),
        [("zone_bucket", "bucket(2, zone)")],
        engine="parquet",
        storage_options={"row_group_rows": 64, "sort_by": ["id"]},
    )


@pytest.fixture(scope="module")
def s3_root(acceleration: Acceleration, s3_server: dict[str, str]) -> str:
    import uuid

    import boto3

    client = boto3.client("s3", **s3_server)
    s3_bucket = f"ap-ranged-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=s3_bucket)
    dataset_root = acceleration.root / acceleration.dataset
    prefix = "ranged-reads"
    for path in dataset_root.rglob("*"):
        if path.is_file() and "_catalog" not in path.parts:
            key = f"{prefix}/{acceleration.dataset}/{path.relative_to(dataset_root).as_posix()}"
            client.upload_file(str(path), s3_bucket, key)
    return f"s3://{s3_bucket}/{prefix}/{acceleration.dataset}"


def _assert_same_rows(got: pa.Table, expected: pa.Table, where: str) -> None:
    """Same schema, same rows as a multiset (row digests: NULLs, NaN, instants and decimals exact)."""
    assert got.schema.equals(expected.schema), where
    missing, extra = multiset_difference(got, expected)
    assert (missing, extra) == ([], []), where
    assert got.num_rows == expected.num_rows


def _reader(acc: Acceleration, root: str, server: dict[str, str], cache: Path, **kwargs: Any) -> Any:
    """A reader of the files under `root` reached with the S3 settings `server` (ranged GETs by boto3)."""
    return PartitionedDatasetReader(
        acc.spec_path,
        acc.dataset,
        catalog=acc.catalog,
        data_root=root,
        s3_settings=server,
        cache_dir=cache,
        **kwargs,
    )


@pytest.mark.s3
@pytest.mark.parametrize("where", FILTERS)
def test_a_first_ranged_read_returns_exactly_the_source_rows(
    acceleration: Acceleration, s3_root: str, s3_server: dict[str, str], tmp_path: Path, where: str
) -> None:
    with _reader(acceleration, s3_root, s3_server, tmp_path / "cache", ranged_read_min_bytes=0) as reader:
        got = reader.read(where)
        ranged = list(reader._remote.ranged_reads)
        cache = reader._remote
    _assert_same_rows(got, acceleration.expected_rows(where), where)
    # The point of the exercise: files were read by ranges, nothing fetched whole into the cache.
    assert ranged, "a first filtered read of files over the threshold reads by ranges"
    assert not list((tmp_path / "cache").rglob("*.parquet"))
    assert cache.ranged_read_min_bytes == 0


@pytest.mark.s3
def test_a_selective_read_fetches_few_row_groups_and_a_repeat_read_caches_the_file(
    acceleration: Acceleration, s3_root: str, s3_server: dict[str, str], tmp_path: Path
) -> None:
    where = "id = 1234"
    with _reader(acceleration, s3_root, s3_server, tmp_path / "cache", ranged_read_min_bytes=0) as reader:
        first = reader.read(where)
        ranged = list(reader._remote.ranged_reads)
        second = reader.read(where)
        third = reader.read(where)
        assert len(reader._remote.ranged_reads) == len(ranged), "a file is read by ranges once"
    for got in (first, second, third):
        _assert_same_rows(got, acceleration.expected_rows(where), where)
    assert ranged
    assert max(r.row_groups for r in ranged) > 10
    assert sum(r.row_groups_read for r in ranged) <= len(ranged), "sorted ids: a row group per file at most"
    assert list((tmp_path / "cache").rglob("*.parquet")), "the second read fetched the file whole"
    assert not [r.path for r in ranged if Path(r.path).exists()], "per-call files are removed"


@pytest.mark.s3
def test_small_files_and_unfiltered_reads_are_fetched_whole(
    acceleration: Acceleration, s3_root: str, s3_server: dict[str, str], tmp_path: Path
) -> None:
    with _reader(acceleration, s3_root, s3_server, tmp_path / "small") as reader:  # default threshold
        got = reader.read("id = 1234")
        assert not reader._remote.ranged_reads
    _assert_same_rows(got, acceleration.expected_rows("id = 1234"), "id = 1234")
    with _reader(acceleration, s3_root, s3_server, tmp_path / "all", ranged_read_min_bytes=0) as reader:
        everything = reader.read()
        assert not reader._remote.ranged_reads, "a read without a filter needs every row group"
    _assert_same_rows(everything, acceleration.table, "no filter")


def test_row_group_statistics_keep_every_row_group_that_may_match(acceleration: Acceleration) -> None:
    """Against the rows themselves: a row group left out holds no row DuckDB says matches."""
    reader = PartitionedDatasetReader(
        acceleration.spec_path, acceleration.dataset, catalog=acceleration.catalog
    )
    with reader:
        for where in FILTERS:
            plan = reader.plan(where)
            for file in plan.inexact_files:
                path = acceleration.root / acceleration.dataset / file.path
                parquet = pq.ParquetFile(path)
                kept = set(row_groups_to_read(parquet.metadata, plan.index.schema, plan.prepared))
                for group in range(parquet.metadata.num_row_groups):
                    if group in kept:
                        continue
                    rows = parquet.read_row_group(group)
                    rows = rows.cast(acceleration.table.select(rows.column_names).schema)
                    assert not duckdb_filter_rows(rows, where), (where, file.path, group)


class CountingHandler(pafs.FileSystemHandler):
    """A pyarrow `FileSystemHandler` over another filesystem that counts what a reader asks of it: the
    bytes each opened file hands out, and the HEAD-like `get_file_info` calls. Read-only."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.bytes_read = 0
        self.reads: list[tuple[str, int, int]] = []  # (path, offset, bytes)
        self.infos = 0
        self.sizes: dict[str, int] = {}

    def _count(self, path: str, offset: int, nbytes: int) -> None:
        self.bytes_read += nbytes
        self.reads.append((path, offset, nbytes))

    def open_input_file(self, path: str) -> Any:
        inner = self.inner.open_input_file(path)
        self.sizes[path] = inner.size()
        return pa.PythonFile(_CountingFile(inner, path, self._count), mode="r")

    def open_input_stream(self, path: str) -> Any:
        return pa.PythonFile(_CountingFile(self.inner.open_input_stream(path), path, self._count), mode="r")

    def get_file_info(self, paths: list[str]) -> list[Any]:
        self.infos += len(paths)
        return [self.inner.get_file_info(p) for p in paths]

    def get_file_info_selector(self, selector: Any) -> list[Any]:
        return list(self.inner.get_file_info(selector))

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise OSError("the counting filesystem is read-only")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = _read_only
    move = copy_file = open_output_stream = open_append_stream = _read_only

    def get_type_name(self) -> str:
        return "counting"

    def normalize_path(self, path: str) -> str:
        return str(path)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other


class _CountingFile:
    def __init__(self, inner: Any, path: str, count: Any) -> None:
        self.inner, self.path, self.count = inner, path, count
        self.closed = False

    def read(self, nbytes: int = -1) -> bytes:
        offset = self.inner.tell()
        data = self.inner.read() if nbytes is None or nbytes < 0 else self.inner.read(nbytes)
        self.count(self.path, offset, len(data))
        return bytes(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self.inner.seek(offset, whence))

    def tell(self) -> int:
        return int(self.inner.tell())

    def size(self) -> int:
        return int(self.inner.size())

    def seekable(self) -> bool:
        return bool(self.inner.seekable())

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self.inner.close()


@pytest.fixture(scope="module")
def wide_acceleration(tmp_path_factory: pytest.TempPathFactory) -> Acceleration:
    """Partitions of many 64-row groups sorted by `id`: a point read of one partition needs one group."""
    return build_acceleration(
        tmp_path_factory.mktemp("ranged-bytes"),
        _table(),
        [("zone_bucket", "bucket(2, zone)")],
        engine="parquet",
        storage_options={"row_group_rows": 64, "sort_by": ["id"]},
    )


@pytest.mark.s3
@pytest.mark.parametrize(
    "where", ["id = 1234 AND zone = 2", "zone = 5 AND id BETWEEN 100 AND 180", "zone = 3 AND id > 2900"]
)
def test_a_first_point_read_through_a_given_filesystem_reads_only_the_row_groups_it_needs(
    wide_acceleration: Acceleration, s3_server: dict[str, str], tmp_path: Path, where: str
) -> None:
    """A caller's own pyarrow filesystem (bytes counted through a wrapper): the footer and the kept row
    groups, not the file."""
    import uuid

    import boto3

    acc = wide_acceleration
    client = boto3.client("s3", **s3_server)
    bucket = f"ap-bytes-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    dataset_root = acc.root / acc.dataset
    for path in dataset_root.rglob("*.parquet"):
        client.upload_file(str(path), bucket, f"{acc.dataset}/{path.relative_to(dataset_root).as_posix()}")
    counting = CountingHandler(S3Settings.from_mapping(s3_server).arrow_filesystem())
    forget_footers()  # a first read in a fresh process: no footer kept from the other cases
    with PartitionedDatasetReader(
        acc.spec_path,
        acc.dataset,
        catalog=acc.catalog,
        data_root=f"s3://{bucket}/{acc.dataset}",
        filesystem=pafs.PyFileSystem(counting),
        cache_dir=tmp_path / "cache",
        ranged_read_min_bytes=0,
    ) as reader:
        plan = reader.plan(where)
        got = reader.read(where)
        assert reader._remote is not None
        ranged = list(reader._remote.ranged_reads)
    _assert_same_rows(got, acc.expected_rows(where), where)
    assert got.num_rows, "the filter selects rows"
    assert len({f.path for f in plan.files}) == 1, "one partition's file"
    (file,) = plan.files
    metadata = pq.ParquetFile(dataset_root / file.path).metadata
    (read,) = ranged
    kept = row_groups_to_read(metadata, plan.index.schema, plan.prepared)
    assert read.row_groups_read == len(kept)
    assert 0 < len(kept) <= 2 < metadata.num_row_groups
    # The data file: its tail once (pyarrow reads the footer with at least 64 KiB of the file's end), then
    # only bytes inside the column chunks of the kept row groups.
    chunks = []  # (start, length) of each kept row group's column chunks, which lie back to back
    for group in kept:
        columns = [metadata.row_group(group).column(j) for j in range(metadata.num_columns)]
        starts = [c.dictionary_page_offset or c.data_page_offset for c in columns]
        ends = [start + c.total_compressed_size for start, c in zip(starts, columns, strict=True)]
        chunks.append((min(starts), max(ends) - min(starts)))
    # pyarrow coalesces reads of ranges less than 8 KiB apart (its pre-buffer hole limit) into one.
    chunks.sort()
    merged = [chunks[0]]
    for start, length in chunks[1:]:
        last_start, last_length = merged[-1]
        if start - (last_start + last_length) <= 8 * 1024:
            merged[-1] = (last_start, max(last_start + last_length, start + length) - last_start)
        else:
            merged.append((start, length))
    needed = sum(length for _, length in merged)
    chunks = merged
    tail_start = file.bytes - min(file.bytes, max(metadata.serialized_size + 8, 64 * 1024))
    data_reads = [(offset, size) for path, offset, size in counting.reads if path.endswith(file.path)]
    footer = (tail_start, file.bytes - tail_start)
    assert data_reads.count(footer) == 1, "the footer is fetched once (for the schema and the rows)"
    for offset, size in data_reads:
        if (offset, size) != footer:
            assert any(start <= offset and offset + size <= start + length for start, length in chunks), (
                offset,
                size,
                chunks,
            )
    assert sum(size for _, size in data_reads) <= (file.bytes - tail_start) + needed
    # Other files: one footer at most (the dataset's schema comes from the newest partition's file; when
    # that is the file read, its footer is fetched once for both).
    others = {path for path, _, _ in counting.reads if not path.endswith(file.path)}
    assert len(others) <= 1
    for other in others:
        reads = [(offset, size) for path, offset, size in counting.reads if path == other]
        assert len(reads) == 1, reads
        assert reads[0][0] + reads[0][1] == counting.sizes[other], reads


# --- ranged GETs of known size (the reader's own S3 settings) ------------------------------------------


@pytest.fixture(scope="module")
def large_acceleration(tmp_path_factory: pytest.TempPathFactory) -> Acceleration:
    """Two partitions of ~20k rows in 512-row groups sorted by `id`: files well over the 64 KiB a footer
    read asks for, so the bytes a point read fetches say whether it read the file or its row groups."""
    return build_acceleration(
        tmp_path_factory.mktemp("ranged-large"),
        _table(40_000),
        [("zone_bucket", "bucket(2, zone)")],
        engine="parquet",
        storage_options={"row_group_rows": 512, "sort_by": ["id"]},
    )


def _upload(acc: Acceleration, server: dict[str, str], damage: Any = None) -> str:
    """The acceleration's partition files in a fresh bucket (`damage(path, bytes)` may change a file's
    bytes on the way); its data root."""
    import uuid

    import boto3

    client = boto3.client("s3", **server)
    bucket = f"ap-ranges-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    dataset_root = acc.root / acc.dataset
    for path in dataset_root.rglob("*.parquet"):
        relative = path.relative_to(dataset_root).as_posix()
        body = path.read_bytes()
        if damage is not None:
            body = damage(relative, body)
        client.put_object(Bucket=bucket, Key=f"{acc.dataset}/{relative}", Body=body)
    return f"s3://{bucket}/{acc.dataset}"


def _ranges(requests: list[tuple[str, str, str | None]], path: str) -> list[tuple[int, int]]:
    """(offset, length) of each ranged GET of `path` (every request must be a ranged GET)."""
    found = []
    for method, url, byte_range in requests:
        if _object_path(url).endswith(path):
            assert method == "GET", (method, url)
            assert byte_range is not None, url
            assert byte_range.startswith("bytes="), (url, byte_range)
            start, end = (int(part) for part in byte_range.removeprefix("bytes=").split("-"))
            found.append((start, end - start + 1))
    return found


def _object_path(url: str) -> str:
    from urllib.parse import unquote

    return unquote(url.split("?")[0])


WHERE_ONE_PARTITION = "id = 20001 AND zone = 2"


def _first_point_read(
    acc: Acceleration, s3_server: dict[str, str], proxy: Any, tmp_path: Path
) -> tuple[Any, pa.Table, list[Any], Any]:
    """A first read of `WHERE_ONE_PARTITION` by ranges (no footer kept from the other cases, as in a fresh
    process), through the counting proxy: its plan, its rows, the requests the read sent (planning's not
    counted), and its one ranged read."""
    root = _upload(acc, s3_server)
    forget_footers()
    with _reader(acc, root, proxy.through(s3_server), tmp_path / "cache", ranged_read_min_bytes=0) as reader:
        plan = reader.plan(WHERE_ONE_PARTITION)
        proxy.log.clear()
        got = reader.read(WHERE_ONE_PARTITION)
        requests = list(proxy.log)
        (read,) = reader._remote.ranged_reads
    return plan, got, requests, read


@pytest.mark.s3
def test_a_first_point_read_sends_no_head_and_gets_only_the_footer_and_the_kept_row_groups(
    large_acceleration: Acceleration, s3_server: dict[str, str], s3_fault_proxy: Any, tmp_path: Path
) -> None:
    """Every request counted by a proxy in front of the endpoint, whichever client sent it."""
    acc = large_acceleration
    plan, got, requests, read = _first_point_read(acc, s3_server, s3_fault_proxy, tmp_path)
    _assert_same_rows(got, acc.expected_rows(WHERE_ONE_PARTITION), WHERE_ONE_PARTITION)
    assert got.num_rows == 1
    assert [m for m, _, _ in requests if m != "GET"] == [], "no HEAD, no LIST: the catalog knows the sizes"
    (file,) = plan.files
    metadata = pq.ParquetFile(acc.root / acc.dataset / file.path).metadata
    assert file.bytes > 4 * 64 * 1024, "a file much larger than a footer read"
    kept = row_groups_to_read(metadata, plan.index.schema, plan.prepared)
    assert read.row_groups_read == len(kept) == 1 < metadata.num_row_groups
    group = metadata.row_group(kept[0])
    columns = [group.column(j) for j in range(group.num_columns)]
    starts = [min(c.data_page_offset, c.dictionary_page_offset or c.data_page_offset) for c in columns]
    chunk = (min(starts), max(s + c.total_compressed_size for s, c in zip(starts, columns, strict=True)))
    tail = min(file.bytes, 64 * 1024)
    gets = _ranges(requests, file.path)
    # The footer (the file's last 64 KiB), then the kept row group's column chunks in one GET.
    assert gets == [(file.bytes - tail, tail), (chunk[0], chunk[1] - chunk[0])], gets
    # Other files: the dataset's schema is read from the newest partition's footer (one GET at most).
    others = [r for r in requests if not _object_path(r[1]).endswith(file.path)]
    assert len(others) <= 1, others
    dataset_root = acc.root / acc.dataset
    sizes = {
        p.relative_to(dataset_root).as_posix(): p.stat().st_size for p in dataset_root.rglob("*.parquet")
    }
    for _, url, _ in others:
        (other,) = [path for path in sizes if _object_path(url).endswith(path)]
        size = sizes[other]
        assert _ranges(others, other) == [(size - min(size, tail), min(size, tail))]


@pytest.mark.s3
def test_a_ranged_read_repeats_transient_faults_and_returns_exactly_the_rows(
    large_acceleration: Acceleration, s3_server: dict[str, str], s3_fault_proxy: Any, tmp_path: Path
) -> None:
    acc = large_acceleration
    root = _upload(acc, s3_server)
    forget_footers()
    where = "zone = 5 AND id BETWEEN 3000 AND 9000"
    with _reader(
        acc, root, s3_fault_proxy.through(s3_server), tmp_path / "cache", ranged_read_min_bytes=0
    ) as reader:
        # Bodies cut short (boto3 cannot repeat those, the repeat rule does), an error, a lost response:
        # the first GETs of the footers and the row groups fail in turn.
        faults = [Fault.TRUNCATE, Fault.TRUNCATE, Fault.ERROR_500, Fault.RESET_AFTER, Fault.TRUNCATE]
        for fault in faults:
            s3_fault_proxy.inject_next(fault, method="GET")
        got = reader.read(where)
        assert reader._remote.ranged_reads
    assert sum(s3_fault_proxy.injected.values()) == len(faults)
    _assert_same_rows(got, acc.expected_rows(where), where)
    assert got.num_rows > 500


def _truncated(relative: str, body: bytes) -> bytes:
    return body[: len(body) // 2]


def _extended(relative: str, body: bytes) -> bytes:
    """Bytes appended: the end no longer is where the catalog says."""
    return body + b"\0" * 1000


def _page_flipped(relative: str, body: bytes) -> bytes:
    """One byte flipped in the middle of the file (inside a data page; the size stays the same)."""
    middle = len(body) // 2
    return body[:middle] + bytes([body[middle] ^ 0xFF]) + body[middle + 1 :]


def _footer_magic_lost(relative: str, body: bytes) -> bytes:
    return body[:-4] + b"PAR0"


@pytest.mark.s3
@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_truncated, r"holds fewer bytes than the \d+ bytes recorded for it"),
        (_extended, r"holds \d+ bytes, \d+ bytes recorded for it"),
        (_footer_magic_lost, r"does not end like a Parquet file|magic bytes not found"),
        (_page_flipped, r"cannot read s3://.*(CRC|checksum)"),
    ],
    ids=["truncated", "extended", "footer", "page"],
)
def test_a_damaged_object_read_by_ranges_raises_a_storage_error(
    large_acceleration: Acceleration, s3_server: dict[str, str], tmp_path: Path, damage: Any, message: str
) -> None:
    acc = large_acceleration
    root = _upload(acc, s3_server, damage)
    forget_footers()
    # The middle of the file, where the flipped page is: which ids it holds depends on the encodings.
    where = "zone = 5 AND id BETWEEN 15000 AND 25000"
    with (
        _reader(acc, root, s3_server, tmp_path / "cache", ranged_read_min_bytes=0) as reader,
        pytest.raises(StorageError, match=message),
    ):
        reader.read(where)


def test_coalesce_merges_nearby_ranges_and_splits_large_ones() -> None:
    from airflow_partitions.objectstore.ranges import coalesce

    # Overlapping and < hole apart: one GET; farther apart: two; empty ranges dropped; unsorted input.
    assert coalesce([(100, 50), (55, 50), (155, 10), (500, 0)], hole=10, part=1000) == [(55, 110)]
    assert coalesce([(0, 10), (21, 5)], hole=10, part=1000) == [(0, 10), (21, 5)]
    assert coalesce([(0, 10), (20, 5)], hole=10, part=1000) == [(0, 25)]
    # A range over `part` bytes: pieces of at most `part`, back to back, covering exactly the range.
    assert coalesce([(5, 25)], hole=0, part=10) == [(5, 10), (15, 10), (25, 5)]


# --- recorded layouts: footer and row groups fetched in one round, the schema from the catalog ----------


@pytest.fixture(scope="module")
def laid_out(tmp_path_factory: pytest.TempPathFactory) -> Acceleration:
    """As `large_acceleration`, every file with its layout recorded (the threshold lowered to 0 bytes)."""
    import airflow_partitions.storage.parquet as parquet_engine

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parquet_engine, "LAYOUT_MIN_BYTES", 0)
        return build_acceleration(
            tmp_path_factory.mktemp("ranged-laid-out"),
            _table(40_000),
            [("zone_bucket", "bucket(2, zone)")],
            engine="parquet",
            storage_options={"row_group_rows": 512, "sort_by": ["id"]},
        )


def _files(acc: Acceleration) -> list[Any]:
    snapshot = acc.catalog.snapshot()
    return [file for entry in snapshot.partitions.values() for file in entry.files]


def test_a_written_file_records_where_its_footer_and_row_groups_lie_and_its_schema(
    laid_out: Acceleration, acceleration: Acceleration
) -> None:
    """Read back from the catalog, against the file's own bytes and footer."""
    import hashlib

    from airflow_partitions.storage.datafile import DataFile
    from airflow_partitions.storage.parquet import ParquetStorage, recorded_schema, row_group_range

    files = _files(laid_out)
    assert files
    for file in files:
        layout = file.layout
        assert layout is not None, file.path
        body = (laid_out.root / laid_out.dataset / file.path).read_bytes()
        footer_length = int.from_bytes(body[-8:-4], "little")
        assert layout.footer_bytes == footer_length + 8
        assert layout.footer_sha256 == hashlib.sha256(body[-footer_length - 8 :]).hexdigest()
        parquet = pq.ParquetFile(pa.BufferReader(body))
        metadata = parquet.metadata
        assert [g[:2] for g in layout.row_groups] == [
            row_group_range(metadata, i) for i in range(metadata.num_row_groups)
        ]
        assert [g[2] for g in layout.row_groups] == [
            metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)
        ]
        assert sum(g[2] for g in layout.row_groups) == file.rows
        # The sort column's bounds per row group: ids rise through the file (NULLs first or last).
        bounds = [s for s in layout.stats["id"] if s is not None and s.min is not None]
        assert len(bounds) >= metadata.num_row_groups - 1
        assert all(a.max <= b.min for a, b in itertools.pairwise(bounds))
        recorded = recorded_schema(layout)
        assert recorded is not None
        assert recorded.equals(ParquetStorage.original_schema(parquet.schema_arrow), check_metadata=True)
        assert recorded.equals(laid_out.table.schema)  # ns timestamps, decimals, tz: exact types
        assert DataFile.from_json(file.to_json()) == file
    # Files under the threshold (8 MiB by default) record none: the catalog stays small.
    assert all(file.layout is None for file in _files(acceleration))


@pytest.mark.s3
@pytest.mark.parametrize("where", FILTERS)
def test_a_first_ranged_read_of_laid_out_files_returns_exactly_the_source_rows(
    laid_out: Acceleration, s3_server: dict[str, str], tmp_path: Path, where: str
) -> None:
    root = _laid_out_root(laid_out, s3_server)
    forget_footers()
    with _reader(laid_out, root, s3_server, tmp_path / "cache", ranged_read_min_bytes=0) as reader:
        got = reader.read(where)
        ranged = list(reader._remote.ranged_reads)
    _assert_same_rows(got, laid_out.expected_rows(where), where)
    assert ranged


_LAID_OUT_ROOTS: dict[str, str] = {}


def _laid_out_root(acc: Acceleration, server: dict[str, str]) -> str:
    """The laid-out files uploaded once per module (the reads above only read them)."""
    if server["endpoint_url"] not in _LAID_OUT_ROOTS:
        _LAID_OUT_ROOTS[server["endpoint_url"]] = _upload(acc, server)
    return _LAID_OUT_ROOTS[server["endpoint_url"]]


@pytest.mark.s3
def test_a_first_point_read_of_a_laid_out_file_fetches_no_schema_and_gets_footer_and_row_group_at_once(
    laid_out: Acceleration, s3_server: dict[str, str], s3_fault_proxy: Any, tmp_path: Path
) -> None:
    acc = laid_out
    plan, got, requests, read = _first_point_read(acc, s3_server, s3_fault_proxy, tmp_path)
    _assert_same_rows(got, acc.expected_rows(WHERE_ONE_PARTITION), WHERE_ONE_PARTITION)
    assert got.num_rows == 1
    (file,) = plan.files
    layout = file.layout
    assert layout is not None
    assert read.row_groups_read == 1 < read.row_groups
    gets = _ranges(requests, file.path)
    # No request for any other file: the dataset's schema is the catalog's.
    assert len(requests) == len(gets) == 2, requests
    tail = min(file.bytes, 64 * 1024)
    (group,) = [g[:2] for g in layout.row_groups if g[:2] in gets]
    assert sorted(gets) == sorted([(file.bytes - tail, tail), group]), gets


def _replaced(acc: Acceleration) -> Any:
    """A damage that puts another valid Parquet file of the same size and row count in the object's place:
    the same rows with one `text` changed, written at another compression level, padded before its footer
    (Parquet offsets count from the start, so padding there moves nothing)."""

    def damage(relative: str, body: bytes) -> bytes:
        table = pq.read_table(pa.BufferReader(body))
        texts = table.column("text").to_pylist()
        texts[len(texts) // 2] = "not the written row"
        changed = table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts, pa.string()))
        # Written plain or with dictionaries (the written file may use either per column), at several
        # compression levels, until one is no larger than the original.
        for dictionary, level in itertools.product((False, True), (22, 19, 15, 9, 3)):
            sink = pa.BufferOutputStream()
            pq.write_table(
                changed,
                sink,
                compression="zstd",
                compression_level=level,
                use_dictionary=dictionary,
                row_group_size=512,
                write_page_checksum=True,
            )
            other = sink.getvalue().to_pybytes()
            if len(other) <= len(body):
                footer = int.from_bytes(other[-8:-4], "little") + 8
                padded = other[:-footer] + b"\0" * (len(body) - len(other)) + other[-footer:]
                assert pq.read_table(pa.BufferReader(padded)).num_rows == table.num_rows
                return padded
        raise AssertionError("no same-size replacement")

    return damage


@pytest.mark.s3
@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_truncated, r"holds (fewer bytes than the|\d+ bytes,) \d+ bytes recorded for it"),
        (_extended, r"holds \d+ bytes, \d+ bytes recorded for it"),
        (_footer_magic_lost, r"its footer differs from the one recorded when the file was written"),
        (_page_flipped, r"cannot read s3://.*(CRC|checksum)"),
        ("replaced", r"its footer differs from the one recorded when the file was written"),
    ],
    ids=["truncated", "extended", "footer", "page", "replaced"],
)
def test_a_damaged_or_replaced_laid_out_object_raises_a_storage_error(
    laid_out: Acceleration, s3_server: dict[str, str], tmp_path: Path, damage: Any, message: str
) -> None:
    """Never the rows of another file: the recorded footer digest catches a same-size replacement that
    the size, the row count and the page checksums all let through."""
    acc = laid_out
    root = _upload(acc, s3_server, _replaced(acc) if damage == "replaced" else damage)
    forget_footers()
    # The middle of the file, where the flipped page is: which ids it holds depends on the encodings.
    where = "zone = 5 AND id BETWEEN 15000 AND 25000"
    with (
        _reader(acc, root, s3_server, tmp_path / "cache", ranged_read_min_bytes=0) as reader,
        pytest.raises(StorageError, match=message),
    ):
        reader.read(where)


@pytest.mark.s3
def test_a_layout_that_does_not_fit_the_file_is_read_by_its_footer(
    laid_out: Acceleration, s3_server: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A recorded layout whose row groups lie past the footer is not used: the footer is fetched first,
    the debug log says so, and the rows are the same."""
    import dataclasses
    import logging

    from airflow_partitions.read.ranged import read_row_groups_by_ranges

    acc = laid_out
    root = _laid_out_root(acc, s3_server)
    where = "zone = 5 AND id BETWEEN 3000 AND 9000"
    with _reader(acc, root, s3_server, tmp_path / "cache", ranged_read_min_bytes=0) as reader:
        plan = reader.plan(where)
        results = []
        for broken in (False, True):
            forget_footers()
            for file in plan.files:
                assert file.layout is not None
                used = file
                if broken:
                    groups = ((file.bytes, 10, file.rows),)  # past the footer, and one group only
                    used = dataclasses.replace(
                        file, layout=dataclasses.replace(file.layout, row_groups=groups)
                    )
                obj = reader._remote.ranged_object(used)
                with caplog.at_level(logging.DEBUG, logger="airflow_partitions.read.ranged"):
                    _, rows = read_row_groups_by_ranges(obj, used, plan.prepared, plan.index.schema)
                results.append((broken, file.path, rows))
    assert any("does not fit" in r.getMessage() for r in caplog.records)
    fitting = {path: table for broken, path, table in results if not broken}
    assert sum(t.num_rows for t in fitting.values()) > 0
    for _, path, table in results:
        _assert_same_rows(table, fitting[path], path)


@pytest.mark.s3
def test_an_object_replaced_between_two_ranged_gets_is_refused(
    laid_out: Acceleration, s3_server: dict[str, str]
) -> None:
    import boto3

    from airflow_partitions.objectstore import S3Store
    from airflow_partitions.objectstore.ranges import ObjectReplacedError, RangedObject

    root = _upload(laid_out, s3_server)
    bucket, prefix = root.removeprefix("s3://").split("/", 1)
    client = boto3.client("s3", **s3_server)
    store = S3Store(client, bucket, prefix)
    file = _files(laid_out)[0]
    obj = RangedObject(store, file.path, file.bytes)
    obj.prefetch([(0, 100)])
    body = (laid_out.root / laid_out.dataset / file.path).read_bytes()
    client.put_object(Bucket=bucket, Key=f"{prefix}/{file.path}", Body=body[:100] + bytes(len(body) - 100))
    with pytest.raises(ObjectReplacedError, match="changed while it was read"):
        obj.prefetch([(file.bytes - 100, 100)])


def test_recorded_bounds_keep_what_the_footer_keeps(laid_out: Acceleration) -> None:
    """The row groups fetched ahead from the recorded bounds hold every row group the footer keeps, and
    the footer's choice is the same whether the sort column's bounds come from the layout or the footer."""
    from airflow_partitions.read.ranged import RecordedRowGroups, _may_match

    reader = PartitionedDatasetReader(laid_out.spec_path, laid_out.dataset, catalog=laid_out.catalog)
    with reader:
        for where in FILTERS:
            plan = reader.plan(where)
            for file in plan.files:
                assert file.layout is not None
                metadata = pq.ParquetFile(laid_out.root / laid_out.dataset / file.path).metadata
                kept = row_groups_to_read(metadata, plan.index.schema, plan.prepared)
                assert (
                    row_groups_to_read(metadata, plan.index.schema, plan.prepared, file.layout.stats) == kept
                )
                ahead = _may_match(RecordedRowGroups(file.layout, plan.index.schema), plan.prepared)
                assert set(kept) <= set(ahead), (where, file.path)
                if where == "id = 1234":
                    assert len(ahead) == 1, "a point read on the sort column: one row group ahead"


@pytest.mark.s3
def test_a_replaced_laid_out_object_read_through_a_given_filesystem_raises_a_storage_error(
    laid_out: Acceleration, s3_server: dict[str, str], tmp_path: Path
) -> None:
    """pyarrow's ranged reads (no footer bytes to digest): the row groups must lie where recorded."""
    acc = laid_out
    root = _upload(acc, s3_server, _replaced(acc))
    forget_footers()
    with (
        _reader(
            acc,
            root,
            s3_server,
            tmp_path / "cache",
            ranged_read_min_bytes=0,
            filesystem=S3Settings.from_mapping(s3_server).arrow_filesystem(),
        ) as reader,
        pytest.raises(StorageError, match="its row groups lie elsewhere than recorded"),
    ):
        reader.read("zone = 5 AND id BETWEEN 15000 AND 25000")


def _typed_table(rows: int = 1_500, *, duration: bool = False) -> pa.Table:
    """The hostile table with the types a ranged read hands DuckDB as Arrow (dictionary text, seconds and
    milliseconds timestamps with and without a zone, unsigned, large text, binary); with `duration`, a
    column DuckDB would bind otherwise from Arrow than from Parquet."""
    table = _table(rows)
    ids = range(rows)
    base = dt.datetime(2024, 3, 1, 12, 30, 15, 123000)
    extra: dict[str, pa.Array] = {
        "label": pa.array([TEXTS[(i * 3) % len(TEXTS)] for i in ids]).dictionary_encode(),
        "ms": pa.array(
            [None if i % 23 == 0 else base + dt.timedelta(milliseconds=1001 * i) for i in ids],
            pa.timestamp("ms"),
        ),
        "sec": pa.array(
            [None if i % 17 == 0 else (base + dt.timedelta(seconds=61 * i)).replace(tzinfo=UTC) for i in ids],
            pa.timestamp("s", tz="America/New_York"),
        ),
        "big": pa.array([None if i % 13 == 0 else 2**63 + i for i in ids], pa.uint64()),
        "long_text": pa.array([TEXTS[(i * 5) % len(TEXTS)] for i in ids], pa.large_string()),
        "raw": pa.array([None if i % 11 == 0 else f"b{i}\x00".encode() for i in ids], pa.binary()),
    }
    if duration:
        extra["took"] = pa.array([None if i % 7 == 0 else i * 1000 for i in ids], pa.duration("ms"))
    for name, column in extra.items():
        table = table.append_column(name, column)
    return table.replace_schema_metadata({b"origin": "hostile é".encode()})


TYPED_FILTERS = [
    "id BETWEEN 100 AND 180",
    "label = 'é/=%' AND id < 400",
    "ms >= TIMESTAMP '2024-03-01 12:40:00' AND ms < TIMESTAMP '2024-03-01 12:45:00.5'",
    "sec > TIMESTAMPTZ '2024-03-01 20:00:00+00' AND id < 700",
    "big > 9223372036854776000 AND id > 1400",
    "long_text = '' AND raw IS NULL",
    "id IS NULL OR (raw IS NULL AND zone IS NOT NULL)",
]


@pytest.mark.s3
@pytest.mark.parametrize("duration", [False, True], ids=["arrow", "duration-in-a-file"])
def test_a_first_ranged_read_hands_duckdb_the_rows_without_a_local_file(
    tmp_path_factory: pytest.TempPathFactory,
    s3_server: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    duration: bool,
) -> None:
    """The row groups a first read fetched by ranges reach DuckDB as an Arrow table: no local Parquet
    file is written (none exists during or after the read), and the rows and types are exactly the
    source's, and those of a read of the whole files (schema metadata too). A type DuckDB binds
    otherwise from Arrow (a duration) goes through a per-call local file instead, with the same rows,
    removed when the call ends."""
    import tempfile

    from airflow_partitions.read import remote

    source = _typed_table(duration=duration)
    acc = build_acceleration(
        tmp_path_factory.mktemp("ranged-typed"),
        source,
        [("zone_bucket", "bucket(2, zone)")],
        engine="parquet",
        storage_options={"row_group_rows": 64, "sort_by": ["id"]},
    )
    root = _upload(acc, s3_server)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    written: list[str] = []

    def spy(table: pa.Table, into: Path) -> str:
        path = real(table, into)
        written.append(path)
        assert Path(path).exists()
        return path

    real = remote.write_local
    monkeypatch.setattr(remote, "write_local", spy)
    mixes = 0
    for where in TYPED_FILTERS:
        forget_footers()
        cache = tmp_path / f"cache-{len(written)}-{hash(where)}"
        with _reader(acc, root, s3_server, cache, ranged_read_min_bytes=0) as reader:
            got = reader.read(where)
            ranged = list(reader._remote.ranged_reads)
        assert ranged, where
        expected = acc.expected_rows(where)
        _assert_same_rows(got, expected, where)
        assert not list(cache.rglob("*.parquet")), where
        assert not list(scratch.rglob("ranged-*.parquet")), "per-call files are removed"
        with _reader(acc, root, s3_server, tmp_path / "whole", ranged_read_min_bytes=None) as reader:
            whole = reader.read(where)
            assert not reader._remote.ranged_reads
        assert got.schema.equals(whole.schema, check_metadata=True), where
        _assert_same_rows(got, whole, where)
        # The smallest file fetched whole, the others by ranges: files and tables in one relation.
        forget_footers()
        smallest = min(file.bytes for file in _files(acc))
        mixed_cache = tmp_path / f"mixed-{hash(where)}"
        with _reader(acc, root, s3_server, mixed_cache, ranged_read_min_bytes=smallest + 1) as reader:
            mixed = reader.read(where)
            mixes += bool(reader._remote.ranged_reads and list(mixed_cache.rglob("*.parquet")))
        _assert_same_rows(mixed, expected, where)
    assert mixes, "some reads combined a cached file with row groups read by ranges"
    if duration:
        assert written, "a duration column is read back from a local file"
    else:
        assert not written, "the rows of the kept row groups go to DuckDB as Arrow, no file written"
