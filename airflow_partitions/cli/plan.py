"""`airflow-partitions plan SPEC DATASET --where ...`: which partitions a filtered read opens, and why."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="explain which partitions a filtered read of a dataset would open",
        description=(
            "Prune a dataset's partitions with a SQL WHERE condition and print the plan: how many of the "
            "partitions are read, and for every partition whether it is read or skipped, why, and whether "
            "it is exact (every row matches, so the filter is not re-applied to it)."
        ),
    )
    parser.add_argument("spec", metavar="SPEC", help="path of the spec YAML file, e.g. dags/datasets.yaml")
    parser.add_argument("dataset", metavar="DATASET", help="name of a dataset in the spec")
    parser.add_argument(
        "--where",
        default=None,
        help="SQL condition on the dataset's columns, e.g. \"region = 'EU' AND ts >= '2026-01-01'\"",
    )
    parser.add_argument("--version", type=int, default=None, help="catalog version to plan (default: newest)")
    parser.add_argument("--json", action="store_true", help="print the plan as a JSON document")
    parser.add_argument(
        "--max-skipped",
        type=int,
        default=None,
        metavar="N",
        help="list at most N skipped partitions in the text output (default: all)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from airflow_partitions.reader import PartitionedDatasetReader

    with PartitionedDatasetReader(args.spec, args.dataset) as reader:
        plan = reader.plan(args.where, args.version)
        if args.json:
            print(json.dumps(plan.to_json(), indent=2, ensure_ascii=False))
        else:
            print(plan.explain(max_skipped=args.max_skipped))
    return 0
