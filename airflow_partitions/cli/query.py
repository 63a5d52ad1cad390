"""`airflow-partitions query SPEC "SELECT ..."`: run one read-only SQL query over pruned partitions."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

from airflow_partitions.exceptions import FilterError

_FORMATS = ("table", "json", "csv")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "query",
        help="run a read-only SQL query over a dataset, opening only the partitions it needs",
        description=(
            "Run one SELECT statement (DuckDB SQL) in which each dataset of the spec it names is a table. "
            "Only the partitions the query's WHERE clauses can need are opened. bucket(), truncate(), "
            "date_part() and date_trunc() compute exactly the partition values. Anything but a single "
            "SELECT is refused."
        ),
    )
    parser.add_argument("spec", metavar="SPEC", help="path of the spec YAML file, e.g. dags/datasets.yaml")
    parser.add_argument("sql", metavar="SQL", help='one SELECT statement, e.g. "SELECT count(*) FROM trips"')
    parser.add_argument(
        "--dataset",
        default=None,
        help="the dataset the query reads (default: the only dataset of the spec the query names)",
    )
    parser.add_argument(
        "--version",
        type=int,
        default=None,
        help="catalog version to read when the query names one dataset (default: newest)",
    )
    parser.add_argument(
        "--dataset-version",
        action="append",
        default=[],
        metavar="NAME=VERSION",
        help="catalog version of one dataset of a multi-dataset query (repeatable; others: newest)",
    )
    parser.add_argument(
        "--as-of",
        default=None,
        metavar="TIME",
        help="read every dataset as of this time (ISO 8601, UTC unless it has an offset)",
    )
    parser.add_argument(
        "--no-split-joins",
        dest="split_joins",
        action="store_false",
        help="run every join as one plain join, never partition pair by partition pair",
    )
    parser.add_argument(
        "--tag",
        default=None,
        metavar="NAME",
        help=(
            "read the version this tag names (see `airflow-partitions tag`) of --dataset, or of the one "
            "dataset the query reads; with several, pass --dataset"
        ),
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop the query after this many seconds (default: 300)",
    )
    parser.add_argument(
        "--memory-limit",
        default=None,
        metavar="SIZE",
        help="memory the query may use, e.g. 512MB or 8GB (default: 4GB or half the machine's memory)",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", dest="format", action="store_const", const="json", help="print JSON lines")
    output.add_argument("--csv", dest="format", action="store_const", const="csv", help="print CSV")
    parser.set_defaults(func=run, format="table")


def run(args: argparse.Namespace) -> int:
    from airflow_partitions.read import (  # lazy: loads numpy, pyarrow, sqlglot
        PartitionedDatasetReader,
        open_project,
    )
    from airflow_partitions.read.multi import datasets_named_in  # lazy: loads numpy, pyarrow, sqlglot

    project = open_project(args.spec)
    named = [args.dataset] if args.dataset else datasets_named_in(project, args.sql)
    for option, value in (("--version", args.version), ("--tag", args.tag)):
        if value is not None and len(named) > 1:
            raise FilterError(
                f"{option} is ambiguous: the query reads {', '.join(named)}; pass --dataset NAME to say "
                f"which dataset {option} pins, or --dataset-version NAME=VERSION for each dataset to pin"
            )
    with PartitionedDatasetReader(project, named[0]) as reader:
        table = reader.query(
            args.sql,
            args.version,
            timeout_s=args.timeout,
            memory_limit=args.memory_limit,
            versions=dataset_versions(args.dataset_version),
            as_of=parse_as_of(args.as_of),
            split_joins=args.split_joins,
            tag=args.tag,
        )
    write_table(table, args.format)
    return 0


def dataset_versions(pairs: list[str]) -> dict[str, int | None]:
    """`NAME=VERSION` arguments as a mapping; `FilterError` for a malformed one."""
    versions: dict[str, int | None] = {}
    for pair in pairs:
        name, _, number = pair.partition("=")
        if not name or not number.strip().isdigit():
            raise FilterError(f"--dataset-version {pair!r}: give NAME=VERSION, e.g. orders=12")
        versions[name.strip()] = int(number)
    return versions


def parse_as_of(text: str | None) -> dt.datetime | None:
    """An `--as-of` time (ISO 8601; UTC unless it carries an offset)."""
    if text is None:
        return None
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise FilterError(
            f"--as-of {text!r} is not an ISO 8601 time, e.g. 2026-05-01T12:00:00+00:00"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def write_table(table: Any, output_format: str) -> None:
    """Print an Arrow table as an aligned text table, JSON lines or CSV on standard output."""
    if output_format == "csv":
        import pyarrow.csv as pa_csv

        sink = sys.stdout.buffer
        pa_csv.write_csv(table, sink)
        sink.flush()
        return
    rows = table.to_pylist()
    if output_format == "json":
        for row in rows:
            print(json.dumps(row, default=str, ensure_ascii=False))
        return
    header = table.column_names
    cells = [[_text(row[name]) for name in header] for row in rows]
    widths = [max([len(name), *(len(line[i]) for line in cells)]) for i, name in enumerate(header)]
    print("  ".join(name.ljust(width) for name, width in zip(header, widths)).rstrip())
    print("  ".join("-" * width for width in widths))
    for line in cells:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")


def _text(value: Any) -> str:
    return "NULL" if value is None else str(value)
