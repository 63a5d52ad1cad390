"""Arrow -> Spark schema mapping shared by every source's Spark reader and the refresh stage."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import PartitionExpressionError, SchemaDriftError, SourceError
from airflow_partitions.sources.schema import needs_exactness_check, widens_losslessly

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.exceptions import SourceError


def spark_schema(schema: pa.Schema) -> Any:
    """The Spark StructType of an Arrow schema, in the Spark form `Transform.to_spark` expects.

    Naive timestamps map to TIMESTAMP_NTZ (no zone shift), unsigned integers widen; types without a
    partition-transform mapping (floats, nested types) use pyspark's own Arrow conversion.
    """
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import from_arrow_type

    from airflow_partitions.transforms.spark import spark_type_for  # lazy: loads pyspark

    fields = []
    for field in schema.remove_metadata():
        try:
            data_type = spark_type_for(field.type)
        except PartitionExpressionError:
            data_type = from_arrow_type(field.type, prefer_timestamp_ntz=True)
        fields.append(T.StructField(field.name, data_type, nullable=True))
    return T.StructType(fields)


def quote_column(name: str) -> str:
    """A column reference Spark parses back to exactly `name` (backticks doubled inside)."""
    return "`" + name.replace("`", "``") + "`"


# Marks the messages of our own per-value checks inside Spark errors, so they can be told apart.
CAST_CHECK_MARK = "airflow-partitions cast check: "
# Marks the failure of a row whose file got no Hive directory values (see `FileSource.spark_frame`).
HIVE_CHECK_MARK = "airflow-partitions hive check: "


def checked_cast(column: Any, source_type: pa.DataType, target_type: pa.DataType, name: str) -> Any:
    """`column` (Spark form of `source_type`) cast to `target_type`'s Spark form, failing the job on a value
    the cast would change (an integer beyond what a double holds exactly, an overflow) instead of
    silently rounding or wrapping it."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    source_spark, target_spark = spark_schema(pa.schema([("s", source_type), ("t", target_type)])).fields
    casted = column.cast(target_spark.dataType)
    if widens_losslessly(source_type, target_type):
        return casted
    if needs_exactness_check(source_type, target_type):
        whole = T.DecimalType(38, 0)
        changed = casted.cast(whole) != column.cast(whole)
    else:
        changed = casted.isNull() | (casted.cast(source_spark.dataType) != column)
    message = F.concat(
        F.lit(f"{CAST_CHECK_MARK}column {name!r}: value "),
        column.cast("string"),
        F.lit(f" ({source_type}) in "),
        F.col("_metadata.file_path"),
        F.lit(f" cannot become {target_type} without loss"),
    )
    return F.when(column.isNotNull() & changed, F.raise_error(message)).otherwise(casted)


def explain_spark_read_error(err: BaseException, description: str) -> SourceError | None:
    """A typed error for a Spark job that failed reading the source (a value that does not parse or
    cast), naming the file and the value and saying how to fix it; None for other failures."""
    import re

    text = str(err)
    found_file = re.search(r"reading file (\S+?)\.?\s", text)
    where = f" in {found_file.group(1)}" if found_file else ""
    checked = re.search(re.escape(CAST_CHECK_MARK) + r"(.*?)(?:\s+SQLSTATE|\n|$)", text)
    if checked:
        return SourceError(
            f"{description}: {checked.group(1)}; declare the column's type under the dataset's schema: "
            "(a type that holds every value), or rewrite the files with one type. Nothing was committed"
        )
    unmatched = re.search(re.escape(HIVE_CHECK_MARK) + r"(.*?)(?:\s+SQLSTATE|\n|$)", text)
    if unmatched:
        return SourceError(
            f"{description}: {unmatched.group(1)}, so its Hive directory values are unknown; check that "
            "nothing else writes under the source's directory while it is read. Nothing was committed"
        )
    mismatch = re.search(
        r"PARQUET_COLUMN_DATA_TYPE_MISMATCH\][^\n]*?(Data type mismatches[^\n]*?)(?:\s+SQLSTATE|\n|$)", text
    )
    if mismatch:
        return SchemaDriftError(
            f"{description}: {mismatch.group(1)}{where}; declare the column's type under the dataset's "
            "schema:, or rewrite the files with one type. Nothing was committed"
        )
    value = re.search(r"The value '(.*?)' of the type \S+ cannot be cast to (\S+)", text) or re.search(
        r"Cannot parse field value '(.*?)' for pattern '.*?' as the target spark data type (\S+)", text
    )
    malformed = re.search(r"Malformed records are detected in record parsing: (.*?)\.?\s*\n", text)
    if value is None and malformed is None:
        return None
    if value is not None:
        what = f"value {value.group(1)!r} cannot be read as {value.group(2).strip(chr(34))}"
    else:
        what = f"a malformed record {malformed.group(1) if malformed else ''}"
    return SourceError(
        f"{description}: {what}{where}; declare the column's type under the dataset's schema: (values with "
        "a zone offset need e.g. `timestamp[us, UTC]`), or fix the value in the file. Nothing is read as "
        "NULL in its place and nothing was committed"
    )
