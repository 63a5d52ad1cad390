"""Routing rows to partitions and merging rows on keys: the primitives every write (and refresh mode) uses."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_partitions.exceptions import WriteKeyError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.write.merge import (
    check_key_columns,
    check_unique_keys,
    delete_rows_by_key,
    delete_rows_matching,
    key_match_mask,
    upsert_rows,
)
from airflow_partitions.write.routing import partition_groups, route_rows, route_to_paths
from tests.matrix_support import SCHEMA, bound_transforms, hostile_chunks, multiset_difference, rows_by_key

LAYOUTS = [
    [("b", "bucket(8, id)")],
    [("s", "s"), ("day", "date_trunc('day', ts)")],
    [("m", "n_int % 5"), ("flag", "flag"), ("y", "year(d)")],
    [("t", "truncate(1000, amount)"), ("h", "hour(ts_naive)")],
    # CASE over string literals routes on indices into its literals (`routing_values`): no ELSE (a NULL
    # partition), one literal in two branches, the one-branch form, beside a second field.
    [("band", "CASE WHEN id > 0 THEN 'pos' WHEN id < -100 THEN 'neg' END"), ("s", "s")],
    [
        (
            "tag",
            "CASE WHEN n_int > 0 THEN 'x' WHEN n_int IS NULL THEN 'y' WHEN n_int < -9 THEN 'x' ELSE 'z' END",
        )
    ],
    [("late", "CASE WHEN s > 'm' THEN 'late' ELSE 'early' END"), ("flag", "flag")],
    [("early", "CASE WHEN s > 'm' THEN 'late' ELSE 'early' END")],
]


@pytest.fixture(scope="module")
def hostile() -> pa.Table:
    return pa.concat_tables(hostile_chunks(seed=16, rows=300))


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: ",".join(e for _, e in layout))
def test_route_rows_matches_the_transforms_row_by_row(
    hostile: pa.Table, layout: list[tuple[str, str]]
) -> None:
    routed = route_to_paths(hostile, bound_transforms(layout, SCHEMA), [name for name, _ in layout])
    expected = rows_by_key(hostile, layout)
    assert set(routed) == set(expected), "every partition a row belongs to, and no other, is routed"
    for path, (key, rows) in routed.items():
        assert key.path([name for name, _ in layout]) == path
        assert multiset_difference(rows, expected[path]) == ([], []), f"rows of {path} differ"
    assert sum(rows.num_rows for _, rows in routed.values()) == hostile.num_rows


def test_route_rows_keeps_the_null_partition_and_input_order() -> None:
    table = pa.table({"id": pa.array([5, None, 3, None, 5], pa.int64()), "v": ["a", "b", "c", "d", "e"]})
    routed = route_rows(table, bound_transforms([("id", "id")], table.schema))
    assert routed[PartitionKey((None,))].column("v").to_pylist() == ["b", "d"]
    assert routed[PartitionKey((5,))].column("v").to_pylist() == ["a", "e"]
    assert routed[PartitionKey((3,))].column("v").to_pylist() == ["c"]


def test_route_rows_groups_dictionary_columns_by_value() -> None:
    """A dictionary column routes by its values: a dictionary holding a value twice or a NULL is decoded
    first, one of distinct values is grouped on its indices (unused entries make no partition)."""
    repeated = pa.DictionaryArray.from_arrays(
        pa.array([0, 1, 2, 3, None, 1], pa.int8()), pa.array(["a", "a", None, "b"])
    )
    distinct = pa.DictionaryArray.from_arrays(
        pa.array([2, None, 2, 0], pa.int32()), pa.array(["x", "unused", "y"])
    )
    for column, expected in [
        (repeated, {("a",): ["r0", "r1", "r5"], (None,): ["r2", "r4"], ("b",): ["r3"]}),
        (distinct, {("y",): ["r0", "r2"], (None,): ["r1"], ("x",): ["r3"]}),
    ]:
        table = pa.table({"c": column, "v": [f"r{n}" for n in range(len(column))]})
        schema = pa.schema([("c", pa.string()), ("v", pa.string())])
        transforms = bound_transforms([("c", "c")], schema)
        routed = route_rows(table, transforms)
        assert {key.values: rows.column("v").to_pylist() for key, rows in routed.items()} == expected
        # One group per value (the streaming refresh writes a group's rows under its key's path).
        group, keys = partition_groups(table, transforms)
        assert len(set(keys)) == len(keys) == len(expected)
        assert [keys[code].values[0] for code in group.to_pylist()] == column.to_pylist()


REPEATING = ["EU", "eu", "Ünïcode", "ß", "ΣΑΣ", "", None, " a/b=c ", "100%", "İx", "'q'", "x" * 40]


@pytest.mark.parametrize(
    "text",
    [
        "coalesce(s, 'none')",
        "lower(s)",
        "CASE WHEN s IS NULL THEN 'n' ELSE upper(left(s, 1)) END",
        "bucket(4, lower(s))",
        "length(s)",
        "regexp_extract(s, '([a-z]+)', 1)",
        "nullif(trim(s), '')",
    ],
)
def test_routing_evaluates_repeating_strings_once_each(text: str) -> None:
    """Over a string column whose values repeat, routing evaluates an expression on each distinct value
    (NULL included: `coalesce(s, 'none')`) and spreads it by index: the same values as `apply` row by
    row, and each row's key is its value. All-distinct strings are evaluated row by row."""
    from airflow_partitions.write.routing import partition_groups

    rows = [REPEATING[(n * 7) % len(REPEATING)] for n in range(5000)]
    for values, encoded in [(rows, True), ([f"{v}{n}" for n, v in enumerate(rows)], False)]:
        table = pa.table({"s": pa.array(values, pa.string())})
        (transform,) = bound_transforms([("p", text)], table.schema)
        expected = transform.apply_table(table).to_pylist()
        routing = transform.routing_values(table)
        assert pa.types.is_dictionary(routing.type) is encoded, text
        assert routing.to_pylist() == expected, text
        group, keys = partition_groups(table, [transform])
        assert len(set(keys)) == len(keys), text
        assert [keys[code].values[0] for code in group.to_pylist()] == expected, text


def test_route_rows_without_fields_and_without_rows() -> None:
    table = pa.table({"id": [1, 2]})
    assert route_rows(table, []) == {PartitionKey(()): table}
    assert route_rows(table.slice(0, 0), bound_transforms([("id", "id")], table.schema)) == {}


def _people(ids: list[int | None], names: list[str | None]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array(names, pa.string())})


def test_upsert_replaces_matching_keys_null_safe_and_appends_new_ones() -> None:
    existing = _people([1, 2, None, 4], ["a", "b", "null-id", "d"])
    incoming = _people([2, None, 9], ["B", "NULL-ID", "i"])
    merged = upsert_rows(existing, incoming, ["id"])
    assert (merged.kept, merged.removed, merged.added, merged.rows) == (2, 2, 3, 5)
    assert sorted(merged.table.to_pylist(), key=repr) == sorted(
        [
            {"id": 1, "name": "a"},
            {"id": 4, "name": "d"},
            {"id": 2, "name": "B"},
            {"id": None, "name": "NULL-ID"},
            {"id": 9, "name": "i"},
        ],
        key=repr,
    )


def test_upsert_on_two_key_columns_and_a_separate_replace_set() -> None:
    existing = pa.table({"a": [1, 1, 2, None], "b": ["x", "y", "x", None], "v": [1, 2, 3, 4]})
    incoming = pa.table({"a": [1], "b": ["y"], "v": [20]})
    moved_away = pa.table({"a": pa.array([None], pa.int64()), "b": pa.array([None], pa.string())})
    merged = upsert_rows(
        existing, incoming, ["a", "b"], replaces=pa.concat_tables([incoming.select(["a", "b"]), moved_away])
    )
    assert merged.removed == 2, "the (1, y) row is replaced and the (NULL, NULL) row moved elsewhere"
    assert sorted(merged.table.column("v").to_pylist()) == [1, 3, 20]


def test_delete_by_key_and_by_mask() -> None:
    existing = _people([1, 2, None, 4], ["a", "b", "c", "d"])
    deleted = delete_rows_by_key(existing, _people([None, 4, 99], [None, None, None]).select(["id"]), ["id"])
    assert (deleted.kept, deleted.removed) == (2, 2)
    assert deleted.table.column("id").to_pylist() == [1, 2]
    masked = delete_rows_matching(existing, pa.array([True, None, False, True]))
    assert masked.table.column("name").to_pylist() == ["b", "c"], "a NULL condition keeps the row"


def test_key_match_mask_on_hostile_types(hostile: pa.Table) -> None:
    keys = ["s", "ts", "amount", "d"]
    probe = hostile.slice(10, 40)
    mask = key_match_mask(hostile, probe.select(keys), keys).to_pylist()
    probe_keys = {tuple(row[k] for k in keys) for row in probe.select(keys).to_pylist()}
    expected = [tuple(row[k] for k in keys) in probe_keys for row in hostile.select(keys).to_pylist()]
    assert mask == expected


def test_key_checks_refuse_what_cannot_be_a_key() -> None:
    with pytest.raises(WriteKeyError, match="needs key columns"):
        check_key_columns(SCHEMA, [])
    with pytest.raises(WriteKeyError, match=r"\['nope'\] are not columns"):
        check_key_columns(SCHEMA, ["id", "nope"])
    with pytest.raises(WriteKeyError, match=r"repeat key \['id'\] values, e.g. \[\(None,\), \(1,\)\]"):
        check_unique_keys(_people([None, 1, 1, None, 2], ["a"] * 5), ["id"])
    check_unique_keys(_people([None, 1, 2], ["a"] * 3), ["id"])
