"""refresh_mode: changes with change data capture (a logical replication slot, pgoutput) against a real
Postgres with wal_level=logical (a private cluster, `pg_logical.py`).

After every refresh a full read equals the Postgres table row for row (hash per row, types and NULLs) and
a filtered read equals DuckDB over the rows Postgres holds. Hostile rows throughout: NULLs in every
non-key column (the partition column included), quotes, `/`, `=`, `%`, unicode, empty strings,
timestamps with offsets.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from airflow_partitions.catalog import open_catalog
from airflow_partitions.cli.main import main
from airflow_partitions.exceptions import ChangeCaptureError, SlotLostError, WalLevelError
from airflow_partitions.refresh import refresh_dataset
from airflow_partitions.refresh.cdc import KILL_AT_ENV, change_stream, committed_position
from airflow_partitions.sources import open_source
from airflow_partitions.spec import load_spec
from airflow_partitions.spec.model import ProjectSpec
from airflow_partitions.storage import get_storage

pytestmark = pytest.mark.postgres

TEXTS = ["a/b", "k=v", "100%", "it's", 'say "hi"', "", None, "é中", "plain"]
REGIONS = ["north", "south/east", "k=v", None, "100%"]


def row_hash(row: dict[str, Any]) -> str:
    """A row's identity: every value, NULLs and types included."""
    text = json.dumps({k: [type(v).__name__, repr(v)] for k, v in sorted(row.items())}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def accelerated(project: ProjectSpec, name: str) -> pa.Table:
    dataset = project.dataset(name)
    catalog = open_catalog(project, dataset)
    snapshot = catalog.latest()
    assert snapshot is not None
    assert catalog.data_root is not None
    files = [f for entry in snapshot.partitions.values() for f in entry.files]
    return get_storage(dataset.acceleration).read(catalog.data_root, files)


def assert_equals_source(project: ProjectSpec, name: str = "accounts") -> None:
    """Full read == the Postgres table, row hash for row hash; a filtered read == DuckDB over the table."""
    import duckdb

    from airflow_partitions.read import PartitionedDatasetReader

    table = accelerated(project, name)
    source = open_source(project.dataset(name).source).read_all()
    assert table.schema.equals(source.schema), f"{table.schema} != {source.schema}"
    ours = sorted(row_hash(r) for r in table.to_pylist())
    theirs = sorted(row_hash(r) for r in source.to_pylist())
    assert len(set(ours)) == len(ours), "no row is in the acceleration twice"
    assert ours == theirs, "the acceleration holds exactly the Postgres rows"
    where = "balance > 10 AND region IS NOT NULL"
    with PartitionedDatasetReader(project, name) as reader:
        filtered = reader.read(where)
    expected = duckdb.sql(f"SELECT * FROM source WHERE {where}").to_arrow_table()
    assert sorted(row_hash(r) for r in filtered.to_pylist()) == sorted(
        row_hash(r) for r in expected.to_pylist()
    ), "a filtered read equals DuckDB over the rows Postgres holds"


def create_accounts(url: str, rows: int = 30) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.accounts (id bigint PRIMARY KEY, region text, balance numeric(12, 2), "
            "note text, updated_at timestamptz, seen timestamp)"
        )
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO public.accounts VALUES (%s, %s, %s, %s, %s, %s)", [row(i) for i in range(rows)]
            )


def row(i: int, *, version: int = 0) -> tuple[Any, ...]:
    offset = dt.timezone(dt.timedelta(hours=(i % 5) - 2, minutes=30 * (i % 2)))
    return (
        i,
        REGIONS[(i + version) % len(REGIONS)],
        None if i % 6 == 0 else f"{i * 2.5 + version:.2f}",
        TEXTS[(i + version) % len(TEXTS)],
        None if i % 7 == 3 else dt.datetime(2026, 5, 1, 8, tzinfo=offset) + dt.timedelta(minutes=i + version),
        None if i % 5 == 4 else dt.datetime(2026, 5, 1, 8) + dt.timedelta(seconds=i * 7 + version),
    )


def accounts_project(tmp_path: Path, url: str, *, extra: str = "") -> ProjectSpec:
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: accounts\n"
        "    from: postgres:public.accounts\n"
        f"    params: {{url: '{url}', pushdown: always}}\n"
        "    acceleration:\n"
        "      refresh_mode: changes\n"
        "      primary_key: [id]\n"
        '      partition_by: [{r: "region"}]\n'
        f"{extra}"
    )
    return load_spec(tmp_path / "spec.yaml")


def execute(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def test_cdc_inserts_updates_moves_deletes_and_truncate(
    pg_logical_database: str, tmp_path: Path, capsys: Any
) -> None:
    url = pg_logical_database
    create_accounts(url)
    project = accounts_project(tmp_path, url)
    first = refresh_dataset(project, "accounts")
    assert first.refresh_mode == "full", "the first refresh copies the table and starts the stream"
    assert any("replication slot" in note for note in first.notes), first.notes
    assert_equals_source(project)

    # Inserts with NULLs in every non-key column, in-place updates, a move to another partition (and to
    # the NULL one), a primary-key change, deletes.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO public.accounts VALUES (100, NULL, NULL, NULL, NULL, NULL)")
        conn.execute(
            "INSERT INTO public.accounts VALUES (101, 'k=v', 12.5, %s, '2026-05-02 10:00:00+05:30', "
            "'2026-05-02 10:00:00')",
            ("quote ' and \" and / = % é中",),
        )
        conn.execute("UPDATE public.accounts SET balance = balance + 1, note = 'it''s' WHERE id = 1")
        conn.execute("UPDATE public.accounts SET region = 'south/east' WHERE id = 2")
        conn.execute("UPDATE public.accounts SET region = NULL WHERE id = 5")
        conn.execute("UPDATE public.accounts SET id = 500 WHERE id = 7")
        conn.execute("DELETE FROM public.accounts WHERE id IN (3, 4)")
        conn.execute("INSERT INTO public.accounts VALUES (102, 'north', 1, 'gone', NULL, NULL)")
        conn.execute("DELETE FROM public.accounts WHERE id = 102")  # inserted and deleted in one batch
    second = refresh_dataset(project, "accounts")
    assert second.refresh_mode == "changes"
    assert any("4 key(s) to delete" in note for note in second.notes), second.notes
    assert_equals_source(project)

    # Nothing changed: nothing committed.
    third = refresh_dataset(project, "accounts")
    assert third.version is None
    assert_equals_source(project)

    # TRUNCATE forces a full copy, said in the output.
    execute(
        url, "TRUNCATE public.accounts", "INSERT INTO public.accounts VALUES (1, 'north', 3, 'x', NULL, NULL)"
    )
    capsys.readouterr()
    assert main(["refresh", str(tmp_path / "spec.yaml"), "accounts"]) == 0
    said = capsys.readouterr().err
    assert "refresh_mode full" in said
    assert "change data capture: TRUNCATE of public.accounts in the change stream: a full refresh" in said
    assert_equals_source(project)
    execute(url, "UPDATE public.accounts SET balance = 99 WHERE id = 1")
    fifth = refresh_dataset(project, "accounts")
    assert fifth.refresh_mode == "changes"
    assert_equals_source(project)


@pytest.mark.spark
def test_cdc_changes_merged_by_spark_executors(pg_logical_database: str, tmp_path: Path, spark: Any) -> None:
    """With a Spark session the executors merge each touched partition (rows upserted, keys deleted),
    with the same per-partition conservation."""
    url = pg_logical_database
    create_accounts(url)
    project = accounts_project(tmp_path, url)
    refresh_dataset(project, "accounts", spark=spark)
    execute(
        url,
        "UPDATE public.accounts SET region = NULL, note = 'moved' WHERE id = 1",
        "UPDATE public.accounts SET id = 1000, region = 'k=v' WHERE id = 2",
        "DELETE FROM public.accounts WHERE id IN (17, 18, 19)",
        "INSERT INTO public.accounts VALUES (1001, '100%', 0.01, '', '2026-01-01 00:00:00-08', NULL)",
    )
    second = refresh_dataset(project, "accounts", spark=spark)
    assert second.refresh_mode == "changes"
    assert second.stage_mode == "written", "the executors merged the partitions"
    assert_equals_source(project)


@pytest.mark.parametrize("strategy", ["arrow", "pushdown", pytest.param("spark", marks=pytest.mark.spark)])
def test_cdc_first_copy_is_read_at_the_slots_snapshot(
    pg_logical_database: str,
    tmp_path: Path,
    monkeypatch: Any,
    strategy: str,
    request: pytest.FixtureRequest,
) -> None:
    """Changes committed after the slot's creation but before the first copy is read (an update, a move,
    a delete, an insert): the copy holds the table as it was at the slot's start, the next refresh applies
    each change once (the old order copied them and streamed them again). Through Spark, a local
    session reads the table through ADBC, at the snapshot too."""
    from airflow_partitions.sources.pg_cdc import ChangeStream

    spark = request.getfixturevalue("spark") if strategy == "spark" else None

    url = pg_logical_database
    create_accounts(url)
    before = open_source(accounts_project(tmp_path, url).dataset("accounts").source).read_all()
    created = ChangeStream.create

    def create_then_change(self: ChangeStream, conn: Any) -> tuple[str, str | None]:
        start = created(self, conn)
        execute(
            url,
            "UPDATE public.accounts SET note = 'after the slot', balance = 1 WHERE id = 1",
            "UPDATE public.accounts SET region = 'moved' WHERE id = 2",
            "DELETE FROM public.accounts WHERE id = 3",
            "INSERT INTO public.accounts VALUES (400, NULL, NULL, '', NULL, NULL)",
        )
        return start

    monkeypatch.setattr(ChangeStream, "create", create_then_change)
    project = accounts_project(tmp_path, url)
    first = refresh_dataset(project, "accounts", strategy=strategy, spark=spark)
    assert first.refresh_mode == "full"
    assert any("at the slot's exported snapshot" in note for note in first.notes), first.notes
    copied = sorted(row_hash(r) for r in accelerated(project, "accounts").to_pylist())
    assert copied == sorted(row_hash(r) for r in before.to_pylist()), "the copy is the table at the start"
    monkeypatch.setattr(ChangeStream, "create", created)
    second = refresh_dataset(project, "accounts")
    assert second.refresh_mode == "changes"
    assert second.changed_rows == 4, second.notes
    assert any("3 row(s) to upsert, 1 key(s) to delete" in note for note in second.notes), second.notes
    assert_equals_source(project)
    from airflow_partitions.sources import pg_cdc

    assert not pg_cdc._EXPORTED, "the snapshot's connection is closed after the copy"


def test_cdc_long_transaction_update_arrives(pg_logical_database: str, tmp_path: Path) -> None:
    """T1 updates id 8 and stays open, T2 updates id 9 and commits, refresh, T1 commits, refresh: id 8's
    new values and partition arrive (the watermark variant loses them for ever)."""
    url = pg_logical_database
    create_accounts(url)
    project = accounts_project(tmp_path, url)
    refresh_dataset(project, "accounts")
    with psycopg.connect(url) as t1:
        t1.execute("UPDATE public.accounts SET region = 'late', updated_at = now() WHERE id = 8")
        execute(url, "UPDATE public.accounts SET balance = 1234.5, updated_at = now() WHERE id = 9")
        refresh_dataset(project, "accounts")
        assert_equals_source(project)  # T2's update; T1's is not committed yet
        t1.commit()
    refresh_dataset(project, "accounts")
    assert_equals_source(project)
    ids = accelerated(project, "accounts").to_pylist()
    assert next(r for r in ids if r["id"] == 8)["region"] == "late"


def test_cdc_unchanged_toasted_values_are_kept(pg_logical_database: str, tmp_path: Path) -> None:
    url = pg_logical_database
    create_accounts(url)
    # Incompressible, so stored out of line (TOAST): sent as "unchanged" when another column changes.
    execute(
        url,
        "UPDATE public.accounts SET note = (SELECT string_agg(md5(g::text) || 'é', '') "
        "FROM generate_series(1, 5000) g) WHERE id = 10",
    )
    project = accounts_project(tmp_path, url)
    refresh_dataset(project, "accounts")
    execute(url, "UPDATE public.accounts SET balance = 7 WHERE id = 10")
    refresh_dataset(project, "accounts")
    assert_equals_source(project)


def test_cdc_refuses_a_server_without_logical_wal(pg_database: str, tmp_path: Path) -> None:
    """The shared server runs wal_level=replica: the error says what to change."""
    create_accounts(pg_database)
    project = accounts_project(tmp_path, pg_database)
    with pytest.raises(
        WalLevelError, match=r"ALTER SYSTEM SET wal_level = logical.*change_detection: watermark"
    ):
        refresh_dataset(project, "accounts")


def test_cdc_dropped_slot_is_refused_until_full(
    pg_logical_database: str, tmp_path: Path, capsys: Any
) -> None:
    url = pg_logical_database
    create_accounts(url)
    project = accounts_project(tmp_path, url)
    refresh_dataset(project, "accounts")
    spec = str(tmp_path / "spec.yaml")
    assert main(["cdc", "status", spec, "accounts", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["slot"]["slot"].startswith("ap_accounts_")
    assert status["slot"]["lag_bytes"] >= 0
    assert status["slot"]["retained_wal_bytes"] >= status["slot"]["lag_bytes"]
    assert status["committed_lsn"] == status["slot"]["confirmed_flush_lsn"]
    assert main(["status", spec, "accounts", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["datasets"][0]
    assert report["cdc"]["slot_name"] == status["slot_name"]
    assert main(["status", spec, "accounts"]) == 0
    assert f"change capture accounts: slot {status['slot_name']} confirmed at" in capsys.readouterr().out
    assert main(["cdc", "drop", spec, "accounts"]) == 0
    capsys.readouterr()
    execute(url, "DELETE FROM public.accounts WHERE id = 11")
    with pytest.raises(SlotLostError, match=r"--full"):
        refresh_dataset(project, "accounts")
    again = refresh_dataset(project, "accounts", full=True)
    assert again.refresh_mode == "full"
    assert_equals_source(project)
    execute(url, "DELETE FROM public.accounts WHERE id = 12")
    refresh_dataset(project, "accounts")
    assert_equals_source(project)


def test_cdc_refuses_a_re_created_table_until_full(pg_logical_database: str, tmp_path: Path) -> None:
    """A table dropped and re-created leaves the publication: its changes never reach the slot."""
    url = pg_logical_database
    create_accounts(url)
    project = accounts_project(tmp_path, url)
    refresh_dataset(project, "accounts")
    execute(url, "DROP TABLE public.accounts")
    create_accounts(url, rows=12)
    execute(url, "DELETE FROM public.accounts WHERE id = 3")
    with pytest.raises(ChangeCaptureError, match=r"no longer in publication .* --full"):
        refresh_dataset(project, "accounts")
    refresh_dataset(project, "accounts", full=True)
    assert_equals_source(project)
    execute(
        url,
        "UPDATE public.accounts SET region = 'k=v' WHERE id = 4",
        "DELETE FROM public.accounts WHERE id = 5",
    )
    assert refresh_dataset(project, "accounts").refresh_mode == "changes"
    assert_equals_source(project)


def test_cdc_watermark_variant_stays_available(pg_logical_database: str, tmp_path: Path) -> None:
    url = pg_logical_database
    create_accounts(url)
    project = accounts_project(
        tmp_path, url, extra="      refresh: {watermark_column: updated_at, change_detection: watermark}\n"
    )
    refresh_dataset(project, "accounts")
    assert change_stream(project, project.dataset("accounts")).info() is None, "no slot is created"


KILL_POINTS = ["cdc-before-apply", "cdc-after-commit", "cdc-after-advance"]


@pytest.mark.parametrize("kill_at", KILL_POINTS)
def test_cdc_exactly_once_across_sigkill(pg_logical_database: str, tmp_path: Path, kill_at: str) -> None:
    """`airflow-partitions refresh` killed (SIGKILL) at each step of the protocol, then run again: the
    acceleration equals the table; no change lost, none applied twice."""
    url = pg_logical_database
    create_accounts(url)
    project = accounts_project(tmp_path, url)
    spec = str(tmp_path / "spec.yaml")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def cli(*args: str, kill: str | None = None) -> subprocess.CompletedProcess[str]:
        run_env = {**env, KILL_AT_ENV: kill} if kill else env
        return subprocess.run(
            [sys.executable, "-m", "airflow_partitions.cli.main", *args],
            env=run_env,
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )

    assert cli("refresh", spec, "accounts").returncode == 0
    execute(
        url,
        "UPDATE public.accounts SET region = 'k=v', balance = 1 WHERE id = 13",
        "DELETE FROM public.accounts WHERE id = 14",
        "INSERT INTO public.accounts VALUES (200, NULL, 5, 'new', NULL, NULL)",
        "UPDATE public.accounts SET id = 300 WHERE id = 15",
    )
    killed = cli("refresh", spec, "accounts", kill=kill_at)
    assert killed.returncode == -9, killed.stderr
    dataset = project.dataset("accounts")
    catalog = open_catalog(project, dataset)
    info = change_stream(project, dataset).info()
    assert info is not None
    if kill_at == "cdc-after-commit":
        assert committed_position(catalog) != info.confirmed_flush_lsn, "committed, the slot not advanced"
    execute(url, "UPDATE public.accounts SET note = 'after the crash' WHERE id = 16")
    rerun = cli("refresh", spec, "accounts")
    assert rerun.returncode == 0, rerun.stderr
    assert_equals_source(project)
    info = change_stream(project, dataset).info()
    assert info is not None
    assert info.confirmed_flush_lsn == committed_position(catalog)


@pytest.mark.parametrize("seed", [1, 2])
def test_cdc_random_sequences_equal_the_table_after_every_refresh(
    pg_logical_database: str, tmp_path: Path, seed: int
) -> None:
    """Seeded random batches of inserts, in-place updates, moves between partitions (NULL one included),
    key changes and deletes, some in one transaction, some spread over several; after every refresh the
    acceleration equals the table."""
    import random

    url = pg_logical_database
    create_accounts(url, rows=60)
    project = accounts_project(tmp_path, url)
    refresh_dataset(project, "accounts")
    rng = random.Random(seed)
    next_id = 1000
    for _ in range(5):
        with psycopg.connect(url, autocommit=True) as conn:
            ids = [r[0] for r in conn.execute("SELECT id FROM public.accounts").fetchall()]
            for _ in range(rng.randint(1, 3)):  # transactions per batch
                with conn.transaction():
                    for _ in range(rng.randint(1, 8)):
                        op = rng.choice(["insert", "update", "move", "rekey", "delete"])
                        if op == "insert" or not ids:
                            conn.execute(
                                "INSERT INTO public.accounts VALUES (%s, %s, %s, %s, %s, %s)",
                                row(next_id, version=rng.randint(0, 9)),
                            )
                            ids.append(next_id)
                            next_id += 1
                            continue
                        target = rng.choice(ids)
                        if op == "update":
                            conn.execute(
                                "UPDATE public.accounts SET note = %s, balance = %s WHERE id = %s",
                                (rng.choice(TEXTS), rng.choice([None, "0.01", "99.99"]), target),
                            )
                        elif op == "move":
                            conn.execute(
                                "UPDATE public.accounts SET region = %s WHERE id = %s",
                                (rng.choice(REGIONS), target),
                            )
                        elif op == "rekey":
                            conn.execute(
                                "UPDATE public.accounts SET id = %s WHERE id = %s", (next_id, target)
                            )
                            ids[ids.index(target)] = next_id
                            next_id += 1
                        else:
                            conn.execute("DELETE FROM public.accounts WHERE id = %s", (target,))
                            ids.remove(target)
        refresh_dataset(project, "accounts")
        assert_equals_source(project)
