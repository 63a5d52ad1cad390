"""`airflow-partitions repartition SPEC DATASET`: move one bounded batch of partitions written under an
older partition_by into the current one, in one atomic commit."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "repartition",
        help="move a batch of partitions of an older partition_by into the current one (one commit)",
        description=(
            "After a partition_by change, each run moves a bounded batch of old partitions into the new "
            "layout: their rows are routed under the current partition_by, appended to the new "
            "partitions they belong to, and the old partitions removed, in one atomic commit with rows "
            "removed = rows added checked per new partition and in total. Reads prune each partition "
            "under its own spec meanwhile. Run it until `status` shows no old partitions left; revert "
            "partition_by to move them back (cancel)."
        ),
    )
    parser.add_argument("spec", metavar="SPEC", help="path of the spec YAML file")
    parser.add_argument("dataset", metavar="DATASET", help="the dataset to re-partition")
    bound = parser.add_mutually_exclusive_group()
    bound.add_argument(
        "--max-partitions", type=int, metavar="N", help="move at most N old partitions (default 64)"
    )
    bound.add_argument(
        "--max-rows", type=int, metavar="N", help="move old partitions holding at most N rows (at least one)"
    )
    parser.add_argument("--dry-run", action="store_true", help="say what would move, commit nothing")
    parser.add_argument("--json", action="store_true", help="print a machine-readable JSON document instead")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from airflow_partitions.spec import load_spec  # lazy: loads sqlglot
    from airflow_partitions.table import open_handle  # lazy: loads sqlglot
    from airflow_partitions.write.repartition import repartition  # lazy: loads sqlglot

    project = load_spec(args.spec)
    report = repartition(
        open_handle(project, args.dataset),
        max_partitions=args.max_partitions,
        max_rows=args.max_rows,
        dry_run=args.dry_run,
    )
    if args.json:
        print(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
    else:
        print(report.describe())
    return 0
