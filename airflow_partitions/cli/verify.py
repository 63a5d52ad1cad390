"""`airflow-partitions verify`: prove a dataset's acceleration still equals its source, per partition.

Progress goes to stderr (a redrawn bar on a terminal, a line per phase otherwise); `--json` prints the
report on stdout. The exit code is 0 when every partition checked is equal (after `--repair`: when the
verify that follows the repair is clean), 1 on any drifted, missing or extra partition, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from airflow_partitions.cli.refresh import ProgressBar


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check that the acceleration still equals its source (per-partition row counts and hashes)",
        description=(
            "Compute each partition's row count and order-independent row hash over the source and over "
            "the acceleration's files, compare them (and the files with the certificate their commit "
            "recorded), and report every partition as equal, drifted, missing or extra."
        ),
    )
    parser.add_argument("spec", help="path of the spec YAML file")
    parser.add_argument("dataset", help="dataset name in the spec")
    selection = parser.add_mutually_exclusive_group()
    selection.add_argument(
        "--partitions",
        nargs="+",
        metavar="KEY",
        help="verify only these partitions (key strings as `refresh --partitions` takes them)",
    )
    selection.add_argument(
        "--where",
        help="verify only partitions whose values match this SQL condition (as `refresh --where`)",
    )
    parser.add_argument(
        "--repair",
        action="store_true",
        help="refresh exactly the partitions that are not equal, in one commit, then verify them again",
    )
    parser.add_argument(
        "--strategy",
        choices=("auto", "spark", "pushdown", "arrow"),
        default="auto",
        help="how --repair refreshes (as `refresh --strategy`)",
    )
    parser.add_argument(
        "--deep",
        action="store_true",
        help="read and hash every partition's files, even those whose bytes match their catalog checksums "
        "and certificate",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from airflow_partitions.refresh.verify import verify_dataset  # lazy: loads sqlglot

    bar = ProgressBar(sys.stderr)
    report = verify_dataset(
        args.spec,
        args.dataset,
        partitions=args.partitions,
        where=args.where,
        repair=args.repair,
        progress=bar,
        strategy=args.strategy,
        deep=args.deep,
    )
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        for line in describe(report):
            print(line, file=sys.stderr)
    return 0 if report.ok else 1


def describe(report: Any) -> list[str]:
    """Human lines: one per partition that is not equal, then the totals (and the repair's outcome)."""
    lines = [
        f"{report.dataset}: {check.verdict} {check.key_path}: {check.reason}" for check in report.differing
    ]
    counts = report.counts()
    version = report.version if report.version is not None else "(no version)"
    lines.append(
        f"{report.dataset}: version {version}: {len(report.partitions):,} partition(s) checked: "
        f"{counts['equal']:,} equal, {counts['drifted']:,} drifted, {counts['missing']:,} missing, "
        f"{counts['extra']:,} extra ({report.elapsed_s:.1f} s)"
    )
    checked_by = report.checked_by()
    lines.append(
        f"{report.dataset}: acceleration side: {checked_by['certificate']:,} partition(s) by certificate "
        f"(files match their checksums), {checked_by['recomputed']:,} recomputed from their files"
        + ("" if report.deep else " (--deep recomputes all)")
        + (f"; source read: {report.source_read}" if report.source_read else "")
    )
    if report.old_partitions:
        held = report.old_layout_json()["partitions_with_old_rows"]
        lines.append(
            f"{report.dataset}: re-partitioning in progress: {report.old_partitions:,} partition(s) of an "
            f"older partition_by ({report.old_rows:,} rows) read and counted under the current one; "
            f"{len(held):,} partition(s) had rows there"
            + (f": {', '.join(held[:10])}" + (", ..." if len(held) > 10 else "") if held else "")
        )
    if report.after_repair is not None:
        after = report.after_repair
        lines.append(
            f"{report.dataset}: repaired {len(report.repaired):,} partition(s) in version "
            f"{report.repaired_version}; verified again: "
            + ("all equal" if after.ok else f"{len(after.differing):,} still differ")
        )
        lines.extend(f"{report.dataset}: still {c.verdict} {c.key_path}: {c.reason}" for c in after.differing)
    return lines
