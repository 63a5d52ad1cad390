"""`airflow-partitions vacuum SPEC DATASET`: expire old catalog versions and delete unreferenced files."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

from airflow_partitions.cli.status import format_bytes
from airflow_partitions.exceptions import CatalogError, SnapshotError


def parse_duration(text: str) -> dt.timedelta:
    """`7d`, `12h`, `1d12h`, `30m`, `45s`, `2w` -> timedelta; a clear error otherwise."""
    # `--help` and argument parsing need neither sqlglot nor yaml, which the spec model loads.
    from airflow_partitions.spec.model import parse_duration as spec_duration  # lazy: sqlglot, yaml

    try:
        return spec_duration(text)
    except ValueError as err:
        raise CatalogError(str(err)) from err


def _duration_argument(text: str) -> dt.timedelta:
    try:
        return parse_duration(text)
    except CatalogError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"must be a positive integer (the newest version counts), got {text!r}"
        )
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "vacuum",
        help="expire old catalog versions and delete files no retained version references",
        description=(
            "Keep the newest catalog versions (by count or by age; default: the last 7 days), delete older "
            "versions' commit records and checkpoints, then delete partition files that no retained version "
            "references, including leftovers of crashed writes, and stages killed runs left behind. Files, "
            "stages and versions younger than --grace are always kept: they may belong to a commit in "
            "flight or a running read."
        ),
    )
    parser.add_argument("spec", metavar="SPEC", help="path of the spec YAML file")
    parser.add_argument("dataset", metavar="DATASET", help="the dataset to vacuum")
    retention = parser.add_mutually_exclusive_group()
    retention.add_argument(
        "--retain-versions", type=_positive_int, metavar="N", help="keep the newest N versions"
    )
    retention.add_argument(
        "--older-than",
        type=_duration_argument,
        metavar="DURATION",
        help="expire versions committed longer ago than DURATION (e.g. 7d, 12h); the default is 7d",
    )
    parser.add_argument(
        "--grace",
        type=_duration_argument,
        default=dt.timedelta(hours=1),
        metavar="DURATION",
        help="never delete anything younger than this, stages included (default 1h)",
    )
    parser.add_argument(
        "--snapshots",
        action="store_true",
        help=(
            "also vacuum the dataset's S3 snapshots (snapshots.mode enabled) with the same retention; "
            "credentials and endpoint from the AWS environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)"
        ),
    )
    parser.add_argument("--dry-run", action="store_true", help="report what would be deleted, delete nothing")
    parser.add_argument("--json", action="store_true", help="print a machine-readable JSON document instead")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # lazy: the spec, the catalog and the stores load sqlglot, yaml and pyarrow, which `--help` must not.
    from airflow_partitions.objectstore import S3Settings  # lazy: see above
    from airflow_partitions.refresh.leftovers import sweep_dataset_staging  # lazy: see above
    from airflow_partitions.snapshots.vacuum import vacuum_snapshots  # lazy: see above
    from airflow_partitions.spec import load_spec  # lazy: see above
    from airflow_partitions.table import open_handle  # lazy: see above

    project = load_spec(args.spec)
    dataset = project.dataset(args.dataset)
    snapshots = dataset.acceleration.snapshots
    if args.snapshots and (snapshots.mode != "enabled" or not snapshots.location):
        raise SnapshotError(
            f"--snapshots: dataset {dataset.name!r} has snapshots.mode {snapshots.mode}; only the owner of a "
            "snapshot (mode enabled, with a location) deletes from it"
        )
    handle = open_handle(project, dataset)
    report = handle.catalog.vacuum(
        retain_versions=args.retain_versions,
        older_than=args.older_than,
        dry_run=args.dry_run,
        grace=args.grace,
    )
    staging = sweep_dataset_staging(handle, grace=args.grace, dry_run=args.dry_run)
    snapshot_report = None
    if args.snapshots:
        snapshot_report = vacuum_snapshots(
            S3Settings.from_source_params({}),
            str(snapshots.location),
            dataset.name,
            retain_versions=args.retain_versions,
            older_than=args.older_than,
            grace=args.grace,
            dry_run=args.dry_run,
        )
    if args.json:
        document = {"dataset": dataset.name, **report.to_json(), "staging": staging.to_json()}
        if snapshot_report is not None:
            document["snapshots"] = snapshot_report.to_json()
        print(json.dumps(document, indent=2, ensure_ascii=False))
    else:
        print(render_report(dataset.name, report))
        print(render_staging(staging))
        if snapshot_report is not None:
            print(render_snapshot_report(snapshot_report))
    return 0


def _expired(verb: str, versions: Any) -> str:
    """`deleted 2 (1..2)`: how many versions went, and which range."""
    return f"{verb} {len(versions)}" + (f" ({versions[0]}..{versions[-1]})" if versions else "")


def render_snapshot_report(report: Any) -> str:

    verb = "would delete" if report.dry_run else "deleted"
    if report.latest_version is None:
        return f"  snapshots    nothing published at {report.location}"
    expired = report.expired_versions
    lines = [
        f"  snapshots    {report.location}: newest version {report.latest_version}, "
        f"retained {', '.join(map(str, report.retained_versions))}",
        f"               versions {_expired(verb, expired)}, objects {verb} {report.deleted_objects} "
        f"({format_bytes(report.deleted_bytes)})",
    ]
    if report.kept_recent_objects:
        lines.append(
            f"               kept {report.kept_recent_objects} unreferenced object(s) younger than the "
            "grace period"
        )
    return "\n".join(lines)


def render_staging(sweep: Any) -> str:

    verb = "would delete" if sweep.dry_run else "deleted"
    line = (
        f"  staging      {verb} {len(sweep.removed)} stage(s) left by earlier runs; {sweep.root}: "
        f"{format_bytes(sweep.bytes_before)} -> {format_bytes(sweep.bytes_after)}"
    )
    if sweep.kept_young:
        line += f" (kept {sweep.kept_young} younger than the grace period)"
    return line


def render_report(name: str, report: Any) -> str:

    verb = "would delete" if report.dry_run else "deleted"
    if report.latest_version is None:
        return f"{name}: nothing to vacuum (no committed version)"
    expired = report.removed_versions
    lines = [
        f"{name}: {'dry run, ' if report.dry_run else ''}newest version {report.latest_version}, "
        f"oldest retained {report.oldest_retained_version}",
        f"  versions     {_expired(verb, expired)}, checkpoints {verb} {len(report.removed_checkpoints)}",
        f"  files        {verb} {len(report.removed_files)} ({format_bytes(report.bytes_freed)})",
    ]
    if report.young_files_kept:
        lines.append(
            f"  kept         {report.young_files_kept} unreferenced file(s) younger than the grace period"
        )
    for shared in report.shared_files:
        state = "compacted" if shared.compacted else "not compacted (little free space)"
        if report.dry_run:
            state = "measured (a dry run rewrites nothing)"
        lines.append(
            f"  shared file  {shared.path} {state}: {format_bytes(shared.bytes_before)} -> "
            f"{format_bytes(shared.bytes_after)}"
        )
    if report.removed_catalog_temporaries:
        lines.append(f"  temporaries  {verb} {report.removed_catalog_temporaries} leftover catalog write(s)")
    lines.extend(f"  note: {note}" for note in report.notes)
    lines.extend(f"    {verb} {f.path}" for f in report.removed_files[:50])
    if len(report.removed_files) > 50:
        lines.append(f"    ... and {len(report.removed_files) - 50} more")
    return "\n".join(lines)
