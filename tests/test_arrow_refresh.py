"""strategy="arrow": one in-process pyarrow read of the source, routed with the dataset's transforms and
written by the dataset's engine, keeps every row.

Real parquet sources of hostile rows (NULLs in every column, partition columns included; unicode, `/ = %`
and quotes), real engines, read back through `PartitionedDatasetHook` and compared with the source by
row digest; filters compared with DuckDB over the source rows. No Spark: the path needs none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from matrix_support import (
    DuckDBOracle,
    FilterGenerator,
    hostile_chunks,
    multiset_difference,
    rows_by_key,
)

from airflow_partitions.exceptions import ConservationError, RefreshError
from airflow_partitions.refresh import refresh_dataset
from airflow_partitions.refresh.pipeline import load_project
from airflow_partitions.table import open_handle

DATASET = "m"
# NULL keys in every field: `s`, `d` and `flag` are NULL in some hostile rows.
COMPOSITE = (("cb", "bucket(4, s)"), ("cy", "date_part('year', d)"), ("cf", "flag"))
IDENTITY = (("sk", "s"),)


def write_source(root: Path, chunks: list[pa.Table]) -> None:
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    for index, chunk in enumerate(chunks):
        pq.write_table(chunk, src / f"chunk{index}.parquet")


def write_spec(
    root: Path, engine: str, fields: tuple[tuple[str, str], ...], *, extra: tuple[str, ...] = ()
) -> Path:
    lines = [
        f"accelerator_dir: {root / 'acc'}",
        "datasets:",
        f"  - name: {DATASET}",
        f"    from: file:{root / 'src'}",
        "    params: {file_format: parquet}",
        "    acceleration:",
        f"      engine: {'duckdb' if engine.startswith('duckdb') else engine}",
    ]
    if engine == "duckdb_tables":
        lines.append("      params: {partition_mode: tables}")
    lines += list(extra)
    lines.append("      partition_by:")
    lines += [f'        - {name}: "{expression}"' for name, expression in fields]
    path = root / "datasets.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def read_back(spec: Path, where: str | None = None) -> pa.Table:
    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

    hook = PartitionedDatasetHook(dataset=DATASET, spec_path=str(spec))
    try:
        return hook.read(where) if where else hook.read()
    finally:
        hook.reader.close()


def conformed(got: pa.Table, expected: pa.Table) -> pa.Table:
    assert set(got.column_names) == set(expected.column_names)
    return pa.table([got.column(f.name).cast(f.type) for f in expected.schema], schema=expected.schema)


def assert_same_rows(got: pa.Table, expected: pa.Table, what: str) -> None:
    missing, extra = multiset_difference(conformed(got, expected), expected)
    assert (not missing, not extra) == (True, True), (
        f"{what}: {got.num_rows} rows read, {expected.num_rows} expected; {len(missing)} missing "
        f"(e.g. {missing[:2]}), {len(extra)} extra (e.g. {extra[:2]})"
    )


def catalog_version(spec: Path) -> int | None:
    project = load_project(spec)
    snapshot = open_handle(project, project.dataset(DATASET)).catalog.latest()
    return snapshot.version if snapshot is not None else None


@pytest.mark.parametrize("engine", ["parquet", "arrow", "duckdb_files", "duckdb_tables"])
def test_full_arrow_refresh_equals_the_source_with_null_keys(tmp_path: Path, engine: str) -> None:
    chunks = hostile_chunks(11 + len(engine), rows=180)
    write_source(tmp_path, chunks)
    spec = write_spec(tmp_path, engine, COMPOSITE)
    expected = pa.concat_tables(chunks)
    summary = refresh_dataset(spec, DATASET, strategy="arrow")
    assert summary.stage_mode == "arrow"
    assert summary.rows == expected.num_rows
    assert summary.conservation is not None
    assert summary.conservation["written"] == expected.num_rows
    got = conformed(read_back(spec), expected)
    assert_same_rows(got, expected, f"{engine}: full read after an arrow refresh")
    # Every field has NULL keys, each written as a partition of its own holding exactly its rows.
    keys = rows_by_key(expected, COMPOSITE)
    for name, _ in COMPOSITE:
        assert any(f"{name}=%NULL" in key for key in keys), f"the data has no NULL {name} key"
    assert summary.refreshed == len(keys)
    got_groups = rows_by_key(got, COMPOSITE)
    assert set(got_groups) == set(keys)
    for key, rows in keys.items():
        assert_same_rows(got_groups[key], rows, f"partition {key}")
    if engine != "parquet":
        return  # filters: once (the read path is the same for every engine)
    # Filtered reads equal DuckDB over the source rows.
    generator = FilterGenerator(expected, [expression for _, expression in COMPOSITE], seed=7)
    oracle = DuckDBOracle(generator.oracle_table())
    try:
        for matrix_filter in generator.filters(8):
            want = expected.take(pa.array(oracle.rows(matrix_filter.oracle_sql), pa.int64()))
            assert_same_rows(read_back(spec, matrix_filter.reader_sql), want, matrix_filter.reader_sql)
    finally:
        oracle.close()
    # Nothing changed: the next plan refreshes nothing and the catalog stays.
    version = catalog_version(spec)
    again = refresh_dataset(spec, DATASET, strategy="arrow")
    assert again.refreshed == 0
    assert catalog_version(spec) == version


def test_schema_drift_between_files_is_unified(tmp_path: Path) -> None:
    chunks = hostile_chunks(23)
    # The first file stores `n_int` as int32 (values that do not fit become NULL) and has no `flag`
    # column at all (NULL there).
    first = chunks[0]
    small = pa.array([v if v is None or abs(v) < 2**31 else None for v in first.column("n_int").to_pylist()])
    first = first.set_column(first.schema.get_field_index("n_int"), "n_int", small.cast(pa.int32()))
    first = first.drop_columns(["flag"])
    write_source(tmp_path, [first, *chunks[1:]])
    spec = write_spec(tmp_path, "parquet", IDENTITY)
    expected_first = first.set_column(
        first.schema.get_field_index("n_int"), "n_int", first.column("n_int").cast(pa.int64())
    ).append_column("flag", pa.nulls(first.num_rows, pa.bool_()))
    expected = pa.concat_tables([expected_first.select(chunks[1].column_names), *chunks[1:]])
    refresh_dataset(spec, DATASET, strategy="arrow")
    assert_same_rows(read_back(spec), expected, "full read over drifting files")


def test_a_selection_refreshes_only_the_selected_partitions(tmp_path: Path) -> None:
    chunks = hostile_chunks(31)
    write_source(tmp_path, chunks)
    spec = write_spec(tmp_path, "parquet", IDENTITY)
    old = pa.concat_tables(chunks)
    refresh_dataset(spec, DATASET, strategy="arrow")
    # New rows land in every partition; only one is refreshed.
    extra = hostile_chunks(32, rows=120, chunks=1)[0]
    extra = extra.set_column(0, "id", pa.array(range(10_000, 10_000 + extra.num_rows), pa.int64()))
    pq.write_table(extra, tmp_path / "src" / "chunk9.parquet")
    new = pa.concat_tables([old, extra])
    old_groups, new_groups = rows_by_key(old, IDENTITY), rows_by_key(new, IDENTITY)
    changed = sorted(
        k for k in new_groups if k in old_groups and new_groups[k].num_rows != old_groups[k].num_rows
    )
    assert changed, "the extra rows must change a committed partition"
    chosen = changed[0]
    summary = refresh_dataset(spec, DATASET, strategy="arrow", partitions=[chosen])
    assert summary.refreshed == 1
    got_groups = rows_by_key(conformed(read_back(spec), old), IDENTITY)
    assert set(got_groups) == set(old_groups)
    for key, rows in got_groups.items():
        want = new_groups[key] if key == chosen else old_groups[key]
        assert_same_rows(rows, want, f"partition {key}")
    # A plain refresh brings the rest.
    refresh_dataset(spec, DATASET, strategy="arrow")
    assert_same_rows(read_back(spec), new, "full read after a plain refresh")


def test_a_where_selection_refreshes_matching_partitions(tmp_path: Path) -> None:
    chunks = hostile_chunks(41)
    write_source(tmp_path, chunks)
    spec = write_spec(tmp_path, "parquet", COMPOSITE)
    expected = pa.concat_tables(chunks)
    summary = refresh_dataset(spec, DATASET, strategy="arrow", where="cf IS NULL")
    got = conformed(read_back(spec), expected)
    want = expected.filter(pa.compute.is_null(expected.column("flag")))
    assert_same_rows(got, want, "rows of the selected (cf IS NULL) partitions")
    assert summary.refreshed == len(rows_by_key(want, COMPOSITE))


def test_a_count_mismatch_publishes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_partitions.storage.parquet import ParquetStorage

    chunks = hostile_chunks(51)
    write_source(tmp_path, chunks)
    spec = write_spec(tmp_path, "parquet", IDENTITY)
    refresh_dataset(spec, DATASET, strategy="arrow")
    version = catalog_version(spec)
    committed = sorted(p.relative_to(tmp_path) for p in (tmp_path / "acc").rglob("*.parquet"))
    pq.write_table(
        hostile_chunks(52, rows=30, chunks=1)[0].set_column(
            0, "id", pa.array(range(20_000, 20_030), pa.int64())
        ),
        tmp_path / "src" / "chunk7.parquet",
    )
    real = ParquetStorage.count_rows

    def one_short(self: Any, dataset_root: Path, file: Any) -> int:
        return int(real(self, dataset_root, file)) - 1

    monkeypatch.setattr(ParquetStorage, "count_rows", one_short)
    with pytest.raises(ConservationError) as caught:
        refresh_dataset(spec, DATASET, strategy="arrow")
    error = caught.value
    assert error.partitions, "the error names the partitions"
    for path, (want, got) in error.partitions.items():
        assert want == got + 1, f"{path}: both counts named ({want}, {got})"
    first, (want, got) = sorted(error.partitions.items())[0]
    assert f"{first}: {want} expected rows, {got} rows found" in str(error)
    assert "rows read vs rows in the written files" in str(error)
    assert catalog_version(spec) == version, "nothing published"
    monkeypatch.undo()
    left = sorted(p.relative_to(tmp_path) for p in (tmp_path / "acc").rglob("*.parquet"))
    assert left == committed, "the refused files were removed"


def test_append_mode_is_refused_with_what_to_use(tmp_path: Path) -> None:
    chunks = hostile_chunks(61)
    write_source(tmp_path, chunks)
    spec = write_spec(
        tmp_path,
        "parquet",
        IDENTITY,
        extra=("      refresh_mode: append", "      refresh: {watermark_column: id}"),
    )
    refresh_dataset(spec, DATASET, strategy="arrow")  # the first refresh writes whole partitions
    version = catalog_version(spec)
    pq.write_table(
        hostile_chunks(62, rows=30, chunks=1)[0].set_column(
            0, "id", pa.array(range(30_000, 30_030), pa.int64())
        ),
        tmp_path / "src" / "chunk8.parquet",
    )
    with pytest.raises(
        RefreshError, match=r"strategy 'arrow' does not support refresh_mode 'append'.*'spark'"
    ):
        refresh_dataset(spec, DATASET, strategy="arrow")
    assert catalog_version(spec) == version


def test_stage_refresh_refuses_arrow_with_where_it_runs() -> None:
    from airflow_partitions.refresh.stage import choose_mode

    with pytest.raises(RefreshError, match=r"refresh --strategy arrow"):
        choose_mode(None, [], "arrow")  # type: ignore[arg-type]


@pytest.mark.parametrize("allow_partial", [True, False])
def test_a_failing_partition_is_recorded_like_the_spark_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, allow_partial: bool
) -> None:
    """One partition's write fails after its files are written. `allow_partial`: the good partitions are
    published with their new rows, the failed one keeps its previous version's rows and its error is in
    the failure store; without it nothing is committed (`PartitionsFailedError`), the error recorded too.
    The files written for the failed partition are removed either way (without `allow_partial`, every
    file the refresh wrote), and the next refresh clears the record."""
    from airflow_partitions.exceptions import PartitionsFailedError
    from airflow_partitions.refresh import arrow_write as arrow_write_module
    from airflow_partitions.refresh.failures import FailureStore

    first = hostile_chunks(61, rows=240)
    write_source(tmp_path, first)
    spec = write_spec(tmp_path, "parquet", IDENTITY)
    refresh_dataset(spec, DATASET, strategy="arrow")
    version = catalog_version(spec)
    committed = set((tmp_path / "acc").rglob("*.parquet"))
    new = hostile_chunks(62, rows=60, chunks=1)[0]
    new = new.set_column(0, "id", pa.array(range(30_000, 30_000 + new.num_rows), pa.int64()))
    pq.write_table(new, tmp_path / "src" / "chunk9.parquet")
    before, added = rows_by_key(pa.concat_tables(first), IDENTITY), rows_by_key(new, IDENTITY)
    failing = "sk=%NULL"
    assert failing in before, "the NULL partition exists"
    assert failing in added, "the NULL partition changes"
    assert len(set(added) - {failing}) >= 2, "other partitions change too"
    real = arrow_write_module.written_entry

    def fail_one(item: Any, *args: Any) -> Any:
        # After the partition's files are written: they must go.
        assert list((tmp_path / "acc" / DATASET / item.key_path).glob("*.parquet")), "files written"
        if item.key_path == failing:
            raise OSError(f"disk full while writing {item.key_path}")
        return real(item, *args)

    monkeypatch.setattr(arrow_write_module, "written_entry", fail_one)
    project = load_project(spec)
    store = FailureStore.for_catalog(open_handle(project, project.dataset(DATASET)).catalog)
    if allow_partial:
        summary = refresh_dataset(spec, DATASET, strategy="arrow", allow_partial=True)
        assert set(summary.failed) == {failing}
        assert "OSError: disk full while writing sk=%NULL" in summary.failed[failing]
        assert catalog_version(spec) != version, "the good partitions were published"
        expected = pa.concat_tables([*first, new])
        keep = pa.array([key != failing for key in _keys_of(expected)])
        want = pa.concat_tables([expected.filter(keep), before[failing]])
        assert_same_rows(read_back(spec), want, "good partitions new, the failed one as it was")
    else:
        with pytest.raises(
            PartitionsFailedError, match=r"1 of \d+ partition\(s\).*nothing was committed"
        ) as caught:
            refresh_dataset(spec, DATASET, strategy="arrow")
        assert set(caught.value.failed) == {failing}
        assert catalog_version(spec) == version, "nothing published"
        assert_same_rows(read_back(spec), pa.concat_tables(first), "the previous version, unchanged")
    recorded = store.failures()
    assert set(recorded) == {failing}
    assert "OSError: disk full while writing sk=%NULL" in recorded[failing].error
    live = set((tmp_path / "acc").rglob("*.parquet"))
    failed_dir = tmp_path / "acc" / DATASET / failing
    if not allow_partial:
        assert live == committed, "the unpublished files were removed"
    assert not [p for p in live - committed if failed_dir in p.parents], (
        "the failed partition's files removed"
    )
    monkeypatch.undo()
    refresh_dataset(spec, DATASET, strategy="arrow")
    assert_same_rows(read_back(spec), pa.concat_tables([*first, new]), "full read after the retry")
    assert store.failures() == {}, "the commit cleared the record"


def _keys_of(table: pa.Table) -> list[str]:
    """Each row's key path under IDENTITY, in row order."""
    from matrix_support import key_path, partition_values

    return [key_path(values, IDENTITY) for values in partition_values(table, IDENTITY)]


def test_arrow_writes_are_made_durable_together_before_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Arrow path writes partitions without an fsync each, then fsyncs every file once and every
    directory from the partition's up to the dataset root once, all before the commit; the rows read back
    are the source's."""
    from airflow_partitions.refresh import pipeline
    from airflow_partitions.storage import base

    chunks = hostile_chunks(71, rows=150)
    write_source(tmp_path, chunks)
    spec = write_spec(tmp_path, "parquet", COMPOSITE)
    events: list[tuple[str, str]] = []
    real_file, real_directory, real_commit = base.fsync_file, base.fsync_directory, pipeline.commit_refresh

    def fsync_file(path: Path) -> None:
        events.append(("file", str(path)))
        real_file(path)

    def fsync_directory(path: Path) -> None:
        events.append(("directory", str(path)))
        real_directory(path)

    def commit_refresh(*args: Any, **kwargs: Any) -> Any:
        events.append(("commit", ""))
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(base, "fsync_file", fsync_file)
    monkeypatch.setattr(base, "fsync_directory", fsync_directory)
    monkeypatch.setattr(pipeline, "commit_refresh", commit_refresh)
    expected = pa.concat_tables(chunks)
    summary = refresh_dataset(spec, DATASET, strategy="arrow")
    assert summary.rows == expected.num_rows
    assert_same_rows(read_back(spec), expected, "full read after a refresh synced in one pass")
    project = load_project(spec)
    handle = open_handle(project, project.dataset(DATASET))
    snapshot = handle.catalog.latest()
    assert snapshot is not None
    root = Path(handle.local_root)
    files = [root / f.path for key in snapshot.partitions for f in snapshot.partitions[key].files]
    assert len(files) == len(rows_by_key(expected, COMPOSITE))
    before_commit = events[: events.index(("commit", ""))]
    synced_files = [path for kind, path in before_commit if kind == "file"]
    assert sorted(synced_files) == sorted(str(p) for p in files), "every published file fsynced once"
    synced_directories = [path for kind, path in before_commit if kind == "directory"]
    levels = {str(level) for p in files for level in p.parents if level.is_relative_to(root)}
    assert levels | {str(root.parent)} <= set(synced_directories)
    assert len(synced_directories) == len(set(synced_directories)), "each directory fsynced once"
    first_directory = next(i for i, (kind, _) in enumerate(before_commit) if kind == "directory")
    assert all(kind == "directory" for kind, _ in before_commit[first_directory:]), "files first"


def test_a_file_that_cannot_be_made_durable_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_partitions.exceptions import StorageError
    from airflow_partitions.storage import base

    chunks = hostile_chunks(72, rows=120)
    write_source(tmp_path, chunks)
    spec = write_spec(tmp_path, "parquet", IDENTITY)
    real_file = base.fsync_file
    victim = "sk=%NULL"

    def failing(path: Path) -> None:
        if path.parent.name == victim:
            raise OSError(5, "Input/output error")
        real_file(path)

    monkeypatch.setattr(base, "fsync_file", failing)
    with pytest.raises(StorageError, match=rf"could not make partition file .*{victim}/part-.*durable"):
        refresh_dataset(spec, DATASET, strategy="arrow")
    assert catalog_version(spec) is None, "nothing published"
    assert not list((tmp_path / "acc").rglob("*.parquet")), "the written files were removed"
