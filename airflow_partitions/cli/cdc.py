"""`airflow-partitions cdc status|drop SPEC DATASET`: a change data capture dataset's replication slot."""

from __future__ import annotations

import argparse
import json
from typing import Any

from airflow_partitions.exceptions import AirflowPartitionsError, RefreshError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "cdc",
        help="show or drop the replication slot of a refresh_mode: changes dataset (change data capture)",
        description=(
            "A refresh_mode: changes dataset on Postgres reads its changes from a logical replication slot "
            "(and a publication of the same name) that its first refresh creates. `status` shows the slot, "
            "its lag (WAL bytes written since the position the acceleration holds) and the WAL the server "
            "retains for it. `drop` removes the slot and the publication: do it when the dataset is retired "
            "(a slot nobody reads makes the server keep WAL for ever). A later refresh of the dataset "
            "refuses until `refresh --full` copies the table again."
        ),
    )
    actions = parser.add_subparsers(dest="cdc_action", metavar="ACTION", required=True)
    for name, helptext in (
        ("status", "show the slot, its lag and the WAL it retains"),
        ("drop", "drop the slot and its publication"),
    ):
        action = actions.add_parser(name, help=helptext)
        action.add_argument("spec", metavar="SPEC", help="path of the spec YAML file")
        action.add_argument("dataset", metavar="DATASET", help="the dataset's name")
        action.add_argument("--json", action="store_true", help="print JSON")
        action.set_defaults(func=run)


def slot_status(project: Any, dataset: Any) -> dict[str, Any]:
    """The slot of a change data capture dataset, as `cdc status --json` and `status` show it."""
    from airflow_partitions.refresh.cdc import change_stream, committed_position  # lazy: loads sqlglot
    from airflow_partitions.table import open_handle  # lazy: loads sqlglot

    stream = change_stream(project, dataset)
    info = stream.info()
    return {
        "dataset": dataset.name,
        "slot_name": stream.slot,
        "slot": info.to_json() if info is not None else None,
        "committed_lsn": committed_position(open_handle(project, dataset).catalog),
    }


def cdc_report(project: Any, dataset: Any) -> dict[str, Any] | None:
    """`slot_status` for `status` (None for a dataset without change data capture; an unreachable
    server or a missing slot is reported, not raised)."""
    from airflow_partitions.refresh.cdc import uses_cdc  # lazy: loads sqlglot

    if not uses_cdc(dataset):
        return None
    try:
        return slot_status(project, dataset)
    except AirflowPartitionsError as err:
        return {
            "dataset": dataset.name,
            "slot_name": None,
            "slot": None,
            "committed_lsn": None,
            "error": str(err),
        }


def run(args: argparse.Namespace) -> int:
    from airflow_partitions.refresh.cdc import change_stream, uses_cdc  # lazy: loads sqlglot
    from airflow_partitions.spec import load_spec  # lazy: loads sqlglot

    project = load_spec(args.spec)
    dataset = project.dataset(args.dataset)
    if not uses_cdc(dataset):
        raise RefreshError(
            f"dataset {dataset.name!r} does not read a replication slot (it needs refresh_mode: changes on a "
            "Postgres source, with refresh.change_detection: cdc, the default)"
        )
    if args.cdc_action == "drop":
        stream = change_stream(project, dataset)
        dropped = stream.drop()
        if args.json:
            print(json.dumps({"dataset": dataset.name, "slot_name": stream.slot, "dropped": dropped}))
        else:
            print(
                f"{dataset.name}: replication slot {stream.slot} "
                f"{'dropped' if dropped['slot'] else 'did not exist'}; publication "
                f"{'dropped' if dropped['publication'] else 'did not exist'}. The next refresh needs --full."
            )
        return 0
    status = slot_status(project, dataset)
    if args.json:
        print(json.dumps(status))
        return 0
    print(format_slot_status(status))
    return 0


def format_slot_status(status: dict[str, Any]) -> str:
    if status.get("error"):
        return f"{status['dataset']}: cannot read the replication slot: {status['error']}"
    slot = status["slot"]
    if slot is None:
        return (
            f"{status['dataset']}: no replication slot {status['slot_name']} (the next refresh creates it"
            + (
                "; the acceleration continues from a position the slot no longer holds: refresh --full)"
                if status["committed_lsn"]
                else ")"
            )
        )
    return (
        f"{status['dataset']}: slot {slot['slot']} confirmed at {slot['confirmed_flush_lsn']}, "
        f"acceleration at {status['committed_lsn']}, lag {slot['lag_bytes']} bytes, retains "
        f"{slot['retained_wal_bytes']} bytes of WAL{' (active)' if slot['active'] else ''}"
    )
