"""Parquet partition files are sorted and cut into row groups, so a point read skips most of a file.

Each partition's rows are sorted (by `acceleration.params.sort_by`, else by the source columns of the
bucket / mod fields), NULLs last, and written in `row_group_rows`-row groups: the row groups' min / max
then exclude each other and a reader skips all but the few that can hold a value. Sorting only reorders:
every row is still there, and the file statistics describe what was written.
"""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from airflow_partitions.exceptions import SpecValidationError, StorageError
from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.spec import parse_spec
from airflow_partitions.storage import get_storage
from airflow_partitions.storage.datafile import compute_column_stats
from airflow_partitions.storage.parquet import ROW_GROUP_ROWS, ParquetStorage
from tests.test_pruning_support import build_acceleration

HOSTILE = ["", " ", "'; DROP TABLE t; --", 'a"b', "../..", "ü\u0000x", "%2F", "\n", "NULL", "z" * 300]


def hostile_table(rows: int = 1000) -> pa.Table:
    """Rows in no particular order; `s` has NULLs and hostile strings, `k` NULLs and duplicates."""
    return pa.table(
        {
            "id": pa.array(list(range(rows)), pa.int64()),
            "k": pa.array([None if i % 37 == 0 else (i * 7919) % 97 for i in range(rows)], pa.int64()),
            "s": pa.array([None if i % 11 == 0 else HOSTILE[(i * 31) % len(HOSTILE)] for i in range(rows)]),
            "f": pa.array([float(i % 13) / 3 for i in range(rows)], pa.float64()),
        }
    )


def sorted_by_id(table: pa.Table) -> pa.Table:
    return table.sort_by("id")


def file_order(path: Path, column: str) -> list[object]:
    return pq.read_table(path, columns=[column]).column(column).to_pylist()


def written_path(root: Path, storage: ParquetStorage, table: pa.Table) -> tuple[Path, object]:
    (file,) = storage.write(table, root, "p=1")
    return root / file.path, file


def test_rows_are_sorted_nulls_last_in_row_groups_of_the_configured_size(tmp_path: Path) -> None:
    table = hostile_table()
    storage = get_storage("parquet", sort_by=["s", "k"], row_group_rows=128)
    assert isinstance(storage, ParquetStorage)
    path, file = written_path(tmp_path, storage, table)

    metadata = pq.read_metadata(path)
    sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    assert sizes == [128] * 7 + [1000 - 7 * 128], "row groups of row_group_rows rows each"
    strings = file_order(path, "s")
    present = [value for value in strings if value is not None]
    assert present == sorted(present), "sorted by s (byte order)"
    assert strings[len(present) :] == [None] * (len(strings) - len(present)), "NULLs last"
    # Within equal `s`, sorted by `k` with its NULLs last; ties keep their source order (stable).
    written = pq.read_table(path)
    expected = table.take(
        pc.sort_indices(table, sort_keys=[("s", "ascending", "at_end"), ("k", "ascending", "at_end")])
    )
    assert written.select(table.column_names).equals(expected)
    # Nothing lost or changed, and the descriptor describes the written file.
    assert sorted_by_id(storage.read(tmp_path, [file])).equals(table)
    assert file.rows == table.num_rows
    assert file.stats == compute_column_stats(expected)


def test_sorted_row_groups_have_disjoint_ranges_that_a_filter_skips(tmp_path: Path) -> None:
    table = hostile_table(4000)
    unsorted = get_storage("parquet", row_group_rows=500)
    sorted_ = get_storage("parquet", row_group_rows=500, sort_by="k")
    assert isinstance(unsorted, ParquetStorage)
    assert isinstance(sorted_, ParquetStorage)
    before, _ = written_path(tmp_path / "unsorted", unsorted, table)
    after, _ = written_path(tmp_path / "sorted", sorted_, table)

    metadata = pq.read_metadata(after)
    column = metadata.schema.to_arrow_schema().get_field_index("k")
    ranges = [
        (
            metadata.row_group(i).column(column).statistics.min,
            metadata.row_group(i).column(column).statistics.max,
        )
        for i in range(metadata.num_row_groups)
        if metadata.row_group(i).column(column).statistics.has_min_max
    ]
    for (_, high), (low, _) in itertools.pairwise(ranges):
        assert high <= low, f"row groups overlap after sorting: {ranges}"

    def row_groups_read(path: Path) -> int:
        (fragment,) = ds.dataset(str(path), format="parquet").get_fragments()
        return len(fragment.split_by_row_group(ds.field("k") == 42))

    assert row_groups_read(before) == 8, "Should read every row group: unsorted ranges all span 42"
    assert row_groups_read(after) <= 2, "Should read one row group, two if k = 42 straddles a boundary"
    expected = table.filter(pc.field("k") == 42).num_rows
    assert ds.dataset(str(after), format="parquet").to_table(filter=ds.field("k") == 42).num_rows == expected


def encodings(path: Path) -> dict[str, set[str]]:
    """Each Parquet column path's encodings over the file's row groups."""
    metadata = pq.read_metadata(path)
    found: dict[str, set[str]] = {}
    for group in range(metadata.num_row_groups):
        for index in range(metadata.num_columns):
            column = metadata.row_group(group).column(index)
            found.setdefault(column.path_in_schema, set()).update(column.encodings)
    return found


@pytest.mark.parametrize("sort_by", [["key"], ["s"], []])
def test_near_distinct_columns_are_written_without_a_dictionary_and_read_back_the_same(
    tmp_path: Path, sort_by: list[str]
) -> None:
    import datetime as dt

    import duckdb

    rows = 6000
    base = hostile_table(rows)
    start = dt.datetime(2026, 3, 1, 12, 0, 0)
    table = base.append_column("key", pa.array([(i * 7) % 50 for i in range(rows)], pa.int64()))
    table = table.append_column(
        "naive_ts",
        pa.array([None if i % 17 == 0 else start + dt.timedelta(seconds=i * 7) for i in range(rows)]),
    )
    table = table.append_column(
        "utc_ts",
        pa.array(
            [start.replace(tzinfo=dt.UTC) + dt.timedelta(microseconds=i * 977) for i in range(rows)],
            pa.timestamp("us", tz="UTC"),
        ),
    )
    table = table.append_column("label", pa.array([f"ü-{i}/=%'" for i in range(rows)]))
    table = table.append_column("dict", pa.array([HOSTILE[i % 3] for i in range(rows)]).dictionary_encode())
    table = table.append_column("empty", pa.nulls(rows, pa.float64()))
    storage = get_storage("parquet", row_group_rows=1000, sort_by=sort_by)
    path, file = written_path(tmp_path, storage, table)

    found = encodings(path)
    for near_distinct in ("id", "naive_ts", "utc_ts", "label"):
        assert "RLE_DICTIONARY" not in found[near_distinct], f"{near_distinct} written plain: {found}"
    for repeated in ("k", "s", "f", "dict"):
        assert "RLE_DICTIONARY" in found[repeated], f"{repeated} keeps its dictionary: {found}"
    assert ("DELTA_BINARY_PACKED" in found["key"]) == (sort_by == ["key"]), found
    # Nothing lost or changed: pyarrow and DuckDB read the same rows back, NULLs included.
    assert sorted_by_id(storage.read(tmp_path, [file])).equals(table)
    with duckdb.connect() as connection:
        connection.execute("SET TimeZone = 'UTC'")
        read = connection.execute(
            "SELECT count(*), count(naive_ts), count(DISTINCT utc_ts), max(label), count(empty) "
            "FROM read_parquet($path)",
            {"path": str(path)},
        ).fetchone()
    assert read == (rows, pc.count(table["naive_ts"]).as_py(), rows, max(table["label"].to_pylist()), 0)


@pytest.mark.parametrize(
    ("key_type", "delta"),
    [
        (pa.int64(), True),
        (pa.uint8(), True),
        (pa.date32(), True),
        (pa.timestamp("s", tz="UTC"), True),  # widened to milliseconds, still INT64
        (pa.string(), False),
    ],
)
def test_first_sort_column_of_integers_is_delta_encoded_the_others_keep_dictionaries(
    tmp_path: Path, key_type: pa.DataType, delta: bool
) -> None:
    import duckdb

    base = hostile_table(3000)
    keys = pc.cast(pc.if_else(pc.is_null(base["k"]), None, pc.multiply(base["k"], 2)), pa.int64())
    if pa.types.is_string(key_type):
        keys = pc.cast(keys, pa.string())
    elif pa.types.is_date(key_type):
        keys = pc.cast(pc.cast(keys, pa.int32()), key_type)
    else:
        keys = pc.cast(keys, key_type)
    table = base.append_column("key", keys).append_column(
        "nested",
        pa.array([None if i % 5 == 0 else {"x": i % 3, "s": HOSTILE[i % len(HOSTILE)]} for i in range(3000)]),
    )
    storage = get_storage("parquet", row_group_rows=500, sort_by=["key", "id"])
    path, file = written_path(tmp_path, storage, table)

    found = encodings(path)
    assert ("DELTA_BINARY_PACKED" in found["key"]) == delta, found
    assert ("RLE_DICTIONARY" in found["key"]) != delta, found
    for other in ("s", "nested.x", "nested.s", "k"):
        assert "RLE_DICTIONARY" in found[other], f"{other} should keep its dictionary: {found}"
    assert "DELTA_BINARY_PACKED" not in found["id"], "only the first sort column"
    # Nothing lost or changed: pyarrow and DuckDB read the same rows back.
    assert sorted_by_id(storage.read(tmp_path, [file])).equals(table)
    probe = table["key"][7]
    expected = (
        table.num_rows,
        pc.count(table["key"]).as_py(),
        table.filter(pc.field("key") == probe).num_rows,
    )
    with duckdb.connect() as connection:
        connection.execute("SET TimeZone = 'UTC'")
        read = connection.execute(
            "SELECT count(*), count(key), count(*) FILTER (WHERE key = $probe) FROM read_parquet($path)",
            {"path": str(path), "probe": probe.as_py()},
        ).fetchone()
    assert read == expected


def test_default_row_group_size_and_unsorted_without_sort_keys(tmp_path: Path) -> None:
    table = hostile_table()
    storage = get_storage("parquet")
    assert isinstance(storage, ParquetStorage)
    assert storage.row_group_rows == ROW_GROUP_ROWS
    assert storage.sort_by == ()
    path, _ = written_path(tmp_path, storage, table)
    assert pq.read_table(path).column("id").to_pylist() == list(range(1000)), "source order kept"


@pytest.mark.parametrize("rows", [0, -5, True, 2.5])
def test_bad_row_group_rows_is_a_storage_error(rows: object) -> None:
    with pytest.raises(StorageError, match="row_group_rows must be a positive integer"):
        get_storage("parquet", row_group_rows=rows)


def test_unsortable_column_is_a_storage_error(tmp_path: Path) -> None:
    table = pa.table({"l": pa.array([[1], [2]], pa.list_(pa.int64()))})
    with pytest.raises(StorageError, match="cannot sort partition rows by"):
        get_storage("parquet", sort_by=["l"]).write(table, tmp_path, "p=1")
    with pytest.raises(StorageError, match="no such column"):
        get_storage("parquet", sort_by=["nope"]).write(table, tmp_path, "p=1")


def spec(acceleration_params: str, *, engine: str = "parquet", schema: bool = True) -> str:
    declared = (
        "\n    schema:\n      id: int64\n      k: int64\n      s: string\n      l: list<int64>"
        if schema
        else ""
    )
    return (
        textwrap.dedent(
            f"""\
        accelerator_dir: /tmp/acc
        datasets:
          - name: events
            from: file:/tmp/events.parquet
            acceleration:
              engine: {engine}
              partition_by:
                - kb: "bucket(4, k)"
                - day: "id"
              params:
        """
        )
        + textwrap.indent(acceleration_params, " " * 8)
        + declared
        + "\n"
    )


def test_storage_from_a_spec_sorts_by_the_bucket_column_unless_sort_by_is_declared() -> None:
    default = parse_spec(spec("{}", schema=False)).dataset("events").acceleration
    assert default.sort_columns == ("k",), "bucket source columns; identity fields hold one value"
    storage = get_storage(default)
    assert isinstance(storage, ParquetStorage)
    assert storage.sort_by == ("k",)
    assert storage.row_group_rows == ROW_GROUP_ROWS
    declared = parse_spec(spec("sort_by: [s, id]\nrow_group_rows: 16384", schema=False))
    storage = get_storage(declared.dataset("events").acceleration)
    assert isinstance(storage, ParquetStorage)
    assert storage.sort_by == ("s", "id")
    assert storage.row_group_rows == 16384


def test_unknown_sort_by_column_names_its_line_and_the_columns() -> None:
    with pytest.raises(SpecValidationError) as caught:
        parse_spec(spec("sort_by: [s, kk]"))
    text = str(caught.value)
    assert "line 11" in text
    assert "acceleration.params.sort_by: unknown column 'kk'" in text
    assert "did you mean 'k'" in text
    assert "columns are id, k, s, l" in text


def test_unknown_sort_by_column_without_type_checks_names_its_line_and_the_columns() -> None:
    with pytest.raises(SpecValidationError) as caught:
        parse_spec(spec("sort_by: [s, kk]"), check_types=False)
    text = str(caught.value)
    assert "line 11" in text
    assert "acceleration.params.sort_by: unknown column 'kk' (did you mean 'k'?)" in text
    assert "schema lists id, k, s, l" in text


def test_unknown_sort_by_column_at_bind_names_its_line_and_the_columns() -> None:
    dataset = parse_spec(spec("sort_by: zzz", schema=False)).dataset("events")
    schema = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("s", pa.string())])
    with pytest.raises(SpecValidationError) as caught:
        dataset.bind(schema)
    text = str(caught.value)
    assert "line 11" in text
    assert "unknown column 'zzz'" in text
    assert "columns are id, k, s" in text


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ("sort_by: l", "column 'l' is of type list<item: int64>, which has no order"),
        ("sort_by: []", "params.sort_by must be a column name or a non-empty list"),
        ("sort_by: [s, s]", "params.sort_by lists a column twice"),
        ("sort_by: 5", "params.sort_by must be a column name"),
        ("row_group_rows: 0", "params.row_group_rows must be a positive integer"),
        ("row_group_rows: many", "params.row_group_rows must be a positive integer"),
        ("sort_bi: s", "unknown key acceleration.params.sort_bi (did you mean 'sort_by'?)"),
    ],
)
def test_bad_layout_params_are_spec_errors(params: str, fragment: str) -> None:
    with pytest.raises(SpecValidationError) as caught:
        parse_spec(spec(params))
    assert fragment in str(caught.value)
    assert "line 11" in str(caught.value)


def test_layout_params_apply_to_parquet_only() -> None:
    with pytest.raises(SpecValidationError) as caught:
        parse_spec(spec("sort_by: s", engine="arrow"))
    assert "params.sort_by applies to engine parquet only" in str(caught.value)


def test_sorted_acceleration_reads_back_exactly_the_source(tmp_path: Path) -> None:
    table = hostile_table(3000)
    built = build_acceleration(
        tmp_path,
        table,
        [("kb", "bucket(4, k)")],
        storage_options={"sort_by": ["k", "s"], "row_group_rows": 100},
    )
    for files in (entry.files for entry in built.catalog.snapshot().partitions.values()):
        for file in files:
            groups = pq.read_metadata(built.root / built.dataset / file.path).num_row_groups
            assert groups == -(-file.rows // 100), "row groups of 100 rows"
    with PartitionedDatasetReader(built.spec_path, built.dataset) as reader:
        assert sorted_by_id(reader.read()).equals(table)
        expected = table.filter(pc.field("k") == 42)
        assert sorted_by_id(reader.read("k = 42")).equals(expected)
        assert sorted_by_id(reader.read("s IS NULL")).equals(table.filter(pc.field("s").is_null()))
