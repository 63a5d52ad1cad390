"""The typed dataset-spec model: enums, frozen dataclasses, the rules they enforce, and binding to a schema.

Every rule lives in one of the `*_problems` functions below. The dataclasses run them in `__post_init__`,
so a spec built in code is checked the same way as one read from YAML; the loader calls the same functions
first so it can report every broken rule of a file at once, each with its line.
"""

from __future__ import annotations

import datetime as dt
import difflib
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_partitions.exceptions import (
    DatasetNotFoundError,
    PartitionExpressionError,
    SpecValidationError,
)
from airflow_partitions.objectstore.location import is_valid_bucket_name
from airflow_partitions.spec.arrow_types import parse_arrow_type
from airflow_partitions.spec.index_settings import (
    declared_index_columns,
    index_params_problem,
    index_type_problem,
)
from airflow_partitions.spec.masking import mask_url_passwords, unencoded_password_problem
from airflow_partitions.spec.schedule import schedule_problem
from airflow_partitions.transforms import BucketTransform, ModTransform
from airflow_partitions.transforms.multi_bucket import MultiBucketTransform

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.transforms import Transform


# --- enums and the engine tables ------------------------------------------------------------------


class SourceScheme(StrEnum):
    """Where a dataset's rows come from (the part of `from:` before the first colon)."""

    FILE = "file"
    S3 = "s3"
    POSTGRES = "postgres"


class FileFormat(StrEnum):
    """Format of file and S3 sources; `json` is newline-delimited JSON (one object per line)."""

    PARQUET = "parquet"
    CSV = "csv"
    JSON = "json"


class Engine(StrEnum):
    """The file format partitions are written in."""

    PARQUET = "parquet"
    DUCKDB = "duckdb"
    ARROW = "arrow"


class Mode(StrEnum):
    """Whether readers serve an acceleration from its files or load partitions into memory."""

    FILE = "file"
    MEMORY = "memory"


class PartitionMode(StrEnum):
    """DuckDB layout: one database file per partition (`files`) or one table per partition (`tables`)."""

    FILES = "files"
    TABLES = "tables"


class SnapshotMode(StrEnum):
    """`enabled`: upload each refreshed partition; `bootstrap_only`: only seed an empty local copy from it."""

    ENABLED = "enabled"
    BOOTSTRAP_ONLY = "bootstrap_only"
    DISABLED = "disabled"


class RefreshMode(StrEnum):
    """How a refresh brings a changed partition up to date (`acceleration.refresh_mode`)."""

    FULL = "full"  # rewrite the partition from all its source rows
    APPEND = "append"  # add the rows past the partition's watermark as new files
    CHANGES = "changes"  # upsert the rows changed since the last watermark, by primary key (Postgres)


class ChangeDetection(StrEnum):
    """How `refresh_mode: changes` finds changed rows (`acceleration.refresh.change_detection`)."""

    CDC = "cdc"  # a logical replication slot: inserts, updates, deletes, truncates, in commit order
    WATERMARK = "watermark"  # rows whose watermark_column is at or past the last one (no deletes)


class LateRows(StrEnum):
    """What an append refresh does with a partition whose rows at or below its watermark differ in number
    from the source's (`refresh.late_rows`): late or deleted rows, rows moved past the watermark."""

    REWRITE = "rewrite"  # rewrite those partitions whole in the same commit (the acceleration = the source)
    REPORT = "report"  # append as usual and report the partitions and counts
    FAIL = "fail"  # refuse the refresh (`LateRowsError`), naming the partitions and counts


# Allowed modes per engine, the first being the default. Partition files always live on disk (Airflow
# tasks are separate processes); `memory` only tells readers to load the selected partitions into memory,
# which is the Arrow engine's natural use and meaningless for DuckDB or Parquet files.
ENGINE_MODES: dict[Engine, tuple[Mode, ...]] = {
    Engine.PARQUET: (Mode.FILE,),
    Engine.DUCKDB: (Mode.FILE,),
    Engine.ARROW: (Mode.MEMORY, Mode.FILE),
}
# Parquet and Arrow always write one file per partition; only DuckDB offers one table per partition.
ENGINE_PARTITION_MODES: dict[Engine, tuple[PartitionMode, ...]] = {
    Engine.PARQUET: (PartitionMode.FILES,),
    Engine.DUCKDB: (PartitionMode.FILES, PartitionMode.TABLES),
    Engine.ARROW: (PartitionMode.FILES,),
}
FILE_FORMAT_SUFFIXES: dict[str, FileFormat] = {
    ".parquet": FileFormat.PARQUET,
    ".pq": FileFormat.PARQUET,
    ".csv": FileFormat.CSV,
    ".json": FileFormat.JSON,
    ".jsonl": FileFormat.JSON,
    ".ndjson": FileFormat.JSON,
}

DEFAULT_ENGINE = Engine.PARQUET
DEFAULT_ACCELERATOR_DIR = ".accelerations"
DEFAULT_POSTGRES_CONNECTION_ID = "postgres_default"
DEFAULT_POSTGRES_SCHEMA = "public"
DEFAULT_DISCOVERY_TIMEOUT_S = 60.0
DEFAULT_MAX_PARTITIONS = 10_000
# How far past the current time a watermark value is still trusted (clock skew between writers).
DEFAULT_MAX_FUTURE_SKEW_S = 300.0

NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PG_IDENTIFIER = r'(?:[A-Za-z_][A-Za-z0-9_$]*|"(?:[^"]|"")+")'
_PG_TABLE = re.compile(rf"^(?:(?P<schema>{_PG_IDENTIFIER})\.)?(?P<table>{_PG_IDENTIFIER})$")


class Problem(NamedTuple):
    """One broken rule: `path` is the YAML key path inside the checked block (for the line number)."""

    path: tuple[str | int, ...]
    message: str


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the closest candidate, or an empty string when none is close."""
    options = [str(candidate) for candidate in candidates]
    by_case = [c for c in options if c.lower() == word.lower()]
    if by_case:
        return f" (did you mean {by_case[0]!r}?)"
    lowered = {c.lower(): c for c in options}
    close = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return f" (did you mean {lowered[close[0]]!r}?)" if close else ""


def one_of(values: Iterable[str]) -> str:
    return ", ".join(values)


def _raise_problems(problems: Sequence[Problem]) -> None:
    if problems:
        raise SpecValidationError([problem.message for problem in problems])


# --- source ---------------------------------------------------------------------------------------


def split_postgres_table(location: str) -> tuple[str, str] | None:
    """`(schema, table)` as Postgres resolves them (unquoted names fold to lower case); None if malformed."""
    match = _PG_TABLE.match(location)
    if not match:
        return None

    def resolve(identifier: str) -> str:
        if identifier.startswith('"'):
            return identifier[1:-1].replace('""', '"')
        return identifier.lower()

    schema = match.group("schema")
    return (resolve(schema) if schema else DEFAULT_POSTGRES_SCHEMA), resolve(match.group("table"))


def qualify_postgres_table(location: str) -> str:
    """`schema.table` for a `[schema.]table` location (schema `public` when omitted); malformed ones as is."""
    match = _PG_TABLE.match(location)
    if match and match.group("schema") is None:
        return f"{DEFAULT_POSTGRES_SCHEMA}.{location}"
    return location


def source_problems(
    scheme: SourceScheme, location: str, params: Mapping[str, Any], file_format: FileFormat | None
) -> list[Problem]:
    """Rules for a source: a usable location per scheme, and the params each scheme understands."""
    problems: list[Problem] = []
    if scheme is SourceScheme.POSTGRES:
        if split_postgres_table(location) is None:
            problems.append(
                Problem(
                    ("from",),
                    f"from 'postgres:{location}' is not a table name; write postgres:schema.table or "
                    "postgres:table (schema public), quoting mixed-case names with double quotes",
                )
            )
        if file_format is not None or "file_format" in params:
            problems.append(
                Problem(("params", "file_format"), "params.file_format applies to file and s3 sources only")
            )
        if "connection_id" in params and "url" in params:
            problems.append(
                Problem(
                    ("params",),
                    "params give both connection_id and url for a postgres source; keep exactly one",
                )
            )
        for key in ("connection_id", "url"):
            if key in params and (not isinstance(params[key], str) or not params[key].strip()):
                problems.append(Problem(("params", key), f"params.{key} must be a non-empty string"))
        url = params.get("url")
        if isinstance(url, str) and url.strip() and not re.match(r"^postgres(ql)?://", url):
            problems.append(
                Problem(
                    ("params", "url"),
                    f"params.url {mask_url_passwords(url)!r} must start with postgresql:// or postgres://",
                )
            )
        unencoded = unencoded_password_problem(url) if isinstance(url, str) else None
        if unencoded is not None:
            problems.append(Problem(("params", "url"), f"params.url {unencoded}"))
        return problems

    if file_format is None:
        problems.append(Problem(("params", "file_format"), f"a {scheme} source needs a file_format"))
    if not location:
        problems.append(Problem(("from",), f"from '{scheme}:' names no location"))
    if scheme is SourceScheme.S3:
        bucket = location.partition("/")[0]
        if not is_valid_bucket_name(bucket):
            problems.append(
                Problem(
                    ("from",),
                    f"from 's3://{location}': bucket name {bucket!r} is invalid; use 3-63 lowercase letters, "
                    "digits, dots or hyphens, starting and ending with a letter or digit",
                )
            )
    elif scheme is SourceScheme.FILE and location and not os.path.isabs(location):
        problems.append(
            Problem(("from",), f"file location {location!r} must be resolved to an absolute path")
        )
    return problems


@dataclass(frozen=True)
class SourceRef:
    """Where a dataset is read from.

    `location` carries no scheme: an absolute local path for `file` (a directory, a file or a glob,
    resolved against the spec file's directory when written relative), `bucket/prefix` for `s3`, and
    `schema.table` for `postgres` (schema `public` when omitted). `params` are the dataset's `params:`
    as written; `file_format` is set for file and S3 sources (from `params.file_format`, else the file
    suffix, else parquet) and None for Postgres.
    """

    scheme: SourceScheme
    location: str
    params: Mapping[str, Any] = field(default_factory=dict)
    file_format: FileFormat | None = None

    def __post_init__(self) -> None:
        _raise_problems(source_problems(self.scheme, self.location, self.params, self.file_format))

    @property
    def uri(self) -> str:
        """The canonical `from:` text: `file:/abs/path`, `s3://bucket/prefix`, `postgres:schema.table`."""
        separator = "://" if self.scheme is SourceScheme.S3 else ":"
        return f"{self.scheme}{separator}{self.location}"

    @property
    def bucket(self) -> str:
        """S3 bucket of an s3 source."""
        self._require(SourceScheme.S3, "bucket")
        return self.location.partition("/")[0]

    @property
    def key_prefix(self) -> str:
        """S3 key (prefix or glob) of an s3 source, without the bucket; may be empty."""
        self._require(SourceScheme.S3, "key_prefix")
        return self.location.partition("/")[2]

    @property
    def table_schema(self) -> str:
        """Postgres schema name, as Postgres resolves it."""
        self._require(SourceScheme.POSTGRES, "table_schema")
        return self._postgres_names()[0]

    @property
    def table_name(self) -> str:
        """Postgres table name, as Postgres resolves it."""
        self._require(SourceScheme.POSTGRES, "table_name")
        return self._postgres_names()[1]

    @property
    def connection_id(self) -> str | None:
        """Airflow connection of a postgres source: `params.connection_id`, else `postgres_default`
        unless `params.url` is given."""
        self._require(SourceScheme.POSTGRES, "connection_id")
        if "url" in self.params:
            return None
        return str(self.params.get("connection_id", DEFAULT_POSTGRES_CONNECTION_ID))

    @property
    def url(self) -> str | None:
        """Explicit `params.url` of a postgres source (takes the place of an Airflow connection)."""
        self._require(SourceScheme.POSTGRES, "url")
        url = self.params.get("url")
        return str(url) if url is not None else None

    def _postgres_names(self) -> tuple[str, str]:
        names = split_postgres_table(self.location)
        assert names is not None, "validated in __post_init__"
        return names

    def _require(self, scheme: SourceScheme, attribute: str) -> None:
        if self.scheme is not scheme:
            raise AttributeError(f"{attribute} is defined for {scheme} sources only; this one is {self.uri}")


# --- refresh and snapshots ------------------------------------------------------------------------


def refresh_problems(
    schedule: str | None,
    check_column: str | None,
    discovery_timeout_s: float,
    max_partitions: int,
    mode: RefreshMode = RefreshMode.FULL,
    watermark_column: str | None = None,
    change_detection: str | None = None,
    late_rows: Any = LateRows.REWRITE,
    max_future_skew_s: Any = DEFAULT_MAX_FUTURE_SKEW_S,
) -> list[Problem]:
    """Rules for `acceleration.refresh` (and `acceleration.refresh_mode`, which it records)."""
    problems: list[Problem] = []
    if change_detection is not None and change_detection not in tuple(ChangeDetection):
        problems.append(
            Problem(
                ("change_detection",),
                f"refresh.change_detection must be one of {', '.join(ChangeDetection)}, "
                f"got {change_detection!r}",
            )
        )
    elif change_detection is not None and mode is not RefreshMode.CHANGES:
        problems.append(
            Problem(
                ("change_detection",),
                f"refresh.change_detection applies to refresh_mode: changes only (this dataset is {mode}); "
                "remove it",
            )
        )
    detection = resolve_change_detection(mode, watermark_column, change_detection)
    if watermark_column is not None and (
        not isinstance(watermark_column, str) or not watermark_column.strip()
    ):
        problems.append(
            Problem(
                ("watermark_column",),
                f"refresh.watermark_column must be a column name, got {watermark_column!r}",
            )
        )
    elif mode is not RefreshMode.FULL and watermark_column is None and detection is not ChangeDetection.CDC:
        column = "created_at" if mode is RefreshMode.APPEND else "updated_at"
        problems.append(
            Problem(
                ("watermark_column",),
                f"refresh_mode: {mode} needs refresh.watermark_column: the column whose values grow with "
                f"each new{' or changed' if mode is RefreshMode.CHANGES else ''} row (e.g. {column}); "
                "set it, or use refresh_mode: full",
            )
        )
    if schedule is not None:
        if not isinstance(schedule, str):
            problems.append(Problem(("schedule",), f"refresh.schedule must be a string, got {schedule!r}"))
        else:
            problem = schedule_problem(schedule)
            if problem:
                problems.append(Problem(("schedule",), f"refresh.{problem}"))
    if check_column is not None and (not isinstance(check_column, str) or not check_column.strip()):
        problems.append(
            Problem(("check_column",), f"refresh.check_column must be a column name, got {check_column!r}")
        )
    if (
        isinstance(discovery_timeout_s, bool)
        or not isinstance(discovery_timeout_s, int | float)
        or not discovery_timeout_s > 0
        or discovery_timeout_s == float("inf")
    ):
        problems.append(
            Problem(
                ("discovery_timeout_s",),
                "refresh.discovery_timeout_s must be a positive number of seconds, "
                f"got {discovery_timeout_s!r}",
            )
        )
    if isinstance(max_partitions, bool) or not isinstance(max_partitions, int) or max_partitions < 1:
        problems.append(
            Problem(
                ("max_partitions",),
                f"refresh.max_partitions must be a positive integer, got {max_partitions!r}",
            )
        )
    if late_rows not in {str(policy) for policy in LateRows}:
        problems.append(
            Problem(
                ("late_rows",),
                f"refresh.late_rows must be one of {', '.join(LateRows)}, got {late_rows!r}",
            )
        )
    if (
        isinstance(max_future_skew_s, bool)
        or not isinstance(max_future_skew_s, int | float)
        or not 0 <= max_future_skew_s < float("inf")
    ):
        problems.append(
            Problem(
                ("max_future_skew_s",),
                "refresh.max_future_skew_s must be a number of seconds, 0 or more, "
                f"got {max_future_skew_s!r}",
            )
        )
    return problems


@dataclass(frozen=True)
class RefreshConfig:
    """When to refresh (`schedule`: an Airflow preset or cron, None = triggered only), which column tells a
    changed source partition (`check_column`, e.g. `updated_at`), the bounds of partition discovery, and
    how a changed partition is refreshed (`mode`, with its `watermark_column`)."""

    schedule: str | None = None
    check_column: str | None = None
    discovery_timeout_s: float = DEFAULT_DISCOVERY_TIMEOUT_S
    max_partitions: int = DEFAULT_MAX_PARTITIONS
    # `acceleration.refresh_mode` and, for append / changes, the column whose values grow with new rows.
    mode: RefreshMode = RefreshMode.FULL
    watermark_column: str | None = None
    # Append: what to do with partitions whose rows at or below the watermark differ from the source's.
    late_rows: LateRows = LateRows.REWRITE
    # Watermark values past now + this many seconds are not trusted (reported, never a read's start).
    max_future_skew_s: float = DEFAULT_MAX_FUTURE_SKEW_S
    # Where `check_column:` sits in the spec file, so a problem found against the source points at it.
    check_column_line: int | None = field(default=None, compare=False, repr=False)
    watermark_column_line: int | None = field(default=None, compare=False, repr=False)
    # refresh_mode changes: `cdc` or `watermark` as written (None: see `resolve_change_detection`).
    change_detection: str | None = None

    def __post_init__(self) -> None:
        _raise_problems(
            refresh_problems(
                self.schedule,
                self.check_column,
                self.discovery_timeout_s,
                self.max_partitions,
                self.mode,
                self.watermark_column,
                self.change_detection,
                str(self.late_rows),
                self.max_future_skew_s,
            )
        )

    @property
    def detection(self) -> ChangeDetection | None:
        """How a changes refresh finds changed rows (None outside refresh_mode: changes)."""
        return resolve_change_detection(self.mode, self.watermark_column, self.change_detection)

    @property
    def detection_reason(self) -> str | None:
        """Which change detection a changes refresh uses and why, for `validate` and the refresh's notes."""
        detection = self.detection
        if detection is None:
            return None
        if self.change_detection is not None:
            return f"change_detection {detection}, as refresh.change_detection says"
        if detection is ChangeDetection.WATERMARK:
            return (
                f"change_detection watermark (rows whose {self.watermark_column} grew): the spec names "
                "refresh.watermark_column and no refresh.change_detection, as specs written before change "
                "data capture did, so it keeps that variant; it sees no delete and no late, backdated or "
                "in-place update. Set refresh.change_detection: cdc to read a replication slot instead "
                "(Postgres, wal_level = logical), or change_detection: watermark to keep this variant and "
                "silence this note"
            )
        return (
            "change_detection cdc (a logical replication slot: inserts, updates, deletes, TRUNCATE), the "
            "default of refresh_mode: changes"
        )


def resolve_change_detection(
    mode: RefreshMode, watermark_column: str | None, change_detection: str | None
) -> ChangeDetection | None:
    """The change detection of a changes dataset (None for other modes): the one the spec names, else
    `cdc`, unless the spec names only a `watermark_column` (a watermark spec written before `cdc`)."""
    if mode is not RefreshMode.CHANGES:
        return None
    if change_detection in tuple(ChangeDetection):
        return ChangeDetection(change_detection)
    return ChangeDetection.WATERMARK if watermark_column is not None else ChangeDetection.CDC


def snapshot_problems(mode: SnapshotMode, location: str | None) -> list[Problem]:
    """Rules for `acceleration.snapshots`."""
    problems: list[Problem] = []
    if mode is not SnapshotMode.DISABLED and not location:
        problems.append(
            Problem(
                ("location",),
                f"snapshots mode {mode} needs a location (snapshots.location: s3://bucket/prefix), "
                "or set snapshots.mode: disabled",
            )
        )
    if location:
        scheme, sep, rest = location.partition("://")
        bucket = rest.partition("/")[0]
        if not sep or scheme != "s3":
            problems.append(
                Problem(("location",), f"snapshots.location {location!r} must be an s3://bucket/prefix URL")
            )
        elif not is_valid_bucket_name(bucket):
            problems.append(
                Problem(
                    ("location",),
                    f"snapshots.location {location!r}: bucket name {bucket!r} is invalid; use 3-63 lowercase "
                    "letters, digits, dots or hyphens, starting and ending with a letter or digit",
                )
            )
    return problems


@dataclass(frozen=True)
class SnapshotConfig:
    """Per-partition snapshots in object storage; `location` is an `s3://bucket/prefix` URL."""

    mode: SnapshotMode = SnapshotMode.DISABLED
    location: str | None = None

    def __post_init__(self) -> None:
        _raise_problems(snapshot_problems(self.mode, self.location))


# --- partition fields -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionField:
    """One `partition_by` entry: its name, the expression as written, and the parsed transform.

    `source_type` is the Arrow type of the source column once the field is bound to a schema (then
    `transform` is bound too and `result_type` is known); `line` is where the entry sits in the spec file.
    """

    name: str
    expression: str
    transform: Transform
    source_type: pa.DataType | None = field(default=None, compare=False)
    line: int | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        problem = field_name_problem(self.name)
        if problem:
            raise SpecValidationError([problem])

    @property
    def source_column(self) -> str:
        """The one column the field reads (a `multi_bucket` field raises: use `source_columns`)."""
        return self.transform.source_column

    @property
    def source_columns(self) -> tuple[str, ...]:
        """Every column the field reads, in order (several only for `multi_bucket`)."""
        return self.transform.source_columns

    @property
    def source_types(self) -> tuple[pa.DataType, ...] | None:
        """The Arrow type of each column in `source_columns` once bound."""
        return self.transform.source_types if self.bound else None

    @property
    def canonical(self) -> str:
        return self.transform.canonical

    @property
    def bound(self) -> bool:
        return self.source_type is not None

    @property
    def result_type(self) -> pa.DataType | None:
        """Arrow type of the partition values, known once the field is bound to the source schema."""
        return self.transform.result_type if self.bound else None

    def bind(self, source_type: pa.DataType) -> PartitionField:
        """A copy bound to the source column's type; raises `PartitionExpressionError` when unusable."""
        return replace(self, transform=self.transform.bind(source_type), source_type=source_type)

    def bind_columns(self, source_types: Sequence[pa.DataType]) -> PartitionField:
        """A copy bound to the type of each source column (`source_type` keeps the first's)."""
        types = list(source_types)
        return replace(self, transform=self.transform.bind_columns(types), source_type=types[0])


def field_name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        return (
            f"partition field name {name!r} must be an identifier (letters, digits and _, not starting "
            "with a digit): it names a column and a directory level"
        )
    return None


def bucket_count(transform: Transform) -> int | None:
    """N of a `bucket(N, col)` transform (its partitions are known without reading the source), else None."""
    return transform.num_buckets if isinstance(transform, BucketTransform) else None


def static_partition_count(counts: Sequence[int]) -> int:
    """Partitions of an all-bucket spec: per field its N buckets plus the NULL partition (NULL rows)."""
    total = 1
    for count in counts:
        total *= count + 1
    return total


# --- acceleration ---------------------------------------------------------------------------------


def engine_problems(engine: Engine, mode: Mode, partition_mode: PartitionMode) -> list[Problem]:
    """Rules tying `mode` and `params.partition_mode` to the engine."""
    problems: list[Problem] = []
    allowed_modes = ENGINE_MODES[engine]
    if mode not in allowed_modes:
        problems.append(
            Problem(
                ("mode",),
                f"engine {engine} requires mode: {' or '.join(allowed_modes)} (got mode: {mode}); "
                f"{engine} partitions are files on disk",
            )
        )
    if partition_mode not in ENGINE_PARTITION_MODES[engine]:
        problems.append(
            Problem(
                ("params", "partition_mode"),
                f"params.partition_mode: {partition_mode} applies to engine duckdb only "
                f"(engine {engine} always writes one file per partition); remove it or use engine: duckdb",
            )
        )
    return problems


def file_layout_problems(engine: Engine, params: Mapping[str, Any]) -> list[Problem]:
    """Rules for the parquet file layout params: `row_group_rows` and `sort_by` (columns checked at bind)."""
    problems: list[Problem] = []
    rows = params.get("row_group_rows")
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        problems.append(
            Problem(
                ("params", "row_group_rows"),
                "params.row_group_rows must be a positive integer (rows per Parquet row group), "
                f"got {rows!r}",
            )
        )
    sort_by = params.get("sort_by")
    if sort_by is not None:
        names = [sort_by] if isinstance(sort_by, str) else sort_by
        if (
            not isinstance(names, list)
            or not names
            or not all(isinstance(name, str) and name for name in names)
        ):
            problems.append(
                Problem(
                    ("params", "sort_by"),
                    "params.sort_by must be a column name or a non-empty list of column names, "
                    f"got {sort_by!r}",
                )
            )
        elif len(set(names)) != len(names):
            problems.append(
                Problem(("params", "sort_by"), f"params.sort_by lists a column twice: {sort_by!r}")
            )
    for key in ("row_group_rows", "sort_by"):
        if key in params and engine is not Engine.PARQUET:
            problems.append(
                Problem(
                    ("params", key),
                    f"params.{key} applies to engine parquet only (engine {engine} files have no Parquet "
                    "row groups); remove it or use engine: parquet",
                )
            )
    return problems


def read_stats_problems(params: Mapping[str, Any]) -> list[Problem]:
    """`params.read_stats`: true (record each read's filter shape, the default), false or literals."""
    value = params.get("read_stats")
    if value is None or isinstance(value, bool) or value == "literals":
        return []
    return [
        Problem(
            ("params", "read_stats"),
            "params.read_stats must be true (record the shape of every read's filter), false (record "
            f"nothing) or literals (record the filter's values too), got {value!r}",
        )
    ]


def declared_sort_columns(params: Mapping[str, Any]) -> tuple[str, ...]:
    """`params.sort_by` as a tuple of column names (empty when not declared or malformed: the malformed
    value is `file_layout_problems`' to report)."""
    sort_by = params.get("sort_by")
    if isinstance(sort_by, str):
        return (sort_by,)
    if isinstance(sort_by, list) and all(isinstance(column, str) for column in sort_by):
        return tuple(sort_by)
    return ()


def partition_name_problems(indexed_fields: Sequence[tuple[int, PartitionField]]) -> list[Problem]:
    """Partition names must be unique (ignoring case: they become columns and directory names)."""
    problems: list[Problem] = []
    first_index: dict[str, int] = {}
    for index, partition_field in indexed_fields:
        key = partition_field.name.lower()
        if key in first_index:
            problems.append(
                Problem(
                    ("partition_by", index),
                    f"partition_by[{index}] {json.dumps(partition_field.expression)}: duplicate "
                    f"partition name {partition_field.name!r} "
                    f"(already used by partition_by[{first_index[key]}]); "
                    "give each field its own name with the {name: expression} form",
                )
            )
        else:
            first_index[key] = index
    return problems


def partition_count_problems(
    enabled: bool, partition_by: Sequence[PartitionField], max_partitions: int
) -> list[Problem]:
    """An enabled acceleration needs partition fields, and all-bucket specs must fit `max_partitions`."""
    if not partition_by:
        if not enabled:
            return []
        return [
            Problem(
                ("partition_by",),
                "acceleration.partition_by is empty; list at least one expression, e.g. "
                "partition_by: [bucket(16, id)], or set enabled: false",
            )
        ]
    counts = [bucket_count(f.transform) for f in partition_by]
    if any(count is None for count in counts):
        return []
    total = static_partition_count([count or 0 for count in counts])
    if total <= max_partitions:
        return []
    return [
        Problem(
            ("refresh", "max_partitions"),
            f"partition_by yields {total} bucket partitions (each field's buckets plus its NULL partition), "
            f"more than refresh.max_partitions ({max_partitions}); lower the bucket count or raise "
            "refresh.max_partitions",
        )
    ]


def acceleration_problems(
    *,
    enabled: bool,
    engine: Engine,
    mode: Mode,
    partition_by: Sequence[PartitionField],
    partition_mode: PartitionMode,
    refresh: RefreshConfig,
    params: Mapping[str, Any],
    primary_key: Sequence[str] = (),
) -> list[Problem]:
    """Every rule across the fields of `acceleration:` (each field is valid on its own by now)."""
    problems: list[Problem] = []
    if not isinstance(enabled, bool):
        problems.append(Problem(("enabled",), f"acceleration.enabled must be true or false, got {enabled!r}"))
    problems += engine_problems(engine, mode, partition_mode)
    problems += file_layout_problems(engine, params)
    index_problem = index_params_problem(params)
    if index_problem:
        problems.append(Problem(("params", "index_columns"), index_problem))

    problems += read_stats_problems(params)
    problems += partition_name_problems(list(enumerate(partition_by)))
    problems += partition_count_problems(enabled, partition_by, refresh.max_partitions)
    problems += primary_key_problems(refresh.mode, primary_key)
    return problems


def primary_key_problems(mode: RefreshMode, primary_key: object) -> list[Problem]:
    """`primary_key` is a list of distinct column names, and refresh_mode: changes cannot do without it."""
    if primary_key is None or primary_key == ():
        if mode is RefreshMode.CHANGES:
            return [
                Problem(
                    ("primary_key",),
                    "refresh_mode: changes needs primary_key: the column(s) that identify a row (e.g. "
                    "primary_key: [id]), so a changed row replaces its old version instead of being added "
                    "twice; set it, or use refresh_mode: append (new rows only) or full",
                )
            ]
        return []
    columns = list(primary_key) if isinstance(primary_key, list | tuple) else None
    if not columns or not all(isinstance(c, str) and c.strip() for c in columns):
        return [
            Problem(
                ("primary_key",),
                f"primary_key must be a list of column names (e.g. [id]), got {primary_key!r}",
            )
        ]
    repeated = sorted({c for c in columns if columns.count(c) > 1})
    if repeated:
        return [Problem(("primary_key",), f"primary_key names {repeated} more than once")]
    return []


@dataclass(frozen=True)
class AccelerationSpec:
    """How a dataset is accelerated: engine, layout, partition fields, refresh and snapshot settings.

    Defaults: enabled, engine parquet, mode file (memory for arrow), partition_mode files, no schedule,
    snapshots disabled. `params` are `acceleration.params` as written (partition_mode included).
    """

    partition_by: tuple[PartitionField, ...]
    enabled: bool = True
    engine: Engine = DEFAULT_ENGINE
    mode: Mode = Mode.FILE
    partition_mode: PartitionMode = PartitionMode.FILES
    params: Mapping[str, Any] = field(default_factory=dict)
    refresh: RefreshConfig = field(default_factory=RefreshConfig)
    snapshots: SnapshotConfig = field(default_factory=SnapshotConfig)
    # The columns that identify a row (refresh_mode: changes; writes); () = none declared.
    primary_key: tuple[str, ...] = ()
    # Where `params.sort_by` sits in the spec file, so an unknown column found at bind points at it.
    sort_by_line: int | None = field(default=None, compare=False, repr=False)
    primary_key_line: int | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _raise_problems(
            acceleration_problems(
                enabled=self.enabled,
                engine=self.engine,
                mode=self.mode,
                partition_by=self.partition_by,
                partition_mode=self.partition_mode,
                refresh=self.refresh,
                params=self.params,
                primary_key=self.primary_key,
            )
        )

    @property
    def refresh_mode(self) -> RefreshMode:
        return self.refresh.mode

    @property
    def sort_columns(self) -> tuple[str, ...]:
        """The columns each partition file is sorted by: `params.sort_by` when declared, else the source
        columns of the `bucket` / `mod` fields (the values that still vary inside one partition, so
        row-group min / max can exclude most of a file on a point read)."""
        declared = declared_sort_columns(self.params)
        if declared:
            return declared

        columns: list[str] = []
        for partition_field in self.partition_by:
            hashed = BucketTransform | ModTransform | MultiBucketTransform
            if not isinstance(partition_field.transform, hashed):
                continue
            for column in partition_field.source_columns:
                if column not in columns:
                    columns.append(column)
        return tuple(columns)

    @property
    def partition_names(self) -> tuple[str, ...]:
        """Field names in order: the `names` of `PartitionKey.path`."""
        return tuple(f.name for f in self.partition_by)

    def partition_spec_canonical(self) -> str:
        """The partition spec as stable text: a JSON list of `[name, canonical transform]` pairs."""
        pairs = [[f.name, f.canonical] for f in self.partition_by]
        return json.dumps(pairs, separators=(",", ":"), ensure_ascii=False)

    @property
    def partition_spec_id(self) -> str:
        """Short stable hash of `partition_spec_canonical()`; changes when any name or transform does."""
        return hashlib.sha256(self.partition_spec_canonical().encode("utf-8")).hexdigest()[:16]

    def partition_field(self, name: str) -> PartitionField:
        """The partition field called `name`."""
        for partition_field in self.partition_by:
            if partition_field.name == name:
                return partition_field
        raise KeyError(
            f"no partition field {name!r}; fields are {one_of(self.partition_names) or '(none)'}"
            f"{did_you_mean(name, self.partition_names)}"
        )


# --- datasets and the project ---------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset: its name, source and acceleration.

    `declared_columns` is the spec's optional `schema:` block as `(column, type text)` pairs;
    `bound_schema` is the Arrow schema the partition fields are bound to (the declared one after
    loading, the real source schema after `bind`), or None while unbound.
    """

    name: str
    source: SourceRef
    acceleration: AccelerationSpec
    declared_columns: tuple[tuple[str, str], ...] = ()
    bound_schema: pa.Schema | None = field(default=None, compare=False, repr=False)
    line: int | None = field(default=None, compare=False, repr=False)
    # `freshness: 2h`: a partition last refreshed longer ago than this misses the dataset's freshness SLA.
    freshness: dt.timedelta | None = field(default=None, compare=False)
    # `renamed_columns: {old: new}`: source columns renamed since the acceleration stored them as `old`
    # (`spec.renames`). The acceleration's fields above already name the stored columns.
    renamed_columns: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        problem = dataset_name_problem(self.name)
        if problem:
            raise SpecValidationError([problem])

    @property
    def partition_by(self) -> tuple[PartitionField, ...]:
        return self.acceleration.partition_by

    @property
    def bound(self) -> bool:
        return self.bound_schema is not None

    def declared_schema(self) -> pa.Schema | None:
        """The `schema:` block as an Arrow schema, or None when the spec declares none."""
        return declared_arrow_schema(self.declared_columns) if self.declared_columns else None

    def bind(self, schema: pa.Schema) -> DatasetSpec:
        """A copy whose partition transforms are bound to the source `schema` (result types known).

        Raises `SpecValidationError` listing every problem: unknown columns (with a did-you-mean), result
        types that cannot be partition values, an unknown `refresh.check_column`.
        """
        bound_fields, problems = bind_problems(self, schema)
        if problems:
            raise SpecValidationError([format_problem(line, message) for line, message in problems])
        acceleration = replace(self.acceleration, partition_by=tuple(bound_fields))
        return replace(self, acceleration=acceleration, bound_schema=schema)


def declared_arrow_schema(columns: Sequence[tuple[str, str]]) -> pa.Schema:
    """Arrow schema of `(column, type text)` pairs as a spec's `schema:` block declares them."""
    import pyarrow as pa

    return pa.schema([(name, parse_arrow_type(text)) for name, text in columns])


def dataset_name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        return (
            f"dataset name {name!r} must be an identifier (letters, digits and _, not starting with a "
            "digit): it names tables, directories and Airflow assets"
        )
    return None


def expression_detail(error: Exception, *spellings: str) -> str:
    """The message of a transform error without its leading `partition expression '<expr>'`: the spec's
    own message already names the entry, so the expression would otherwise appear twice."""
    message = str(error)
    for spelling in spellings:
        for quoted in (repr(spelling), json.dumps(spelling)):
            prefix = f"partition expression {quoted}"
            if message.startswith(prefix):
                return message[len(prefix) :].removeprefix(":").strip()
    return message


def format_problem(line: int | None, message: str) -> str:
    return f"line {line}: {message}" if line is not None else message


def bind_problems(
    dataset: DatasetSpec, schema: pa.Schema
) -> tuple[list[PartitionField], list[tuple[int | None, str]]]:
    """Bind every partition field of `dataset` to `schema`: the bound fields and `(line, message)`s."""
    return bind_fields(
        f"dataset {dataset.name!r}",
        list(enumerate(dataset.partition_by)),
        dataset.acceleration.refresh.check_column,
        schema,
        dataset.acceleration.refresh.check_column_line or dataset.line,
        sort_by=declared_sort_columns(dataset.acceleration.params),
        sort_by_line=dataset.acceleration.sort_by_line or dataset.line,
        index_columns=declared_index_columns(dataset.acceleration.params),
        index_columns_line=dataset.line,
        watermark_column=dataset.acceleration.refresh.watermark_column,
        watermark_column_line=dataset.acceleration.refresh.watermark_column_line or dataset.line,
        primary_key=dataset.acceleration.primary_key,
        primary_key_line=dataset.acceleration.primary_key_line or dataset.line,
    )


def bind_fields(
    label: str,
    indexed_fields: Sequence[tuple[int, PartitionField]],
    check_column: str | None,
    schema: pa.Schema,
    check_column_line: int | None = None,
    *,
    sort_by: Sequence[str] = (),
    sort_by_line: int | None = None,
    watermark_column: str | None = None,
    watermark_column_line: int | None = None,
    primary_key: Sequence[str] = (),
    primary_key_line: int | None = None,
    index_columns: Sequence[str] = (),
    index_columns_line: int | None = None,
) -> tuple[list[PartitionField], list[tuple[int | None, str]]]:
    """Bind `(position, field)`s to `schema`: every unknown column, unusable result type, unknown
    `check_column` and unknown or unsortable `sort_by` column becomes a `(line, message)` starting with
    `label` (`dataset 'name'`)."""
    names = list(schema.names)
    bound: list[PartitionField] = []
    problems: list[tuple[int | None, str]] = []

    def column_problem(column: str) -> str | None:
        matches = schema.get_all_field_indices(column)
        if len(matches) > 1:
            return f"column {column!r} appears {len(matches)} times in the source schema; it is ambiguous"
        if not matches:
            listing = f"; columns are {one_of(names)}" if len(names) <= 12 else ""
            return f"unknown column {column!r}{did_you_mean(column, names)}{listing}"
        return None

    by_folded: dict[str, list[str]] = {}
    for name in names:
        by_folded.setdefault(name.casefold(), []).append(name)
    for spellings in by_folded.values():
        if len(set(spellings)) > 1:
            # DuckDB, which reads every acceleration, resolves names case-insensitively: one of the two
            # columns would read as the other (or as NULL), so such a source is refused, not half read.
            problems.append(
                (
                    None,
                    f"{label}: the source has columns {' and '.join(map(repr, sorted(set(spellings))))}, "
                    "whose names differ only by case; the accelerations cannot keep them apart (DuckDB "
                    "matches names case-insensitively): rename one in the source",
                )
            )
    for index, partition_field in indexed_fields:
        where = f"{label}: partition_by[{index}] {json.dumps(partition_field.expression)}"
        column_problems = [
            problem for problem in map(column_problem, partition_field.source_columns) if problem
        ]
        if column_problems:
            problems.extend((partition_field.line, f"{where}: {problem}") for problem in column_problems)
            continue
        source_types = [schema.field(column).type for column in partition_field.source_columns]
        try:
            bound.append(partition_field.bind_columns(source_types))
        except PartitionExpressionError as err:
            detail = expression_detail(err, partition_field.expression, partition_field.canonical)
            problems.append((partition_field.line, f"{where}: {detail}"))
    if check_column is not None:
        problem = column_problem(check_column)
        if problem:
            problems.append((check_column_line, f"{label}: refresh.check_column: {problem}"))
    for column in sort_by:
        problem = column_problem(column)
        if problem is None and _unsortable(schema.field(column).type):
            problem = f"column {column!r} is of type {schema.field(column).type}, which has no order"
        if problem:
            listing = f"; columns are {one_of(names)}" if "columns are" not in problem else ""
            problems.append((sort_by_line, f"{label}: acceleration.params.sort_by: {problem}{listing}"))
    if watermark_column is not None:
        problem = column_problem(watermark_column)
        if problem is None:
            problem = watermark_type_problem(watermark_column, schema.field(watermark_column).type)
        if problem:
            problems.append((watermark_column_line, f"{label}: refresh.watermark_column: {problem}"))
    for column in primary_key:
        problem = column_problem(column)
        if problem:
            problems.append((primary_key_line, f"{label}: primary_key: {problem}"))
    for column in index_columns:
        problem = column_problem(column) or index_type_problem(column, schema.field(column).type)
        if problem:
            problems.append((index_columns_line, f"{label}: acceleration.params.index_columns: {problem}"))
    return bound, problems


def watermark_type_problem(column: str, arrow_type: pa.DataType) -> str | None:
    """A watermark must be an integer, date or timestamp (s / ms / us) column: the types whose file
    statistics are exact, so the committed maximum is the watermark (no rounding can skip or repeat a row).
    """
    import pyarrow as pa

    if pa.types.is_integer(arrow_type) or pa.types.is_date(arrow_type):
        return None
    if pa.types.is_timestamp(arrow_type):
        if arrow_type.unit != "ns":
            return None
        return (
            f"column {column!r} is {arrow_type}; nanosecond timestamps cannot be an exact watermark here "
            f"(statistics hold microseconds): declare it as `{column}: timestamp[us"
            f"{', ' + arrow_type.tz if arrow_type.tz else ''}]` under the dataset's schema: (refused if a "
            "value has nanoseconds), or choose another column"
        )
    return (
        f"column {column!r} is {arrow_type}; a watermark must be an integer, date or timestamp column "
        "whose values grow with new rows"
    )


def _unsortable(arrow_type: pa.DataType) -> bool:
    """Nested types (lists, structs, maps, unions) have no order Arrow can sort by."""
    import pyarrow as pa

    return pa.types.is_nested(arrow_type) or pa.types.is_null(arrow_type)


def validate_against_schema(dataset: DatasetSpec, schema: pa.Schema) -> list[str]:
    """Every problem binding `dataset` to the source `schema` would raise; empty when it binds cleanly."""
    return [format_problem(line, message) for line, message in bind_problems(dataset, schema)[1]]


@dataclass(frozen=True)
class ProjectSpec:
    """A whole spec file: where it came from, where accelerations live, and its datasets."""

    path: Path | None
    # Local: where partition files and catalogs live. With an `s3://` accelerator_dir (`accelerator_url`)
    # it is this worker's private scratch directory (catalog cache, local stage before upload), never
    # shared between tasks.
    accelerator_dir: Path
    datasets: tuple[DatasetSpec, ...]
    # `s3://bucket/prefix` when accelerator_dir is on S3: data files, catalogs and stages live there.
    accelerator_url: str | None = None

    @property
    def remote(self) -> bool:
        """Whether partition files live on object storage (`accelerator_dir: s3://...`)."""
        return self.accelerator_url is not None

    @property
    def accelerator_location(self) -> str:
        """Where the shared files (partition files, catalogs, stages) live: the `s3://` URL of an
        accelerator_dir on S3, else the local accelerator_dir."""
        return self.accelerator_url or str(self.accelerator_dir)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.datasets)

    def dataset(self, name: str) -> DatasetSpec:
        """The dataset called `name`; raises `DatasetNotFoundError` listing the known names."""
        for dataset in self.datasets:
            if dataset.name == name:
                return dataset
        where = f" in {self.path}" if self.path else ""
        raise DatasetNotFoundError(
            f"no dataset {name!r}{where}{did_you_mean(name, self.names)}; "
            f"known datasets: {one_of(self.names) or '(none)'}"
        )


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(w|d|h|m|s)")
_UNIT_SECONDS = {"w": 604_800, "d": 86_400, "h": 3_600, "m": 60, "s": 1}


def parse_duration(text: str) -> dt.timedelta:
    """`7d`, `12h`, `1d12h`, `30m`, `45s`, `2w` -> timedelta; `ValueError` saying how to write one."""
    compact = text.strip().lower().replace(" ", "")
    position = 0
    seconds = 0.0
    for match in _DURATION_PART.finditer(compact):
        if match.start() != position:
            break
        seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    if not compact or position != len(compact):
        raise ValueError(
            f"invalid duration {text!r}: use a number and a unit (w, d, h, m, s), e.g. 7d, 12h or 1d12h"
        )
    return dt.timedelta(seconds=seconds)
