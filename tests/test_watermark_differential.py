"""Randomised differential test of the watermark modes: seeded sequences of inserts, late inserts, updates
(moving the watermark, moving partitions), deletes and future-dated rows applied to a Postgres table and to
Hive-laid-out Parquet files; after each step a refresh, then a full read compared with the source row for
row (a hash per row, NULLs and types included).

What a mode cannot see is named by the test, not assumed: `refresh_mode: changes` on a watermark does not
see hard deletes or rows stamped below its watermark (README, "which mode sees what"), so those steps are
not drawn for it; every step drawn must leave the acceleration equal to the source.
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
from test_refresh_modes import assert_equals_source

from airflow_partitions.refresh import refresh_dataset
from airflow_partitions.spec import load_spec
from airflow_partitions.spec.model import ProjectSpec

SEEDS = (3, 11, 29, 47, 83)
STEPS = 6
REGIONS = ["a/b", "k=v", "100%", "it's", "", None, "é中"]
NOTES = ["plain", 'say "hi"', "", None, "é中", "x=y/z"]
APPEND_STEPS = ("insert", "late", "move", "delete", "future")
CHANGES_STEPS = ("insert", "move", "future")


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
    """One step of `kind`; `jitter` stamps inserts up to 30 minutes back (late for append to find;
    changes on a watermark does not see rows stamped below its watermark, so it gets none)."""
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
            pg_step(conn, rng, kind, next_id, jitter=mode == "append")
            summary = refresh_dataset(project, "t")
            assert summary.refresh_mode == mode, f"seed {seed} step {step} ({kind})"
            assert_equals_source(project, "t")


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
