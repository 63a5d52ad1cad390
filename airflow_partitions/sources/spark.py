"""Arrow -> Spark schema mapping shared by every source's Spark reader and the refresh stage."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa


def spark_schema(schema: pa.Schema) -> Any:
    """The Spark StructType of an Arrow schema, in the Spark form `Transform.to_spark` expects.

    Naive timestamps map to TIMESTAMP_NTZ (no zone shift), unsigned integers widen; types without a
    partition-transform mapping (floats, nested types) use pyspark's own Arrow conversion.
    """
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import from_arrow_type

    from airflow_partitions.exceptions import PartitionExpressionError
    from airflow_partitions.transforms.spark import spark_type_for

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
