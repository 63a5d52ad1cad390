"""File sources on real files and a real S3 endpoint: formats, globs, Hive layouts, fingerprints, timeouts."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from airflow_partitions.exceptions import DiscoveryTimeoutError, SourceError
from airflow_partitions.sources.base import EMPTY_FINGERPRINT, Deadline
from airflow_partitions.sources.files import FileSource, glob_to_regex
from airflow_partitions.transforms import parse_transform


def sample_table(offset: int = 0, rows: int = 6) -> pa.Table:
    ids = list(range(offset, offset + rows))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array([["EU", "US", None][i % 3] for i in ids], pa.string()),
            "amount": pa.array([i * 1.5 for i in ids], pa.float64()),
            "ts": pa.array([dt.datetime(2026, 1, 1 + i % 4, 12, 30) for i in ids], pa.timestamp("us")),
        }
    )


def write_jsonl(table: pa.Table, path: Path) -> None:
    with path.open("w") as handle:
        for row in table.to_pylist():
            row["ts"] = row["ts"].isoformat(sep=" ")
            handle.write(json.dumps(row) + "\n")


def sorted_rows(table: pa.Table) -> list[dict[str, object]]:
    return sorted(table.to_pylist(), key=lambda r: r["id"])


def bound(expr: str, source: FileSource):  # type: ignore[no-untyped-def]
    transform = parse_transform(expr)
    return transform.bind(source.schema().field(transform.source_column).type)


# --- globs and listing ------------------------------------------------------------------------------


def test_glob_star_stays_in_one_directory_and_double_star_spans_levels() -> None:
    assert glob_to_regex("*.parquet").fullmatch("a.parquet")
    assert not glob_to_regex("*.parquet").fullmatch("sub/a.parquet")
    assert glob_to_regex("**/*.parquet").fullmatch("sub/deeper/a.parquet")
    assert glob_to_regex("**/*.parquet").fullmatch("a.parquet")
    assert glob_to_regex("part-[0-9].csv").fullmatch("part-7.csv")
    assert not glob_to_regex("part-[!0-9].csv").fullmatch("part-7.csv")


def test_directory_listing_skips_markers_and_hidden_files(tmp_path: Path) -> None:
    pq.write_table(sample_table(), tmp_path / "a.parquet")
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / ".a.parquet.crc").write_text("x")
    (tmp_path / "_temporary").mkdir()
    pq.write_table(sample_table(), tmp_path / "_temporary" / "b.parquet")
    source = FileSource(str(tmp_path))
    assert [f.relative for f in source.list_files()] == ["a.parquet"]
    assert source.file_format == "parquet"


def test_glob_selects_only_matching_files(tmp_path: Path) -> None:
    pq.write_table(sample_table(0), tmp_path / "jan.parquet")
    pq.write_table(sample_table(6), tmp_path / "feb.parquet")
    (tmp_path / "sub").mkdir()
    pq.write_table(sample_table(12), tmp_path / "sub" / "mar.parquet")
    top = FileSource(str(tmp_path / "*.parquet"))
    assert [f.relative for f in top.list_files()] == ["feb.parquet", "jan.parquet"]
    everything = FileSource(str(tmp_path / "**" / "*.parquet"))
    assert len(everything.list_files()) == 3
    assert everything.read_all().num_rows == 18


def test_missing_path_and_unknown_format_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        FileSource(str(tmp_path / "nope")).list_files()
    (tmp_path / "data.bin").write_bytes(b"\x00")
    with pytest.raises(SourceError, match="file_format"):
        _ = FileSource(str(tmp_path / "data.bin")).file_format
    with pytest.raises(SourceError, match="unknown file_format"):
        _ = FileSource(str(tmp_path), params={"file_format": "avro"}).file_format


# --- formats ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("file_format", ["parquet", "csv", "json"])
def test_every_format_reads_back_row_for_row(tmp_path: Path, file_format: str) -> None:
    table = sample_table(rows=9)
    if file_format == "parquet":
        pq.write_table(table, tmp_path / "part.parquet")
    elif file_format == "csv":
        pacsv.write_csv(table, tmp_path / "part.csv")
    else:
        write_jsonl(table, tmp_path / "part.jsonl")
    source = FileSource(str(tmp_path))
    assert source.file_format == file_format
    assert source.schema().field("id").type == pa.int64()
    assert pa.types.is_timestamp(source.schema().field("ts").type)
    got = source.read_all()
    assert sorted_rows(got.cast(table.schema)) == sorted_rows(table)


def test_csv_delimiter_param(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("id;name\n1;a\n2;b\n")
    source = FileSource(str(tmp_path / "data.txt"), params={"file_format": "csv", "delimiter": ";"})
    assert source.read_all().to_pylist() == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]


# --- survey: keys and fingerprints ------------------------------------------------------------------


def test_flat_files_scan_for_keys_and_fingerprint_the_whole_source(tmp_path: Path) -> None:
    pq.write_table(sample_table(0), tmp_path / "a.parquet")
    pq.write_table(sample_table(6), tmp_path / "b.parquet")
    source = FileSource(str(tmp_path))
    transforms = [bound("region", source), bound("date_trunc('day', ts)", source)]
    survey = source.survey(transforms, need_keys=True, check_column=None, deadline=Deadline(30))
    expected = {(r, dt.datetime(2026, 1, 1 + i % 4)) for i, r in enumerate(["EU", "US", None] * 4)}
    assert set(survey.keys or []) == expected
    assert survey.granularity == "source"
    before = survey.fingerprint(("EU", dt.datetime(2026, 1, 1)))
    assert before == survey.fingerprint(("US", dt.datetime(2026, 1, 2))) == survey.whole_fingerprint
    # Any file change refreshes every partition: the layout cannot tell which ones it touched.
    pq.write_table(sample_table(100), tmp_path / "b.parquet")
    after = source.survey(transforms, need_keys=False, check_column=None, deadline=Deadline(30))
    assert after.keys is None
    assert after.fingerprint(("EU", dt.datetime(2026, 1, 1))) != before


def test_hive_layout_maps_files_to_partitions(tmp_path: Path) -> None:
    for region in ("EU", "US", "a/b=c"):
        directory = tmp_path / f"region={region.replace('/', '%2F').replace('=', '%3D')}"
        directory.mkdir()
        pq.write_table(sample_table().drop_columns(["region"]), directory / "part-0.parquet")
    null_dir = tmp_path / "region=__HIVE_DEFAULT_PARTITION__"
    null_dir.mkdir()
    pq.write_table(sample_table().drop_columns(["region"]), null_dir / "part-0.parquet")
    source = FileSource(str(tmp_path))
    assert source.hive_columns == ("region",)
    assert source.schema().field("region").type == pa.string()
    transforms = [bound("region", source)]
    assert source.can_read_partition(transforms)
    survey = source.survey(transforms, need_keys=True, check_column=None, deadline=Deadline(30))
    assert set(survey.keys or []) == {("EU",), ("US",), ("a/b=c",), (None,)}
    assert survey.granularity == "partition"
    fingerprints = {key: survey.fingerprint(key) for key in survey.keys or []}
    assert len(set(fingerprints.values())) == 4, "each partition has its own files, so its own fingerprint"
    assert survey.fingerprint(("nowhere",)) == EMPTY_FINGERPRINT

    # Rewrite only the US files: only the US fingerprint moves.
    pq.write_table(sample_table(50).drop_columns(["region"]), tmp_path / "region=US" / "part-0.parquet")
    os.utime(tmp_path / "region=US" / "part-0.parquet", ns=(1, 1))
    again = source.survey(transforms, need_keys=True, check_column=None, deadline=Deadline(30))
    changed = {key for key in fingerprints if again.fingerprint(key) != fingerprints[key]}
    assert changed == {("US",)}

    # A pushed-down read returns exactly that partition's rows, Hive column included.
    hint = source.partition_read_hint(transforms, ("a/b=c",))
    rows = source.read_partition(transforms, ("a/b=c",), hint)
    assert rows.num_rows == 6
    assert set(rows.column("region").to_pylist()) == {"a/b=c"}
    assert source.read_partition(transforms, (None,), None).column("region").null_count == 6


def test_hive_discovery_lists_directories_without_opening_files(tmp_path: Path) -> None:
    # bucket over a Hive column: each directory decides its bucket, so discovery never reads data.
    for location in (3, 17, 42):
        directory = tmp_path / f"loc={location}"
        directory.mkdir()
        pq.write_table(pa.table({"v": [1, 2]}), directory / "a.parquet")
    source = FileSource(str(tmp_path))
    transforms = [bound("truncate(10, loc)", source)]
    source.schema()  # read once; afterwards the data files are unreadable
    for path in tmp_path.glob("loc=*/a.parquet"):
        path.write_bytes(b"not parquet at all")
    survey = source.survey(transforms, need_keys=True, check_column=None, deadline=Deadline(30))
    assert set(survey.keys or []) == {(0,), (10,), (40,)}


def test_mixed_hive_and_data_fields_fingerprint_by_directory(tmp_path: Path) -> None:
    for day in ("2026-01-01", "2026-01-02"):
        directory = tmp_path / f"day={day}"
        directory.mkdir()
        pq.write_table(sample_table(), directory / "a.parquet")
    source = FileSource(str(tmp_path))
    transforms = [bound("day", source), bound("bucket(2, id)", source)]
    assert not source.can_read_partition(transforms), "bucket(id) is not decided by the directories"
    survey = source.survey(transforms, need_keys=True, check_column=None, deadline=Deadline(30))
    assert survey.projection == (0,)
    assert len(survey.keys or []) == 4
    first = [k for k in survey.keys or [] if k[0] == "2026-01-01"]
    assert len({survey.fingerprint(k) for k in first}) == 1, "both buckets of one day share its files"


def test_discovery_timeout_is_a_clear_error(tmp_path: Path) -> None:
    pq.write_table(sample_table(), tmp_path / "a.parquet")
    source = FileSource(str(tmp_path))
    deadline = Deadline(0.0)
    with pytest.raises(DiscoveryTimeoutError, match=r"did not finish within 0 s.*discovery_timeout"):
        source.survey([bound("region", source)], need_keys=True, check_column=None, deadline=deadline)


# --- S3 ---------------------------------------------------------------------------------------------


@pytest.mark.s3
def test_s3_source_lists_with_etags_reads_and_detects_hive(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    import boto3

    client: Any = boto3.client("s3", **s3_server)  # type: ignore[call-overload]
    for region in ("EU", "US"):
        local = tmp_path / f"{region}.parquet"
        pq.write_table(sample_table().drop_columns(["region"]), local)
        client.upload_file(str(local), s3_bucket, f"trips/region={region}/part-0.parquet")
    client.put_object(Bucket=s3_bucket, Key="trips/_SUCCESS", Body=b"")
    client.put_object(Bucket=s3_bucket, Key="other/x.parquet", Body=b"ignored")
    params = {"file_format": "parquet", "endpoint_url": s3_server["endpoint_url"]}
    source = FileSource(f"{s3_bucket}/trips", params=params, scheme="s3")
    files = source.list_files()
    assert [f.relative for f in files] == ["region=EU/part-0.parquet", "region=US/part-0.parquet"]
    assert all(len(f.version) == 32 for f in files), "S3 files are versioned by their ETag (an MD5 here)"
    assert source.hive_columns == ("region",)
    table = source.read_all()
    assert table.num_rows == 12
    assert sorted(set(table.column("region").to_pylist())) == ["EU", "US"]
    transforms = [bound("region", source)]
    survey = source.survey(transforms, need_keys=True, check_column=None, deadline=Deadline(30))
    assert set(survey.keys or []) == {("EU",), ("US",)}
    before = survey.fingerprint(("EU",))
    client.put_object(Bucket=s3_bucket, Key="trips/region=EU/part-1.parquet", Body=_parquet_bytes())
    again = source.survey(transforms, need_keys=False, check_column=None, deadline=Deadline(30))
    assert again.fingerprint(("EU",)) != before
    assert again.fingerprint(("US",)) == survey.fingerprint(("US",))

    globbed = FileSource(f"s3://{s3_bucket}/trips/region=U*/*.parquet", params=params)
    assert [f.relative for f in globbed.list_files()] == ["region=US/part-0.parquet"]


def _parquet_bytes() -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(sample_table(7).drop_columns(["region"]), sink)
    return bytes(sink.getvalue().to_pybytes())


@pytest.mark.s3
def test_s3_missing_bucket_is_a_source_error(s3_server: dict[str, str]) -> None:
    source = FileSource(
        "s3://no-such-bucket-here/x/",
        params={"file_format": "parquet", "endpoint_url": s3_server["endpoint_url"]},
    )
    with pytest.raises(SourceError, match="cannot list"):
        source.list_files()


@pytest.mark.spark
def test_spark_reads_csv_quoting_as_arrow_does(tmp_path: Path, spark: Any) -> None:
    """RFC 4180: `""` inside quotes is one quote and a backslash is a plain character, on both read paths.

    Spark's default escape character is a backslash, which kept the doubled quotes of row 1 as text.
    """
    (tmp_path / "data.csv").write_text(
        'id,note\n1,"it\'s ""quoted"""\n2,"a\\b"\n3,"x,y"\n4,plain\n5,"50% a/b=c"\n', encoding="utf-8"
    )
    source = FileSource(str(tmp_path / "data.csv"), params={"file_format": "csv"})
    transforms = [bound("id % 2", source)]
    frame = source.spark_frame(spark, transforms, None, work_dir=str(tmp_path / "work"))
    from_spark = sorted((row["id"], row["note"]) for row in frame.collect())
    from_arrow = sorted((row["id"], row["note"]) for row in source.read_all().to_pylist())
    assert from_spark == from_arrow
    assert from_spark == [(1, 'it\'s "quoted"'), (2, "a\\b"), (3, "x,y"), (4, "plain"), (5, "50% a/b=c")]
