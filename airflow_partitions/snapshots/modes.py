"""What each snapshot mode allows: upload after a refresh, bootstrap an empty local copy, or neither."""

from __future__ import annotations

from typing import NamedTuple

from airflow_partitions.exceptions import SnapshotError
from airflow_partitions.spec.model import SnapshotMode


class SnapshotActions(NamedTuple):
    """`upload`: publish partition files and manifests after each refresh; `bootstrap`: seed from them."""

    upload: bool
    bootstrap: bool


# `bootstrap_only` suits read replicas: they hydrate from a snapshot another writer owns and never write
# one themselves, so they cannot overwrite what they did not produce.
SNAPSHOT_ACTIONS: dict[SnapshotMode, SnapshotActions] = {
    SnapshotMode.ENABLED: SnapshotActions(upload=True, bootstrap=True),
    SnapshotMode.BOOTSTRAP_ONLY: SnapshotActions(upload=False, bootstrap=True),
    SnapshotMode.DISABLED: SnapshotActions(upload=False, bootstrap=False),
}


def snapshot_actions(mode: SnapshotMode | str) -> SnapshotActions:
    """The actions `mode` allows (`SnapshotMode` or its string value)."""
    try:
        resolved = SnapshotMode(mode)
    except ValueError as err:
        allowed = ", ".join(m.value for m in SnapshotMode)
        raise SnapshotError(f"unknown snapshot mode {mode!r}; use one of {allowed}") from err
    return SNAPSHOT_ACTIONS[resolved]
