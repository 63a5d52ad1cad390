"""`airflow-partitions init DIR`: the example DAG file, its spec and sample data, ready for an Airflow.

A pip-installed package carries no repository checkout, so the example lives in the package
(`airflow_partitions/examples/`) and this command writes it out: `DIR/dags/refresh_datasets.py` and
`DIR/dags/datasets.yaml` (three local-file datasets), and the sample files they read under `DIR/data/`.
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path
from typing import Any

from airflow_partitions.exceptions import ExampleInitError
from airflow_partitions.sample_data import write_events, write_sensor_readings, write_taxi_trips

EXAMPLE_FILES: tuple[str, ...] = ("refresh_datasets.py", "datasets.yaml")
DEFAULT_ROWS = 20_000


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "init",
        help="write the example DAG file, its spec and sample data into a directory",
        description=(
            "Write DIR/dags/refresh_datasets.py (one refresh DAG per dataset), DIR/dags/datasets.yaml "
            "(three datasets over local files) and sample data under DIR/data/. Point Airflow's "
            "dags_folder at DIR/dags, or copy both files into yours (they must stay side by side)."
        ),
    )
    parser.add_argument("directory", metavar="DIR", help="where to write dags/ and data/")
    parser.add_argument(
        "--rows", type=int, default=DEFAULT_ROWS, help=f"taxi trips to generate (default {DEFAULT_ROWS:,})"
    )
    parser.add_argument("--no-data", action="store_true", help="write the DAG file and spec only")
    parser.add_argument("--force", action="store_true", help="overwrite example files already there")
    parser.set_defaults(func=run)


def write_example(
    directory: Path, *, rows: int = DEFAULT_ROWS, data: bool = True, force: bool = False
) -> Path:
    """Write the example into `directory`; returns its dags folder."""
    if rows < 1:
        raise ExampleInitError(f"--rows must be at least 1, got {rows}")
    dags = directory / "dags"
    existing = [dags / name for name in EXAMPLE_FILES if (dags / name).exists()]
    if existing and not force:
        raise ExampleInitError(
            f"{', '.join(str(p) for p in existing)} already exist; pick another directory or pass --force "
            "to overwrite them"
        )
    dags.mkdir(parents=True, exist_ok=True)
    examples = resources.files("airflow_partitions") / "examples"
    for name in EXAMPLE_FILES:
        (dags / name).write_bytes((examples / name).read_bytes())
    if data:
        write_taxi_trips(directory / "data" / "taxi_trips", rows)
        write_events(directory / "data" / "events", max(100, rows // 20))
        write_sensor_readings(directory / "data" / "sensor_readings", max(100, rows // 20))
    return dags


def run(args: argparse.Namespace) -> int:
    directory = Path(args.directory).expanduser().resolve()
    dags = write_example(directory, rows=args.rows, data=not args.no_data, force=args.force)
    print(f"wrote {dags / EXAMPLE_FILES[0]} and {dags / EXAMPLE_FILES[1]}")
    if not args.no_data:
        print(f"wrote sample data under {directory / 'data'}")
    print(
        "next:\n"
        f"  airflow-partitions validate {dags / 'datasets.yaml'}\n"
        f"  export AIRFLOW__CORE__DAGS_FOLDER={dags}   # or copy both files into your dags folder\n"
        "  airflow dags test refresh_events"
    )
    return 0
