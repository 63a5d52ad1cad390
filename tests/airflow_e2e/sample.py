"""Small sample datasets for Airflow-level tests and benchmarks: Parquet files, a Postgres table, a spec.

`install_example_dag` copies the repository's example DAG file next to a generated spec, so the tests run
the DAG file users deploy, on data the test controls.
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_DAG_FILE = REPO_ROOT / "dags" / "refresh_datasets.py"
REGIONS: tuple[str, ...] = ("EU", "US", "APAC")
FIRST_DAY = dt.date(2026, 1, 1)


def sales_rows(
    rows: int, days: int, regions: Sequence[str] = REGIONS, *, seed: int = 0
) -> dict[str, list[Any]]:
    """Deterministic sales rows spread over `days` days and `regions`."""
    ids = list(range(seed, seed + rows))
    return {
        "id": ids,
        "region": [regions[i % len(regions)] for i in ids],
        "amount": [round(1.5 * (i % 97) + 0.25, 2) for i in ids],
        "ts": [
            dt.datetime.combine(
                FIRST_DAY + dt.timedelta(days=(i // len(regions)) % days), dt.time(i % 24, i % 60)
            )
            for i in ids
        ],
    }


def write_sales(directory: Path, *, rows: int = 180, days: int = 3, regions: Sequence[str] = REGIONS) -> Path:
    """One Parquet file of sales rows (id, region, amount, ts) in `directory`; returns the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    data = sales_rows(rows, days, regions)
    table = pa.table(
        {
            "id": pa.array(data["id"], pa.int64()),
            "region": pa.array(data["region"], pa.string()),
            "amount": pa.array(data["amount"], pa.float64()),
            "ts": pa.array(data["ts"], pa.timestamp("us")),
        }
    )
    path = directory / "sales-0.parquet"
    pq.write_table(table, path)
    return path


def append_sales(directory: Path, *, rows: int, days: int, regions: Sequence[str], name: str) -> Path:
    """Another Parquet file of new sales rows (ids after the first file's)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = sales_rows(rows, days, regions, seed=100_000)
    table = pa.table(
        {
            "id": pa.array(data["id"], pa.int64()),
            "region": pa.array(data["region"], pa.string()),
            "amount": pa.array(data["amount"], pa.float64()),
            "ts": pa.array(data["ts"], pa.timestamp("us")),
        }
    )
    path = directory / name
    pq.write_table(table, path)
    return path


def create_orders(database_url: str, *, rows: int = 120, max_amount: int = 4000) -> None:
    """Table public.orders(id, customer_id, amount, updated_at) with an index on amount."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL, "
            "amount bigint NOT NULL, updated_at timestamptz NOT NULL)"
        )
        conn.execute("CREATE INDEX orders_amount ON public.orders (amount)")
        base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO public.orders VALUES (%s, %s, %s, %s)",
                [
                    (i, i % 17, (i * 37) % max_amount, base + dt.timedelta(minutes=i))
                    for i in range(1, rows + 1)
                ],
            )


def sample_spec(
    *,
    accelerator_dir: Path,
    sales_dir: Path,
    orders_connection_id: str | None = None,
    snapshot_location: str | None = None,
    sales_schedule: str | None = None,
) -> str:
    """A spec with `sales` (Parquet files by region and day) and, optionally, `orders` (Postgres)."""
    snapshots = (
        f"      snapshots: {{mode: enabled, location: '{snapshot_location}'}}\n" if snapshot_location else ""
    )
    schedule = f"      refresh: {{schedule: '{sales_schedule}'}}\n" if sales_schedule else ""
    text = (
        f"accelerator_dir: {accelerator_dir}\n"
        "datasets:\n"
        "  - name: sales\n"
        f"    from: file:{sales_dir}/\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        "      engine: parquet\n"
        "      partition_by:\n"
        "        - region: region\n"
        "        - day: \"date_trunc('day', ts)\"\n"
        f"{schedule}{snapshots}"
    )
    if orders_connection_id:
        text += (
            "  - name: orders\n"
            "    from: postgres:public.orders\n"
            f"    params: {{connection_id: {orders_connection_id}}}\n"
            "    acceleration:\n"
            "      engine: duckdb\n"
            "      partition_by:\n"
            "        - amount_band: truncate(1000, amount)\n"
            "      refresh: {check_column: updated_at}\n"
        )
    return text


def install_example_dag(dags_dir: Path, spec_text: str) -> Path:
    """Copy the repository's example DAG file into `dags_dir` with `spec_text` as its datasets.yaml."""
    dags_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLE_DAG_FILE, dags_dir / EXAMPLE_DAG_FILE.name)
    spec_path = dags_dir / "datasets.yaml"
    spec_path.write_text(spec_text)
    return spec_path


def write_wide(directory: Path, partitions: int, *, rows_per_partition: int = 2) -> Any:
    """Rows `id`, `k` (`id % partitions`: one partition per value) and `note` (NULL every seventh row)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    ids = list(range(partitions * rows_per_partition))
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "k": pa.array([i % partitions for i in ids], pa.int64()),
            "note": pa.array([None if i % 7 == 0 else f"ü/{i}=%" for i in ids], pa.string()),
        }
    )
    pq.write_table(table, directory / "wide.parquet")
    return table
