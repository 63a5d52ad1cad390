"""Shared parts of the write tests: a hostile Postgres source, specs over it, an oracle of applied writes."""

from __future__ import annotations

import datetime as dt
import json
import random
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.spec import load_spec
from airflow_partitions.spec.model import ProjectSpec

UTC = dt.UTC
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("region", pa.string()),
        ("ts", pa.timestamp("us", "UTC")),
        ("amount", pa.decimal128(12, 2)),
        ("note", pa.string()),
    ]
)
REGIONS = [None, "EU", "US", "", "a/b", "k=v", "100%", "it's", 'say "hi"', "日本", "🙂", "NULL", "%NULL"]
NOTES = [None, "", "plain", "tab\there", "new\nline", "ünïcödé", "x" * 300]


def hostile_rows(seed: int, ids: range, *, regions: list[str | None] | None = None) -> pa.Table:
    """Rows with NULLs in every column but `id` (the key), hostile strings, instants and decimals."""
    rng = random.Random(seed)
    pool = regions or REGIONS
    rows: list[dict[str, Any]] = []
    for i in ids:
        ts = dt.datetime(2026, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=rng.randrange(0, 40 * 86_400))
        rows.append(
            {
                "id": i,
                "region": rng.choice(pool),
                "ts": None if rng.random() < 0.1 else ts.replace(microsecond=rng.randrange(10**6)),
                "amount": None if rng.random() < 0.1 else Decimal(rng.randint(-99_999, 99_999)).scaleb(-2),
                "note": rng.choice(NOTES),
            }
        )
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def create_source(url: str, table: pa.Table, name: str = "items") -> None:
    """A Postgres table `name` holding `table` (id the primary key; region indexed for pushdown)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {name} (id bigint PRIMARY KEY, region text, ts timestamptz, amount numeric(12,2), "
            "note text)"
        )
        conn.execute(f"CREATE INDEX ON {name} (region)")
        conn.execute(f"CREATE INDEX ON {name} (ts)")
        with conn.cursor() as cur, cur.copy(f"COPY {name} (id, region, ts, amount, note) FROM STDIN") as copy:
            for row in table.to_pylist():
                copy.write_row([row[n] for n in SCHEMA.names])


def source_rows(url: str, name: str = "items") -> pa.Table:
    """What the Postgres table holds, read with psycopg (not through the package)."""
    import psycopg

    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SET TIME ZONE 'UTC'")
        cur.execute(f"SELECT id, region, ts, amount, note FROM {name}")
        rows = [dict(zip(SCHEMA.names, r, strict=True)) for r in cur.fetchall()]
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def write_spec(
    tmp_path: Path,
    url: str,
    partition_by: list[str],
    *,
    engine: str = "parquet",
    params: dict[str, Any] | None = None,
    table: str = "items",
) -> ProjectSpec:
    acceleration_params = params or {}
    lines = [
        "accelerator_dir: acc",
        "datasets:",
        "  - name: items",
        f"    from: postgres:public.{table}",
        f"    params: {json.dumps({'url': url, 'pushdown': 'always'})}",
        "    acceleration:",
        f"      engine: {engine}",
        f"      params: {json.dumps(acceleration_params)}",
        '      primary_key: ["id"]',
        "      partition_by:",
        *[f"        - {json.dumps(field)}" for field in partition_by],
    ]
    path = tmp_path / "spec.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return load_spec(path)


def read_all(project: ProjectSpec | Path, version: int | None = None) -> pa.Table:
    reader = PartitionedDatasetReader(project, "items")
    try:
        return reader.read(version=version) if version is not None else reader.read()
    finally:
        reader.close()


class Oracle:
    """The rows a dataset must hold, by id (unique), after the writes applied to it in Python."""

    def __init__(self, table: pa.Table) -> None:
        self.rows: dict[int, dict[str, Any]] = {r["id"]: r for r in table.to_pylist()}

    def append(self, table: pa.Table) -> None:
        for row in table.to_pylist():
            assert row["id"] not in self.rows, "test data: appended ids are new"
            self.rows[row["id"]] = row

    def upsert(self, table: pa.Table) -> None:
        for row in table.to_pylist():
            self.rows[row["id"]] = row

    def delete(self, predicate: Any) -> int:
        doomed = [i for i, row in self.rows.items() if predicate(row)]
        for i in doomed:
            del self.rows[i]
        return len(doomed)

    def table(self) -> pa.Table:
        return pa.Table.from_pylist(list(self.rows.values()), schema=SCHEMA)


def fresh_database() -> Any:
    """A context manager creating a fresh Postgres database (dropped on exit), yielding its URL: one per
    test module, each test using its own tables (a database costs seconds to drop)."""
    import contextlib
    import uuid

    import psycopg

    from tests.conftest import PG_HOST, PG_PORT, PG_USER

    @contextlib.contextmanager
    def database() -> Any:
        name = f"ap_test_{uuid.uuid4().hex[:12]}"
        admin = {"host": PG_HOST, "port": PG_PORT, "user": PG_USER, "dbname": "postgres", "autocommit": True}
        with psycopg.connect(**admin) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"
        finally:
            with psycopg.connect(**admin) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return database()


class Source:
    """A Postgres table of its own in the module's database (create it, read it back, spec over it)."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.url = url
        self.table = f"items_{uuid.uuid4().hex[:8]}"
        self.tmp_path = tmp_path

    def create(self, rows: pa.Table) -> None:
        create_source(self.url, rows, self.table)

    def rows(self) -> pa.Table:
        return source_rows(self.url, self.table)

    def spec(self, layout: list[str], **options: Any) -> ProjectSpec:
        return write_spec(self.tmp_path, self.url, layout, table=self.table, **options)


def assert_same_rows(got: pa.Table, expected: pa.Table, what: str) -> None:
    """Row for row by hash (NULLs, types and values), and the dataset's exact Arrow types."""
    from tests.matrix_support import multiset_difference

    missing, extra = multiset_difference(got, expected)
    assert (missing[:3], extra[:3]) == ([], []), f"{what}: rows missing / extra"
    assert got.schema.equals(SCHEMA), f"{what}: types changed: {got.schema}"
