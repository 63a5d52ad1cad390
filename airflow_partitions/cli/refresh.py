"""`airflow-partitions refresh`: refresh a dataset's partitions in this process (plan to commit).

Progress goes to stderr (a redrawn bar on a terminal, a line per phase otherwise); `--json` prints the
summary on stdout, with the row counts the commit checked (`conservation`). The exit code is 0 on
success, 1 when partitions failed (nothing committed unless `--allow-partial`) or rows were lost or gained
(never committed), 2 for bad input (the command's common error handling).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from airflow_partitions.cli import print_error
from airflow_partitions.exceptions import ConservationError, PartitionsFailedError, RunConfError

BAR_WIDTH = 28


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "refresh",
        help="refresh a dataset's partitions now (discover, Spark stage, write, atomic commit)",
        description=(
            "Discover the dataset's partitions, refresh the new and changed ones with Spark and publish "
            "them in one atomic catalog commit. Partitions gone from the source are removed."
        ),
    )
    parser.add_argument("spec", help="path of the spec YAML file")
    parser.add_argument("dataset", help="dataset name in the spec")
    parser.add_argument(
        "--partitions",
        nargs="+",
        metavar="KEY",
        help="refresh only these partitions (canonical key strings such as expr0=7, or name=value/...), "
        "even if unchanged",
    )
    parser.add_argument(
        "--where",
        help="refresh only partitions whose values match this SQL condition (e.g. \"day >= '2026-01-01'\")",
    )
    parser.add_argument(
        "--failed",
        action="store_true",
        help="refresh exactly the partitions whose last refresh failed (as `status --partitions` and the "
        "Airflow UI's Partitions page show them)",
    )
    parser.add_argument("--full", action="store_true", help="refresh every partition, changed or not")
    parser.add_argument(
        "--shuffle-stage",
        action="store_true",
        help="shuffle in Spark so each partition is staged as one file (fewer files, one extra shuffle)",
    )
    parser.add_argument(
        "--strategy",
        choices=("auto", "spark", "pushdown", "arrow"),
        default="auto",
        help="auto: the in-process Arrow path when the source fits this machine's memory budget "
        "(AP_ARROW_MEMORY_BUDGET, default a quarter of the memory) and no --remote Spark is given, else "
        "Spark (reading partitions straight from a source that can prune: Hive files, indexed Postgres); "
        "spark/pushdown force a Spark stage; arrow: one in-process pyarrow read of the whole source, "
        "routed and written here (full refresh mode only). The summary says which ran and why",
    )
    parser.add_argument("--remote", metavar="SC_URL", help="use a Spark Connect server (sc://host:15002)")
    parser.add_argument("--workers", type=int, default=None, help="parallel partition writers (default 4)")
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="commit the partitions that succeeded even if others failed",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    parser.set_defaults(func=run)


class ProgressBar:
    """Partitions done / total, rows and elapsed time on stderr."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.interactive = stream.isatty()
        self._last_phase: str | None = None

    def __call__(self, progress: Any) -> None:
        line = self.render(progress.phase, progress.done, progress.total, progress.rows, progress.elapsed_s)
        if self.interactive:
            self.stream.write("\r\033[K" + line)
            if progress.phase == "done":
                self.stream.write("\n")
        elif progress.phase != self._last_phase or progress.phase == "done":
            self.stream.write(line + "\n")
        self.stream.flush()
        self._last_phase = progress.phase

    @staticmethod
    def render(phase: str, done: int, total: int, rows: int, elapsed: float) -> str:
        filled = int(BAR_WIDTH * done / total) if total else (BAR_WIDTH if phase == "done" else 0)
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        minutes, seconds = divmod(int(elapsed), 60)
        return f"{phase:<9} [{bar}] {done}/{total} partitions  {rows:,} rows  {minutes:02d}:{seconds:02d}"


def run(args: argparse.Namespace) -> int:
    from airflow_partitions.refresh import refresh_dataset  # lazy: loads sqlglot

    partitions = args.partitions
    if args.failed:
        if args.partitions or args.where:
            raise RunConfError("--failed selects the partitions itself: drop --partitions / --where")
        partitions = remembered_failures(args.spec, args.dataset)
        if not partitions:
            print(f"{args.dataset}: no partition's last refresh failed; nothing to do", file=sys.stderr)
            return 0
        print(f"{args.dataset}: refreshing {len(partitions)} failed partition(s)", file=sys.stderr)
    bar = ProgressBar(sys.stderr)
    try:
        summary = refresh_dataset(
            args.spec,
            args.dataset,
            partitions=partitions,
            where=args.where,
            full=args.full,
            progress=bar,
            remote=args.remote,
            strategy=args.strategy,
            repartition=args.shuffle_stage,
            workers=args.workers,
            allow_partial=args.allow_partial,
        )
    except (PartitionsFailedError, ConservationError) as err:
        if args.json and err.summary is not None:
            print(json.dumps(err.summary.to_json(), indent=2))  # type: ignore[attr-defined]
        print_error(err)
        return 1
    if args.json:
        print(json.dumps(summary.to_json(), indent=2))
    else:
        counts = summary.plan
        version = summary.version if summary.version is not None else "(unchanged)"
        print(
            f"{summary.dataset}: version {version}; "
            f"{summary.refreshed} partition(s) written ({counts['new']} new, {counts['changed']} changed, "
            f"{counts['forced'] + counts['respec']} forced), {summary.removed} removed, "
            f"{counts['unchanged']} unchanged; {summary.rows:,} rows in {summary.timings_s['total']:.1f} s",
            file=sys.stderr,
        )
        if summary.conservation is not None:
            print(f"{summary.dataset}: {describe_conservation(summary.conservation)}", file=sys.stderr)
        print(f"{summary.dataset}: {describe_mode(summary)}", file=sys.stderr)
        if summary.strategy is not None:
            print(
                f"{summary.dataset}: strategy {summary.strategy}: {summary.strategy_reason}", file=sys.stderr
            )
        from airflow_partitions.refresh.cdc import NOTE  # lazy: loads sqlglot
        from airflow_partitions.refresh.modes import DETECTION_NOTE  # lazy: loads sqlglot

        for note in summary.notes:
            # e.g. a TRUNCATE in the stream forced a full copy; the watermark variant implied by the spec
            if note.startswith((NOTE, DETECTION_NOTE)):
                print(f"{summary.dataset}: {note}", file=sys.stderr)
    return 1 if summary.failed else 0


def describe_mode(summary: Any) -> str:
    """One line on the refresh mode and what it added (append) or rewrote (full)."""
    if summary.refresh_mode == "changes":
        line = (
            f"refresh_mode changes: {summary.changed_rows or 0:,} changed row(s) upserted into "
            f"{summary.refreshed:,} partition(s) ({summary.rows_written:,} rows rewritten in all)"
        )
    elif summary.refresh_mode != "append":
        return f"refresh_mode {summary.refresh_mode}: {summary.rows_written:,} rows written to new files"
    else:
        line = (
            f"refresh_mode append: {summary.appended_rows:,} rows appended to "
            f"{summary.appended_partitions:,} partition(s); {summary.rows_written:,} rows written to new "
            "files in all"
        )
    audit = describe_watermark_audit(summary.late_rows, summary.future_rows, summary.late_rows_policy)
    if audit:
        line += f"; {audit}"
    if summary.null_watermark_rows:
        line += (
            f"; {summary.null_watermark_rows:,} source row(s) with a NULL watermark are not in the "
            "acceleration (append and changes never read them: run refresh --full)"
        )
    return line


def remembered_failures(spec_path: str, dataset_name: str) -> list[str]:
    """Key paths of the dataset's partitions whose last refresh failed (the failure store)."""
    from airflow_partitions.refresh.failures import FailureStore  # lazy: loads sqlglot
    from airflow_partitions.spec import load_spec  # lazy: loads sqlglot
    from airflow_partitions.table import open_handle  # lazy: loads sqlglot

    project = load_spec(spec_path)
    catalog = open_handle(project, project.dataset(dataset_name)).catalog
    return sorted(FailureStore.for_catalog(catalog).failures())


def describe_conservation(counts: Any) -> str:
    """One line on the row counts a commit checked (`VersionInfo.conservation` / `CommitResult`)."""
    source = counts.get("source_rows")
    scanned = f", {source:,} in the source (full scan)" if source is not None else ""
    return (
        f"rows conserved: {counts.get('routed', 0):,} routed, {counts.get('written', 0):,} written"
        f"{scanned} over {counts.get('partitions_checked', 0):,} partition(s)"
    )


def describe_watermark_audit(late: Any, future: Any, policy: Any) -> str:
    """What a watermark mode could not see, per partition (`RefreshPlan.late_rows` / `future_rows`)."""
    parts: list[str] = []
    if late:
        action = {"rewrite": "rewritten whole", "report": "NOT taken (late_rows: report)"}.get(
            str(policy), ""
        )
        listing = ", ".join(f"{path} {count:+,}" for path, count in list(late.items())[:5])
        more = f" and {len(late) - 5} more" if len(late) > 5 else ""
        parts.append(
            f"late rows (source minus acceleration at or below the watermark) in {len(late):,} partition(s)"
            f"{', ' + action if action else ''}: {listing}{more}"
        )
    if future:
        listing = ", ".join(f"{path} {count:,}" for path, count in list(future.items())[:5])
        parts.append(f"{sum(future.values()):,} row(s) with a watermark in the future: {listing}")
    return "; ".join(parts)
