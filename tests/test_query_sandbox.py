"""The `query` sandbox under hostile SQL: time and memory limits, no local paths, no other version's rows.

Every query here is one the sandbox must stop or refuse: one that runs forever, one that wants all the
memory, one that asks DuckDB where the files are, one that reads the tables another catalog version
keeps in the shared `_tables.duckdb` file. `pytest.mark.timeout` is the hang guard: a limit that does not
hold fails the test instead of stalling the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from test_pruning_support import Acceleration, build_acceleration

from airflow_partitions.catalog import PartitionEntry
from airflow_partitions.cli.main import main
from airflow_partitions.exceptions import FilterError, QueryLimitError, UnsafeQueryError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.read import QueryLimits
from airflow_partitions.storage import get_storage

ROWS = 240
ENGINES = {
    "parquet": {"engine": "parquet", "max_rows_per_file": 20},
    "duckdb_files": {"engine": "duckdb"},
    "duckdb_tables": {"engine": "duckdb", "partition_mode": "tables"},
    "arrow": {"engine": "arrow"},
}
ENDLESS = [
    "SELECT count(*) AS n FROM range(100000000000)",
    "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT max(n) FROM t",
    "SELECT count(*) AS n FROM events, range(1000000000) r WHERE events.region = 'EU'",
]


def make_table(first_id: int = 0, rows: int = ROWS) -> pa.Table:
    ids = range(first_id, first_id + rows)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array([["EU", "US", "APAC"][i % 3] for i in ids], pa.string()),
            "note": pa.array([f"note '{i}' \"x\"" for i in ids], pa.string()),
        }
    )


@pytest.fixture(scope="module")
def accelerations(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Acceleration]:
    base = tmp_path_factory.mktemp("sandbox")
    return {
        name: build_acceleration(base / name, make_table(), [("region", "region")], **options)
        for name, options in ENGINES.items()
    }


def assert_no_local_path(text: str, acc: Acceleration) -> None:
    for path in (acc.root, acc.root.parent):
        assert str(path) not in text, f"a local path leaked: {text}"


# --- time ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sql", ENDLESS)
def test_a_query_past_its_timeout_is_stopped(accelerations: dict[str, Acceleration], sql: str) -> None:
    with accelerations["parquet"].reader() as reader:
        with pytest.raises(QueryLimitError, match=r"1 s time limit.*timeout_s") as caught:
            reader.query(sql, timeout_s=1)
        assert caught.value.limit == "timeout"
        # The reader stays usable after an interrupted query.
        assert reader.query("SELECT count(*) AS n FROM events").column("n")[0].as_py() == ROWS


@pytest.mark.timeout(120)
def test_the_reader_default_timeout_applies(accelerations: dict[str, Acceleration]) -> None:
    limits = QueryLimits(timeout_s=1)
    with accelerations["duckdb_tables"].reader(query_limits=limits) as reader, pytest.raises(QueryLimitError):
        reader.query(ENDLESS[2])


@pytest.mark.timeout(120)
def test_cli_query_timeout(
    accelerations: dict[str, Acceleration], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = str(accelerations["parquet"].spec_path)
    assert main(["query", spec, ENDLESS[2], "--timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert "1 s time limit" in err
    assert "--timeout" in err
    assert main(["query", spec, "SELECT count(*) AS n FROM events", "--timeout", "60", "--json"]) == 0
    assert capsys.readouterr().out.strip() == f'{{"n": {ROWS}}}'


@pytest.mark.timeout(120)
def test_hook_query_timeout(accelerations: dict[str, Acceleration]) -> None:
    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

    hook = PartitionedDatasetHook(dataset="events", spec_path=str(accelerations["arrow"].spec_path))
    try:
        with pytest.raises(QueryLimitError, match="timeout"):
            hook.query(ENDLESS[0], timeout_s=1)
    finally:
        hook.close()


# --- memory -------------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "sql",
    [
        "SELECT list(range) AS l FROM range(300000000)",
        "SELECT count(DISTINCT range::VARCHAR || 'x') AS n FROM range(300000000)",
    ],
)
def test_a_query_past_its_memory_limit_raises(accelerations: dict[str, Acceleration], sql: str) -> None:
    with accelerations["parquet"].reader() as reader:
        with pytest.raises(QueryLimitError, match=r"64MB memory limit.*memory_limit") as caught:
            reader.query(sql, memory_limit="64MB", timeout_s=60)
        assert caught.value.limit == "memory"


def test_the_sandbox_runs_with_bounded_memory_and_threads(accelerations: dict[str, Acceleration]) -> None:
    with accelerations["parquet"].reader() as reader:
        row = reader.query(
            "SELECT current_setting('memory_limit') AS memory, current_setting('threads') AS threads",
            memory_limit="100MB",
        ).to_pylist()[0]
    assert row["memory"] == "95.3 MiB", "memory_limit set as asked"
    assert 1 <= int(row["threads"]) <= 4


@pytest.mark.parametrize(
    "limits",
    [
        {"timeout_s": 0},
        {"timeout_s": -5},
        {"timeout_s": float("nan")},
        {"memory_limit": "lots"},
        {"memory_limit": "0GB"},
        {"memory_limit": "1GB'; SET threads = 64; --"},
    ],
)
def test_invalid_limits_are_refused(accelerations: dict[str, Acceleration], limits: dict[str, Any]) -> None:
    with accelerations["parquet"].reader() as reader, pytest.raises(QueryLimitError, match="must be"):
        reader.query("SELECT 1", **limits)


# --- local paths --------------------------------------------------------------------------------------

PROBES = [
    "SELECT current_setting('allowed_paths') AS p",
    "SELECT current_setting('temp_directory') AS p",
    "SELECT * FROM duckdb_settings()",
    "SELECT path FROM duckdb_databases()",
    "SELECT sql FROM duckdb_views()",
    "SELECT view_definition FROM information_schema.views",
    "SELECT pg_get_viewdef(view_oid) FROM (SELECT 1 AS view_oid)",
    "SELECT * FROM duckdb_temporary_files()",
    "SELECT * FROM query('SELECT * FROM duckdb_settings()')",
    "SELECT * FROM glob('/**')",
    "SELECT count(*) AS n FROM events WHERE id IN (SELECT length(value) FROM duckdb_settings())",
    "SELECT * FROM parquet_metadata('x.parquet')",
]


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("sql", PROBES)
def test_the_query_cannot_learn_local_paths(
    accelerations: dict[str, Acceleration], engine: str, sql: str
) -> None:
    acc = accelerations[engine]
    if "events" not in sql:
        sql += " UNION ALL BY NAME SELECT count(*) AS n FROM events"  # the files are in the database
    with acc.reader() as reader, pytest.raises(UnsafeQueryError) as caught:
        reader.query(sql)
    assert_no_local_path(str(caught.value), acc)


FAILING = [
    "SELECT nope FROM events",
    "SELECT region + 1 FROM events",
    "SELECT CAST(note AS INTEGER) AS n FROM events WHERE region = 'EU'",
    "SELECT * FROM events WHERE id = 'not a number'",
    "SELECT * FROM events e JOIN events f USING (missing)",
    "SELECT error(note) FROM events",
]


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("sql", FAILING)
def test_query_errors_name_no_local_path(
    accelerations: dict[str, Acceleration], engine: str, sql: str
) -> None:
    acc = accelerations[engine]
    with acc.reader() as reader, pytest.raises(FilterError) as caught:
        reader.query(sql)
    assert_no_local_path(str(caught.value), acc)


@pytest.mark.parametrize("engine", ["parquet", "duckdb_files"])
def test_a_damaged_file_is_named_by_its_place_in_the_dataset(tmp_path: Path, engine: str) -> None:
    acc = build_acceleration(tmp_path, make_table(), [("region", "region")], **ENGINES[engine])
    damaged = next(p for p in (acc.root / acc.dataset / "region=EU").iterdir() if p.is_file())
    damaged.write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")
    with acc.reader() as reader, pytest.raises(FilterError) as caught:
        reader.query("SELECT count(*) AS n FROM events WHERE region = 'EU'")
    assert_no_local_path(str(caught.value), acc)
    assert f"region=EU/{damaged.name}" in str(caught.value), "the message still says which file"


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_damaged_file_read_is_a_storage_error_naming_it(tmp_path: Path, engine: str) -> None:
    """`read` (not only `query`) turns a damaged partition file into a typed error that names the file."""
    from airflow_partitions.exceptions import StorageError

    acc = build_acceleration(tmp_path, make_table(), [("region", "region")], **ENGINES[engine])
    if engine == "duckdb_tables":  # the rows live in the shared file
        damaged = acc.root / acc.dataset / "_tables.duckdb"
    else:
        damaged = next(p for p in (acc.root / acc.dataset / "region=EU").iterdir() if p.is_file())
    damaged.write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")
    with acc.reader() as reader, pytest.raises(StorageError) as caught:
        reader.read("region = 'EU'")
    assert damaged.name in str(caught.value), "the message says which file"


def test_the_sandbox_still_reads_what_it_should(accelerations: dict[str, Acceleration]) -> None:
    with accelerations["duckdb_tables"].reader() as reader:
        described = reader.query("DESCRIBE events")
        assert described.column("column_name").to_pylist() == ["id", "region", "note"]
        summary = reader.query("SUMMARIZE SELECT id FROM events")
        assert summary.num_rows == 1
        joined = reader.query(
            "WITH eu AS (SELECT * FROM events WHERE region = 'EU') "
            "SELECT count(*) AS n FROM eu, unnest([1, 2]) u(x), range(2) r, generate_series(1, 1) g"
        )
        assert joined.column("n")[0].as_py() == ROWS // 3 * 4


# --- other versions in the shared DuckDB file -----------------------------------------------------------


@pytest.fixture
def two_versions(tmp_path: Path) -> tuple[Acceleration, str, set[int]]:
    """A `tables`-mode acceleration whose EU partition version 2 replaced: version 1's table still sits in
    the shared file with rows version 2 does not have. Returns it, the old table's name and its ids."""
    acc = build_acceleration(
        tmp_path, make_table(), [("region", "region")], engine="duckdb", partition_mode="tables"
    )
    storage = get_storage("duckdb", "tables")
    old = acc.snapshot()
    spec = old.partition_spec
    key = PartitionKey(("EU",))
    old_files = old.partitions[key.path(spec.names)].files
    old_table = old_files[0].table
    assert old_table is not None
    replacement = make_table(first_id=10_000, rows=6).filter(pc.equal(make_table(10_000, 6)["region"], "EU"))
    dataset_root = acc.root / acc.dataset
    files = storage.publish(dataset_root, storage.write(replacement, dataset_root, key.path(spec.names)))
    acc.catalog.commit(
        base_version=old.version, upserts=[PartitionEntry.from_files(key, spec, files)], partition_spec=spec
    )
    old_ids = set(make_table().filter(pc.equal(make_table()["region"], "EU"))["id"].to_pylist())
    return acc, old_table, old_ids


def test_tables_mode_query_sees_only_its_version(two_versions: tuple[Acceleration, str, set[int]]) -> None:
    from airflow_partitions.storage import duckdb_engine

    acc, old_table, old_ids = two_versions
    with acc.reader() as reader:
        eu = reader.query("SELECT id FROM events WHERE region = 'EU'").column("id").to_pylist()
        assert not set(eu) & old_ids, "the newest version shows the replaced EU partition"
        assert set(reader.query("SELECT id FROM events", version=1).column("id").to_pylist()) >= old_ids
        for sql in (
            "SELECT table_name AS t FROM duckdb_tables()",
            "SELECT table_name AS t FROM information_schema.tables",
            "SELECT name AS t FROM (SHOW ALL TABLES)",
            "SHOW ALL TABLES",
            "SELECT table_name AS t FROM duckdb_columns()",
        ):
            with pytest.raises(UnsafeQueryError):
                reader.query(f"{sql} UNION ALL BY NAME SELECT region AS t FROM events")
        # The shared file is attached under the next `ap_part_<n>` alias: name the old table through it.
        alias = f"ap_part_{next(duckdb_engine._attach_ids) + 1}"
        with pytest.raises(UnsafeQueryError, match="only the dataset"):
            reader.query(f"SELECT id FROM events UNION ALL SELECT id FROM {alias}.{old_table}")
        with pytest.raises(UnsafeQueryError, match="only the dataset"):
            reader.query(f'SELECT id FROM events UNION ALL SELECT id FROM {alias}.main."{old_table}"')
        # A name DuckDB cannot find gets no suggestion of the shared file's tables.
        for near in (old_table[:-2], "_ap_tablez"):
            with pytest.raises(FilterError) as caught:
                reader.query(f"SELECT * FROM (WITH {near} AS (SELECT 1) SELECT 1), {near}, events")
            assert old_table not in str(caught.value)
            assert "_ap_tables" not in str(caught.value)


# --- queries sharing one locked database (local files scanned in place) --------------------------------


def test_queries_on_one_reader_each_see_only_their_version(tmp_path: Path) -> None:
    """A reader's queries share one locked database: each query's view holds its own version's files."""
    acc = build_acceleration(tmp_path, make_table(), [("region", "region")], engine="parquet")
    storage = get_storage("parquet")
    old = acc.snapshot()
    spec = old.partition_spec
    key = PartitionKey(("EU",))
    replacement = make_table(first_id=10_000, rows=9).filter(pc.equal(make_table(10_000, 9)["region"], "EU"))
    dataset_root = acc.root / acc.dataset
    files = storage.publish(dataset_root, storage.write(replacement, dataset_root, key.path(spec.names)))
    acc.catalog.commit(
        base_version=old.version, upserts=[PartitionEntry.from_files(key, spec, files)], partition_spec=spec
    )
    old_eu = set(make_table().filter(pc.equal(make_table()["region"], "EU"))["id"].to_pylist())
    sql = "SELECT id FROM events WHERE region = 'EU'"
    with acc.reader() as reader:
        for _ in range(2):  # alternate versions on the same reader: no view outlives its query
            assert set(reader.query(sql, version=1).column("id").to_pylist()) == old_eu
            assert set(reader.query(sql).column("id").to_pylist()) == set(replacement["id"].to_pylist())
        assert reader._scanner.sandbox_root is not None, "parquet on local disk uses the shared database"


@pytest.mark.timeout(120)
def test_concurrent_queries_on_one_reader_are_isolated(accelerations: dict[str, Acceleration]) -> None:
    """Threads querying one reader get their own answers; a timed-out query stops only itself."""
    from concurrent.futures import ThreadPoolExecutor

    table = make_table()
    expected = {
        region: pc.sum(table.filter(pc.equal(table["region"], region))["id"]).as_py()
        for region in ("EU", "US", "APAC")
    }
    with accelerations["parquet"].reader() as reader:

        def total(region: str) -> int:
            return reader.query(f"SELECT sum(id) AS s FROM events WHERE region = '{region}'")["s"][0].as_py()

        def endless() -> str:
            with pytest.raises(QueryLimitError):
                reader.query(ENDLESS[0], timeout_s=1)
            return "stopped"

        with ThreadPoolExecutor(max_workers=4) as pool:
            stopped = pool.submit(endless)
            answers = [(region, pool.submit(total, region)) for region in list(expected) * 8]
            assert {region: future.result() for region, future in answers} == expected
            assert stopped.result() == "stopped"


# --- names resolved the way DuckDB resolves them ---------------------------------------------------------

# Spellings DuckDB reads as the dataset: each must read every row, never an empty placeholder.
DATASET_SPELLINGS = [
    "events",
    "main.events",
    "temp.events",
    "temp.main.events",
    '"events"',
    'temp."main"."events"',
    "EVENTS",
]
# Unicode format characters (category Cf): DuckDB's tokenizer reads them as white space, sqlglot as part
# of the name, so a query holding one outside a string literal is refused as invisible and ambiguous.
FORMAT_CHARACTERS = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u202e"]


@pytest.mark.parametrize("engine", ["parquet", "duckdb_tables"])
@pytest.mark.parametrize("name", DATASET_SPELLINGS)
def test_every_spelling_of_the_dataset_reads_all_its_rows(
    accelerations: dict[str, Acceleration], engine: str, name: str
) -> None:
    with accelerations[engine].reader() as reader:
        assert reader.query(f"SELECT count(*) AS n FROM {name}").column("n")[0].as_py() == ROWS
        eu = reader.query(f"SELECT count(*) AS n FROM {name} WHERE region = 'EU'").column("n")[0].as_py()
        assert eu == ROWS // 3
        both = reader.query(
            f"SELECT count(*) AS n FROM events e JOIN {name} f ON e.id = f.id WHERE e.region = 'EU'"
        )
        assert both.column("n")[0].as_py() == ROWS // 3


@pytest.mark.parametrize("character", FORMAT_CHARACTERS)
@pytest.mark.parametrize(
    "template",
    [
        "SELECT count(*) AS n FROM {c}events",
        "SELECT count(*) AS n FROM events{c}",
        "SELECT count(*) AS n FROM ev{c}ents",
        "SELECT count(*) AS n FROM events WHERE region{c} = 'EU'",
        'SELECT count(*) AS n FROM "{c}events"',
        "SELECT count(*) AS n FROM events e, {c}events f WHERE e.id = f.id",
    ],
)
def test_an_invisible_format_character_in_the_sql_is_refused(
    accelerations: dict[str, Acceleration], character: str, template: str
) -> None:
    with accelerations["parquet"].reader() as reader, pytest.raises(UnsafeQueryError) as caught:
        reader.query(template.format(c=character))
    message = str(caught.value)
    assert f"U+{ord(character):04X}" in message
    assert "delete it" in message


def test_a_format_character_inside_a_string_literal_is_data(accelerations: dict[str, Acceleration]) -> None:
    with accelerations["parquet"].reader() as reader:
        row = reader.query("SELECT 'a\u200bb' AS s, count(*) AS n FROM events").to_pylist()[0]
    assert row == {"s": "a\u200bb", "n": ROWS}


# A CTE's name is legal only where it is in scope; outside, DuckDB resolves the name in the catalog.
OUT_OF_SCOPE_CTES = [
    "SELECT * FROM (WITH pg_settings AS (SELECT 1) SELECT * FROM pg_settings) x, pg_settings",
    "SELECT * FROM (WITH duckdb_settings AS (SELECT 1) SELECT 1) x, duckdb_settings",
    "SELECT * FROM events WHERE id IN (WITH pg_settings AS (SELECT 1) SELECT 1) UNION ALL BY NAME "
    "SELECT * FROM pg_settings",
    "WITH a AS (SELECT * FROM pg_settings), pg_settings AS (SELECT 1) SELECT * FROM a, events",
    "WITH pg_settings AS (SELECT * FROM pg_settings) SELECT * FROM pg_settings, events",
    "SELECT (WITH pg_settings AS (SELECT 1) SELECT 1) AS x, * FROM pg_settings, events",
    "SELECT * FROM (WITH information_schema AS (SELECT 1) SELECT 1) x, information_schema.tables, events",
    "SELECT * FROM (WITH pg_catalog AS (SELECT 1) SELECT 1) x, pg_catalog.pg_settings, events",
    "SELECT * FROM (WITH x AS (SELECT 1) SELECT 1) y, system.main.pg_settings, events",
    "SELECT * FROM (WITH pg_settings AS (SELECT 1) SELECT 1 UNION SELECT 2) y, pg_settings, events",
    "WITH RECURSIVE pg_settings AS (SELECT * FROM pg_settings UNION ALL SELECT * FROM pg_settings LIMIT 1) "
    "SELECT * FROM pg_settings, events",
    # A name DuckDB reads as a glob over the dataset directory (every version's files).
    'SELECT * FROM (WITH "**/*.parquet" AS (SELECT 1) SELECT 1) x, "**/*.parquet"',
    'SELECT count(*) AS n FROM (WITH "region=EU/*.parquet" AS (SELECT 1) SELECT 1) x, "region=EU/*.parquet"',
]
# Relations no query may read, whatever it declares around them.
FOREIGN_RELATIONS = [
    "pg_settings",
    "pg_catalog.pg_settings",
    "main.pg_settings",
    "duckdb_settings()",
    "information_schema.tables",
    "memory.main.events",
    "system.main.events",
    "read_parquet('**/*.parquet')",
    "glob('*')",
    "read_csv('x.csv')",
    '"pg_settings"',
    '"pg\u0073ettings"',
    '"events\u200b"',
    '"еvents"',  # a Cyrillic е
]


@pytest.mark.parametrize("sql", OUT_OF_SCOPE_CTES)
def test_a_cte_name_outside_its_scope_is_refused(accelerations: dict[str, Acceleration], sql: str) -> None:
    acc = accelerations["parquet"]
    with acc.reader() as reader, pytest.raises(UnsafeQueryError) as caught:
        reader.query(sql)
    assert "allowed_directories" not in str(caught.value)
    assert_no_local_path(str(caught.value), acc)


@pytest.mark.parametrize("relation", FOREIGN_RELATIONS)
@pytest.mark.parametrize(
    "template",
    [
        "SELECT * FROM {r}",
        "SELECT * FROM (WITH x AS (SELECT 1) SELECT 1) y, {r}",
        "WITH q AS (SELECT * FROM {r}) SELECT * FROM q",
        "SELECT * FROM events WHERE id IN (SELECT 1 FROM {r})",
    ],
)
def test_no_spelling_reaches_a_foreign_relation(
    accelerations: dict[str, Acceleration], relation: str, template: str
) -> None:
    with accelerations["parquet"].reader() as reader, pytest.raises(UnsafeQueryError):
        reader.query(template.format(r=relation))


def test_ctes_in_scope_still_work(accelerations: dict[str, Acceleration]) -> None:
    with accelerations["parquet"].reader() as reader:
        for sql in (
            "WITH eu AS (SELECT * FROM events WHERE region = 'EU'), n AS (SELECT count(*) AS n FROM eu) "
            "SELECT n FROM n",
            "SELECT n FROM (WITH eu AS (SELECT * FROM events WHERE region = 'EU') "
            "SELECT count(*) AS n FROM eu)",
            "WITH events AS (SELECT * FROM events WHERE region = 'EU') SELECT count(*) AS n FROM events",
            "WITH RECURSIVE t(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM t WHERE k < 3) "
            "SELECT count(*) // 3 AS n FROM t, events WHERE region = 'EU'",
            "WITH eu AS (SELECT * FROM events) SELECT count(*) AS n FROM eu WHERE region = 'EU' "
            "AND id IN (WITH ids AS (SELECT id FROM eu) SELECT id FROM ids)",
        ):
            assert reader.query(sql).column("n")[0].as_py() == ROWS // 3, sql


# --- limits that bound: memory outside DuckDB's buffers, time spent before DuckDB runs ------------------

# Memory DuckDB's `memory_limit` does not count: a list or a string built by one function call.
UNBUFFERED = [
    "SELECT len(generate_series(1, 300000000)) AS n",
    "SELECT length(repeat('x', 1500000000)) AS n",
    "SELECT count(*) AS n FROM events WHERE length(repeat(note, 100000000)) > 0",
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sql", UNBUFFERED)
def test_memory_duckdb_does_not_count_is_bounded_too(
    accelerations: dict[str, Acceleration], sql: str
) -> None:
    import resource

    before = resource.getrlimit(resource.RLIMIT_AS)
    with accelerations["parquet"].reader() as reader:
        with pytest.raises(QueryLimitError, match=r"200MB memory limit.*memory_limit") as caught:
            reader.query(sql, memory_limit="200MB", timeout_s=60)
        assert caught.value.limit == "memory"
        assert resource.getrlimit(resource.RLIMIT_AS) == before, "the process's limit is restored"
        assert reader.query("SELECT count(*) AS n FROM events").column("n")[0].as_py() == ROWS


@pytest.mark.timeout(120)
def test_a_read_filter_is_bounded_in_memory(tmp_path: Path) -> None:
    acc = build_acceleration(tmp_path, make_table(), [("region", "region")], engine="parquet")
    with acc.reader(query_limits=QueryLimits(memory_limit="200MB")) as reader:
        with pytest.raises(QueryLimitError) as caught:
            reader.read("length(repeat(note, 100000000)) > 0")
        assert caught.value.limit == "memory"
        assert reader.read("region = 'EU'").num_rows == ROWS // 3


def long_or(terms: int) -> str:
    return " OR ".join(f"id = {i}" for i in range(terms))


@pytest.mark.timeout(300)
def test_the_time_limit_covers_parsing_and_pruning(accelerations: dict[str, Acceleration]) -> None:
    """A 10,000-term OR costs far more than 0.05 s to parse, check and prune, before DuckDB runs."""
    sql = f"SELECT count(*) AS n FROM events WHERE {long_or(10_000)}"
    with accelerations["parquet"].reader() as reader:
        with pytest.raises(QueryLimitError, match="time limit") as caught:
            reader.query(sql, timeout_s=0.05)
        assert caught.value.limit == "timeout"
    limits = QueryLimits(timeout_s=0.05)
    with accelerations["parquet"].reader(query_limits=limits) as reader:
        for call in (reader.plan, reader.read):
            with pytest.raises(QueryLimitError, match="time limit") as caught:
                call(long_or(10_000))
            assert caught.value.limit == "timeout"
