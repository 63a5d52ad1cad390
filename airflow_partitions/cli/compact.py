"""`airflow-partitions compact SPEC [DATASET]`: merge each partition's small files in one atomic commit."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from airflow_partitions.cli.status import format_bytes
from airflow_partitions.exceptions import CompactionError


def _size_argument(text: str) -> int:
    from airflow_partitions.refresh.compaction import parse_size  # lazy: loads sqlglot

    try:
        return parse_size(text)
    except CompactionError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "compact",
        help="merge each partition's small files into target-size files (one atomic commit)",
        description=(
            "For every partition holding two or more files smaller than --target-file-size, read those "
            "files and write them back as target-size files through the dataset's storage engine (sorted "
            "and cut into row groups as a refresh writes them, statistics recomputed), then publish every "
            "compacted partition in one catalog version. Rows are counted before and after: a difference "
            "publishes nothing. A refresh that touched a partition meanwhile makes the commit fail and "
            "nothing is lost; the replaced files stay until vacuum removes them."
        ),
    )
    parser.add_argument("spec", metavar="SPEC", help="path of the spec YAML file")
    parser.add_argument(
        "dataset", metavar="DATASET", nargs="?", help="the dataset to compact (default: every dataset)"
    )
    parser.add_argument(
        "--where", metavar="SQL", help="compact only partitions that may hold rows matching this filter"
    )
    parser.add_argument(
        "--partitions",
        nargs="+",
        metavar="KEY",
        help="compact only these partitions (canonical key paths, as `status` lists them)",
    )
    parser.add_argument(
        "--target-file-size",
        type=_size_argument,
        default=None,
        metavar="SIZE",
        help="files smaller than this are merged, and new files are cut near it (default 128MB)",
    )
    parser.add_argument(
        "--target-rows",
        type=int,
        default=None,
        metavar="N",
        help="also treat files with N or more rows as large, and write at most N rows per file",
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would be merged, write nothing")
    parser.add_argument("--json", action="store_true", help="print a machine-readable JSON document instead")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from airflow_partitions.refresh.compaction import (  # lazy: loads sqlglot
        DEFAULT_TARGET_FILE_BYTES,
        compact_dataset,
    )
    from airflow_partitions.spec import load_spec  # lazy: loads sqlglot

    project = load_spec(args.spec)
    datasets = [project.dataset(args.dataset)] if args.dataset else list(project.datasets)
    if args.target_rows is not None and args.target_rows < 1:
        raise CompactionError(f"--target-rows must be a positive integer, got {args.target_rows}")
    reports = []

    def progress(line: str) -> None:
        # Progress goes to stderr, so `--json` output stays one document.
        print(f"  {line}", file=sys.stderr if args.json else sys.stdout, flush=True)

    for dataset in datasets:
        if not args.json:
            print(f"{dataset.name}: {'planning' if args.dry_run else 'compacting'}", flush=True)
        report = compact_dataset(
            project,
            dataset,
            target_file_bytes=args.target_file_size or DEFAULT_TARGET_FILE_BYTES,
            target_rows=args.target_rows,
            partitions=args.partitions,
            where=args.where,
            dry_run=args.dry_run,
            progress=progress,
        )
        reports.append(report)
        if not args.json:
            print(render_report(report))
    if args.json:
        document: Any = [r.to_json() for r in reports]
        print(json.dumps(document[0] if args.dataset else document, indent=2, ensure_ascii=False))
    return 0


def render_report(report: Any) -> str:

    name = report.dataset
    if report.base_version is None:
        return f"{name}: nothing to compact (no committed version)"
    if not report.partitions:
        return (
            f"{name}: nothing to compact in version {report.base_version} ({report.examined} partition(s) "
            "examined, none holds two or more small files)"
        )
    moved = sum(sum(f.bytes for f in p.merged) for p in report.partitions)
    if report.dry_run:
        lines = [
            f"{name}: dry run on version {report.base_version}: would merge {report.files_before} file(s) "
            f"({format_bytes(moved)}) in {len(report.partitions)} of {report.examined} partition(s)"
        ]
        lines.extend(
            f"    {p.key_path}: {len(p.merged)} small file(s), {p.rows} row(s)"
            for p in report.partitions[:50]
        )
        if len(report.partitions) > 50:
            lines.append(f"    ... and {len(report.partitions) - 50} more")
        return "\n".join(lines)
    return (
        f"{name}: version {report.version} compacts {len(report.partitions)} of {report.examined} "
        f"partition(s): {report.files_before} -> {report.files_after} file(s), "
        f"{sum(p.rows for p in report.partitions)} row(s) kept, in {report.elapsed_s:.1f} s"
    )
