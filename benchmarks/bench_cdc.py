"""A change data capture refresh of 1,000 changed rows against a full refresh of the same Postgres table.

    python -m benchmarks.bench_cdc                  # 2,000,000 rows
    python -m benchmarks.bench_cdc --rows 10000000  # the issue's size
    python -m benchmarks.bench_cdc --quick          # 200,000 rows, 3 rounds

One table, two datasets partitioned by `date_trunc('day', created_at)` (365 days):
* `cdc`: `refresh_mode: changes` (change data capture from a logical replication slot, the default);
* `full` (the anchor): `refresh_mode: full`, refreshed with `--full` (every partition rewritten).
Each round, untimed: 1,000 changes land in the newest days (800 updates, some moving a row to another
day, 100 deletes, 100 inserts), the usual shape of an operational table; then both refresh in a shuffled
order (`benchmarks/pairing.py`) and the figure is the per-round ratio cdc / full (issue 26's goal: <= 0.05
at 10M rows). The cdc refresh decodes the slot, merges only the partitions the changed keys can be in
(file statistics of the key), and writes them; it does not read the table.

Needs a server with wal_level=logical: `--pg-admin-url` names one; by default a private cluster is
started with Debian's initdb/pg_ctl (as the tests do, `tests/pg_logical.py`) and stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks import load
from benchmarks.pairing import Ratio, Target, figure_line, run_rounds

CDC_TARGET = Target("<=", 0.05)
DAYS = 365
CHANGES = 1_000


def table_rows(start: int, rows: int, total: int) -> pa.Table:
    """Rows `start` .. `start + rows` of a `total`-row table whose ids grow with `created_at`: the newest
    days hold the highest ids."""
    rng = np.random.default_rng(start)
    ids = np.arange(start, start + rows)
    base = np.datetime64("2025-01-01T00:00:00", "us").astype(np.int64)
    created = base + ids * (DAYS * 86_400_000_000 // total)
    return pa.table(
        {
            "id": pa.array(ids, type=pa.int64()),
            "account": pa.array(rng.integers(0, 5000, rows), type=pa.int64()),
            "amount": pa.array(rng.normal(50, 20, rows)),
            "note": pa.array([f"n{v % 97}" for v in range(rows)], type=pa.string()),
            "created_at": pa.array(created.astype("datetime64[us]"), type=pa.timestamp("us")),
        }
    )


def spec_text(root: Path, url: str) -> str:
    datasets = []
    for name, mode in (("cdc", "changes"), ("full", "full")):
        datasets.append(
            f"  - name: {name}\n"
            "    from: postgres:public.bench_cdc\n"
            f"    params: {{url: '{url}'}}\n"
            "    acceleration:\n"
            f"      refresh_mode: {mode}\n"
            + ("      primary_key: [id]\n" if mode == "changes" else "")
            + "      partition_by: [{day: \"date_trunc('day', created_at)\"}]\n"
        )
    return f"accelerator_dir: {root / 'acc'}\ndatasets:\n" + "".join(datasets)


def change_batch(url: str, next_id: int, seed: int) -> int:
    """800 updates (every 8th moving its row a day back), 100 deletes, 100 inserts in the newest days."""
    import psycopg

    rng = np.random.default_rng(seed)
    with psycopg.connect(url, autocommit=True) as conn:
        newest = conn.execute("SELECT max(id) FROM public.bench_cdc").fetchone()
        assert newest is not None
        top = int(newest[0])
        picked = rng.choice(np.arange(max(0, top - 20_000), top), size=900, replace=False).tolist()
        updates, deletes = picked[:800], picked[800:]
        with conn.transaction():
            conn.execute(
                "UPDATE public.bench_cdc SET amount = amount + 1, note = 'changed' WHERE id = ANY(%s)",
                (updates[100:],),
            )
            conn.execute(
                "UPDATE public.bench_cdc SET created_at = created_at - interval '1 day' WHERE id = ANY(%s)",
                (updates[:100],),
            )
            conn.execute("DELETE FROM public.bench_cdc WHERE id = ANY(%s)", (deletes,))
            conn.execute(
                "INSERT INTO public.bench_cdc SELECT i, i %% 5000, 1.5, 'new', "
                "(SELECT max(created_at) FROM public.bench_cdc) FROM generate_series(%s, %s) AS i",
                (next_id, next_id + 99),
            )
    return next_id + 100


def check_equal(project: Any) -> None:
    """Both accelerations hold the same rows after the last round (a benchmark of wrong answers is void)."""
    from airflow_partitions.catalog import open_catalog
    from airflow_partitions.storage import get_storage

    tables = []
    for name in ("cdc", "full"):
        dataset = project.dataset(name)
        catalog = open_catalog(project, dataset)
        snapshot = catalog.latest()
        assert snapshot is not None
        files = [f for entry in snapshot.partitions.values() for f in entry.files]
        table = get_storage(dataset.acceleration).read(catalog.data_root, files)
        tables.append(table.sort_by("id"))
    assert tables[0].equals(tables[1]), "the cdc acceleration equals the full one"


def figure(root: Path, url: str, rows: int, rounds: int) -> tuple[Ratio, Any]:
    import adbc_driver_postgresql.dbapi as adbc
    import psycopg

    from airflow_partitions.refresh import refresh_dataset
    from airflow_partitions.refresh.spark_session import build_local_session
    from airflow_partitions.spec import load_spec

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.bench_cdc (id bigint PRIMARY KEY, account bigint, amount float8, "
            "note text, created_at timestamp)"
        )
    chunk = 1_000_000
    with adbc.connect(url) as conn, conn.cursor() as cur:
        for start in range(0, rows, chunk):
            part = table_rows(start, min(chunk, rows - start), rows)
            cur.adbc_ingest("bench_cdc", part, mode="append")
        conn.commit()
    (root / "spec.yaml").write_text(spec_text(root, url))
    project = load_spec(root / "spec.yaml")
    spark = build_local_session(app_name="bench-cdc")
    refresh_dataset(project, "cdc", spark=spark)
    refresh_dataset(project, "full", spark=spark)
    next_id = rows
    next_id = change_batch(url, next_id, seed=0)  # the warm-up round
    refresh_dataset(project, "cdc")
    refresh_dataset(project, "full", full=True, spark=spark)
    contenders = {
        "cdc": lambda: refresh_dataset(project, "cdc"),
        "full": lambda: refresh_dataset(project, "full", full=True, spark=spark),
    }
    seconds: dict[str, list[float]] = {"cdc": [], "full": []}
    results: dict[str, Any] = {}
    for index in range(rounds):
        next_id = change_batch(url, next_id, seed=index + 1)
        one = run_rounds(contenders, 1, warmup=False, seed=index)
        for name, values in one.seconds.items():
            seconds[name].extend(values)
        results.update(one.results)
    check_equal(project)
    summary = results["cdc"]
    assert summary.refresh_mode == "changes", summary.to_json()
    ratio = Ratio(tuple(c / f for c, f in zip(seconds["cdc"], seconds["full"], strict=True)))
    return ratio, (summary, seconds)


@contextlib.contextmanager
def logical_server(admin_url: str | None) -> Iterator[str]:
    if admin_url is not None:
        yield admin_url
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from pg_logical import logical_cluster

    with logical_cluster() as address:
        if address is None:
            raise SystemExit(
                "no initdb/pg_ctl on this machine: pass --pg-admin-url of a wal_level=logical server"
            )
        yield f"postgresql://postgres@{address[0]}:{address[1]}/postgres"


@contextlib.contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    import psycopg

    name = f"ap_bench_cdc_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            for (slot,) in conn.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)
            ).fetchall():
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows in the table")
    parser.add_argument("--repeat", type=int, default=5, help="paired rounds (1,000 changes each)")
    parser.add_argument("--quick", action="store_true", help="200,000 rows, 3 rounds")
    parser.add_argument("--pg-admin-url", default=None, help="a wal_level=logical server (default: private)")
    args = load.parse_args(parser, argv)
    rows = 200_000 if args.quick else args.rows
    rounds = 3 if args.quick else args.repeat
    root = Path(tempfile.mkdtemp(prefix="ap-bench-cdc-"))
    try:
        with logical_server(args.pg_admin_url) as admin, scratch_database(admin) as url:
            ratio, (summary, seconds) = figure(root, url, rows, rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"change data capture: {rows:,} rows over {DAYS} days, {CHANGES:,} changes a round, {rounds} rounds"
    )
    print(
        f"  cdc {np.median(seconds['cdc']):.2f} s (last: {summary.refreshed} partitions merged), "
        f"full {np.median(seconds['full']):.2f} s (median)"
    )
    print(
        figure_line(f"cdc refresh of {CHANGES:,} changes / full refresh ({rows:,} rows)", ratio, CDC_TARGET)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
