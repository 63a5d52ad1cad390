"""Side-index settings of `acceleration.params` (`index_columns`, `index_fpp`, `index_max_values`,
`index_max_bytes`) and the column types an index supports; `storage/side_index.py` builds the indexes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

DEFAULT_FPP = 0.01
DEFAULT_MAX_VALUES = 64
DEFAULT_MAX_BYTES = 64 * 1024
# One split-block bloom filter block: eight 32-bit words.
BLOCK_BYTES = 32
# The largest bloom filter a file may keep per column (it lives in the catalog entry).
MAX_BYTES = 16 * 1024 * 1024
INDEX_PARAMS = ("index_columns", "index_fpp", "index_max_values", "index_max_bytes")


def declared_index_columns(params: Mapping[str, Any]) -> tuple[str, ...]:
    """`params.index_columns` as a tuple (empty when absent or malformed: `index_params_problem` says)."""
    columns = params.get("index_columns")
    if isinstance(columns, list | tuple) and all(isinstance(c, str) for c in columns):
        return tuple(columns)
    return ()


def index_params_problem(params: Mapping[str, Any]) -> str | None:
    """What is wrong with the side-index settings in `acceleration.params`, or None."""
    if not any(key in params for key in INDEX_PARAMS):
        return None
    if "index_columns" not in params:
        return "params.index_fpp / index_max_values / index_max_bytes need params.index_columns"
    return index_settings_problem(
        params.get("index_columns"),
        params.get("index_fpp", DEFAULT_FPP),
        params.get("index_max_values", DEFAULT_MAX_VALUES),
        params.get("index_max_bytes", DEFAULT_MAX_BYTES),
    )


def index_settings_problem(columns: object, fpp: object, max_values: object, max_bytes: object) -> str | None:
    """What is wrong with index settings as `acceleration.params` spell them, or None."""
    if not isinstance(columns, list | tuple) or not all(isinstance(c, str) and c for c in columns):
        return (
            f"params.index_columns must be a list of column names, e.g. [user_id, country], got {columns!r}"
        )
    if len(set(columns)) != len(columns):
        return f"params.index_columns lists a column twice: {list(columns)!r}"
    if isinstance(fpp, bool) or not isinstance(fpp, int | float) or not 0.0 < float(fpp) < 0.5:
        return f"params.index_fpp must be a false-positive rate between 0 and 0.5 (e.g. 0.01), got {fpp!r}"
    if isinstance(max_values, bool) or not isinstance(max_values, int) or not 0 <= max_values <= 4096:
        return f"params.index_max_values must be an integer from 0 to 4096 (e.g. 64), got {max_values!r}"
    if (
        isinstance(max_bytes, bool)
        or not isinstance(max_bytes, int)
        or not BLOCK_BYTES <= max_bytes <= MAX_BYTES
    ):
        return (
            f"params.index_max_bytes must be an integer from {BLOCK_BYTES} to {MAX_BYTES} (bytes of one "
            f"column's bloom filter in one file), got {max_bytes!r}"
        )
    return None


def index_kind(arrow_type: pa.DataType) -> str | None:
    """The hashing kind of a column type, or None when side indexes do not support it."""
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        return index_kind(arrow_type.value_type)
    if pa.types.is_integer(arrow_type):
        return "integer"
    if pa.types.is_boolean(arrow_type):
        return "boolean"
    if pa.types.is_date(arrow_type):
        return "date"
    if pa.types.is_timestamp(arrow_type):
        return "timestamptz" if arrow_type.tz is not None else "timestamp"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "string"
    if pa.types.is_string_view(arrow_type):
        return "string"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return "binary"
    if pa.types.is_fixed_size_binary(arrow_type) or pa.types.is_binary_view(arrow_type):
        return "binary"
    return None


def index_type_problem(column: str, arrow_type: pa.DataType) -> str | None:
    """Why `column` cannot have a side index, or None."""
    if index_kind(arrow_type) is not None:
        return None
    return (
        f"column {column!r} is of type {arrow_type}; index columns must be integer, boolean, date, "
        "timestamp, string or binary columns (floats and decimals compare by value across encodings, "
        "nested types have no equality filter): remove it from params.index_columns"
    )
