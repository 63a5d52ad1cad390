"""The options of one refresh run: their JSON schemas (the UI trigger form) and their validated values.

A refresh DAG declares these as `Param`s, so the Airflow UI's trigger form offers them and the REST API
validates a run's `conf` against the same schemas. Operators read the merged values from
`context["params"]`; an explicit operator argument wins over the run's value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from airflow_partitions.exceptions import RunConfError

PARTITIONS = "partitions"
WHERE = "where"
FULL_REFRESH = "full_refresh"
SNAPSHOT = "snapshot"

# JSON schemas of the run options, with defaults; `dag_factory` turns each into an Airflow `Param`.
RUN_PARAM_SCHEMAS: dict[str, dict[str, Any]] = {
    PARTITIONS: {
        "default": None,
        "type": ["null", "array"],
        "items": {"type": "string", "minLength": 1},
        "title": "Partitions",
        "description": (
            "Refresh exactly these partitions, one per line as the mapped refresh task shows it "
            "(e.g. region=Zürich/day=2026-01-01T00:00:00) or as Airflow partition key "
            "(Zürich|2026-01-01T00:00:00). They are refreshed even if unchanged. "
            "Empty: let discovery decide."
        ),
    },
    WHERE: {
        "default": None,
        "type": ["null", "string"],
        "title": "Where",
        "description": (
            "SQL filter on partition columns or expressions (e.g. region = 'EU' AND day >= '2026-01-01'): "
            "only partitions that can hold matching rows are considered."
        ),
    },
    FULL_REFRESH: {
        "default": False,
        "type": "boolean",
        "title": "Full refresh",
        "description": (
            "Refresh every selected partition, changed or not (otherwise only new and changed ones)."
        ),
    },
    SNAPSHOT: {
        "default": True,
        "type": "boolean",
        "title": "Upload snapshots",
        "description": (
            "Upload refreshed partitions to the dataset's snapshot location (when snapshots are enabled)."
        ),
    },
}


@dataclass(frozen=True)
class RefreshRunConf:
    """Validated run options: explicit partitions, a partition filter, full refresh, snapshot upload."""

    partitions: tuple[str, ...] | None = None
    where: str | None = None
    full_refresh: bool = False
    snapshot: bool = True

    def __post_init__(self) -> None:
        if self.partitions is not None:
            bad = [p for p in self.partitions if not isinstance(p, str) or not p.strip()]
            if bad:
                raise RunConfError(
                    f"`{PARTITIONS}` must be a list of non-empty canonical partition keys "
                    f"(e.g. ['bucket=7/day=2026-01-01']); got {bad!r}"
                )
        if self.where is not None and not isinstance(self.where, str):
            raise RunConfError(f"`{WHERE}` must be a SQL filter string, got {type(self.where).__name__}")
        for name in (FULL_REFRESH, SNAPSHOT):
            if not isinstance(getattr(self, name), bool):
                raise RunConfError(f"`{name}` must be true or false, got {getattr(self, name)!r}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], **overrides: Any) -> RefreshRunConf:
        """From a run's params (or conf); `overrides` that are not None win (explicit operator arguments)."""
        merged = {name: values.get(name, schema["default"]) for name, schema in RUN_PARAM_SCHEMAS.items()}
        merged.update({name: value for name, value in overrides.items() if value is not None})
        return cls(
            partitions=_as_partitions(merged[PARTITIONS]),
            where=_as_where(merged[WHERE]),
            full_refresh=merged[FULL_REFRESH],
            snapshot=merged[SNAPSHOT],
        )

    @classmethod
    def from_context(cls, context: Mapping[str, Any], **overrides: Any) -> RefreshRunConf:
        """From a task's context: the DAG's params merged with the run's conf, as Airflow resolves them."""
        params = context.get("params") or {}
        return cls.from_mapping(params, **overrides)

    def for_partition_key(self, partition_key: str | None) -> RefreshRunConf:
        """These options for a run that carries Airflow's `partition_key`: that one partition, conf-less.

        A run triggered with a partition key (the REST API's / UI's `partition_key`, a partition-aware
        backfill, an asset-triggered partitioned run) refreshes exactly the partition it names, in any
        form `select_keys` accepts (Airflow's composite key `EU|2026-01-01T00:00:00`, the readable
        label, the canonical key string), changed or not. Naming partitions a second way (`partitions`
        or `where`) in the same run is refused: one run, one selection.
        """
        if partition_key is None:
            return self
        if self.partitions is not None or self.where is not None:
            raise RunConfError(
                f"this run carries partition_key {partition_key!r} and also `{PARTITIONS}` / `{WHERE}`; "
                "a run with a partition key refreshes that partition: trigger it without "
                f"`{PARTITIONS}` and `{WHERE}`, or without a partition key"
            )
        return replace(self, partitions=(partition_key,))

    def to_conf(self) -> dict[str, Any]:
        """The run conf that reproduces these options (what the UI form and the backfill CLI send)."""
        return {
            PARTITIONS: list(self.partitions) if self.partitions is not None else None,
            WHERE: self.where,
            FULL_REFRESH: self.full_refresh,
            SNAPSHOT: self.snapshot,
        }


def _as_partitions(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        # The UI's list field and hand-written conf sometimes send one key per line.
        lines = [line.strip() for line in value.splitlines()]
        return tuple(line for line in lines if line) or None
    if isinstance(value, Sequence):
        keys = tuple(value)
        return keys or None
    raise RunConfError(
        f"`{PARTITIONS}` must be a list of canonical partition keys, got {type(value).__name__}"
    )


def _as_where(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip() or None
    raise RunConfError(f"`{WHERE}` must be a SQL filter string, got {type(value).__name__}")


def run_partition_key(context: Mapping[str, Any]) -> str | None:
    """The `partition_key` of the task's run (Airflow 3.2+ partitioned runs), or None."""
    key = context.get("partition_key")
    if key is None:
        dag_run = context.get("dag_run")
        key = getattr(dag_run, "partition_key", None)
    return key if isinstance(key, str) and key else None
