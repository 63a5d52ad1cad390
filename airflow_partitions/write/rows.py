"""The rows a write is given: any Arrow form (or a Spark / pandas DataFrame) as one Arrow table, conformed
to the acceleration's schema with an error that names every column that does not fit."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import WriteError, WriteSchemaError
from airflow_partitions.sources.files import csv_convert_options

if TYPE_CHECKING:
    import pyarrow as pa

# What `arrow_rows` accepts, for messages.
ACCEPTED_INPUT = (
    "a pyarrow Table, RecordBatch, RecordBatchReader or iterable of RecordBatches, a pandas DataFrame, or a "
    "Spark DataFrame"
)


ROWS_FILE_FORMATS = ("parquet", "csv", "jsonl")
_FORMAT_OF_SUFFIX = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
}


@dataclass(frozen=True)
class RowsFile:
    """A local file of rows to write: parquet, csv (with a header line) or jsonl (one JSON object a line).

    The format comes from `file_format`, else the extension (`.parquet`/`.pq`, `.csv`, `.jsonl`/`.json`/
    `.ndjson`). Text formats are parsed with the dataset's column types, so values keep their types.
    """

    path: str
    file_format: str | None = None

    @property
    def format(self) -> str:
        chosen = (self.file_format or "").lower()
        if not chosen:
            suffix = os.path.splitext(self.path)[1].lower()
            chosen = _FORMAT_OF_SUFFIX.get(suffix, "")
        if chosen not in ROWS_FILE_FORMATS:
            raise WriteError(
                f"cannot tell the format of {self.path!r}: give file_format as one of "
                f"{', '.join(ROWS_FILE_FORMATS)} (or name the file .parquet, .csv or .jsonl)"
            )
        return chosen


def read_rows_file(rows_file: RowsFile, schema: pa.Schema) -> pa.Table:
    """The rows of `rows_file`, text formats parsed with `schema`'s types for the columns it names."""
    import pyarrow as pa

    file_format = rows_file.format
    if not os.path.isfile(rows_file.path):
        raise WriteError(f"the file of rows to write {rows_file.path!r} does not exist (or is not a file)")
    try:
        if file_format == "parquet":
            import pyarrow.parquet as pq

            return pq.read_table(rows_file.path)
        if file_format == "csv":
            import pyarrow.csv as pcsv

            # The rule CSV sources are read by: only an empty field is NULL.
            return pcsv.read_csv(rows_file.path, convert_options=csv_convert_options(schema))
        import pyarrow.json as pjson

        return pjson.read_json(
            rows_file.path,
            parse_options=pjson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer"),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as err:
        raise WriteError(
            f"cannot read the rows in {rows_file.path} as {file_format}: {err}; check the file against "
            f"the dataset's columns ({', '.join(f'{f.name} {f.type}' for f in schema)})"
        ) from err


def arrow_rows(data: Any) -> pa.Table:
    """`data` as one Arrow table (the rows are read once; a reader or iterator is consumed)."""
    import pyarrow as pa

    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    if _is_spark_frame(data):
        return spark_frame_rows(data)
    if type(data).__module__.startswith("pandas") and hasattr(data, "columns"):
        return pa.Table.from_pandas(data, preserve_index=False)
    if isinstance(data, Iterable) and not isinstance(data, str | bytes | dict):
        batches = list(data)
        if batches and all(isinstance(b, pa.RecordBatch) for b in batches):
            return pa.Table.from_batches(batches)
        if not batches:
            raise WriteError(f"the write was given an empty iterable: give {ACCEPTED_INPUT} (with a schema)")
    raise WriteError(f"cannot write {type(data).__name__} rows: give {ACCEPTED_INPUT}")


def _is_spark_frame(data: Any) -> bool:
    module = type(data).__module__
    return module.startswith("pyspark.") and hasattr(data, "schema") and hasattr(data, "mapInArrow")


def spark_frame_rows(frame: Any) -> pa.Table:
    """A Spark DataFrame's rows as Arrow (Spark 4 `toArrow`, else the Arrow collection pandas uses)."""
    to_arrow = getattr(frame, "toArrow", None)
    if callable(to_arrow):
        table = to_arrow()
    else:  # pragma: no cover - Spark 3.x
        import pyarrow as pa

        table = pa.Table.from_batches(frame._collect_as_arrow())
    return table


@dataclass(frozen=True, slots=True)
class Conformed:
    """`table` conformed to a schema (None when a column does not fit) and what did not fit: column
    names given more than once, schema columns missing, columns the schema lacks, and per column that
    does not cast safely, its name, type and the cast error."""

    table: pa.Table | None
    repeated: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    uncastable: tuple[tuple[str, pa.DataType, Exception], ...] = ()


def conform_columns(table: pa.Table, schema: pa.Schema) -> Conformed:
    """The one conformer of the write side (writes, staged and source rows of a refresh): `table` with
    exactly `schema`'s columns, in its order and types (safe casts only; names matched exactly). Columns
    the schema lacks are left out and reported (`extra`); the caller decides whether they are an error."""
    import pyarrow as pa

    names = table.column_names
    repeated = tuple(sorted({name for name in names if names.count(name) > 1}))
    if repeated:
        return Conformed(None, repeated=repeated)
    missing = tuple(name for name in schema.names if name not in names)
    extra = tuple(name for name in names if name not in schema.names)
    uncastable: list[tuple[str, pa.DataType, Exception]] = []
    columns = []
    for target in schema:
        if target.name not in names:
            continue
        column = table.column(target.name)
        if not column.type.equals(target.type):
            try:
                column = column.cast(target.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
                uncastable.append((target.name, column.type, err))
        columns.append(column)
    if missing or uncastable:
        return Conformed(None, (), missing, extra, tuple(uncastable))
    conformed = pa.Table.from_arrays(columns, schema=schema) if columns else schema.empty_table()
    return Conformed(conformed, extra=extra)


def conform_rows(table: pa.Table, schema: pa.Schema, *, dataset: str) -> pa.Table:
    """`table` with exactly `schema`'s columns, in its order and types (`conform_columns`).

    Refuses (`WriteSchemaError`, naming each column) a column the dataset lacks, a dataset column the rows
    lack, and a column whose values do not cast to the dataset's type without loss (safe cast). Column
    order does not matter; names are matched exactly (case-sensitive, as `partition_by` is).
    """
    result = conform_columns(table, schema)
    if result.repeated:
        raise WriteSchemaError(
            f"dataset {dataset!r}: the rows name column(s) {list(result.repeated)} more than once; give each "
            "column once",
            extra=result.repeated,
        )
    if result.table is not None and not result.extra:
        return result.table
    parts = []
    if result.missing:
        parts.append(f"missing column(s) {list(result.missing)}")
    if result.extra:
        parts.append(f"column(s) {list(result.extra)} the dataset does not have")
    if result.uncastable:
        details = [
            f"{name!r} is {given}, the dataset has {schema.field(name).type} ({err})"
            for name, given, err in result.uncastable
        ]
        parts.append("column(s) whose values do not fit the dataset's type: " + "; ".join(details))
    raise WriteSchemaError(
        f"dataset {dataset!r}: the rows do not match its schema: {'; '.join(parts)}. The dataset's "
        f"columns are {', '.join(f'{f.name} {f.type}' for f in schema)}; give exactly those columns "
        "(any order) with values of those types. Nothing was written.",
        missing=result.missing,
        extra=result.extra,
        uncastable=tuple(name for name, _, _ in result.uncastable),
    )
