"""Route Arrow rows to their partitions with the dataset's own transforms (the NULL partition included).

The partition values are computed by `Transform.apply`, the same vectorised code the refresh uses to
check staged rows (`refresh/finalize.py verify_partition`) and discovery uses to list keys, so a row a
write adds lands in the partition a refresh would put it in. Rows are grouped by the tuple of partition
values (NULL is a value like any other; one sort and one take); every row lands in exactly one group and
the counts are checked: rows in == rows routed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import ConservationError
from airflow_partitions.keys import PartitionKey

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.transforms import Transform


def partition_values(table: pa.Table, transforms: Sequence[Transform]) -> list[pa.Array]:
    """One array of partition values per field for every row of `table` (`Transform.routing_values`; a
    dictionary array stays one, its dictionary made to hold each value once)."""
    import pyarrow as pa

    arrays: list[pa.Array] = []
    for transform in transforms:
        computed = transform.routing_values(table)
        if isinstance(computed, pa.ChunkedArray):
            computed = computed.combine_chunks() if computed.num_chunks else pa.array([], computed.type)
        if pa.types.is_dictionary(computed.type) and not _groups_on_indices(computed):
            computed = _deduplicated(computed)
        arrays.append(computed)
    return arrays


def _groups_on_indices(array: pa.DictionaryArray) -> bool:
    """Whether equal indices mean equal values and the reverse: no value twice in the dictionary, and
    NULL either an entry or NULL indices, not both."""
    import pyarrow.compute as pc

    dictionary = array.dictionary
    if pc.count_distinct(dictionary, mode="all").as_py() != len(dictionary):
        return False
    return dictionary.null_count == 0 or array.indices.null_count == 0


def _deduplicated(array: pa.DictionaryArray) -> pa.DictionaryArray:
    """The same values over a dictionary holding each value once: the dictionary's entries encoded (a
    NULL entry one value of its own, which the rows with a NULL index join) and the indices mapped."""
    import pyarrow as pa
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(array.dictionary, null_encoding="encode")
    indices = pc.take(encoded.indices, array.indices)
    null_entries = [n for n, value in enumerate(encoded.dictionary.is_null().to_pylist()) if value]
    if null_entries and indices.null_count:
        indices = pc.fill_null(indices, pa.scalar(null_entries[0], indices.type))
    return pa.DictionaryArray.from_arrays(indices, encoded.dictionary)


def _group_codes(values: Sequence[pa.Array]) -> Any:
    """One integer group per row: each field's values dictionary-encoded (NULL a value of its own; a
    dictionary array's indices encoded instead of its values) and combined with the groups so far,
    re-encoded at each step so codes stay below the row count. Encoding numbers codes densely in order of
    first appearance, so the first field's codes need no second encoding."""
    import pyarrow as pa
    import pyarrow.compute as pc

    group: Any = None
    for array in values:
        plain = array.indices if pa.types.is_dictionary(array.type) else array
        encoded = pc.dictionary_encode(plain, null_encoding="encode")
        codes = encoded.indices.cast(pa.int64())
        if group is None:
            group = codes
            continue
        codes = pc.add(pc.multiply(group, len(encoded.dictionary)), codes)
        group = pc.dictionary_encode(codes).indices.cast(pa.int64())
    return group


def _key_values(array: pa.Array, rows: pa.Array) -> list[Any]:
    """The values of `array` at `rows` as Python values (a dictionary array decoded first: its own
    `to_pylist` goes through a scalar per row)."""
    import pyarrow as pa

    taken = array.take(rows)
    if pa.types.is_dictionary(taken.type):
        taken = taken.dictionary_decode()
    values: list[Any] = taken.to_pylist()
    return values


def partition_groups(table: pa.Table, transforms: Sequence[Transform]) -> tuple[pa.Array, list[PartitionKey]]:
    """Per row of `table`, the index of its partition in the returned key list (keys as `route_rows`
    computes them, without moving any row)."""
    import pyarrow as pa

    if not transforms:
        return pa.array([0] * table.num_rows, pa.int64()), [PartitionKey(())]
    import numpy as np

    values = partition_values(table, transforms)
    group = _group_codes(values)
    # Codes are dense and numbered in order of first appearance (dictionary encoding), so the running
    # maximum steps up by one at each group's first row: one linear pass finds them all.
    codes = group.to_numpy(zero_copy_only=False)
    running = np.maximum.accumulate(codes)
    first = np.searchsorted(running, np.arange(int(running[-1]) + 1), side="left")
    first_rows = pa.array(first, pa.int64())
    key_values = [_key_values(array, first_rows) for array in values]
    keys = [PartitionKey(tuple(column[position] for column in key_values)) for position in range(len(first))]
    return group, keys


def route_rows(
    table: pa.Table, transforms: Sequence[Transform], *, dataset: str = "dataset"
) -> dict[PartitionKey, pa.Table]:
    """`table`'s rows grouped by partition key: `{PartitionKey: rows}`, rows keep their input order.

    `transforms` are the dataset's bound partition transforms, in field order (none: every row goes to
    the one partition `PartitionKey(())`). Rows whose partition value is NULL go to the NULL partition.
    An empty table routes to `{}`. Raises `ConservationError` if the groups do not hold exactly the input
    rows (a routing bug must not reach a commit).
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return {}
    if not transforms:
        return {PartitionKey(()): table}
    values = partition_values(table, transforms)
    group = _group_codes(values)
    # One stable sort by group and one `take`: each partition is a slice of the sorted rows, in input order.
    order = pc.sort_indices(group)
    counts = np.bincount(group.to_numpy(zero_copy_only=False)).tolist()
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    first_rows = pc.take(order, pa.array(starts))
    key_values = [_key_values(array, first_rows) for array in values]
    ordered = table.take(order)
    routed: dict[PartitionKey, pa.Table] = {}
    for position, (start, rows) in enumerate(zip(starts.tolist(), counts, strict=True)):
        key = PartitionKey(tuple(column[position] for column in key_values))
        part = ordered.slice(start, rows)
        # Two groups can only share a key if the encoding told values apart that compare equal in Python.
        routed[key] = pa.concat_tables([routed[key], part]) if key in routed else part
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
