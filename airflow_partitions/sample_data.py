"""Deterministic sample data for the demo and benchmarks: taxi trips, events and sensor readings.

Zones are skewed like real taxi data: one hot pickup zone carries ~5% of the trips and one cold zone only a
few hundred, so pruning is measured on both ends of the distribution.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

HOT_ZONE = 132
COLD_ZONE = 5
ZONES = 265
YEAR_START = dt.datetime(2025, 1, 1)


def taxi_trips(rows: int, *, seed: int = 7, days: int = 365) -> Any:
    """A taxi-trips-like pyarrow Table with `rows` rows spread over `days` days from 2025-01-01."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    # Zipf-ish popularity over zones, then pin the hot share to ~5% and the cold zone to a few hundred.
    weights = 1.0 / np.arange(1, ZONES + 1) ** 0.9
    weights = weights / weights.sum()
    zones = rng.choice(np.arange(1, ZONES + 1), size=rows, p=weights).astype(np.int32)
    hot = rng.random(rows) < 0.05
    zones[hot] = HOT_ZONE
    zones[zones == COLD_ZONE] = COLD_ZONE + 1
    cold_count = min(rows, max(1, min(400, rows // 20_000)))
    zones[rng.choice(rows, size=cold_count, replace=False)] = COLD_ZONE

    start_us = int(YEAR_START.timestamp() * 1_000_000)
    pickup = start_us + rng.integers(0, days * 86_400 * 1_000_000, size=rows, dtype=np.int64)
    duration = rng.integers(60, 3_600, size=rows, dtype=np.int64) * 1_000_000
    distance = np.round(rng.gamma(2.0, 1.6, size=rows), 2)
    fare = np.round(3.0 + distance * 2.5 + rng.random(rows) * 5, 2)
    return pa.table(
        {
            "VendorID": pa.array(rng.integers(1, 3, size=rows, dtype=np.int32)),
            "tpep_pickup_datetime": pa.array(pickup, type=pa.timestamp("us")),
            "tpep_dropoff_datetime": pa.array(pickup + duration, type=pa.timestamp("us")),
            "passenger_count": pa.array(rng.integers(1, 7, size=rows, dtype=np.int64)),
            "trip_distance": pa.array(distance),
            "PULocationID": pa.array(zones),
            "DOLocationID": pa.array(rng.integers(1, ZONES + 1, size=rows, dtype=np.int32)),
            "fare_amount": pa.array(fare),
            "total_amount": pa.array(np.round(fare * 1.2, 2)),
        }
    )


def write_taxi_trips(directory: Path, rows: int, *, files: int = 4, seed: int = 7) -> list[Path]:
    """Write `rows` trips as `files` Parquet files under `directory` (replacing earlier sample files)."""
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("trips-*.parquet"):
        old.unlink()
    table = taxi_trips(rows, seed=seed)
    paths: list[Path] = []
    step = -(-rows // files)
    for index in range(files):
        path = directory / f"trips-{index:03d}.parquet"
        pq.write_table(table.slice(index * step, step), path)
        paths.append(path)
    return paths


def write_events(directory: Path, rows: int, *, seed: int = 11) -> Path:
    """Newline-delimited JSON events with hostile region names (slash, equals, percent, unicode, NULL)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    regions: list[str | None] = ["EU", "US", "APAC", "eu/west=1", "50%", "Zürich", "", None]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "events-000.jsonl"
    start = dt.datetime(2024, 11, 1, tzinfo=dt.UTC)
    with path.open("w", encoding="utf-8") as out:
        for i in range(rows):
            ts = start + dt.timedelta(seconds=int(rng.integers(0, 2 * 365 * 86_400)))
            record = {
                "event_id": f"e{i:07d}",
                "user_id": int(rng.integers(1, 50_000)),
                "region": regions[int(rng.integers(0, len(regions)))],
                "event_type": ["view", "click", "buy"][int(rng.integers(0, 3))],
                "ts": ts.isoformat(),
            }
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def write_sensor_readings(directory: Path, rows: int, *, seed: int = 13) -> Path:
    """CSV sensor readings: device ids (negatives included) for `device_id % 16` shards."""
    import numpy as np

    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "readings-000.csv"
    start = dt.datetime(2026, 1, 1)
    with path.open("w", encoding="utf-8") as out:
        out.write("device_id,reading_at,temperature_c,status\n")
        for _ in range(rows):
            device = int(rng.integers(-50, 5_000))
            at = start + dt.timedelta(milliseconds=int(rng.integers(0, 30 * 86_400_000)))
            temperature = round(float(rng.normal(21.0, 4.0)), 2)
            status = ["ok", "warn", "fail"][int(rng.integers(0, 3))]
            out.write(f"{device},{at.isoformat(sep=' ', timespec='milliseconds')},{temperature},{status}\n")
    return path
