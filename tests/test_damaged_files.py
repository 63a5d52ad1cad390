"""Damaged partition files: one flipped byte never reads back wrong rows, never crashes, is never laundered.

Each engine's committed partition file (the shared `_tables.duckdb` in duckdb `tables` mode) gets one byte
flipped at a time, at offsets spread over the whole file (header, data, footer). After each flip a fresh
reader does a full read and a filtered read: each must give exactly the source's rows or a `StorageError`
naming the file. The reads run in a child process (this module run as a script), so a crash is an outcome
the test reports rather than the end of the test run; a child that dies is started again after the offset
it died on.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

if __name__ != "__main__":
    from matrix_support import hostile_chunks, row_digests
    from test_pruning_support import build_acceleration, duckdb_filter_rows

ENGINES = {
    "parquet": ("parquet", "files"),
    "duckdb_files": ("duckdb", "files"),
    "duckdb_tables": ("duckdb", "tables"),
    "arrow": ("arrow", "files"),
}
PARTITION_BY = [("b", "bucket(4, n_int)")]
# Ids start at 10**12: a filter keeping about half the rows of every partition, the damaged one included.
FILTER = "id < 1000000000150 AND s IS NOT NULL"
OFFSETS = 24
# Seconds one child may take for all its offsets before the test gives up on it.
CHILD_TIMEOUT_S = 600


def hostile_table() -> pa.Table:
    return pa.concat_tables(hostile_chunks(seed=27, rows=300, chunks=2))


def spread_offsets(size: int, count: int = OFFSETS) -> list[int]:
    """`count` distinct offsets over a file of `size` bytes: the first bytes (magic, header), evenly spaced
    ones through the middle, and the last bytes (footer, trailing magic)."""
    edges = [0, 1, 4, 9, 17, size - 1, size - 2, size - 5, size - 9, size - 30]
    middle = [size * (i + 1) // (count - len(edges) + 1) for i in range(count - len(edges))]
    offsets = sorted({o for o in edges + middle if 0 <= o < size})
    step = 3
    while len(offsets) < count:  # tiny files: fill from the start
        offsets = sorted(set(offsets) | {step})
        step += 7
    return offsets


def target_file(root: Path, snapshot: Any, engine: str) -> tuple[Path, str]:
    """The file to damage (the largest partition's, or the shared file) and the name an error must give."""
    if engine == "duckdb_tables":
        return root / "_tables.duckdb", "_tables.duckdb"
    entry = max(snapshot.partitions.values(), key=lambda e: e.rows)
    file = entry.files[0]
    return root / file.path, file.path.rsplit("/", 1)[-1]


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_flipped_byte_reads_back_the_exact_rows_or_a_storage_error_naming_the_file(
    tmp_path: Path, engine: str
) -> None:
    name, mode = ENGINES[engine]
    table = hostile_table()
    acc = build_acceleration(tmp_path, table, PARTITION_BY, engine=name, partition_mode=mode)
    snapshot = acc.catalog.latest()
    assert snapshot is not None
    root = acc.root / acc.dataset
    target, file_name = target_file(root, snapshot, engine)
    pristine = target.read_bytes()
    offsets = spread_offsets(len(pristine))
    assert len(offsets) >= 20
    assert 0 < len(duckdb_filter_rows(table, FILTER)) < table.num_rows
    full = sorted(row_digests(table))
    filtered = sorted(row_digests(table.take(pa.array(duckdb_filter_rows(table, FILTER), pa.int64()))))
    outcomes: dict[int, str] = {}
    remaining = list(offsets)
    while remaining:
        job = {
            "spec": str(acc.spec_path),
            "dataset": acc.dataset,
            "target": str(target),
            "offsets": remaining,
            "filter": FILTER,
        }
        try:
            done = subprocess.run(
                [sys.executable, __file__, json.dumps(job)],
                capture_output=True,
                text=True,
                timeout=CHILD_TIMEOUT_S,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )
        finally:
            target.write_bytes(pristine)  # a child that died left its flip in place
        started: list[int] = []
        for line in done.stdout.splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "start":
                started.append(int(rest))
            elif kind == "result":
                record = json.loads(rest)
                outcomes[record["offset"]] = _judge(record, full, filtered, file_name)
        if done.returncode != 0:
            assert started, f"the child failed before any offset: {done.stderr[-3000:]}"
            crashed = started[-1]
            outcomes[crashed] = f"crash (exit {done.returncode}): {done.stderr[-500:]}"
        remaining = [o for o in remaining if o not in outcomes]
        if done.returncode == 0 and remaining:
            raise AssertionError(f"the child skipped offsets {remaining}: {done.stderr[-3000:]}")
    bad = {offset: outcome for offset, outcome in outcomes.items() if outcome not in ("exact", "refused")}
    tally = Counter(outcomes.values())
    assert not bad, (
        f"{engine}: {len(bad)} of {len(offsets)} flips read back wrong rows, crashed or raised an untyped "
        f"error ({dict(tally)}):\n" + "\n".join(f"  offset {o}: {v}" for o, v in sorted(bad.items()))
    )
    assert tally["refused"] >= len(offsets) // 2, f"{engine}: most flips must be detected: {dict(tally)}"
    # Restored, the file reads back exactly once more.
    with acc.reader() as reader:
        assert sorted(row_digests(reader.read())) == full


def _judge(record: dict[str, Any], full: list[str], filtered: list[str], file_name: str) -> str:
    """`exact`, `refused` (a StorageError naming the file and the repair) or what went wrong."""
    verdicts = []
    for read, expected in (("full", full), ("filtered", filtered)):
        outcome = record[read]
        if outcome["kind"] == "rows":
            if sorted(outcome["digests"]) != expected:
                return (
                    f"{read} read returned {len(outcome['digests'])} rows, not the {len(expected)} expected"
                )
            verdicts.append("exact")
        elif outcome["kind"] == "StorageError":
            message = outcome["message"]
            if file_name not in message or "refresh" not in message:
                return f"{read} read: StorageError without the file or the repair: {message}"
            verdicts.append("refused")
        else:
            return f"{read} read raised {outcome['kind']}: {outcome['message'][:300]}"
    return "refused" if "refused" in verdicts else "exact"


# --- compaction and vacuum never launder a damaged file ------------------------------------------


@pytest.mark.parametrize("engine", ["parquet", "duckdb_files", "arrow"])
def test_compaction_refuses_a_damaged_file_and_vacuum_keeps_it(tmp_path: Path, engine: str) -> None:
    from test_compaction import fragmented, project_of

    from airflow_partitions.exceptions import StorageError
    from airflow_partitions.refresh.compaction import compact_dataset

    acc = fragmented(tmp_path, engine)
    head = acc.catalog.latest()
    assert head is not None
    root = acc.root / acc.dataset
    entry = max(head.partitions.values(), key=lambda e: len(e.files))
    assert len(entry.files) > 1
    damaged = root / entry.files[1].path
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    project, dataset = project_of(acc)
    with pytest.raises(StorageError) as raised:
        compact_dataset(project, dataset, catalog=acc.catalog)  # type: ignore[arg-type]
    message = str(raised.value)
    assert damaged.name in message, message
    assert f"--partitions {entry.key_path}" in message, message
    latest = acc.catalog.latest()
    assert latest is not None
    assert latest.version == head.version, "a refused compaction publishes nothing"
    acc.catalog.vacuum(retain_versions=1, grace=dt.timedelta(0))
    assert damaged.read_bytes() == bytes(data), "the damaged file stays, as the evidence and to repair"


def test_compaction_of_a_damaged_shared_duckdb_table_refuses(tmp_path: Path) -> None:
    """In duckdb `tables` mode a damaged block of the shared file fails DuckDB's block checksum: the
    compaction refuses with a `StorageError` naming the shared file, and publishes nothing."""
    from test_compaction import fragmented, project_of

    from airflow_partitions.exceptions import StorageError
    from airflow_partitions.refresh.compaction import compact_dataset

    acc = fragmented(tmp_path, "duckdb_tables")
    head = acc.catalog.latest()
    assert head is not None
    shared = acc.root / acc.dataset / "_tables.duckdb"
    pristine = shared.read_bytes()
    project, dataset = project_of(acc)
    refused = 0
    # Every 4 KiB block from the first data block on: a flip in a block some table uses must be refused,
    # a flip in a free block changes nothing a compaction reads.
    for offset in range(3 * 4096 + 100, len(pristine), 4096):
        if refused >= 3:
            break
        data = bytearray(pristine)
        data[offset] ^= 0xFF
        shared.write_bytes(bytes(data))
        message = ""
        try:
            compact_dataset(project, dataset, catalog=acc.catalog)  # type: ignore[arg-type]
        except StorageError as err:
            message = str(err)
        if message:
            shared.write_bytes(pristine)
            assert "_tables.duckdb" in message, message
            assert "refresh" in message, message
            latest = acc.catalog.latest()
            assert latest is not None
            assert latest.version == head.version
            refused += 1
            continue
        # The flip was in a block no table uses (the compaction changed the file: the loop ends). The
        # rows it wrote were read from checked blocks: a read gives exactly the source's rows.
        with acc.reader() as reader:
            assert sorted(row_digests(reader.read())) == sorted(row_digests(acc.table))
        break
    assert refused, "a flip in the shared file's table blocks must be refused"


# --- object storage: fetched copies are checked before use ----------------------------------------


def _damaged_on_s3(tmp_path: Path, engine: str, s3_server: dict[str, Any]) -> tuple[Any, str, Any, str]:
    """An acceleration uploaded to S3 with one byte flipped in the middle of its largest partition file:
    the acceleration, its S3 root, the damaged file and the name an error must give."""
    import uuid

    import boto3

    name, mode = ENGINES[engine]
    acc = build_acceleration(tmp_path, hostile_table(), PARTITION_BY, engine=name, partition_mode=mode)
    snapshot = acc.catalog.latest()
    assert snapshot is not None
    damaged = max(snapshot.partitions.values(), key=lambda e: e.rows).files[0]
    client = boto3.client("s3", **s3_server)
    bucket = f"ap-damaged-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    root = acc.root / acc.dataset
    for path in root.rglob("*"):
        if path.is_file() and "_catalog" not in path.parts:
            relative = path.relative_to(root).as_posix()
            body = bytearray(path.read_bytes())
            if relative == damaged.path:
                body[len(body) // 2] ^= 0xFF
            client.put_object(Bucket=bucket, Key=f"{acc.dataset}/{relative}", Body=bytes(body))
    return acc, f"s3://{bucket}/{acc.dataset}", damaged, damaged.path.rsplit("/", 1)[-1]


@pytest.mark.s3
@pytest.mark.parametrize("engine", ["parquet", "arrow", "duckdb_files"])
def test_a_damaged_object_on_s3_is_refused_whole_or_by_ranges(
    tmp_path: Path, engine: str, s3_server: dict[str, str]
) -> None:
    """Whole-file fetches (the read cache, local copies of DuckDB and Arrow files) are checked against the
    catalog's SHA-256 before use; a parquet ranged first read verifies the page CRCs of what it fetches."""
    from airflow_partitions.exceptions import SnapshotIntegrityError, StorageError
    from airflow_partitions.objectstore import S3Settings
    from airflow_partitions.read import PartitionedDatasetReader

    acc, s3_root, _, file_name = _damaged_on_s3(tmp_path, engine, s3_server)
    full = sorted(row_digests(acc.table))
    filtered = sorted(
        row_digests(acc.table.take(pa.array(duckdb_filter_rows(acc.table, FILTER), pa.int64())))
    )
    for ranged_min, where, expected in ((0, FILTER, filtered), (None, None, full), (None, FILTER, filtered)):
        reader = PartitionedDatasetReader(
            acc.spec_path,
            acc.dataset,
            catalog=acc.catalog,
            data_root=s3_root,
            filesystem=S3Settings.from_mapping(s3_server).arrow_filesystem(),
            cache_dir=tmp_path / f"cache-{ranged_min}-{where is None}",
            ranged_read_min_bytes=ranged_min,
        )
        with reader:
            try:
                got = reader.read(where)
            except (StorageError, SnapshotIntegrityError) as err:
                message = str(err)
            else:
                message = ""
                assert sorted(row_digests(got)) == expected, (
                    f"{engine} {where}: wrong rows from a damaged object"
                )
        if message:
            assert file_name in message, message
            assert "refresh" in message, message
        elif engine != "parquet" or ranged_min is None:
            raise AssertionError(f"{engine} {where}: a damaged object fetched whole must be refused")


# --- the child: reads after each flip --------------------------------------------------------------


def _read_outcome(read: Any) -> dict[str, Any]:
    from matrix_support import row_digests

    from airflow_partitions.exceptions import StorageError

    try:
        table = read()
    except StorageError as err:
        return {"kind": "StorageError", "message": str(err)}
    except Exception as err:  # every other outcome is reported to the test, which fails on it
        return {"kind": type(err).__module__ + "." + type(err).__name__, "message": str(err)}
    return {"kind": "rows", "digests": row_digests(table)}


def _child(job: dict[str, Any]) -> None:
    from airflow_partitions.read import PartitionedDatasetReader

    target = Path(job["target"])
    pristine = target.read_bytes()
    for offset in job["offsets"]:
        print(f"start {offset}", flush=True)
        data = bytearray(pristine)
        data[offset] ^= 0xFF
        target.write_bytes(bytes(data))
        try:
            with PartitionedDatasetReader(job["spec"], job["dataset"]) as reader:
                full = _read_outcome(reader.read)
                filtered = _read_outcome(lambda: reader.read(job["filter"]))
        finally:
            target.write_bytes(pristine)
        print("result " + json.dumps({"offset": offset, "full": full, "filtered": filtered}), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    _child(json.loads(sys.argv[1]))
