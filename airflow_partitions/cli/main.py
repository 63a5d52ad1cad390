"""The `airflow-partitions` command: a thin argparse front over the core; one module per subcommand."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from airflow_partitions.cli import print_error
from airflow_partitions.exceptions import AirflowPartitionsError

# Each module defines `register(subparsers) -> None`; the parser it adds sets `func(args) -> int`.
# Add a subcommand by creating `cli/<name>.py` and listing it here.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "init",
    "validate",
    "refresh",
    "status",
    "vacuum",
    "compact",
    "backfill",
    "plan",
    "query",
    "write",
    "cdc",
    "verify",
    "tag",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="airflow-partitions",
        description="Keep partitioned accelerations fresh and read them with partition pruning.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(f"airflow_partitions.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args))
        # Flush here, not at interpreter exit, so a reader that went away is handled below.
        sys.stdout.flush()
        return code
    except AirflowPartitionsError as err:
        print_error(err)
        return 2
    except BrokenPipeError:
        # The reader closed the pipe (`status | head`): stop quietly, as Unix tools do. Point stdout at
        # /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by the closed pipe


if __name__ == "__main__":
    sys.exit(main())
