"""`airflow-partitions validate SPEC`: report every problem in a spec file, or summarise its datasets."""

from __future__ import annotations

import argparse
import json
from typing import Any

from airflow_partitions.exceptions import SpecValidationError

UNKNOWN_TYPE = "?"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check a dataset spec file and summarise its datasets",
        description=(
            "Load a dataset spec the way a DAG does and print every problem found (exit status 1), or a "
            "summary of its datasets and partition expressions (exit status 0)."
        ),
    )
    parser.add_argument("spec", metavar="SPEC", help="path of the spec YAML file, e.g. dags/datasets.yaml")
    parser.add_argument("--json", action="store_true", help="print a machine-readable JSON document instead")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from airflow_partitions.spec import describe_project, load_spec

    try:
        project = load_spec(args.spec)
    except SpecValidationError as err:
        if args.json:
            print(json.dumps({"valid": False, "path": err.path or args.spec, "errors": err.errors}, indent=2))
        else:
            print(f"{err.path or args.spec}: {len(err.errors)} error(s)")
            for message in err.errors:
                print(f"  {message}")
        return 1
    summary = describe_project(project)
    if args.json:
        print(json.dumps({"valid": True, **summary}, indent=2, default=str))
    else:
        print(render_summary(summary))
    return 0


def _table(rows: list[list[str]], indent: str) -> list[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows
    ]


def render_summary(summary: dict[str, Any]) -> str:
    """The human-readable summary of `describe_project` output."""
    datasets = summary["datasets"]
    lines = [
        f"{summary['path']}: valid, {len(datasets)} dataset(s)",
        f"accelerator_dir: {summary['accelerator_dir']}",
    ]
    any_unknown = False
    for dataset in datasets:
        source = dataset["source"]
        acceleration = dataset["acceleration"]
        refresh = acceleration["refresh"]
        snapshots = acceleration["snapshots"]
        file_format = f" ({source['file_format']})" if source["file_format"] else ""
        layout = (
            f", partition_mode {acceleration['partition_mode']}" if acceleration["engine"] == "duckdb" else ""
        )
        enabled = "" if acceleration["enabled"] else "  [acceleration disabled]"
        lines += [
            "",
            f"{dataset['name']}{enabled}",
            f"  source      {source['uri']}{file_format}",
            f"  engine      {acceleration['engine']}, mode {acceleration['mode']}{layout}",
            f"  partitions  {len(acceleration['partition_by'])} field(s), "
            f"spec id {acceleration['partition_spec_id']}",
        ]
        rows = [["name", "expression", "canonical transform", "result type"]]
        for partition_field in acceleration["partition_by"]:
            result_type = partition_field["result_type"] or UNKNOWN_TYPE
            any_unknown = any_unknown or partition_field["result_type"] is None
            rows.append(
                [
                    partition_field["name"],
                    partition_field["expression"],
                    partition_field["canonical"],
                    result_type,
                ]
            )
        if len(rows) > 1:
            lines += _table(rows, "    ")
        schedule = refresh["schedule"] or "no schedule (triggered runs only)"
        check = f", change column {refresh['check_column']}" if refresh["check_column"] else ""
        lines.append(
            f"  refresh     {schedule}{check}; discovery timeout {refresh['discovery_timeout_s']:g} s, "
            f"at most {refresh['max_partitions']} partitions"
        )
        where = f" -> {snapshots['location']}" if snapshots["location"] else ""
        lines.append(f"  snapshots   {snapshots['mode']}{where}")
    if any_unknown:
        lines += [
            "",
            f"{UNKNOWN_TYPE} = result type known once the source schema is read; declare a `schema:` block "
            "in the dataset to check it here",
        ]
    return "\n".join(lines)
