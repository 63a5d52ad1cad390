"""Writes that never invent, duplicate or hide a row: one CSV rule for sources and writes, one key equality
(`IS NOT DISTINCT FROM`) for upserts and deletes, key uniqueness under concurrent upserts, and a dataset
emptied by a delete that reads as 0 rows of its schema.

Sources are local files (CSV or parquet) so no database is needed; the race runs two real writers in
threads of one process, each with its own catalog, forced to plan from the same version before either
commits.
"""

from __future__ import annotations

import io
import json
import math
import threading
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_partitions.cli.main import main as cli_main
from airflow_partitions.exceptions import WriteKeyError
from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.refresh.pipeline import refresh_dataset
from airflow_partitions.spec import load_spec
from airflow_partitions.spec.model import ProjectSpec
from airflow_partitions.table import open_handle
from airflow_partitions.write import commit as writes
from airflow_partitions.write.merge import check_unique_keys, delete_rows_by_key, key_match_mask, upsert_rows
from tests.writes_support import SCHEMA, Oracle, assert_same_rows, hostile_rows

DATASET = "items"
# Texts pyarrow's CSV reader takes for NULL by default; a CSV source keeps each as the string it is.
NULL_LOOKALIKES = ["NA", "NULL", "N/A", "#N/A", "null", "nan", "NaN", "-NaN", "None", "n/a", "#NA", "<NA>"]


def file_spec(
    root: Path, file_format: str, partition_by: list[str], *, key: str = "id", engine: str = "parquet"
) -> ProjectSpec:
    lines = [
        f"accelerator_dir: {root / 'acc'}",
        "datasets:",
        f"  - name: {DATASET}",
        f"    from: file:{root / 'src'}",
        f"    params: {{file_format: {file_format}}}",
        "    acceleration:",
        f"      engine: {engine}",
        f"      primary_key: [{key}]",
        "      partition_by:",
        *[f"        - {json.dumps(field)}" for field in partition_by],
    ]
    path = root / "spec.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return load_spec(path)


def read_all(project: ProjectSpec) -> pa.Table:
    reader = PartitionedDatasetReader(project, DATASET)
    try:
        return reader.read()
    finally:
        reader.close()


def run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = cli_main(list(argv))
    return code, out.getvalue()


# --- finding 1: one CSV rule ----------------------------------------------------------------------


def csv_text(rows: list[tuple[str, str, str]]) -> str:
    """CSV of (id, region, note) fields written as given (quoting included)."""
    return "id,region,note\n" + "".join(f"{i},{region},{note}\n" for i, region, note in rows)


def csv_rows(first_id: int) -> tuple[str, list[dict[str, Any]]]:
    """A CSV whose region and note hold every NULL look-alike, unquoted and quoted, and empty fields
    (NULL, quoted or not), with the rows a reader must see."""
    fields: list[tuple[str, str, str]] = []
    expected: list[dict[str, Any]] = []
    next_id = first_id
    for token in [*NULL_LOOKALIKES, "a/b", "k=v", "100%", "日本", "🙂"]:
        for region_field, note_field in ((token, token), (f'"{token}"', '"it\'s ""q"""')):
            fields.append((str(next_id), region_field, note_field))
            note = token if note_field == token else 'it\'s "q"'
            expected.append({"id": next_id, "region": token, "note": note})
            next_id += 1
    # Only an empty field is NULL, quoted or not, in a string column and in the key's integer column.
    fields += [(str(next_id), "", '""'), (str(next_id + 1), '""', "")]
    expected += [
        {"id": next_id, "region": None, "note": None},
        {"id": next_id + 1, "region": None, "note": None},
    ]
    return csv_text(fields), expected


CSV_SCHEMA = pa.schema([("id", pa.int64()), ("region", pa.string()), ("note", pa.string())])


@pytest.mark.parametrize("strategy", ["arrow", pytest.param("spark", marks=pytest.mark.spark)])
def test_csv_null_lookalikes_are_strings_in_sources_and_in_writes(
    tmp_path: Path, strategy: str, request: pytest.FixtureRequest
) -> None:
    """`NA` (North America) is the string 'NA' whether a CSV source or `write --append x.csv` reads it."""
    source_text, source_expected = csv_rows(1)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.csv").write_text(source_text, encoding="utf-8")
    project = file_spec(tmp_path, "csv", ["region"])
    if strategy == "spark":
        refresh_dataset(project, DATASET, spark=request.getfixturevalue("spark"), strategy="spark")
    else:
        refresh_dataset(project, DATASET, strategy="arrow")
    expected = pa.Table.from_pylist(source_expected, schema=CSV_SCHEMA)
    got = read_all(project)
    assert sorted(got.to_pylist(), key=lambda r: r["id"]) == expected.to_pylist(), "source refresh"

    write_text, write_expected = csv_rows(1000)
    rows_file = tmp_path / "rows.csv"
    rows_file.write_text(write_text, encoding="utf-8")
    code, _ = run_cli("write", str(project.path), DATASET, "--append", str(rows_file))
    assert code == 0
    expected = pa.Table.from_pylist(source_expected + write_expected, schema=CSV_SCHEMA)
    got = read_all(project)
    assert sorted(got.to_pylist(), key=lambda r: r["id"]) == expected.to_pylist(), "after write --append"
    # And an upsert of a CSV file reads it by the same rule: 'NULL' replaces NULL, '' becomes NULL.
    upsert_file = tmp_path / "upsert.csv"
    upsert_file.write_text(csv_text([("1", "NULL", ""), (str(write_expected[-1]["id"]), "NA", "N/A")]))
    code, _ = run_cli("write", str(project.path), DATASET, "--upsert", str(upsert_file))
    assert code == 0
    by_id = {r["id"]: r for r in read_all(project).to_pylist()}
    assert by_id[1] == {"id": 1, "region": "NULL", "note": None}
    assert by_id[write_expected[-1]["id"]] == {"id": write_expected[-1]["id"], "region": "NA", "note": "N/A"}
    assert len(by_id) == expected.num_rows


# --- finding 10b: one key equality ----------------------------------------------------------------

NAN = float("nan")
FLOAT_KEYS: list[float | None] = [0.0, -0.0, NAN, -NAN, None, 1.5, -1.5, math.inf, -math.inf, 1e-300]


def duckdb_matches(table: pa.Table, key_rows: pa.Table, keys: list[str]) -> list[bool]:
    """Per row of `table`: does DuckDB find its key among `key_rows` with IS NOT DISTINCT FROM?"""
    condition = " AND ".join(f't."{k}" IS NOT DISTINCT FROM k."{k}"' for k in keys)
    numbered = table.append_column("__row", pa.array(range(table.num_rows), pa.int64()))
    connection = duckdb.connect()
    try:
        connection.register("t", numbered)
        connection.register("k", key_rows)
        found = connection.sql(
            f"SELECT __row FROM t WHERE EXISTS (SELECT 1 FROM k WHERE {condition})"
        ).fetchall()
    finally:
        connection.close()
    hit = {row for (row,) in found}
    return [i in hit for i in range(table.num_rows)]


@pytest.mark.parametrize("float_type", [pa.float64(), pa.float32()], ids=str)
def test_key_equality_is_duckdbs_is_not_distinct_from(float_type: pa.DataType) -> None:
    """-0.0 is 0.0, NaN is NaN (any sign), NULL is NULL: the write merge agrees with DuckDB row by row,
    on one key column and on two (a float and a hostile string)."""
    strings = [None, "", "a/b", "k=v", "100%", "it's", "日本"]
    existing = pa.table(
        {
            "k": pa.array([k for k in FLOAT_KEYS for _ in strings], float_type),
            "s": pa.array(strings * len(FLOAT_KEYS), pa.string()),
        }
    )
    for incoming_keys in ([-0.0], [0.0], [NAN], [-NAN], [None], [-0.0, NAN, None], [1.5, -math.inf]):
        incoming = pa.table({"k": pa.array(incoming_keys, float_type)})
        mask = key_match_mask(existing, incoming, ["k"]).to_pylist()
        assert mask == duckdb_matches(existing, incoming, ["k"]), incoming_keys
    pairs = pa.table({"k": pa.array([-0.0, -NAN, None], float_type), "s": pa.array(["", None, "日本"])})
    assert key_match_mask(existing, pairs, ["k", "s"]).to_pylist() == duckdb_matches(
        existing, pairs, ["k", "s"]
    )
    # An upsert of -0.0 replaces the 0.0 row (and the -0.0 row): one row per key afterwards.
    single = pa.table({"k": pa.array([0.0, NAN, None, 2.0], float_type), "v": ["zero", "nan", "null", "two"]})
    upserted = upsert_rows(
        single, pa.table({"k": pa.array([-0.0, -NAN], float_type), "v": ["new0", "newnan"]}), ["k"]
    )
    assert (upserted.removed, upserted.added, upserted.rows) == (2, 2, 4)
    assert sorted(upserted.table.column("v").to_pylist()) == ["new0", "newnan", "null", "two"]
    deleted = delete_rows_by_key(single, pa.table({"k": pa.array([-0.0, None], float_type)}), ["k"])
    assert sorted(deleted.table.column("v").to_pylist()) == ["nan", "two"]
    # One write may not give a key twice, however it is spelt.
    for repeated in ([0.0, -0.0], [NAN, -NAN], [None, None]):
        with pytest.raises(WriteKeyError, match="repeat key"):
            check_unique_keys(pa.table({"k": pa.array([*repeated, 1.0], float_type)}), ["k"])
    check_unique_keys(pa.table({"k": pa.array([0.0, NAN, None, 1.0], float_type)}), ["k"])


def test_upsert_and_delete_by_key_on_float_keys_through_a_dataset(tmp_path: Path) -> None:
    """Upserts of -0.0 and -NaN keys replace the 0.0 and NaN rows of a dataset, across files and partitions,
    the file statistics never ruling out a file a NaN key can be in."""
    schema = pa.schema([("k", pa.float64()), ("region", pa.string()), ("v", pa.string())])
    (tmp_path / "src").mkdir()
    pq.write_table(schema.empty_table(), tmp_path / "src" / "empty.parquet")
    project = file_spec(tmp_path, "parquet", ["region"], key="k")
    dataset = project.dataset(DATASET)
    first = pa.table(
        {"k": [0.0, NAN, None, 5.0, 7.0], "region": ["a/b", "EU", None, "EU", "日本"], "v": list("abcde")},
        schema=schema,
    )
    writes.append(open_handle(project, dataset), first)
    # A second file in EU whose statistics (NaN left out) are [10, 20]: a NaN key may still be there.
    writes.append(
        open_handle(project, dataset),
        pa.table({"k": [10.0, 20.0], "region": ["EU", "EU"], "v": ["f", "g"]}, schema=schema),
    )
    writes.upsert(
        open_handle(project, dataset),
        pa.table({"k": [-0.0, -NAN], "region": ["k=v", "100%"], "v": ["A", "B"]}, schema=schema),
    )
    got = sorted(read_all(project).to_pylist(), key=lambda r: r["v"])
    assert [r["v"] for r in got] == ["A", "B", "c", "d", "e", "f", "g"], "0.0 and NaN replaced, once each"
    assert {r["v"]: r["region"] for r in got}["A"] == "k=v"
    writes.upsert(
        open_handle(project, dataset),
        pa.table({"k": [NAN, 20.0], "region": ["EU", "EU"], "v": ["N", "G"]}, schema=schema),
    )
    got = sorted(read_all(project).to_pylist(), key=lambda r: r["v"])
    assert [r["v"] for r in got] == ["A", "G", "N", "c", "d", "e", "f"]
    result = writes.delete(open_handle(project, dataset), "k IS NOT DISTINCT FROM '-0.0'::DOUBLE OR isnan(k)")
    assert result.rows_removed == 2
    assert sorted(r["v"] for r in read_all(project).to_pylist()) == ["G", "c", "d", "e", "f"]


# --- finding 10c: a dataset emptied by a delete ---------------------------------------------------


@pytest.mark.spark
def test_a_dataset_emptied_by_delete_reads_as_zero_rows_of_its_schema(tmp_path: Path, spark: Any) -> None:
    (tmp_path / "src").mkdir()
    rows = hostile_rows(11, range(1, 41))
    pq.write_table(rows, tmp_path / "src" / "rows.parquet")
    project = file_spec(tmp_path, "parquet", ["region", "date_trunc('day', ts)"])
    refresh_dataset(project, DATASET, strategy="arrow")
    dataset = project.dataset(DATASET)
    assert_same_rows(read_all(project), rows, "refreshed")
    result = writes.delete(open_handle(project, dataset), "TRUE")
    assert result.rows_removed == 40
    assert result.partitions == ()
    assert len(result.removed_partitions) > 0

    empty = SCHEMA.empty_table()
    reader = PartitionedDatasetReader(project, DATASET)
    try:
        assert_same_rows(reader.read(), empty, "read")
        assert_same_rows(reader.read("region = 'a/b' OR id > 3"), empty, "filtered read")
        assert reader.read(columns=["note"]).schema == pa.schema([("note", pa.string())])
        assert reader.query(f"SELECT count(*) AS n FROM {DATASET}").to_pylist() == [{"n": 0}]
        assert_same_rows(reader.query(f"SELECT * FROM {DATASET} WHERE note <> ''"), empty, "query")
        plan = reader.plan()
        assert (len(plan.selected), plan.index.schema) == (0, SCHEMA)
        frame = reader.to_spark(spark)
        assert frame.count() == 0
        assert frame.columns == SCHEMA.names
    finally:
        reader.close()

    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

    hook = PartitionedDatasetHook(dataset=DATASET, spec_path=str(project.path))
    try:
        assert_same_rows(hook.read(), empty, "hook read")
        assert hook.query(f"SELECT count(*) AS n FROM {DATASET}").to_pylist() == [{"n": 0}]
    finally:
        hook.close()

    code, out = run_cli(
        "query", str(project.path), f"SELECT count(*) AS n, min(region) AS r FROM {DATASET}", "--json"
    )
    assert (code, [json.loads(line) for line in out.splitlines()]) == (0, [{"n": 0, "r": None}])
    code, out = run_cli("plan", str(project.path), DATASET, "--json")
    assert code == 0
    assert (json.loads(out)["total"], json.loads(out)["selected"]) == (0, 0)
    # The next write fills it again, with the same schema.
    writes.append(open_handle(project, dataset), rows.slice(0, 5))
    assert_same_rows(read_all(project), rows.slice(0, 5), "written again")


# --- finding 3: concurrent upserts of one new key -------------------------------------------------

RACE_ROUNDS = 50
RACE_REGIONS: list[str | None] = [None, "EU", "a/b", "k=v", "100%", "it's", 'say "hi"', "日本", "🙂", ""]


def _upserts_together(project: ProjectSpec, batches: list[pa.Table]) -> dict[int, Any]:
    """Upsert each batch in its own thread, all planned from the same version: each writer opens the
    dataset (its own catalog, its base version), then waits for the others before planning and committing.
    Each one's result or error."""
    barrier = threading.Barrier(len(batches))
    outcomes: dict[int, Any] = {}
    open_target = writes.open_write_target

    def opened_together(*args: Any, **kwargs: Any) -> writes.WriteTarget:
        target = open_target(*args, **kwargs)
        barrier.wait(timeout=60)
        return target

    def run(index: int) -> None:
        assert project.path is not None
        own = load_spec(project.path)
        try:
            outcomes[index] = writes.upsert(open_handle(own, own.dataset(DATASET)), batches[index])
        except Exception as err:  # collected: the caller's assertion names it
            outcomes[index] = err

    with pytest.MonkeyPatch.context() as patch:
        # Forced interleaving, not a stand-in: the real open, then a barrier.
        patch.setattr(writes, "open_write_target", opened_together)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(batches))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    return outcomes


# The 50-round race on parquet; fewer rounds on DuckDB, whose per-partition files cost more to attach.
@pytest.mark.parametrize(("engine", "rounds"), [("parquet", RACE_ROUNDS), ("duckdb", 8)])
def test_concurrent_upserts_of_one_new_key_never_duplicate_it(
    tmp_path: Path, engine: str, rounds: int
) -> None:
    """Two writers upsert the same new keys into different partitions from the same version, then both
    commit: one wins, the other gets `CommitConflictError` and, written again, moves the keys. In every
    round each key is on exactly one row and a full read equals the oracle."""
    (tmp_path / "src").mkdir()
    pq.write_table(SCHEMA.empty_table(), tmp_path / "src" / "empty.parquet")
    project = file_spec(tmp_path, "parquet", ["region"], engine=engine)
    dataset = project.dataset(DATASET)
    initial = hostile_rows(21, range(1, 31), regions=RACE_REGIONS)
    writes.append(open_handle(project, dataset), initial)
    oracle = Oracle(initial)
    duplicated: set[int] = set()  # keys seen on two rows, after any race or retry
    outcomes_seen: list[str] = []
    for round_number in range(rounds):
        first_id = 10_000 + 10 * round_number
        ids = range(first_id, first_id + 3)
        region_a = RACE_REGIONS[round_number % len(RACE_REGIONS)]
        region_b = RACE_REGIONS[(round_number + 3) % len(RACE_REGIONS)]
        # Both carry the same new keys to different partitions: neither touches the other's partition.
        rows_a = hostile_rows(round_number, ids, regions=[region_a])
        rows_b = hostile_rows(round_number + 1000, ids, regions=[region_b])
        outcomes = _upserts_together(project, [rows_a, rows_b])
        duplicated |= _duplicated_keys(read_all(project))
        outcomes_seen.append(" ".join(sorted(type(o).__name__ for o in outcomes.values())))
        committed = [i for i, o in outcomes.items() if isinstance(o, writes.WriteResult)]
        winner = rows_a if committed == [0] else rows_b
        oracle.upsert(winner)
        if len(committed) == 1:
            # The loser writes again from the newest version: its rows replace the winner's.
            loser = rows_b if committed == [0] else rows_a
            writes.upsert(open_handle(project, dataset), loser)
            oracle.upsert(loser)
            duplicated |= _duplicated_keys(read_all(project))
        else:
            oracle.upsert(rows_b)  # (the old code: both committed; the oracle takes the later one)
    assert not duplicated, (
        f"{len(duplicated)} keys on two rows over {rounds} rounds: {sorted(duplicated)[:6]}"
    )
    assert set(outcomes_seen) == {"CommitConflictError WriteResult"}, "one writer wins each round"
    assert_same_rows(read_all(project), oracle.table(), f"after {rounds} rounds")


def _duplicated_keys(table: pa.Table) -> set[int]:
    seen: set[int] = set()
    twice: set[int] = set()
    for key in table.column("id").to_pylist():
        (twice if key in seen else seen).add(key)
    return twice


@pytest.mark.postgres
def test_changes_refresh_matches_nan_and_zero_keys_as_the_merge_does(
    pg_database: str, tmp_path: Path
) -> None:
    """refresh_mode changes on a float8 key: a changed NaN row (Postgres: NaN = NaN) moving to another
    partition leaves its old one, though file statistics leave NaN out; a full read equals the source."""
    import datetime as dt

    import psycopg

    from airflow_partitions.sources import open_source

    start = dt.datetime(2026, 5, 1, 8, tzinfo=dt.UTC)
    keys = [NAN, 0.0, 1.5, 2.5, -math.inf, math.inf, 3.5]
    regions = ["EU", "a/b", "EU", "k=v", "日本", "EU", None]
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.f (k float8 PRIMARY KEY, region text, note text, updated_at timestamptz)"
        )
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO public.f VALUES (%s, %s, %s, %s)",
                [
                    (k, r, f"it's {i}", start + dt.timedelta(minutes=i))
                    for i, (k, r) in enumerate(zip(keys, regions, strict=True))
                ],
            )
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        f"  - name: {DATASET}\n"
        "    from: postgres:public.f\n"
        f"    params: {{url: '{pg_database}', pushdown: always}}\n"
        "    acceleration:\n"
        "      refresh_mode: changes\n"
        "      primary_key: [k]\n"
        '      partition_by: [{r: "region"}]\n'
        "      refresh: {watermark_column: updated_at}\n"
    )
    project = load_spec(tmp_path / "spec.yaml")
    refresh_dataset(project, DATASET)
    later = start + dt.timedelta(hours=1)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("UPDATE public.f SET region = '100%%', updated_at = %s WHERE k = 'NaN'", (later,))
        conn.execute("UPDATE public.f SET region = NULL, updated_at = %s WHERE k = '-0'", (later,))
    assert refresh_dataset(project, DATASET).refresh_mode == "changes"

    def identity(row: dict[str, Any]) -> str:
        return json.dumps({k: repr(v) for k, v in sorted(row.items())})

    source = open_source(project.dataset(DATASET).source).read_all()
    got = read_all(project)
    assert got.num_rows == len(keys), "each key on one row"
    assert sorted(map(identity, got.to_pylist())) == sorted(map(identity, source.to_pylist()))
