"""Randomised differential test of the watermark modes: seeded sequences of inserts, late inserts, updates
(moving the watermark, moving partitions), deletes and future-dated rows applied to a Postgres table and to
Hive-laid-out Parquet files; after each step a refresh, then a full read compared with the source row for
row (a hash per row, NULLs and types included).

Both modes get every step: what a watermark cannot read (late rows, hard deletes, rows whose watermark
moved) the refresh's audit finds and, under `refresh.late_rows: rewrite` (the default), rewrites, so every
step must leave the acceleration equal to the source; under `report` the test checks that each partition's
row count differs from the source's by exactly what the refresh named (`late_rows`), and nowhere else.
"""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_cdc_postgres import REGIONS as PG_REGIONS
from test_cdc_postgres import TEXTS, create_accounts, row
from test_cdc_postgres import assert_equals_source as assert_equals_table
from test_refresh_modes import assert_equals_source

from airflow_partitions.catalog import open_catalog
from airflow_partitions.refresh import refresh_dataset
from airflow_partitions.spec import load_spec
from airflow_partitions.spec.model import ProjectSpec

SEEDS = (3, 11, 29, 47, 83)
STEPS = 6
REGIONS = ["a/b", "k=v", "100%", "it's", "", None, "é中"]
NOTES = ["plain", 'say "hi"', "", None, "é中", "x=y/z"]
APPEND_STEPS = ("insert", "late", "move", "delete", "future")
CHANGES_STEPS = APPEND_STEPS


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


# --- Postgres --------------------------------------------------------------------------------------


def pg_project(tmp_path: Path, url: str, mode: str) -> ProjectSpec:
    extra = "      primary_key: [id]\n" if mode == "changes" else ""
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: t\n"
        "    from: postgres:public.t\n"
        f"    params: {{url: '{url}', pushdown: always, reader: adbc}}\n"
        "    acceleration:\n"
        f"      refresh_mode: {mode}\n"
        f"{extra}"
        '      partition_by: [{r: "region"}]\n'
        "      refresh: {watermark_column: ts}\n"
    )
    return load_spec(tmp_path / "spec.yaml")


def pg_step(conn: Any, rng: random.Random, kind: str, next_id: list[int], *, jitter: bool = True) -> None:
    """One step of `kind`; `jitter` stamps inserts up to 30 minutes back (late rows for the audit to find)."""
    ids = [row[0] for row in conn.execute("SELECT id FROM public.t ORDER BY id").fetchall()]
    picked = rng.sample(ids, min(len(ids), rng.randint(1, 4)))
    if kind in ("insert", "late", "future"):
        offset = {"insert": dt.timedelta(0), "late": -dt.timedelta(days=20), "future": dt.timedelta(days=30)}
        for _ in range(rng.randint(1, 5)):
            next_id[0] += 1
            # Stamped by the server's clock, as the `move` step's `now()`: a Python time cut to the second
            # could fall below a watermark a `move` set earlier in that second, a late row for `changes`.
            conn.execute(
                "INSERT INTO public.t VALUES (%s, %s, %s, %s, clock_timestamp() + %s)",
                (
                    next_id[0],
                    rng.choice(REGIONS),
                    rng.choice([None, f"{rng.uniform(-99, 99):.2f}"]),
                    rng.choice(NOTES),
                    offset[kind] - dt.timedelta(minutes=rng.randint(0, 30) if jitter else 0),
                ),
            )
    elif kind == "move":  # an update: a new value, the watermark forward, sometimes another partition
        for row_id in picked:
            conn.execute(
                "UPDATE public.t SET note = %s, region = CASE WHEN %s THEN %s ELSE region END, ts = now() "
                "WHERE id = %s",
                (rng.choice(NOTES), rng.random() < 0.5, rng.choice(REGIONS), row_id),
            )
    elif kind == "delete":
        conn.execute("DELETE FROM public.t WHERE id = ANY(%s)", (picked,))


@pytest.mark.postgres
@pytest.mark.parametrize("mode", ["append", "changes"])
@pytest.mark.parametrize("seed", SEEDS)
def test_postgres_watermark_modes_equal_the_source_after_every_step(
    pg_database: str, tmp_path: Path, mode: str, seed: int
) -> None:
    rng = random.Random(seed)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.t (id bigint PRIMARY KEY, region text, amount numeric(8, 2), note text, "
            "ts timestamptz)"
        )
        conn.execute("CREATE INDEX t_region ON public.t (region)")
        next_id = [0]
        for kind in ("late", "insert", "insert"):
            pg_step(conn, rng, kind, next_id)
        project = pg_project(tmp_path, pg_database, mode)
        refresh_dataset(project, "t")
        assert_equals_source(project, "t")
        for step in range(STEPS):
            kind = rng.choice(APPEND_STEPS if mode == "append" else CHANGES_STEPS)
            pg_step(conn, rng, kind, next_id)
            summary = refresh_dataset(project, "t")
            # changes rewrites what its audit found whole, with the changed partitions (a full plan).
            rewritten = mode == "changes" and bool(summary.late_rows)
            expected_mode = "full" if rewritten else mode
            assert summary.refresh_mode == expected_mode, f"seed {seed} step {step} ({kind})"
            assert_equals_source(project, "t")


def watermark_project(tmp_path: Path, url: str, mode: str, policy: str) -> ProjectSpec:
    """The accounts table refreshed on the `updated_at` watermark: `append`, or `changes` with
    change_detection watermark (the variant for sources where no slot can be created)."""
    detection = ", change_detection: watermark" if mode == "changes" else ""
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: accounts\n"
        "    from: postgres:public.accounts\n"
        f"    params: {{url: '{url}', pushdown: always}}\n"
        "    acceleration:\n"
        f"      refresh_mode: {mode}\n"
        "      primary_key: [id]\n"
        '      partition_by: [{r: "region"}]\n'
        f"      refresh: {{watermark_column: updated_at, late_rows: {policy}{detection}}}\n"
    )
    return load_spec(tmp_path / "spec.yaml")


def count_differences(project: ProjectSpec, url: str) -> dict[str, int]:
    """Per partition, the table's rows minus the acceleration's (only partitions that differ)."""
    from airflow_partitions.keys import PartitionKey

    with psycopg.connect(url) as conn:
        counts = conn.execute("SELECT region, count(*) FROM public.accounts GROUP BY region").fetchall()
    source = {PartitionKey((region,)).path(["r"]): n for region, n in counts}
    snapshot = open_catalog(project, project.dataset("accounts")).latest()
    assert snapshot is not None
    held = {path: entry.rows for path, entry in snapshot.partitions.items()}
    differences = {path: source.get(path, 0) - held.get(path, 0) for path in {*source, *held}}
    return {path: n for path, n in sorted(differences.items()) if n}


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("mode", "policy"),
    [("append", "rewrite"), ("changes", "rewrite"), ("append", "report"), ("changes", "report")],
)
def test_watermark_random_sequences_equal_the_table_or_name_what_they_miss(
    pg_database: str, tmp_path: Path, mode: str, policy: str
) -> None:
    """Seeded random steps on the watermark modes: inserts, updates that move the watermark (in place
    and between partitions, the NULL one included), hard deletes, and late rows (a watermark below the
    partition's, or NULL). After every refresh: under late_rows: rewrite the acceleration equals the table
    row for row; under report each partition's row count differs from the table's by exactly what the
    refresh named (`late_rows`), and nowhere else.

    A step holds deletes and updates, or late rows, never both: the audit counts rows, so a delete and a
    late row of one partition between two refreshes cancel (`airflow-partitions verify` compares row
    hashes). An update that keeps its watermark is no change a watermark sees; none is made here."""
    import random

    url = pg_database
    create_accounts(url, rows=40)
    project = watermark_project(tmp_path, url, mode, policy)
    refresh_dataset(project, "accounts")
    assert_equals_table(project)
    rng = random.Random(7)
    clock = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    next_id = 1000
    named: list[dict[str, int]] = []
    for _ in range(4):
        late_step = rng.random() < 0.5
        with psycopg.connect(url, autocommit=True) as conn:
            ids = [r[0] for r in conn.execute("SELECT id FROM public.accounts").fetchall()]
            for _ in range(rng.randint(2, 6)):
                clock += dt.timedelta(seconds=rng.randint(1, 90))
                op = rng.choice(["insert", "late"] if late_step else ["insert", "update", "move", "delete"])
                if op in {"insert", "late"}:
                    values = list(row(next_id, version=rng.randint(0, 9)))
                    values[4] = clock if op == "insert" else rng.choice([None, dt.datetime(2026, 1, 1)])
                    conn.execute("INSERT INTO public.accounts VALUES (%s, %s, %s, %s, %s, %s)", values)
                    ids.append(next_id)
                    next_id += 1
                    continue
                target = rng.choice(ids)
                if op == "update":
                    conn.execute(
                        "UPDATE public.accounts SET note = %s, balance = %s, updated_at = %s WHERE id = %s",
                        (rng.choice(TEXTS), rng.choice([None, "0.01", "99.99"]), clock, target),
                    )
                elif op == "move":
                    conn.execute(
                        "UPDATE public.accounts SET region = %s, updated_at = %s WHERE id = %s",
                        (rng.choice(PG_REGIONS), clock, target),
                    )
                else:
                    conn.execute("DELETE FROM public.accounts WHERE id = %s", (target,))
                    ids.remove(target)
        summary = refresh_dataset(project, "accounts")
        assert summary.late_rows is not None, "the watermark audit ran"
        named.append(summary.late_rows)
        if policy == "rewrite":
            assert_equals_table(project)
        else:
            assert summary.late_rows == count_differences(project, url), (
                "the partitions and counts named are exactly where the acceleration differs"
            )
    assert any(named), "the sequence holds rows the watermark cannot see"


# --- Parquet files ---------------------------------------------------------------------------------


FILE_REGIONS = ["a", "b%2Fc", "k=v", "é"]


def rows_table(ids: list[int], rng: random.Random, stamp: dt.datetime) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, type=pa.int64()),
            "note": pa.array([rng.choice(NOTES) for _ in ids], type=pa.string()),
            "ts": pa.array(
                [
                    None if rng.random() < 0.1 else stamp - dt.timedelta(minutes=rng.randint(0, 30))
                    for _ in ids
                ],
                type=pa.timestamp("us"),
            ),
        }
    )


def file_step(root: Path, rng: random.Random, kind: str, next_id: list[int]) -> None:
    files = sorted(root.glob("*/*.parquet"))
    if kind in ("insert", "late", "future"):
        offset = {"insert": dt.timedelta(0), "late": -dt.timedelta(days=20), "future": dt.timedelta(days=30)}
        ids = list(range(next_id[0] + 1, next_id[0] + 1 + rng.randint(1, 5)))
        next_id[0] = ids[-1]
        region = root / f"region={rng.choice(FILE_REGIONS)}"
        region.mkdir(exist_ok=True)
        stamp = now().replace(tzinfo=None) + offset[kind]
        pq.write_table(rows_table(ids, rng, stamp), region / f"f{ids[0]}.parquet")
    else:  # rewrite a file: a row moved forward ("move") or dropped ("delete")
        target = rng.choice(files)
        table = pq.read_table(target)
        index = rng.randrange(table.num_rows)
        # A file is never emptied: a Hive directory whose files hold no row is a partition discovery
        # lists but no read finds (a separate matter from watermarks).
        if kind == "delete" and table.num_rows > 1:
            table = table.filter(pa.array([i != index for i in range(table.num_rows)]))
        else:
            stamps = table.column("ts").to_pylist()
            # Microseconds, as a writer's clock stamps them: strictly past every committed value.
            stamps[index] = dt.datetime.now(dt.UTC).replace(tzinfo=None)
            table = table.set_column(2, "ts", pa.array(stamps, type=pa.timestamp("us")))
        pq.write_table(table, target)


@pytest.mark.parametrize("seed", SEEDS)
def test_parquet_append_equals_the_source_after_every_step(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    root = tmp_path / "src"
    root.mkdir()
    next_id = [0]
    for kind in ("late", "insert", "insert"):
        file_step(root, rng, kind, next_id)
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: t\n"
        f"    from: file:{root}\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        "      refresh_mode: append\n"
        '      partition_by: [{r: "region"}]\n'
        "      refresh: {watermark_column: ts}\n"
    )
    project = load_spec(tmp_path / "spec.yaml")
    refresh_dataset(project, "t")
    assert_equals_source(project, "t")
    for step in range(STEPS):
        kind = rng.choice(APPEND_STEPS)
        file_step(root, rng, kind, next_id)
        summary = refresh_dataset(project, "t")
        assert summary.refresh_mode == "append", f"seed {seed} step {step} ({kind})"
        assert_equals_source(project, "t")
