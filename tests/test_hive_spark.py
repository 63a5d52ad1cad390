"""Hive directory values read through the Spark stage equal what pyarrow decodes, byte for byte.

Spark's own partition discovery decodes `%C3%A9` byte by byte (not as UTF-8) and refuses an empty value
(`s=`); the source must hand Spark the values pyarrow gives. Each layout is refreshed by the Spark stage
and by pushdown, and a full read of the acceleration must equal the source read independently.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.refresh import PartitionResult, StageResult, commit_refresh, plan_refresh
from airflow_partitions.refresh.pipeline import refresh_dataset
from airflow_partitions.spec import load_spec
from airflow_partitions.table import open_handle

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parent.parent

# Directory values pyarrow percent-encodes (non-ASCII, separators, `%`, quotes, spaces), NULL (written as
# __HIVE_DEFAULT_PARTITION__) and plain ASCII.
ENCODED = ["é", "日本語", "a/b=c", "50%", None, "x", 'it\'s "q"', "sp ace", "100% é/ü", "a+b", "[x]*?"]
ENCODED += ["nb\u00a0sp", "emoji😀"]
# The empty value: its directory is `s=`, which Spark's discovery refuses outright.
EMPTY = ["", "x", None]
# Directories named with literal non-ASCII, as Spark itself writes them.
# `+` (a space to a form decoder), `#` (a URI fragment) and a no-break space (escaped inside a URI) too.
LITERAL = ["é", "日本語", "sp ace", "ü ñ", "x", "a+b", "h#1", "nb\u00a0sp", "emoji😀", "semi;colon"]
LITERAL += ["[x]", "st*r", "q?", "{y,z}", "back\\slash"]


def hive_rows(values: list[str | None], per_value: int = 4) -> pa.Table:
    rows = [(value, index * per_value + r) for index, value in enumerate(values) for r in range(per_value)]
    return pa.table(
        {
            "id": pa.array([i for _, i in rows], pa.int64()),
            "s": pa.array([v for v, _ in rows], pa.string()),
            "note": pa.array([None if i % 3 == 0 else f"n{i} é'%/=" for _, i in rows], pa.string()),
        }
    )


def write_encoded(directory: Path, table: pa.Table, file_format: str = "parquet") -> None:
    """pyarrow's Hive writer: percent-encoded directory values, NULL as __HIVE_DEFAULT_PARTITION__."""
    pads.write_dataset(
        table,
        directory,
        format=file_format,
        partitioning=pads.partitioning(pa.schema([("s", pa.string())]), flavor="hive"),
    )


def write_literal(directory: Path, table: pa.Table) -> None:
    """Directories named `s=<value>` with the value's characters as they are (no escaping)."""
    for value in set(table.column("s").to_pylist()):
        assert value is not None
        part = table.filter(pa.array([v == value for v in table.column("s").to_pylist()]))
        target = directory / f"s={value}"
        target.mkdir(parents=True)
        pq.write_table(part.drop_columns(["s"]), target / "part 0.parquet")


def source_table(directory: Path, file_format: str = "parquet") -> pa.Table:
    """The source read independently: pyarrow's dataset with Hive partitioning (CSV: an empty field is
    NULL, as the project reads CSV)."""
    file_format_: Any = file_format
    if file_format == "csv":
        file_format_ = pads.CsvFileFormat(
            convert_options=pacsv.ConvertOptions(
                null_values=[""], strings_can_be_null=True, quoted_strings_can_be_null=True
            )
        )
    return pads.dataset(
        directory,
        format=file_format_,
        partitioning=pads.partitioning(pa.schema([("s", pa.string())]), flavor="hive"),
    ).to_table()


def multiset(table: pa.Table) -> Counter[tuple[Any, ...]]:
    names = sorted(table.column_names)
    return Counter(tuple(row[n] for n in names) for row in table.select(names).to_pylist())


def write_spec(tmp_path: Path, source: str, partition_by: str, params: str = "file_format: parquet") -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: t\n"
        f"    from: {source}\n"
        f"    params: {{{params}}}\n"
        "    acceleration:\n"
        f"      partition_by: {partition_by}\n"
    )
    return spec


def read_everything(spec: Path) -> pa.Table:
    reader = PartitionedDatasetReader(spec, "t")
    try:
        return reader.read()
    finally:
        reader.close()


def write_layout(layout: str, directory: Path) -> None:
    if layout == "encoded":
        write_encoded(directory, hive_rows(ENCODED))
    elif layout == "empty":
        write_encoded(directory, hive_rows(EMPTY))
    else:
        write_literal(directory, hive_rows(LITERAL))


@pytest.mark.parametrize("layout", ["encoded", "empty", "literal"])
@pytest.mark.parametrize("strategy", ["spark", "pushdown"])
def test_hive_values_survive_each_strategy(spark: Any, tmp_path: Path, layout: str, strategy: str) -> None:
    write_layout(layout, tmp_path / "src")
    source = source_table(tmp_path / "src")
    spec = write_spec(tmp_path, "file:src", "[{sk: s}]")
    summary = refresh_dataset(spec, "t", spark=spark, strategy=strategy)
    # Through Spark the executors write the final parquet files.
    assert summary.stage_mode == ("written" if strategy == "spark" else strategy)
    assert summary.failed == {}
    assert summary.rows == source.num_rows
    read = read_everything(spec)
    assert multiset(read.select(source.column_names)) == multiset(source), "every row, every value exact"
    expected_keys = set(source.column("s").to_pylist())
    assert set(read.column("s").to_pylist()) == expected_keys


@pytest.mark.parametrize("layout", ["encoded", "empty", "literal"])
def test_composite_layout_goes_through_spark_under_auto(spark: Any, tmp_path: Path, layout: str) -> None:
    """A bucket on a file column is not decided by the directories: "auto" must use the Spark stage."""
    write_layout(layout, tmp_path / "src")
    source = source_table(tmp_path / "src")
    spec = write_spec(tmp_path, "file:src", "[{sk: s}, {b: 'bucket(3, id)'}]")
    summary = refresh_dataset(spec, "t", spark=spark, strategy="auto")
    assert summary.stage_mode == "written"
    assert summary.failed == {}
    assert summary.rows == source.num_rows
    assert multiset(read_everything(spec).select(source.column_names)) == multiset(source)


def test_csv_hive_values_survive_the_spark_stage(spark: Any, tmp_path: Path) -> None:
    """CSV files are read without the Hive columns (their headers do not have them), then joined on."""
    write_encoded(tmp_path / "src", hive_rows([*ENCODED, *EMPTY]), file_format="csv")
    source = source_table(tmp_path / "src", file_format="csv")
    spec = write_spec(tmp_path, "file:src", "[{sk: s}, {b: 'bucket(3, id)'}]", params="file_format: csv")
    summary = refresh_dataset(spec, "t", spark=spark, strategy="spark")
    assert summary.stage_mode == "written"
    assert summary.rows == source.num_rows
    assert multiset(read_everything(spec).select(source.column_names)) == multiset(source)


@pytest.mark.s3
def test_s3_hive_values_survive_the_copy_to_stage(
    spark: Any, tmp_path: Path, s3_server: dict[str, str], s3_bucket: str
) -> None:
    import boto3

    local = tmp_path / "local"
    write_encoded(local, hive_rows([*ENCODED, ""]))
    source = source_table(local)
    client: Any = boto3.client("s3", **s3_server)  # type: ignore[call-overload]
    for root, _, names in os.walk(local):
        for name in names:
            path = Path(root) / name
            client.upload_file(str(path), s3_bucket, f"hive/{path.relative_to(local).as_posix()}")
    endpoint = s3_server["endpoint_url"]
    spec = write_spec(
        tmp_path,
        f"s3://{s3_bucket}/hive",
        "[{sk: s}, {b: 'bucket(3, id)'}]",
        params=f"file_format: parquet, endpoint_url: '{endpoint}'",
    )
    summary = refresh_dataset(spec, "t", spark=spark, strategy="spark")
    assert summary.stage_mode == "written"
    assert summary.rows == source.num_rows
    assert multiset(read_everything(spec).select(source.column_names)) == multiset(source)


@pytest.mark.slow
def test_hive_values_through_spark_connect(spark_connect_server: dict[str, Any], tmp_path: Path) -> None:
    """The same read with a Spark Connect session (DataFrame API only), in the spark-submit job."""
    write_encoded(tmp_path / "src", hive_rows([*ENCODED, ""]))
    write_literal(tmp_path / "src", hive_rows(["[x]", "{y,z}", "ü ñ+"]))
    source = source_table(tmp_path / "src")
    spec = write_spec(tmp_path, "file:src", "[{sk: s}, {b: 'bucket(3, id)'}]")
    project = load_spec(spec)
    plan = plan_refresh(project, "t")
    (tmp_path / "plan.json").write_text(plan.dumps())
    completed = subprocess.run(
        [
            sys.executable,
            str(REPO / "spark_jobs" / "refresh_partitions.py"),
            "stage",
            "--spec",
            str(spec),
            "--dataset",
            "t",
            "--plan",
            str(tmp_path / "plan.json"),
            "--location",
            str(tmp_path / "stage"),
            "--output",
            str(tmp_path / "out.json"),
            "--remote",
            spark_connect_server["url"],
            "--finalize",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    output = json.loads((tmp_path / "out.json").read_text())
    assert output["mode"] == "written"
    results = [PartitionResult.from_json(r) for r in output["results"]]
    commit = commit_refresh(
        open_handle(project, project.dataset("t")), plan, results, stage=StageResult.from_json(output)
    )
    assert commit.rows == source.num_rows
    assert multiset(read_everything(spec).select(source.column_names)) == multiset(source)


@pytest.mark.parametrize("strategy", ["spark", "pushdown", "arrow"])
def test_zero_row_files_conserve(spark: Any, tmp_path: Path, strategy: str) -> None:
    """A 0-row file is a file like any other: 0 rows read, 0 routed. One beside rows (s=x) adds nothing; one
    alone in its directory (s=z) names no partition, since the source has no row with s = 'z'."""
    write_encoded(tmp_path / "src", hive_rows(["x", None, "é/ü"]))
    empty = hive_rows(["x"]).drop_columns(["s"]).slice(0, 0)
    (tmp_path / "src" / "s=z").mkdir()
    pq.write_table(empty, tmp_path / "src" / "s=z" / "empty.parquet")
    pq.write_table(empty, tmp_path / "src" / "s=x" / "empty.parquet")
    source = source_table(tmp_path / "src")
    spec = write_spec(tmp_path, "file:src", "[{sk: s}]")
    summary = refresh_dataset(spec, "t", spark=spark, strategy=strategy)
    assert summary.failed == {}
    assert summary.rows == source.num_rows == 12
    read = read_everything(spec)
    assert multiset(read.select(source.column_names)) == multiset(source)
    assert set(read.column("s").to_pylist()) == {"x", None, "é/ü"}
    # The directory gains rows: its partition appears on the next refresh.
    pq.write_table(hive_rows(["x"]).drop_columns(["s"]), tmp_path / "src" / "s=z" / "rows.parquet")
    refresh_dataset(spec, "t", spark=spark, strategy=strategy)
    assert multiset(read_everything(spec).select(source.column_names)) == multiset(
        source_table(tmp_path / "src")
    )
