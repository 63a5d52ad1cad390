"""`airflow-partitions write SPEC DATASET`: append, upsert or delete rows, one atomic catalog commit."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from airflow_partitions.cli import print_error
from airflow_partitions.exceptions import ConservationError, WriteError, WriteThroughError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "write",
        help="append, upsert or delete rows of an acceleration in one atomic commit",
        description=(
            "Write to a dataset's acceleration: rows of a parquet, csv or jsonl file are routed to their "
            "partitions with the dataset's partition expressions (the NULL partition included) and "
            "committed at once; readers see all of the write or none of it. --upsert replaces rows with "
            "the same key (--key, else the spec's acceleration.primary_key); --delete-where deletes "
            "the rows a SQL condition matches. A write conflicts with a concurrent commit (refresh or "
            "write) of one of the same partitions: write again."
        ),
    )
    parser.add_argument("spec", metavar="SPEC", help="path of the spec YAML file")
    parser.add_argument("dataset", metavar="DATASET", help="the dataset to write to")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--append", metavar="FILE", help="add the rows of FILE")
    mode.add_argument("--upsert", metavar="FILE", help="insert the rows of FILE, replacing rows of their key")
    mode.add_argument("--delete-where", metavar="SQL", help="delete the rows this SQL condition matches")
    parser.add_argument(
        "--key",
        action="append",
        metavar="COLUMN",
        help="a key column of --upsert (repeat for several; default the spec's primary_key)",
    )
    parser.add_argument(
        "--file-format", choices=("parquet", "csv", "jsonl"), help="format of FILE (default: its extension)"
    )
    parser.add_argument(
        "--write-through",
        action="store_true",
        help=(
            "Postgres sources: write the rows to the source table in one transaction first, then to the "
            "acceleration (connection from params.url or AIRFLOW_CONN_<ID>)"
        ),
    )
    parser.add_argument("--json", action="store_true", help="print the result as a JSON document")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from airflow_partitions.spec import load_spec  # lazy: loads sqlglot
    from airflow_partitions.table import open_handle  # lazy: loads sqlglot
    from airflow_partitions.write.commit import append, delete, upsert  # lazy: loads sqlglot
    from airflow_partitions.write.rows import RowsFile  # lazy: loads sqlglot
    from airflow_partitions.write.write_through import write_through  # lazy: loads sqlglot

    if args.key and not args.upsert:
        raise_usage("--key applies to --upsert only")
    if args.write_through and args.delete_where is not None:
        raise_usage("--write-through covers --append and --upsert; delete in the source, then refresh")
    project = load_spec(args.spec)
    dataset = project.dataset(args.dataset)
    handle = open_handle(project, dataset)
    started = time.monotonic()
    try:
        if args.delete_where is not None:
            print(f"{dataset.name}: deleting rows where {args.delete_where}", file=sys.stderr)
            result = delete(handle, args.delete_where)
        else:
            path = args.append or args.upsert
            operation = "append" if args.append else "upsert"
            rows = RowsFile(path, args.file_format)
            print(f"{dataset.name}: {operation} of {path} ({rows.format})", file=sys.stderr)
            if args.write_through:
                result = write_through(handle, rows, operation=operation, keys=args.key)
            elif args.append:
                result = append(handle, rows)
            else:
                result = upsert(handle, rows, keys=args.key)
    except (WriteThroughError, ConservationError) as err:
        if args.json:
            document: dict[str, Any] = {
                "dataset": dataset.name,
                "error": type(err).__name__,
                "message": str(err),
            }
            if isinstance(err, WriteThroughError):
                document["source_rows"] = err.source_rows
                document["partitions"] = list(err.partitions)
            print(json.dumps(document, indent=2, ensure_ascii=False))
        print_error(err)
        return 1
    if args.json:
        print(json.dumps(result.to_json(), indent=2, ensure_ascii=False))
    else:
        rate = result.rows_in / result.elapsed_s if result.elapsed_s > 0 and result.rows_in else None
        speed = f" ({rate:,.0f} rows/s)" if rate else ""
        print(f"{result.describe()} in {time.monotonic() - started:.2f} s{speed}", file=sys.stderr)
    return 0


def raise_usage(message: str) -> None:

    raise WriteError(message)
