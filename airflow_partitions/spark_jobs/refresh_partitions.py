"""spark-submit entry point of a refresh: stage a plan (and optionally finalize partitions), print JSON.

    spark-submit .../airflow_partitions/spark_jobs/refresh_partitions.py stage --spec SPEC --dataset NAME \\
        --plan plan.json --location /shared/staging/run-1 [--output stage.json] \\
        [--strategy auto|spark|pushdown] [--repartition] [--finalize]
    spark-submit .../airflow_partitions/spark_jobs/refresh_partitions.py finalize --spec SPEC \\
        --dataset NAME --stage stage.json --items items.json [--output results.json]

`stage` runs the one Spark job of a refresh (the plan is `RefreshPlan.to_json()`); with `--finalize` it
also writes every planned partition and adds their descriptors under `results`. `finalize` writes the
given work items from an existing stage. The result JSON goes to `--output`, else to stdout. The same
script runs under plain `python` with `--master local[2]` or `--remote sc://host:15002`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from airflow_partitions.exceptions import AirflowPartitionsError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="refresh_partitions.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("stage", "finalize"):
        sub = commands.add_parser(name)
        sub.add_argument("--spec", required=True, help="spec YAML path")
        sub.add_argument("--dataset", required=True, help="dataset name")
        sub.add_argument("--output", help="write the result JSON here instead of stdout")
        session = sub.add_mutually_exclusive_group()
        session.add_argument("--remote", help="Spark Connect URL (sc://host:15002) instead of spark-submit's")
        session.add_argument("--master", help="build a local session with this master (plain python runs)")
        if name == "stage":
            sub.add_argument("--plan", required=True, help="RefreshPlan JSON file")
            sub.add_argument("--location", help="stage directory (default: the dataset's staging root)")
            sub.add_argument("--strategy", choices=("auto", "spark", "pushdown"), default="auto")
            sub.add_argument("--repartition", action="store_true")
            sub.add_argument("--finalize", action="store_true", help="also finalize every planned partition")
        else:
            sub.add_argument("--stage", required=True, help="StageResult JSON file, or the stage location")
            sub.add_argument("--items", required=True, help="JSON file: a list of work items")
    return parser


def spark_session(args: argparse.Namespace) -> Any:
    from airflow_partitions.refresh.spark_session import (  # lazy: loads sqlglot
        build_connect_session,
        build_local_session,
        build_submitted_session,
    )

    if args.remote:
        return build_connect_session(args.remote)
    if args.master:
        return build_local_session(master=args.master)
    return build_submitted_session()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from airflow_partitions.refresh import finalize_partition, stage_refresh  # lazy: loads sqlglot
    from airflow_partitions.refresh.job_files import (  # lazy: loads sqlglot
        read_plan,
        read_stage_reference,
        read_work_items,
        s3_settings_from_environment,
        write_job_output,
    )
    from airflow_partitions.spec import load_spec  # lazy: loads sqlglot
    from airflow_partitions.table import open_handle  # lazy: loads sqlglot

    try:
        project = load_spec(args.spec)
        # Files on S3: the executors upload the partition files with the settings the submitter handed
        # over (none: the AWS environment).
        handle = open_handle(project, args.dataset, s3_settings=s3_settings_from_environment())
        output: dict[str, Any]
        if args.command == "stage":
            plan = read_plan(args.plan)
            stage = stage_refresh(
                handle,
                plan,
                spark=spark_session(args),
                location=args.location,
                strategy=args.strategy,
                repartition=args.repartition,
            )
            output = stage.to_json()
            if args.finalize and stage.location:
                output["results"] = [finalize_partition(handle, stage, item).to_json() for item in plan.items]
        else:
            stage_ref = read_stage_reference(args.stage)
            items = read_work_items(args.items)
            output = {"results": [finalize_partition(handle, stage_ref, item).to_json() for item in items]}
    except AirflowPartitionsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    write_job_output(output, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
