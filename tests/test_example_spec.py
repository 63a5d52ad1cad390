"""Every dataset of the example spec (`dags/datasets.yaml`) survives a real refresh: no row lost or changed.

For each dataset the spec declares (a new one is covered as soon as it is added), hostile rows of the
source's shape are written where the spec reads them: the `schema:` block when there is one, else the
columns the partition expressions and `refresh.check_column` name. NULLs sit in every column, partition
columns included; strings carry `/`, `=`, `%`, quotes, commas, unicode and the empty string; timestamps
come with and without offsets (`+00:00`, `Z`, `+02:00`, `-05:30` where the column is tz-aware). Then the
real refresh runs (Spark, the real Postgres) and a full read through `PartitionedDatasetHook` must equal
the source as a multiset of rows, each row hashed over every column with its value's kind. The source is
read independently of the package (pyarrow for Parquet, DuckDB for JSON lines and CSV with the declared
types, psycopg for Postgres).
"""

from __future__ import annotations

import collections
import csv
import datetime as dt
import decimal
import hashlib
import json
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_partitions.spec import load_spec
from airflow_partitions.spec.model import DatasetSpec, FileFormat, SourceScheme

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_SPEC = REPO_ROOT / "dags" / "datasets.yaml"
DATASET_NAMES = load_spec(EXAMPLE_SPEC).names
ROWS = 48

# --- hostile values per column kind -----------------------------------------------------------------

STRINGS: list[str | None] = [
    "EU",
    "eu/west=1",
    "50%",
    "%NULL",
    "Zürich",
    "",
    None,
    'it\'s "quoted"',
    "a,b",
    "日本",
]
FLOATS: list[float | None] = [0.0, -0.0, 1.5, -2.25, 1e300, None, math.pi]
INT32: list[int | None] = [0, 1, -1, 132, 2_147_483_647, -2_147_483_000, None, 5]
INT64: list[int | None] = [0, 1, -1, 132, 2**62, -(10**18), None, 4_999, -1_001]
BOOLS: list[bool | None] = [True, False, None]
DATES: list[dt.date | None] = [dt.date(2026, 1, 1), dt.date(1969, 12, 31), None, dt.date(2024, 2, 29)]
NAIVE_TIMESTAMPS: list[dt.datetime | None] = [
    dt.datetime(2026, 1, 1),
    dt.datetime(2025, 12, 31, 23, 59, 59, 999_000),
    dt.datetime(1970, 1, 1),
    None,
    dt.datetime(2026, 2, 28, 12, 30, 15, 123_000),
    dt.datetime(1969, 12, 31, 23, 59, 59),
]
# Timestamps of tz-aware columns as the text a JSON or CSV source holds: every spelling of an offset.
TZ_TIMESTAMP_TEXTS: list[str | None] = [
    "2025-02-06T16:11:51+00:00",
    "2025-02-06T16:11:51Z",
    "2025-02-06T18:11:51.123+02:00",
    "2024-12-31T23:30:00-05:30",  # 2025 in UTC: an offset ignored moves the row to another year
    None,
    "1969-12-31T23:59:59Z",
    "2026-07-01T00:00:00.000001+00:00",
]


def _unit_floor(value: dt.datetime, unit: str) -> dt.datetime:
    if unit == "s":
        return value.replace(microsecond=0)
    if unit == "ms":
        return value.replace(microsecond=value.microsecond // 1000 * 1000)
    return value


def _parse_tz(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def hostile_column(arrow_type: pa.DataType, rows: int, salt: int) -> list[Any]:
    """`rows` hostile Python values of `arrow_type`; `salt` shifts columns against each other."""
    if pa.types.is_timestamp(arrow_type):
        if arrow_type.tz is not None:
            base: list[Any] = [None if t is None else _parse_tz(t) for t in TZ_TIMESTAMP_TEXTS]
        else:
            base = list(NAIVE_TIMESTAMPS)
        base = [None if v is None else _unit_floor(v, arrow_type.unit) for v in base]
    elif pa.types.is_int32(arrow_type) or pa.types.is_int16(arrow_type) or pa.types.is_int8(arrow_type):
        limit = 2 ** (arrow_type.bit_width - 1)
        base = [v for v in INT32 if v is None or -limit < v < limit]
    elif pa.types.is_integer(arrow_type):
        base = list(INT64)
    elif pa.types.is_floating(arrow_type):
        base = list(FLOATS)
    elif pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        base = list(STRINGS)
    elif pa.types.is_boolean(arrow_type):
        base = list(BOOLS)
    elif pa.types.is_date32(arrow_type):
        base = list(DATES)
    else:
        pytest.fail(f"no hostile values for columns of type {arrow_type}; add them to {__file__}")
    # Stride 1: every value (NULL included) shows up in every column within len(base) rows.
    return [base[(row + salt * 3) % len(base)] for row in range(rows)]


def hostile_table(schema: pa.Schema, rows: int = ROWS) -> pa.Table:
    columns = {f.name: hostile_column(f.type, rows, salt) for salt, f in enumerate(schema)}
    table = pa.table({name: pa.array(values, schema.field(name).type) for name, values in columns.items()})
    # One row that is NULL in every column: partition columns included.
    return pa.concat_tables([table, pa.table({f.name: pa.nulls(1, f.type) for f in schema})])


def source_shape(dataset: DatasetSpec) -> pa.Schema:
    """The source's columns: the declared `schema:`, else what the partition expressions and
    `refresh.check_column` need (with an id and a free-text column beside them)."""
    declared = dataset.declared_schema()
    if declared is not None:
        return declared
    kinds = {
        "identity": pa.string(),
        "bucket": pa.int64(),
        "truncate": pa.int64(),
        "mod": pa.int64(),
        "date_part": pa.timestamp("us", "UTC"),
        "date_trunc": pa.timestamp("us", "UTC"),
    }
    fields: dict[str, pa.DataType] = {"id": pa.int64()}
    for partition_field in dataset.partition_by:
        fields[partition_field.source_column] = kinds[partition_field.transform.name]
    if dataset.acceleration.refresh.check_column:
        fields[dataset.acceleration.refresh.check_column] = pa.timestamp("us", "UTC")
    fields.setdefault("note", pa.string())
    return pa.schema(list(fields.items()))


# --- writing the source -------------------------------------------------------------------------------


def _file_targets(location: str, suffix: str, parts: int) -> list[Path]:
    """Files to write so that `location` (a directory, a file or a glob) reads exactly them."""
    if any(ch in location for ch in "*?["):
        directory, pattern = os.path.split(location)
        assert not any(ch in directory for ch in "*?["), f"glob in a directory name: {location}"
        return [Path(directory) / pattern.replace("*", f"part-{i:03d}") for i in range(parts)]
    if location.endswith("/") or not os.path.splitext(location)[1]:
        return [Path(location) / f"part-{i:03d}.{suffix}" for i in range(parts)]
    return [Path(location)]


def _text(value: Any, arrow_type: pa.DataType, index: int) -> Any:
    """A value as a JSON or CSV source spells it."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        if arrow_type.tz is not None:
            # The written spelling, not the parsed instant: cycle through the offsets of the list.
            texts = [t for t in TZ_TIMESTAMP_TEXTS if t is not None and _parse_tz(t) == value]
            return texts[index % len(texts)] if texts else value.isoformat()
        sep = "T" if index % 2 else " "
        return value.isoformat(sep=sep, timespec="milliseconds" if arrow_type.unit == "ms" else "auto")
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def write_files(dataset: DatasetSpec, table: pa.Table) -> list[Path]:
    import pyarrow.parquet as pq

    file_format = dataset.source.file_format
    suffix = {FileFormat.PARQUET: "parquet", FileFormat.CSV: "csv", FileFormat.JSON: "jsonl"}[file_format]
    targets = _file_targets(dataset.source.location, suffix, parts=2)
    step = -(-table.num_rows // len(targets))
    for index, target in enumerate(targets):
        target.parent.mkdir(parents=True, exist_ok=True)
        part = table.slice(index * step, step)
        if file_format is FileFormat.PARQUET:
            pq.write_table(part, target)
            continue
        types = [f.type for f in table.schema]
        rows = [
            {name: _text(row[name], kind, n) for (name, kind) in zip(table.column_names, types, strict=True)}
            for n, row in enumerate(part.to_pylist())
        ]
        with target.open("w", encoding="utf-8", newline="") as out:
            if file_format is FileFormat.JSON:
                for row in rows:
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
            else:
                writer = csv.writer(out)
                writer.writerow(table.column_names)
                for row in rows:
                    writer.writerow(
                        ["" if v is None else repr(v) if isinstance(v, float) else v for v in row.values()]
                    )
    return targets


PG_TYPES = {
    "int8": "smallint",
    "int16": "smallint",
    "int32": "integer",
    "int64": "bigint",
    "double": "double precision",
    "float": "real",
    "string": "text",
    "bool": "boolean",
    "date32[day]": "date",
}


def _pg_type(arrow_type: pa.DataType) -> str:
    if pa.types.is_timestamp(arrow_type):
        return "timestamptz" if arrow_type.tz is not None else "timestamp"
    return PG_TYPES[str(arrow_type)]


def write_postgres(dataset: DatasetSpec, table: pa.Table, url: str) -> None:
    import psycopg
    from psycopg import sql

    source = dataset.source
    target = sql.Identifier(source.table_schema, source.table_name)
    columns = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(f.name), sql.SQL(_pg_type(f.type))) for f in table.schema
    )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(source.table_schema)))
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(target, columns))
        placeholders = sql.SQL(", ").join(sql.Placeholder() * table.num_columns)
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL("INSERT INTO {} VALUES ({})").format(target, placeholders),
                [tuple(row.values()) for row in table.to_pylist()],
            )


# --- reading the source independently -------------------------------------------------------------


def _duckdb_type(arrow_type: pa.DataType) -> str:
    if pa.types.is_timestamp(arrow_type):
        return "TIMESTAMPTZ" if arrow_type.tz is not None else "TIMESTAMP"
    return {
        "int8": "TINYINT",
        "int16": "SMALLINT",
        "int32": "INTEGER",
        "int64": "BIGINT",
        "double": "DOUBLE",
        "float": "FLOAT",
        "string": "VARCHAR",
        "bool": "BOOLEAN",
        "date32[day]": "DATE",
    }[str(arrow_type)]


def read_source_independently(
    dataset: DatasetSpec, schema: pa.Schema, files: Sequence[Path], pg_url: str | None
) -> list[tuple[Any, ...]]:
    """The source rows as plain tuples, read without the package's source code."""
    names = schema.names
    if dataset.source.scheme is SourceScheme.POSTGRES:
        import psycopg
        from psycopg import sql

        assert pg_url is not None
        source = dataset.source
        query = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(sql.Identifier(n) for n in names),
            sql.Identifier(source.table_schema, source.table_name),
        )
        with psycopg.connect(pg_url) as conn:
            return list(conn.execute(query).fetchall())
    if dataset.source.file_format is FileFormat.PARQUET:
        import pyarrow.parquet as pq

        table = pa.concat_tables([pq.read_table(path) for path in files])
        return [tuple(row[n] for n in names) for row in table.to_pylist()]
    import duckdb

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    columns = "{" + ", ".join(f"'{f.name}': '{_duckdb_type(f.type)}'" for f in schema) + "}"
    paths = "[" + ", ".join(f"'{path}'" for path in files) + "]"
    if dataset.source.file_format is FileFormat.JSON:
        relation = f"read_json({paths}, format = 'newline_delimited', columns = {columns})"
    else:
        relation = f"read_csv({paths}, header = true, columns = {columns})"
    return list(con.execute(f"SELECT * FROM {relation}").fetchall())


# --- row identity ---------------------------------------------------------------------------------


def value_token(value: Any) -> str:
    """A value with its kind: `1` the integer is not `1.0` nor `'1'`; an instant is compared in UTC."""
    if value is None:
        return "NULL"
    if hasattr(value, "to_pydatetime"):  # pandas Timestamp from nanosecond columns
        value = value.to_pydatetime()
    if isinstance(value, bool):
        return f"bool:{value}"
    if isinstance(value, int):
        return f"int:{value}"
    if isinstance(value, float):
        return f"float:{value!r}"
    if isinstance(value, decimal.Decimal):
        return f"decimal:{value.normalize()}"
    if isinstance(value, str):
        return f"str:{value}"
    if isinstance(value, bytes):
        return f"bytes:{value.hex()}"
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            return f"timestamp:{value.isoformat()}"
        return f"timestamptz:{value.astimezone(dt.UTC).isoformat()}"
    if isinstance(value, dt.date):
        return f"date:{value.isoformat()}"
    return f"{type(value).__name__}:{value!r}"


def row_hashes(rows: Sequence[Sequence[Any]]) -> collections.Counter[str]:
    counter: collections.Counter[str] = collections.Counter()
    for row in rows:
        text = "\x1f".join(value_token(v) for v in row)
        counter[hashlib.sha256(text.encode("utf-8")).hexdigest()] += 1
    return counter


def describe_rows(rows: Sequence[Sequence[Any]], hashes: collections.Counter[str]) -> list[str]:
    """Up to five rows whose hashes are in `hashes`, as their value tokens."""
    shown = []
    for row in rows:
        text = "\x1f".join(value_token(v) for v in row)
        if hashlib.sha256(text.encode("utf-8")).hexdigest() in hashes:
            shown.append(" | ".join(value_token(v) for v in row))
        if len(shown) == 5:
            break
    return shown


# --- the test -------------------------------------------------------------------------------------


@pytest.fixture
def example_project(tmp_path: Path) -> Path:
    """The example spec copied under `tmp_path/dags/`: its relative paths then resolve inside tmp_path."""
    spec = tmp_path / "dags" / "datasets.yaml"
    spec.parent.mkdir()
    shutil.copyfile(EXAMPLE_SPEC, spec)
    return spec


@pytest.mark.spark
@pytest.mark.parametrize("name", DATASET_NAMES)
def test_example_dataset_refresh_conserves_every_row(
    name: str,
    example_project: Path,
    tmp_path: Path,
    spark: Any,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook
    from airflow_partitions.refresh.pipeline import refresh_dataset

    project = load_spec(example_project)
    dataset = project.dataset(name)
    schema = source_shape(dataset)
    table = hostile_table(schema)

    files: list[Path] = []
    pg_url: str | None = None
    if dataset.source.scheme is SourceScheme.FILE:
        if not Path(dataset.source.location).is_relative_to(tmp_path):
            pytest.fail(f"dataset {name!r} reads {dataset.source.location}: use a path relative to dags/")
        files = write_files(dataset, table)
    elif dataset.source.scheme is SourceScheme.POSTGRES:
        connection_id = dataset.source.connection_id
        if connection_id is None:
            pytest.fail(f"dataset {name!r} gives params.url; the example spec should name a connection")
        pg_url = request.getfixturevalue("pg_database")
        monkeypatch.setenv(f"AIRFLOW_CONN_{connection_id.upper()}", pg_url)
        write_postgres(dataset, table, pg_url)
    else:
        pytest.fail(f"no sample source writer for {dataset.source.uri}; add one to {__file__}")

    expected_rows = read_source_independently(dataset, schema, files, pg_url)
    assert len(expected_rows) == table.num_rows, "the independent read sees every written row"

    summary = refresh_dataset(project, name, spark=spark)
    assert not summary.failed, summary.failed

    hook = PartitionedDatasetHook(dataset=name, spec_path=str(example_project))
    try:
        plan = hook.plan()
        accelerated = hook.read(columns=schema.names)
    finally:
        hook.close()
    assert plan.total > 0, "the refresh published no partition"
    actual_rows = [tuple(row[n] for n in schema.names) for row in accelerated.to_pylist()]

    expected = row_hashes(expected_rows)
    actual = row_hashes(actual_rows)
    lost = expected - actual
    invented = actual - expected
    assert not lost, (
        f"dataset {name!r}: {sum(lost.values())} source row(s) missing or changed, "
        f"{sum(invented.values())} row(s) in the acceleration not in the source\n"
        f"  missing: {describe_rows(expected_rows, lost)}\n"
        f"  instead: {describe_rows(actual_rows, invented)}"
    )
    assert not invented, f"rows in the acceleration not in the source: {describe_rows(actual_rows, invented)}"
    assert summary.rows == len(expected_rows), f"the commit counted {summary.rows} rows"
