"""`airflow-partitions status SPEC [DATASET]`: versions, partition count, rows, bytes, last refresh."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from airflow_partitions.advisor import DEFAULT_TARGET_FILE_BYTES, size_findings
from airflow_partitions.cli.cdc import cdc_report, format_slot_status
from airflow_partitions.cli.refresh import describe_conservation, describe_watermark_audit
from airflow_partitions.exceptions import PartitionExpressionError, RefreshError
from airflow_partitions.keys import value_to_text

if TYPE_CHECKING:
    from airflow_partitions.spec.renames import ColumnRenames

RECENT_VERSIONS = 5


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "status",
        help="show the catalog state of accelerated datasets",
        description=(
            "For each dataset of the spec (or only DATASET): the newest catalog version and the retained "
            "ones, partition count, rows, bytes, last refresh and the latest commits. --partitions lists "
            "every partition with its state (fresh, stale, failed, missing, removed: the source is "
            "surveyed), key, rows, bytes, refresh time and the Airflow task that wrote it."
        ),
    )
    parser.add_argument("spec", metavar="SPEC", help="path of the spec YAML file")
    parser.add_argument("dataset", metavar="DATASET", nargs="?", help="only this dataset")
    parser.add_argument("--json", action="store_true", help="print a machine-readable JSON document instead")
    parser.add_argument(
        "--partitions", action="store_true", help="list every partition of the newest version"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from airflow_partitions.spec import load_spec  # lazy: loads sqlglot

    project = load_spec(args.spec)
    datasets = [project.dataset(args.dataset)] if args.dataset else list(project.datasets)
    reports = [dataset_status(project, dataset, partitions=args.partitions) for dataset in datasets]
    if args.json:
        print(json.dumps({"spec": str(args.spec), "datasets": reports}, indent=2, ensure_ascii=False))
    else:
        print("\n\n".join(render_status(report) for report in reports) or "no datasets in the spec")
    return 0


def dataset_status(
    project: Any, dataset: Any, *, partitions: bool = False, s3_settings: Any = None
) -> dict[str, Any]:
    """The JSON-ready status of one dataset's catalog; `s3_settings` reach one on S3 (the Partitions page
    passes its DAG's AWS connection; unset, the AWS environment is used)."""
    from airflow_partitions.table import open_handle  # lazy: loads sqlglot

    catalog = open_handle(project, dataset, s3_settings=s3_settings).catalog
    acceleration = dataset.acceleration
    report: dict[str, Any] = {
        "name": dataset.name,
        "engine": str(acceleration.engine),
        "partition_mode": str(acceleration.partition_mode),
        "catalog": f"{catalog.store.describe()}/{catalog.prefix}",
        "data_root": str(catalog.data_root) if catalog.data_root is not None else None,
        "spec_partition_spec_id": acceleration.partition_spec_id,
    }

    from airflow_partitions.spec.renames import renames_of  # lazy: loads yaml (--help loads neither)

    renames = renames_of(dataset)
    if renames:
        report["renamed_columns"] = dict(renames.pairs)
    report["cdc"] = cdc_report(project, dataset)
    snapshot = catalog.latest()
    if snapshot is None:
        report.update(latest_version=None, retained_versions=0, partition_count=0, rows=0, bytes=0)
        if partitions:
            report.update(partition_report(project, dataset, catalog=catalog))
        return report
    history = catalog.versions()
    last_refreshed = snapshot.last_refreshed_at
    report.update(
        latest_version=snapshot.version,
        committed_at=_time(snapshot.committed_at),
        operation=snapshot.operation,
        retained_versions=len(history),
        oldest_retained_version=history[0].version if history else snapshot.version,
        partition_count=snapshot.partition_count,
        rows=snapshot.total_rows,
        bytes=snapshot.total_bytes,
        last_refreshed_at=_time(last_refreshed) if last_refreshed else None,
        catalog_partition_spec_id=snapshot.partition_spec.spec_id,
        # Under the names users see: a renamed column by its current name (the catalog keeps the stored).
        catalog_partition_by=[
            [field[0], current_canonical(field[1], renames)] for field in snapshot.partition_spec.fields
        ],
        spec_partition_by=[
            [f.name, renames.current_transform(f.transform).canonical] for f in acceleration.partition_by
        ],
        spec_matches_catalog=snapshot.partition_spec.spec_id == acceleration.partition_spec_id,
        refresh_mode=str(acceleration.refresh.mode),
        watermark_column=renames.current(acceleration.refresh.watermark_column)
        if acceleration.refresh.watermark_column
        else None,
        # The newest committed watermark (per partition with --partitions): where an append resumes.
        watermark=_watermark_text(
            max(
                (
                    w
                    for w in _watermarks(snapshot, acceleration.refresh.watermark_column).values()
                    if w is not None
                ),
                default=None,
            )
        ),
        recent_versions=[info.to_json() for info in history[-RECENT_VERSIONS:]],
        # Row counts the newest refresh commit checked (None when it recorded none, e.g. a bootstrap).
        conservation=_last_conservation(history),
        # The last `verify` of the dataset (None: never verified).
        last_verify=_last_verify(catalog),
    )
    if not report["spec_matches_catalog"]:
        report["partition_by_changed"] = respec_status(
            dataset.name, report["catalog_partition_by"], report["spec_partition_by"]
        )
    from airflow_partitions.write.repartition import layout_progress  # lazy: loads sqlglot

    # Partitions (and rows) still under another partition_by than the spec's: a re-partitioning to do.
    report["repartition"] = layout_progress(snapshot, acceleration.partition_spec_id)
    if partitions:
        report.update(partition_report(project, dataset, catalog=catalog))
        marks = _watermarks(snapshot, acceleration.refresh.watermark_column) if snapshot is not None else {}
        for partition in report["partitions"]:
            partition["watermark"] = _watermark_text(marks.get(partition["key_path"]))
            # The rows' count and hash its commit certified (`verify` checks the files against it).
            entry = snapshot.partitions.get(partition["key_path"])
            certificate = entry.certificate if entry is not None else None
            partition["certificate"] = certificate.to_json() if certificate is not None else None
        mark_layout_findings(report)
    if dataset.freshness is not None:
        report["freshness"] = freshness_status(dataset.freshness, snapshot)
    return report


def mark_layout_findings(report: dict[str, Any]) -> None:
    """The advisor's catalog-only findings (`advisor.size_findings`) on the `--partitions` document that
    the Partitions page shows: `skew` on each partition (over `SKEW_FACTOR` times the median rows) and
    `layout` with the counts the page's warning line shows (skewed partitions, tiny files against
    compaction's default target size). A file's size is its partition's bytes over its file count: the
    document carries no per-file sizes."""

    partitions = report.get("partitions") or []
    rows = []
    for partition in partitions:
        count, size = partition.get("rows") or 0, partition.get("bytes") or 0
        files = partition.get("files") or 0
        rows.append((partition["key_path"], count, size, [size // files] * files if files else []))
    findings = size_findings(rows, target_file_bytes=DEFAULT_TARGET_FILE_BYTES)
    skewed = {item["key_path"] for item in findings["skewed"]}
    for partition in partitions:
        partition["skew"] = partition["key_path"] in skewed
    report["layout"] = {
        "skewed": findings["skewed"][:10],
        "skewed_count": len(findings["skewed"]),
        "median_rows": findings["median_rows"],
        "skew_factor": findings["skew_factor"],
        "files": findings["files"],
        "tiny_files": findings["tiny_files"],
        "tiny_file_bytes": findings["tiny_file_bytes"],
    }


def _last_verify(catalog: Any) -> dict[str, Any] | None:
    from airflow_partitions.refresh.verify import last_verify  # lazy: loads sqlglot

    return last_verify(catalog)


def freshness_status(freshness: dt.timedelta, snapshot: Any) -> dict[str, Any]:
    """The dataset's freshness SLA: its duration, and the partitions of the newest version last refreshed
    longer ago than that (`overdue`, oldest first, at most 20 named), as of now."""
    now = dt.datetime.now(dt.UTC)
    entries = list(snapshot.partitions.values()) if snapshot is not None else []
    overdue = sorted((e for e in entries if now - e.refreshed_at > freshness), key=lambda e: e.refreshed_at)
    return {
        "sla_seconds": int(freshness.total_seconds()),
        "overdue": len(overdue),
        "overdue_partitions": [e.key_path for e in overdue[:20]],
        "met": not overdue,
    }


def partition_report(
    project: Any, dataset: Any, *, catalog: Any = None, refreshing: Iterable[str] = ()
) -> dict[str, Any]:
    """`states` (counts), `discovery_error` and `partitions` (each with its state) of `status --partitions`:
    the same document the Airflow UI's Partitions page reads (`refreshing`: key paths a task writes now)."""
    from airflow_partitions.refresh.partition_states import partition_states  # lazy: loads sqlglot

    states = partition_states(project, dataset, catalog=catalog)
    if refreshing:
        states = states.with_refreshing(refreshing)
    return states.to_json()


def respec_status(
    dataset: str, catalog_fields: list[list[str]], spec_fields: list[list[str]]
) -> dict[str, str]:
    """What to do after a partition_by change; the same answer refresh discovery gives when it refuses."""
    from airflow_partitions.refresh.discovery import partition_by_text  # lazy: loads sqlglot

    message = (
        "partition_by in the spec differs from the catalog's: spec "
        f"({partition_by_text([(n, c) for n, c in spec_fields])}), catalog "
        f"({partition_by_text([(n, c) for n, c in catalog_fields])}). A plain refresh (or refresh --full) "
        "rebuilds every partition under the new partition_by in one atomic commit; a refresh of "
        "selected partitions (--partitions, --where) first moves the old partitions holding their rows "
        "into the new layout (a backfill is refused until the rebuild). Or move the partitions over "
        "batch by batch while reads and writes go on: "
        f"`airflow-partitions repartition SPEC {dataset}`, run until no old partitions are left. Or "
        "revert partition_by"
    )
    return {
        "rebuild": f"airflow-partitions refresh SPEC {dataset}",
        "repartition": f"airflow-partitions repartition SPEC {dataset}",
        "partial_refresh": "moves the old partitions holding its rows first",
        "message": message,
    }


def current_canonical(canonical: str, renames: ColumnRenames) -> str:
    """A stored field's canonical text with renamed columns under their current names."""
    if not renames:
        return canonical
    from airflow_partitions.transforms import parse_transform  # lazy: loads sqlglot

    try:
        return renames.current_transform(parse_transform(canonical)).canonical
    except PartitionExpressionError:  # a field this version no longer parses: shown as recorded
        return canonical


def render_status(report: dict[str, Any]) -> str:
    """Human-readable text for one `dataset_status` report."""
    header = f"{report['name']}  (engine {report['engine']}"
    if report["engine"] == "duckdb":
        header += f", partition_mode {report['partition_mode']}"
    header += f"; catalog {report['catalog']})"
    if report["latest_version"] is None:
        text = f"{header}\n  no committed version yet: run `airflow-partitions refresh` for this dataset"
        return "\n".join([text, *render_partitions(report)])
    lines = [
        header,
        f"  version       {report['latest_version']} ({report['operation']}, {report['committed_at']}); "
        f"{report['retained_versions']} retained from {report['oldest_retained_version']}",
        f"  partitions    {report['partition_count']:,}",
        f"  rows          {report['rows']:,}",
        f"  bytes         {format_bytes(report['bytes'])}",
        f"  last refresh  {report['last_refreshed_at'] or '-'}",
    ]
    if report.get("renamed_columns"):
        renamed = ", ".join(f"{old} -> {new}" for old, new in report["renamed_columns"].items())
        lines.append(f"  renamed       {renamed} (stored name -> current name)")
    if report.get("watermark_column"):
        lines.append(
            f"  refresh mode  {report['refresh_mode']}; watermark {report['watermark_column']} "
            f"up to {report['watermark'] or '-'}"
        )
    if report.get("cdc") is not None:
        lines.append(f"  change capture {format_slot_status(report['cdc'])}")
    counts = report.get("conservation")
    if counts is not None:
        lines.append(f"  last commit   {describe_conservation(counts)} (version {counts['version']})")

        audit = describe_watermark_audit(
            counts.get("late_rows"), counts.get("future_rows"), counts.get("late_rows_policy")
        )
        if audit:
            lines.append(f"  watermark     {audit}")
    verified = report.get("last_verify")
    if verified is not None:
        differing = f"; differing {', '.join(verified['differing'][:5])}" if verified["differing"] else ""
        lines.append(
            f"  last verify   {verified['result']} at {verified['verified_at']} "
            f"(version {verified['version']}){differing}"
        )
    if "partition_by_changed" in report:
        lines.append(f"  WARNING: {report['partition_by_changed']['message']}")
    progress = report.get("repartition")
    if progress and progress["in_progress"]:
        done = progress["total_rows"] - progress["rows_left"]
        share = 100.0 * done / progress["total_rows"] if progress["total_rows"] else 100.0
        lines.append(
            f"  repartition   {progress['partitions_left']:,} partition(s), {progress['rows_left']:,} rows "
            f"left under older partition_by ({share:.1f}% of rows moved; specs in use: "
            f"{', '.join(progress['specs_in_use'])})"
        )
    lines.append("  recent versions:")
    for info in reversed(report["recent_versions"]):
        what = "replaced all partitions" if info["replace_all"] else f"{info['partitions_changed']} changed"
        lines.append(
            f"    {info['version']:>6}  {info['committed_at']}  {info['operation']:<10} {what}, "
            f"{info['partitions_removed']} removed, {info['rows']:,} rows written"
        )
    lines.extend(render_partitions(report))
    return "\n".join(lines)


def _watermarks(snapshot: Any, column: str | None) -> dict[str, Any]:
    """Key path -> committed watermark (max of `column` in the partition's files) of every partition."""
    if column is None:
        return {}
    from airflow_partitions.refresh.modes import partition_watermark  # lazy: loads sqlglot

    marks: dict[str, Any] = {}
    for entry in snapshot.partitions.values():
        try:
            marks[entry.key_path] = partition_watermark(entry, column)
        except RefreshError:
            marks[entry.key_path] = None
    return marks


def _watermark_text(value: Any) -> str | None:
    if value is None:
        return None

    return value_to_text(value)


def render_partitions(report: dict[str, Any]) -> list[str]:
    """The `--partitions` table: state, key, rows, bytes, files, refresh time and who wrote it."""
    if "partitions" not in report:
        return []
    counts = ", ".join(f"{n} {state}" for state, n in report["states"].items() if n)
    lines = [f"  partitions:   {counts or 'none'}"]
    if report.get("discovery_error"):
        lines.append(f"  WARNING: the source could not be surveyed: {report['discovery_error']}")
    rows = [["state", "key", "rows", "bytes", "files", "refreshed_at", "row_hash", "written_by / error"]]
    for p in report["partitions"]:
        writer = p["written_by"]
        note = f"{writer['dag_id']} {writer['run_id']}" if writer else ""
        if p["failure"] is not None:
            note = p["failure"]["error"].splitlines()[0][:120] if p["failure"]["error"] else "failed"
        rows.append(
            [
                p["state"],
                p["key"],
                f"{p['rows']:,}" if p["rows"] is not None else "-",
                format_bytes(p["bytes"]) if p["bytes"] is not None else "-",
                str(p["files"]) if p["files"] is not None else "-",
                p["refreshed_at"] or "-",
                p["certificate"]["row_hash"] if p.get("certificate") else "-",
                note,
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        lines.append("    " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return lines


def _last_conservation(history: Any) -> dict[str, Any] | None:
    """The newest version's recorded row counts, with its version number."""
    for info in reversed(history):
        if info.conservation is not None:
            return {"version": info.version, **info.conservation}
    return None


def format_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def _time(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
