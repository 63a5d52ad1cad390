"""The modulo transform `col % N` with SQL semantics: the remainder takes the sign of the dividend.

`-7 % 3` is -1 (as in Spark, DuckDB and Postgres), so a signed column spans partitions -(N-1)..N-1.
The result has the column's integer type; a remainder always fits it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow_partitions.transforms.base import Transform

if TYPE_CHECKING:
    import pyarrow as pa


class ModTransform(Transform):
    """`col % N` over integer columns."""

    name: ClassVar[str] = "mod"
    accepts: ClassVar[str] = "integer columns"

    def __init__(self, source_column: str, modulus: int) -> None:
        super().__init__(source_column)
        if modulus <= 0:
            raise ValueError(f"modulus must be positive, got {modulus}")
        self.modulus = modulus

    @property
    def canonical(self) -> str:
        return f"{self.column_sql} % {self.modulus}"

    @property
    def monotonic(self) -> bool:
        return False

    def _result_type(self, source_type: pa.DataType) -> pa.DataType | None:
        from airflow_partitions.transforms import arrow_support as support  # lazy: loads pyarrow

        return source_type if support.is_integer(source_type) else None

    def _apply_array(self, values: pa.Array) -> pa.Array:
        import numpy as np

        from airflow_partitions.transforms import arrow_support as support  # lazy: loads pyarrow

        data_type = values.type
        dtype = np.dtype(data_type.to_pandas_dtype())
        raw = support.fixed_width_values(values, dtype)
        if support.is_unsigned_integer(data_type):
            remainder = np.remainder(raw.astype(np.uint64), np.uint64(self.modulus))
        else:
            # fmod truncates toward zero, so the remainder has the dividend's sign: SQL semantics.
            remainder = np.fmod(raw.astype(np.int64), np.int64(min(self.modulus, support.INT64_MAX)))
        return support.from_numpy(remainder.astype(dtype), data_type, values)

    def _apply_scalar(self, value: Any) -> int:
        value = self._coerce_scalar(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._scalar_error(value, "an int")
        remainder = abs(value) % self.modulus
        return -remainder if value < 0 else remainder

    def _spark_form(self, column: Any, source: pa.DataType) -> Any:
        from airflow_partitions.transforms import spark  # lazy: loads pyspark

        return spark.mod_column(column, source, self.modulus)
