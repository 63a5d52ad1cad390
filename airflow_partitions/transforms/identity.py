"""The identity transform: a plain column is its own partition value (one partition per distinct value)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow_partitions.transforms.base import Interval, OrderPreservingTransform, Transform

if TYPE_CHECKING:
    import pyarrow as pa


class IdentityTransform(OrderPreservingTransform):
    """`col`: the value itself; tz-aware timestamps are expressed in UTC."""

    name: ClassVar[str] = "identity"
    accepts: ClassVar[str] = "string, integer, boolean, date and timestamp columns"

    @property
    def canonical(self) -> str:
        return self.column_sql

    @property
    def one_to_one(self) -> bool:
        return True

    def values_of(self, other: Transform, partition_values: Any) -> Any:
        # Identity partition values are the source values: any transform of the column follows.
        return partition_values if other == self else other.apply(partition_values)

    def routing_values(self, table: Any) -> Any:
        import pyarrow as pa

        # A dictionary column of the values themselves routes on its indices (no decoding).
        column = table.column(self.source_column)
        if pa.types.is_dictionary(column.type) and column.type.value_type.equals(self.result_type):
            return column
        return super().routing_values(table)

    def _result_type(self, source_type: pa.DataType) -> pa.DataType | None:
        import pyarrow as pa

        if pa.types.is_timestamp(source_type) and source_type.tz is not None:
            return pa.timestamp(source_type.unit, "UTC")
        return source_type

    def _apply_array(self, values: pa.Array) -> pa.Array:
        import pyarrow as pa

        if pa.types.is_timestamp(values.type) and values.type.tz is not None:
            # Same instants, stored identically: only the zone label changes.
            return values.view(pa.timestamp(values.type.unit, "UTC"))
        return values

    def _apply_scalar(self, value: Any) -> Any:
        return self._coerce_scalar(value)

    def _spark_form(self, column: Any, source: pa.DataType) -> Any:
        from airflow_partitions.transforms import spark  # lazy: loads pyspark

        return spark.identity_column(column, source)

    def preimage(self, partition_value: Any) -> Interval | None:
        if partition_value is None:
            return None
        value = self._coerce_scalar(partition_value)
        return Interval(value, value, lower_inclusive=True, upper_inclusive=True)
