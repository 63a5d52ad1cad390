"""Route Arrow rows to their partitions with the dataset's own transforms (the NULL partition included).

The partition values are computed by `Transform.apply`, the same vectorised code the refresh uses to
check staged rows (`refresh/finalize.py verify_partition`) and discovery uses to list keys, so a row a
write adds lands in the partition a refresh would put it in. Rows are grouped by the tuple of partition
values in one Arrow group-by (NULL is a value like any other); every row lands in exactly one group and
the counts are checked: rows in == rows routed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from airflow_partitions.exceptions import ConservationError
from airflow_partitions.keys import PartitionKey

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.transforms import Transform

# Column names that cannot collide with a dataset's own columns (the grouping table holds only these).
_ROW_COLUMN = "__ap_row"


def partition_values(table: pa.Table, transforms: Sequence[Transform]) -> list[pa.Array]:
    """One array of partition values per field for every row of `table` (dictionaries decoded)."""
    import pyarrow as pa

    arrays: list[pa.Array] = []
    for transform in transforms:
        computed = transform.apply(table.column(transform.source_column))
        if isinstance(computed, pa.ChunkedArray):
            computed = computed.combine_chunks() if computed.num_chunks else pa.array([], computed.type)
        if pa.types.is_dictionary(computed.type):
            computed = computed.cast(computed.type.value_type)
        arrays.append(computed)
    return arrays


def route_rows(
    table: pa.Table, transforms: Sequence[Transform], *, dataset: str = "dataset"
) -> dict[PartitionKey, pa.Table]:
    """`table`'s rows grouped by partition key: `{PartitionKey: rows}`, rows keep their input order.

    `transforms` are the dataset's bound partition transforms, in field order (none: every row goes to
    the one partition `PartitionKey(())`). Rows whose partition value is NULL go to the NULL partition.
    An empty table routes to `{}`. Raises `ConservationError` if the groups do not hold exactly the input
    rows (a routing bug must not reach a commit).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return {}
    if not transforms:
        return {PartitionKey(()): table}
    values = partition_values(table, transforms)
    names = [f"__ap_k{i}" for i in range(len(values))]
    grouping = pa.table(
        {**dict(zip(names, values, strict=True)), _ROW_COLUMN: pa.array(range(table.num_rows), pa.int64())}
    )
    groups = grouping.group_by(names, use_threads=False).aggregate([(_ROW_COLUMN, "list")])
    rows_column = groups.column(f"{_ROW_COLUMN}_list")
    key_columns = [groups.column(name).to_pylist() for name in names]
    routed: dict[PartitionKey, pa.Table] = {}
    for position in range(groups.num_rows):
        key = PartitionKey(tuple(column[position] for column in key_columns))
        indices = rows_column[position].values
        # Input order within a partition, whatever order the aggregation collected the indices in.
        rows = table.take(pc.take(indices, pc.array_sort_indices(indices)))
        # Two groups can only share a key if the group-by told values apart that compare equal in Python.
        routed[key] = pa.concat_tables([routed[key], rows]) if key in routed else rows
    check_routed(dataset, table.num_rows, routed)
    return routed


def check_routed(dataset: str, rows_in: int, routed: dict[PartitionKey, pa.Table]) -> None:
    """Rows in == rows over every routed partition, else `ConservationError` (nothing is written)."""
    total = sum(part.num_rows for part in routed.values())
    if total != rows_in:
        raise ConservationError(
            dataset,
            {"[all routed partitions]": (rows_in, total)},
            expected="rows given to the write",
            actual="rows routed to partitions",
            hint="Routing lost or duplicated rows; nothing was written. Report this with the input.",
        )


def route_to_paths(
    table: pa.Table, transforms: Sequence[Transform], names: Sequence[str], *, dataset: str = "dataset"
) -> dict[str, tuple[PartitionKey, pa.Table]]:
    """`route_rows` keyed by the canonical key path (`PartitionKey.path(names)`), as the catalog keys them."""
    return {
        key.path(names): (key, rows) for key, rows in route_rows(table, transforms, dataset=dataset).items()
    }
