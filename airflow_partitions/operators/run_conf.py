"""The options of one refresh run: their JSON schemas (the UI trigger form) and their validated values.

A refresh DAG declares these as `Param`s, so the Airflow UI's trigger form offers them and the REST API
validates a run's `conf` against the same schemas. Operators read the merged values from
`context["params"]`; an explicit operator argument wins over the run's value. Airflow keeps conf keys no
param declares, so `from_context` refuses them itself: a misspelt `wher` must not run an unfiltered refresh.
"""

from __future__ import annotations

import datetime as dt
import difflib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import RunConfError
from airflow_partitions.keys import (
    PartitionKey,
    Scalar,
    composite_key,
    escape_component,
    key_text_problem,
    partition_label,
)

if TYPE_CHECKING:
    from airflow_partitions.spec import DatasetSpec

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
            "every partition that can hold matching rows is refreshed, even if unchanged; the others are "
            "left as they are."
        ),
    },
    FULL_REFRESH: {
        "default": False,
        "type": "boolean",
        "title": "Full refresh",
        "description": (
            "Without Partitions or Where: on, every partition is rewritten, changed or not; off, only new "
            "and changed partitions are refreshed and unchanged ones are left as they are. With Partitions "
            "or Where it changes nothing: the selected partitions are refreshed even if unchanged and "
            "every other partition is left as it is."
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
        """From a task's context: the DAG's params merged with the run's conf, as Airflow resolves them.

        A conf key that neither these options nor the DAG's own params declare is refused
        (`check_conf_keys`) before any value is read.
        """
        dag_run = context.get("dag_run")
        conf = getattr(dag_run, "conf", None) or {}
        declared = getattr(context.get("dag"), "params", None) or {}
        check_conf_keys(conf, {*RUN_PARAM_SCHEMAS, *declared})
        params = context.get("params") or {}
        return cls.from_mapping(params, **overrides)

    def check_partitions(self, dataset: str, names: Sequence[str]) -> None:
        """Refuse `partitions` keys that do not have the dataset's partition fields, in order."""
        problems = [problem for key in self.partitions or () if (problem := key_text_problem(key, names))]
        if problems:
            raise RunConfError(f"`{PARTITIONS}` of dataset {dataset!r}: {'; '.join(problems)}")

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


def check_conf_keys(conf: Mapping[str, Any], valid: Collection[str]) -> None:
    """Refuse a run conf with keys outside `valid`, naming the closest valid key of each and all of them."""
    unknown = sorted((str(key) for key in conf if key not in valid), key=str)
    if not unknown:
        return
    described = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
        described.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    raise RunConfError(
        f"the run's conf has unknown key{'s' if len(unknown) > 1 else ''} {', '.join(described)}; "
        f"valid keys: {', '.join(sorted(valid))}. Nothing was refreshed: trigger the DAG again with "
        "the key spelt as listed"
    )


# Sample values, by the declared type of the column a partition field reads (the DAG parser has no pyarrow).
_SAMPLE_BY_TYPE: tuple[tuple[str, Scalar], ...] = (
    ("timestamp", dt.datetime(2026, 1, 1)),
    ("date", dt.date(2026, 1, 1)),
    ("bool", True),
    ("decimal", Decimal("10.00")),
    ("int", 42),
    ("uint", 42),
    ("string", "EU"),
    ("large_string", "EU"),
    ("utf8", "EU"),
)
_SAMPLE_DATE_PART = {"year": 2026, "quarter": 1, "month": 1, "week": 1, "day": 1, "hour": 0, "minute": 0}


def example_partition_key(dataset: DatasetSpec) -> PartitionKey | None:
    """A plausible key of the dataset, for the trigger form's help; None when a field's type is unknown."""
    from airflow_partitions.transforms import (  # lazy: loads sqlglot
        BucketTransform,
        DatePartTransform,
        DateTruncTransform,
        ModTransform,
        TruncateTransform,
    )
    from airflow_partitions.transforms.expression import ExpressionTransform  # lazy: loads sqlglot
    from airflow_partitions.transforms.multi_bucket import MultiBucketTransform  # lazy: loads sqlglot

    declared = dict(dataset.declared_columns)
    values: list[Scalar] = []
    for field in dataset.acceleration.partition_by:
        transform = field.transform
        if isinstance(transform, MultiBucketTransform):
            # Buckets are int32 whatever the columns: 0..N-1.
            values.append(min(7, transform.num_buckets - 1))
            continue
        column_type = str(declared.get(transform.source_column, ""))
        if isinstance(transform, ExpressionTransform):
            # Its values are what DuckDB computes, which the DAG parser does not load: no made-up sample.
            return None
        by_type = next((v for prefix, v in _SAMPLE_BY_TYPE if column_type.startswith(prefix)), None)
        if isinstance(by_type, dt.datetime) and "," in column_type:
            by_type = by_type.replace(tzinfo=dt.UTC)  # `timestamp[us, UTC]`: keys hold UTC instants
        if isinstance(transform, BucketTransform):
            value: Scalar = min(7, transform.num_buckets - 1)
        elif isinstance(transform, ModTransform):
            value = min(3, transform.modulus - 1)
        elif isinstance(transform, DatePartTransform):
            value = _SAMPLE_DATE_PART.get(transform.unit, 1)
        elif isinstance(transform, DateTruncTransform):
            value = by_type if isinstance(by_type, dt.date) else dt.datetime(2026, 1, 1)
        elif isinstance(transform, TruncateTransform) and isinstance(by_type, int | Decimal):
            value = by_type if isinstance(by_type, Decimal) else 0
        elif isinstance(transform, TruncateTransform) and by_type is None:
            return None
        else:
            if by_type is None:
                return None
            value = by_type
        values.append(value)
    return PartitionKey(tuple(values))


def partitions_schema(dataset: DatasetSpec) -> dict[str, Any]:
    """The `partitions` param of one dataset: its key format in the help, and a pattern the form checks."""
    names = dataset.acceleration.partition_names
    shape = "/".join(f"{name}=<value>" for name in names)
    example = example_partition_key(dataset)
    if example is not None:
        readable = partition_label(names, example)
        canonical = example.path(names)
        sample = f"; e.g. `{readable}`" + (f" or, escaped, `{canonical}`" if readable != canonical else "")
    else:
        sample = ""
    schema = dict(RUN_PARAM_SCHEMAS[PARTITIONS])
    composite = f" or as Airflow partition key (`{composite_key(example)}`)" if example is not None else ""
    fields = ", ".join(
        f"`{field.name}` is `{field.expression}`" for field in dataset.acceleration.partition_by
    )
    schema["description"] = (
        f"Refresh exactly these partitions of {dataset.name}, one key per line as shown on the mapped "
        f"task: `{shape}`{sample}{composite}, where {fields}. NULL is %NULL. They are refreshed even if "
        "unchanged; no other partition is refreshed or removed. Empty: let discovery decide."
    )
    schema["items"] = {"type": "string", "minLength": 1, "pattern": _key_pattern(names)}
    return schema


def _key_pattern(names: Sequence[str]) -> str:
    """A regular expression (JSON Schema dialect) of keys naming `names` in order, readable or escaped."""

    def alternatives(name: str) -> str:
        spellings = dict.fromkeys((name, escape_component(name)))
        return "(?:" + "|".join(_regex_literal(s) for s in spellings) + ")"

    if not names:
        return "^$"
    # Later fields after `/` (the label form) or `, ` (the comma form of logs, `PartitionKey.describe`).
    rest = "".join(f".*(?:/|,\\s*){alternatives(name)}=" for name in names[1:])
    # Or Airflow's composite key: one value per field, joined by `|` (a value escapes its own `|`).
    composite = r"\|".join(["[^|]*"] * len(names))
    return rf"^(?:\s*/?{alternatives(names[0])}={rest}.*|{composite})$"


def _regex_literal(text: str) -> str:
    # Only the syntax characters: Python's re.escape adds escapes (`\-`) that ECMAScript's unicode mode
    # (the UI's validator) rejects.
    return "".join(f"\\{ch}" if ch in "\\^$.|?*+()[]{}/" else ch for ch in text)
