"""`airflow-partitions advise SPEC DATASET`: what the layout costs the recorded reads, and a better one."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from airflow_partitions.advisor import advise


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "advise",
        help="find skew, tiny files and unpruned filters, and simulate better partition layouts",
        description=(
            "Read the dataset's catalog and its read statistics (recorded by every read and query unless "
            "AP_READ_STATS=0 or acceleration.params.read_stats: false) and report skewed partitions, tiny "
            "and huge files, partitions never read and filters that prune nothing; then simulate candidate "
            "layouts (bucket counts, date grains, field order, an added filter column) over the data with "
            "the recorded filters, print what each reads per query, the winner and the partition_by to "
            "paste, and sort_by advice for filters on non-partition columns."
        ),
    )
    parser.add_argument("spec", metavar="SPEC", help="path of the spec YAML file, e.g. dags/datasets.yaml")
    parser.add_argument("dataset", metavar="DATASET", help="name of a dataset in the spec")
    parser.add_argument("--json", action="store_true", help="print the advice as a JSON document")
    parser.add_argument(
        "--target-file-bytes",
        type=int,
        default=None,
        metavar="BYTES",
        help="file size to aim for (default 128 MiB, as compaction): tiny = under 1/16 of it, huge = over 2x",
    )
    parser.add_argument(
        "--row-group-rows",
        type=int,
        default=None,
        metavar="ROWS",
        help="rows per row group for sort advice (default: params.row_group_rows, else the writer's)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    print(
        f"advising {args.dataset}: reading the catalog, the read statistics and the data ...", file=sys.stderr
    )
    advice = advise(
        args.spec, args.dataset, target_file_bytes=args.target_file_bytes, row_group_rows=args.row_group_rows
    )
    if args.json:
        print(json.dumps(advice.to_json(), indent=2, ensure_ascii=False, default=str))
    else:
        print(advice.render())
    return 0
