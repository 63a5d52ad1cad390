"""The `airflow-partitions` command line."""

from __future__ import annotations

import sys


def print_error(err: BaseException) -> None:
    """`error: <message>` on stderr, secrets masked: URL passwords and the secrets of every spec loaded."""
    from airflow_partitions.spec.masking import mask_secrets  # lazy: loads sqlglot

    print(f"error: {mask_secrets(str(err))}", file=sys.stderr)
