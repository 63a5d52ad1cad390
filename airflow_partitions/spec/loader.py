"""Read a spec file into a `ProjectSpec`, collecting every broken rule (with its line) before raising once.

Relative paths (`accelerator_dir`, `file:` sources) are resolved against the spec file's directory, so a
DAG file and the command line read the same spec the same way whatever the working directory.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from airflow_partitions.exceptions import PartitionExpressionError, PartitionSpecError, SpecValidationError
from airflow_partitions.objectstore.location import parse_s3_location
from airflow_partitions.spec.arrow_types import parse_arrow_type
from airflow_partitions.spec.index_settings import INDEX_PARAMS, declared_index_columns
from airflow_partitions.spec.masking import mask_secrets, remember_secrets, spec_secrets
from airflow_partitions.spec.model import (
    DEFAULT_ACCELERATOR_DIR,
    DEFAULT_DISCOVERY_TIMEOUT_S,
    DEFAULT_ENGINE,
    DEFAULT_MAX_FUTURE_SKEW_S,
    DEFAULT_MAX_PARTITIONS,
    ENGINE_MODES,
    FILE_FORMAT_SUFFIXES,
    AccelerationSpec,
    DatasetSpec,
    Engine,
    FileFormat,
    LateRows,
    Mode,
    PartitionField,
    PartitionMode,
    Problem,
    ProjectSpec,
    RefreshConfig,
    RefreshMode,
    SnapshotConfig,
    SnapshotMode,
    SourceRef,
    SourceScheme,
    bind_fields,
    dataset_name_problem,
    declared_arrow_schema,
    declared_sort_columns,
    did_you_mean,
    engine_problems,
    expression_detail,
    field_name_problem,
    file_layout_problems,
    format_problem,
    one_of,
    parse_duration,
    partition_count_problems,
    partition_name_problems,
    primary_key_problems,
    qualify_postgres_table,
    refresh_problems,
    snapshot_problems,
    source_problems,
)
from airflow_partitions.spec.renames import renamed_columns_problems, stored_dataset
from airflow_partitions.spec.yaml_lines import LineDict, LineList, format_yaml_error, read_yaml
from airflow_partitions.transforms import parse_transform

SCRATCH_DIR_ENV = "AIRFLOW_PARTITIONS_SCRATCH_DIR"
TOP_LEVEL_KEYS = ("accelerator_dir", "local_scratch_dir", "datasets")
DATASET_KEYS = ("name", "from", "params", "acceleration", "schema", "freshness", "renamed_columns")
ACCELERATION_KEYS = (
    "enabled",
    "engine",
    "mode",
    "partition_by",
    "params",
    "refresh",
    "refresh_mode",
    "primary_key",
    "snapshots",
)
REFRESH_KEYS = (
    "schedule",
    "check_column",
    "watermark_column",
    "discovery_timeout_s",
    "max_partitions",
    "late_rows",
    "max_future_skew_s",
    "change_detection",
)
SNAPSHOT_KEYS = ("mode", "location")
# Free-form params blocks are not closed, but a key that is one typo away from a known one is an error.
KNOWN_SOURCE_PARAMS = ("file_format", "connection_id", "url")
KNOWN_ACCELERATION_PARAMS = (
    "partition_mode",
    "max_rows_per_file",
    "row_group_rows",
    "sort_by",
    *INDEX_PARAMS,
)

EnumT = TypeVar("EnumT", Engine, Mode, PartitionMode, SnapshotMode, FileFormat, RefreshMode)


# Parsed specs of this process by (resolved path, text, check_types, scratch-dir variable).
_SPEC_CACHE: dict[tuple[str, str, bool, str | None], ProjectSpec] = {}
_SPEC_CACHE_LOCK = threading.Lock()


def load_spec(path: str | Path, *, check_types: bool = True) -> ProjectSpec:
    """Read and validate the spec file at `path`; raises `SpecValidationError` listing every problem.

    `check_types=False` skips what needs pyarrow (parsing `schema:` types, result types of the partition
    expressions) so DAG files parse fast; column names are still checked against `schema:`. The refresh
    tasks and `airflow-partitions validate` load with type checks.
    """
    spec_path = Path(path).expanduser().resolve()
    try:
        text = spec_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecValidationError([f"spec file not found: {spec_path}"], path=str(spec_path)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise SpecValidationError([f"cannot read spec file {spec_path}: {err}"], path=str(spec_path)) from err
    # A parsed spec is immutable: a process parses each file once until its text changes (a CLI call or a
    # task opens the same spec for the reader, the catalog and the operator). Keyed by the text, not the
    # mtime: file times tick in milliseconds, and a rewrite inside one tick must not read as unchanged.
    key = (str(spec_path), text, check_types, os.environ.get(SCRATCH_DIR_ENV))
    with _SPEC_CACHE_LOCK:
        cached = _SPEC_CACHE.get(key)
    if cached is not None:
        return cached
    project = parse_spec(text, path=spec_path, check_types=check_types)
    with _SPEC_CACHE_LOCK:
        # One entry per (file, check_types): an edited file replaces its older parse.
        for stale in [k for k in _SPEC_CACHE if k[0] == key[0] and k[2] == check_types]:
            del _SPEC_CACHE[stale]
        _SPEC_CACHE[key] = project
    return project


def parse_spec(
    text: str, *, path: Path | None = None, base_dir: Path | None = None, check_types: bool = True
) -> ProjectSpec:
    """Validate spec `text`; relative paths resolve against `base_dir` (default: `path`'s directory, else
    the working directory)."""
    where = str(path) if path is not None else None
    root = base_dir if base_dir is not None else (path.parent if path is not None else Path.cwd())
    try:
        document = read_yaml(text)
    except yaml.YAMLError as err:
        raise SpecValidationError([format_yaml_error(err)], path=where) from None
    # Known before any rule runs, so no message (and no later error of this process) can quote them.
    secrets = spec_secrets(document.data)
    remember_secrets(secrets)
    reader = _SpecReader(Path(os.path.abspath(root)), check_types=check_types)
    for line, message in document.duplicates:
        reader.add(line, message)
    project = reader.read_project(document.data, path)
    if reader.findings or project is None:
        messages = reader.messages() or ["the spec is invalid"]
        raise SpecValidationError([mask_secrets(message, secrets) for message in messages], path=where)
    return project


def parse_source_uri(
    text: str, params: Mapping[str, Any], base_dir: Path
) -> tuple[SourceRef | None, list[Problem]]:
    """Parse a `from:` value (`file:...`, `s3://...`, `postgres:...`) with its dataset `params`."""
    stripped = text.strip()
    head, sep, rest = stripped.partition(":")
    if not sep:
        return None, [
            Problem(
                ("from",),
                f"from {text!r} has no scheme; write file:{stripped}, s3://bucket/prefix or "
                "postgres:schema.table",
            )
        ]
    try:
        scheme = SourceScheme(head.lower())
    except ValueError:
        hint = " (s3a:// and s3n:// are Hadoop spellings; write s3://)" if head in ("s3a", "s3n") else ""
        return None, [
            Problem(
                ("from",),
                f"from {text!r}: unsupported source scheme {head!r}; use one of "
                f"file:, s3://, postgres:{hint or did_you_mean(head, SourceScheme)}",
            )
        ]

    problems: list[Problem] = []
    location = rest
    if scheme is SourceScheme.S3:
        if not rest.startswith("//"):
            return None, [Problem(("from",), f"from {text!r}: write S3 locations as s3://bucket/prefix")]
        location = rest[2:]
    elif scheme is SourceScheme.FILE:
        if rest.startswith("//"):
            # file:///abs/path is the URI spelling of /abs/path; file://host/... is not a local path.
            if not rest.startswith("///"):
                return None, [
                    Problem(("from",), f"from {text!r}: file URIs must be local (file:/path or file:///path)")
                ]
            location = rest[2:]
        if not location.strip():
            return None, [Problem(("from",), f"from {text!r} names no path")]
        location = os.path.normpath(os.path.join(base_dir, os.path.expanduser(location)))
    else:
        location = rest.strip()
        if not location:
            return None, [Problem(("from",), f"from {text!r} names no table; write postgres:schema.table")]
        location = qualify_postgres_table(location)

    file_format: FileFormat | None = None
    if scheme is not SourceScheme.POSTGRES:
        raw_format = params.get("file_format")
        if raw_format is None:
            suffix = os.path.splitext(location.rstrip("/"))[1].lower()
            file_format = FILE_FORMAT_SUFFIXES.get(suffix, FileFormat.PARQUET)
        else:
            file_format, problem = _enum_value(FileFormat, raw_format, "params.file_format")
            if problem:
                problems.append(Problem(("params", "file_format"), problem))
                return None, problems
    problems += source_problems(scheme, location, params, file_format)
    if problems:
        return None, problems
    return SourceRef(scheme=scheme, location=location, params=params, file_format=file_format), []


# --- helpers --------------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    """How a YAML value reads in a message: `a string 'x'`, `an integer 5`, `a list`, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"an integer {value}"
    if isinstance(value, float):
        return f"a number {value}"
    if isinstance(value, str):
        return f"a string {value!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def _plain(value: Any) -> Any:
    """The value with the line-tracking containers replaced by plain dicts and lists."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _line_at(root: Any, path: Sequence[str | int]) -> int | None:
    """Line of the deepest element of `path` that exists under `root`."""
    line: int | None = getattr(root, "line", None)
    node = root
    for part in path:
        in_dict = isinstance(node, LineDict) and part in node
        in_list = isinstance(node, LineList) and isinstance(part, int) and 0 <= part < len(node)
        if not (in_dict or in_list):
            break
        line = node.line_of(part)
        node = node[part]
    return line


def _enum_value(enum_cls: type[EnumT], raw: Any, what: str) -> tuple[EnumT | None, str | None]:
    valid = [member.value for member in enum_cls]
    if isinstance(raw, str):
        try:
            return enum_cls(raw), None
        except ValueError:
            pass
        return None, f"unknown {what} {raw!r}; valid values: {one_of(valid)}{did_you_mean(raw, valid)}"
    return None, f"{what} must be one of {one_of(valid)}, got {_kind(raw)}"


class _SpecReader:
    """Walks the parsed YAML, building typed objects and recording `(line, message)` for every problem."""

    def __init__(self, base_dir: Path, *, check_types: bool = True) -> None:
        self.base_dir = base_dir
        self.check_types = check_types
        self.findings: list[tuple[int | None, str]] = []

    def add(self, line: int | None, message: str) -> None:
        self.findings.append((line, message))

    def add_problems(
        self, root: Any, prefix: tuple[str | int, ...], label: str, problems: Iterable[Problem]
    ) -> int:
        count = 0
        for problem in problems:
            self.add(_line_at(root, (*prefix, *problem.path)), f"{label}: {problem.message}")
            count += 1
        return count

    def messages(self) -> list[str]:
        ordered = sorted(self.findings, key=lambda finding: finding[0] or 0)
        return [format_problem(line, message) for line, message in ordered]

    def check_keys(self, block: LineDict, allowed: Sequence[str], where: str, label: str) -> None:
        for key in block:
            if key not in allowed:
                shown = key if isinstance(key, str) else repr(key)
                suggestion = did_you_mean(shown, allowed) if isinstance(key, str) else ""
                self.add(
                    block.line_of(key),
                    f"{label}unknown key {where}{shown}{suggestion}; allowed keys: {one_of(allowed)}",
                )

    def check_near_misses(
        self, block: Mapping[Any, Any], known: Sequence[str], where: str, label: str
    ) -> None:
        for key in block:
            if isinstance(key, str) and key not in known:
                close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
                if close:
                    line = block.line_of(key) if isinstance(block, LineDict) else None
                    self.add(line, f"{label}unknown key {where}{key} (did you mean {close[0]!r}?)")

    def read_enum(
        self, block: LineDict, key: str, enum_cls: type[EnumT], default: EnumT | None, what: str, label: str
    ) -> EnumT | None:
        """The enum member under `key`, `default` when absent or null, None (and a finding) when invalid."""
        raw = block.get(key)
        if raw is None:
            return default
        value, problem = _enum_value(enum_cls, raw, what)
        if problem:
            self.add(block.line_of(key), f"{label}: {problem}")
        return value

    def read_mapping(self, block: LineDict, key: str, what: str, label: str) -> LineDict | None:
        """The mapping under `key` (empty when absent), or None after recording that it is not a mapping."""
        raw = block.get(key)
        if raw is None:
            empty = LineDict()
            empty.line = block.line_of(key)
            return empty
        if not isinstance(raw, LineDict):
            self.add(block.line_of(key), f"{label}: {what} must be a mapping, got {_kind(raw)}")
            return None
        for inner in raw:
            if not isinstance(inner, str):
                self.add(raw.line_of(inner), f"{label}: {what} keys must be strings, got {_kind(inner)}")
                return None
        return raw

    # --- project ----------------------------------------------------------------------------------

    def read_project(self, data: Any, path: Path | None) -> ProjectSpec | None:
        if data is None:
            self.add(1, "the spec is empty; expected a mapping with a `datasets:` list")
            return None
        if not isinstance(data, LineDict):
            self.add(
                getattr(data, "line", 1),
                f"the spec must be a mapping with a `datasets:` list, got {_kind(data)}",
            )
            return None
        self.check_keys(data, TOP_LEVEL_KEYS, "", "")
        accelerator_dir = self.read_accelerator_dir(data)
        accelerator_url = None
        if isinstance(accelerator_dir, str):
            accelerator_url, accelerator_dir = accelerator_dir, self.read_local_scratch_dir(data)
        elif "local_scratch_dir" in data:
            self.add(
                data.line_of("local_scratch_dir"),
                "local_scratch_dir applies only to an accelerator_dir on S3 (s3://bucket/prefix); remove it",
            )
        raw_datasets = data.get("datasets")
        datasets: list[DatasetSpec] = []
        if raw_datasets is None:
            self.add(data.line, "the spec has no `datasets:` list; declare at least one dataset")
        elif not isinstance(raw_datasets, LineList):
            self.add(
                data.line_of("datasets"), f"`datasets:` must be a list of datasets, got {_kind(raw_datasets)}"
            )
        else:
            if not raw_datasets:
                self.add(data.line_of("datasets"), "`datasets:` is empty; declare at least one dataset")
            for index, raw in enumerate(raw_datasets):
                dataset = self.read_dataset(index, raw, raw_datasets.line_of(index))
                if dataset is not None:
                    datasets.append(dataset)
            self.check_duplicate_names(raw_datasets)
        if accelerator_dir is None:
            return None
        if accelerator_url is not None:
            for dataset in datasets:
                if dataset.acceleration.partition_mode == PartitionMode.TABLES:
                    self.add(
                        data.line_of("accelerator_dir"),
                        f"dataset {dataset.name!r}: duckdb partition_mode tables keeps every partition in "
                        "one shared database file that each commit rewrites in place, which write-once "
                        "objects on S3 cannot hold; use partition_mode files (or engine parquet or arrow) "
                        "with an s3:// accelerator_dir",
                    )
        return ProjectSpec(
            path=path,
            accelerator_dir=accelerator_dir,
            datasets=tuple(datasets),
            accelerator_url=accelerator_url,
        )

    def read_accelerator_dir(self, data: LineDict) -> Path | str | None:
        """A local directory (resolved against the spec's directory), or a validated `s3://` URL string."""
        raw = data.get("accelerator_dir", DEFAULT_ACCELERATOR_DIR)
        if not isinstance(raw, str) or not raw.strip():
            self.add(
                data.line_of("accelerator_dir"), f"accelerator_dir must be a directory path, got {_kind(raw)}"
            )
            return None
        text = raw.strip()
        if "://" in text or text.startswith("s3:"):
            try:
                location = parse_s3_location(text, what="accelerator_dir", error=PartitionSpecError)
            except PartitionSpecError as err:
                self.add(data.line_of("accelerator_dir"), f"{err}; or give a local directory path")
                return None
            return location.uri()
        return Path(os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(text))))

    def read_local_scratch_dir(self, data: LineDict) -> Path:
        """This worker's private scratch directory for an S3 accelerator_dir: `local_scratch_dir`, else
        `$AIRFLOW_PARTITIONS_SCRATCH_DIR`, else `<tmp>/airflow-partitions-<user>` (never shared by tasks:
        every byte another task needs goes through S3)."""
        import getpass
        import tempfile

        raw = data.get("local_scratch_dir") or os.environ.get(SCRATCH_DIR_ENV)
        if isinstance(raw, str) and raw.strip():
            return Path(os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(raw.strip()))))
        if raw is not None:
            self.add(
                data.line_of("local_scratch_dir"),
                f"local_scratch_dir must be a directory path, got {_kind(raw)}",
            )
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = str(os.getuid())
        return Path(tempfile.gettempdir()) / f"airflow-partitions-{user}"

    def check_duplicate_names(self, raw_datasets: LineList) -> None:
        first_seen: dict[str, tuple[str, int | None]] = {}
        for index, raw in enumerate(raw_datasets):
            name = raw.get("name") if isinstance(raw, LineDict) else None
            if not isinstance(name, str) or dataset_name_problem(name):
                continue
            line = raw.line_of("name")
            key = name.lower()
            if key in first_seen:
                first_name, first_line = first_seen[key]
                same = "" if first_name == name else f" (as {first_name!r}; names ignore case)"
                self.add(
                    line,
                    f"dataset {name!r} (datasets[{index}]) is defined more than once{same}: first on line "
                    f"{first_line}; dataset names must be unique",
                )
            else:
                first_seen[key] = (name, line)

    # --- dataset ----------------------------------------------------------------------------------

    def read_dataset(self, index: int, raw: Any, line: int | None) -> DatasetSpec | None:
        if not isinstance(raw, LineDict):
            self.add(
                line,
                f"datasets[{index}] must be a mapping with name, from and acceleration, got {_kind(raw)}",
            )
            return None
        before = len(self.findings)
        name = raw.get("name")
        label = f"dataset {name!r}" if isinstance(name, str) and name else f"datasets[{index}]"
        if name is None:
            self.add(raw.line, f"{label}: name is required")
        else:
            problem = dataset_name_problem(name)
            if problem:
                self.add(raw.line_of("name"), f"{label}: {problem}")
        self.check_keys(raw, DATASET_KEYS, "", f"{label}: ")

        params = self.read_mapping(raw, "params", "params", label)
        source = self.read_source(raw, _plain(params) if params is not None else {}, label)
        if params is not None:
            self.check_near_misses(params, KNOWN_SOURCE_PARAMS, "params.", f"{label}: ")
        declared = self.read_declared_schema(raw, label)
        acceleration, indexed_fields = self.read_acceleration(raw, label)
        freshness = self.read_freshness(raw, label)
        renamed, rename_problems = renamed_columns_problems(_plain(raw.get("renamed_columns")))
        for problem in rename_problems:
            self.add(raw.line_of("renamed_columns"), f"{label}: {problem}")
        if declared and self.check_types:
            self.check_declared_columns(raw, label, declared, indexed_fields)
        elif declared:
            self.check_declared_names(raw, label, declared, indexed_fields)
        if len(self.findings) > before or source is None or acceleration is None or declared is None:
            return None
        assert isinstance(name, str)
        dataset = DatasetSpec(
            name=name,
            source=source,
            acceleration=acceleration,
            declared_columns=declared,
            line=raw.line,
            freshness=freshness,
            renamed_columns=renamed,
        )
        try:
            dataset = stored_dataset(dataset)
        except SpecValidationError as err:
            for problem in err.errors:
                self.add(raw.line_of("renamed_columns"), f"{label}: {problem}")
            return None
        return dataset.bind(dataset.declared_schema()) if declared and self.check_types else dataset

    def read_freshness(self, raw: LineDict, label: str) -> dt.timedelta | None:
        """`freshness: 2h`: the dataset's freshness SLA (a positive duration), or None when not given."""
        text = raw.get("freshness")
        if text is None:
            return None
        try:
            freshness = parse_duration(str(text))
        except ValueError as err:
            self.add(raw.line_of("freshness"), f"{label}: freshness: {err}")
            return None
        if freshness <= dt.timedelta(0):
            self.add(raw.line_of("freshness"), f"{label}: freshness must be longer than 0, e.g. 2h or 1d")
            return None
        return freshness

    def check_declared_names(
        self,
        raw: LineDict,
        label: str,
        declared: Sequence[tuple[str, str]],
        indexed_fields: Sequence[tuple[int, PartitionField]],
    ) -> None:
        """Without type checks, still refuse partition expressions over columns `schema:` does not list."""
        names = [column for column, _ in declared]
        for index, field in indexed_fields:
            for column in field.transform.source_columns:
                if column in names:
                    continue
                hint = difflib.get_close_matches(column, names, n=1)
                suggestion = f"; did you mean {hint[0]!r}?" if hint else f"; schema lists {', '.join(names)}"
                where = f"{label}: partition_by[{index}] {field.expression!r}"
                self.add(field.line, f"{where}: unknown column {column!r}{suggestion}")
        block = raw.get("acceleration")
        params = block.get("params") if isinstance(block, LineDict) else None
        if isinstance(params, LineDict):
            for column in declared_sort_columns(_plain(params)):
                if column not in names:
                    self.add(
                        params.line_of("sort_by"),
                        f"{label}: acceleration.params.sort_by: unknown column {column!r}"
                        f"{did_you_mean(column, names)}; schema lists {', '.join(names)}",
                    )
            for column in declared_index_columns(_plain(params)):
                if column not in names:
                    self.add(
                        params.line_of("index_columns"),
                        f"{label}: acceleration.params.index_columns: unknown column {column!r}"
                        f"{did_you_mean(column, names)}; schema lists {', '.join(names)}",
                    )

    def check_declared_columns(
        self,
        raw: LineDict,
        label: str,
        declared: Sequence[tuple[str, str]],
        indexed_fields: Sequence[tuple[int, PartitionField]],
    ) -> None:
        """Check the parsed fields against the `schema:` block, so unknown columns and unusable result types
        fail at load (DAG parse time), not at the first refresh, even when other rules failed too."""
        block = raw.get("acceleration")
        refresh = block.get("refresh") if isinstance(block, LineDict) else None
        check_column = refresh.get("check_column") if isinstance(refresh, LineDict) else None
        watermark = refresh.get("watermark_column") if isinstance(refresh, LineDict) else None
        primary_key = block.get("primary_key") if isinstance(block, LineDict) else None
        params = block.get("params") if isinstance(block, LineDict) else None
        sort_by = declared_sort_columns(_plain(params)) if isinstance(params, LineDict) else ()
        _, problems = bind_fields(
            label,
            indexed_fields,
            check_column if isinstance(check_column, str) else None,
            declared_arrow_schema(declared),
            refresh.line_of("check_column") if isinstance(refresh, LineDict) else None,
            sort_by=sort_by,
            sort_by_line=params.line_of("sort_by") if isinstance(params, LineDict) else None,
            index_columns=declared_index_columns(_plain(params)) if isinstance(params, LineDict) else (),
            index_columns_line=params.line_of("index_columns") if isinstance(params, LineDict) else None,
            watermark_column=watermark if isinstance(watermark, str) else None,
            watermark_column_line=refresh.line_of("watermark_column")
            if isinstance(refresh, LineDict)
            else None,
            primary_key=[c for c in primary_key if isinstance(c, str)]
            if isinstance(primary_key, list)
            else (),
            primary_key_line=block.line_of("primary_key") if isinstance(block, LineDict) else None,
        )
        for line, message in problems:
            self.add(line, message)

    def read_source(self, raw: LineDict, params: Mapping[str, Any], label: str) -> SourceRef | None:
        value = raw.get("from")
        if value is None:
            self.add(
                raw.line,
                f"{label}: from is required (file:path, s3://bucket/prefix or postgres:schema.table)",
            )
            return None
        if not isinstance(value, str):
            self.add(raw.line_of("from"), f"{label}: from must be a string, got {_kind(value)}")
            return None
        source, problems = parse_source_uri(value, params, self.base_dir)
        self.add_problems(raw, (), label, problems)
        return source

    def read_declared_schema(self, raw: LineDict, label: str) -> tuple[tuple[str, str], ...] | None:
        block = self.read_mapping(raw, "schema", "schema", label)
        if block is None:
            return None
        if "schema" in raw and not block:
            self.add(raw.line_of("schema"), f"{label}: schema is empty; list column: type pairs or remove it")
            return None
        if not block:
            return ()
        check_type = parse_arrow_type if self.check_types else _accept_type_text

        columns: list[tuple[str, str]] = []
        ok = True
        for column, type_text in block.items():
            if not isinstance(type_text, str):
                self.add(
                    block.line_of(column),
                    f"{label}: schema.{column} must be a type name, got {_kind(type_text)}",
                )
                ok = False
                continue
            try:
                check_type(type_text)
            except PartitionSpecError as err:
                self.add(block.line_of(column), f"{label}: schema.{column}: {err}")
                ok = False
                continue
            columns.append((column, type_text.strip()))
        return tuple(columns) if ok else None

    # --- acceleration -----------------------------------------------------------------------------

    def read_acceleration(
        self, raw: LineDict, label: str
    ) -> tuple[AccelerationSpec | None, list[tuple[int, PartitionField]]]:
        """The acceleration (None after any problem) and the partition fields that parsed on their own."""
        block = raw.get("acceleration")
        if block is None:
            self.add(
                raw.line,
                f"{label}: acceleration is required (at least acceleration: {{partition_by: [...]}})",
            )
            return None, []
        if not isinstance(block, LineDict):
            self.add(
                raw.line_of("acceleration"), f"{label}: acceleration must be a mapping, got {_kind(block)}"
            )
            return None, []
        before = len(self.findings)
        self.check_keys(block, ACCELERATION_KEYS, "acceleration.", f"{label}: ")

        enabled = block.get("enabled", True)
        if not isinstance(enabled, bool):
            self.add(
                block.line_of("enabled"),
                f"{label}: acceleration.enabled must be true or false, got {_kind(enabled)}",
            )
        engine = self.read_enum(block, "engine", Engine, DEFAULT_ENGINE, "engine", label)
        default_mode = ENGINE_MODES[engine][0] if engine is not None else None
        mode = self.read_enum(block, "mode", Mode, default_mode, "mode", label)

        params = self.read_mapping(block, "params", "acceleration.params", label)
        partition_mode = self.read_partition_mode(params, engine, label)
        if params is not None:
            self.check_near_misses(params, KNOWN_ACCELERATION_PARAMS, "acceleration.params.", f"{label}: ")

        indexed_fields, fields_ok = self.read_partition_by(block, label)
        refresh_mode = self.read_enum(
            block, "refresh_mode", RefreshMode, RefreshMode.FULL, "refresh_mode", label
        )
        refresh = self.read_refresh(block, label, refresh_mode or RefreshMode.FULL)
        primary_key = _plain(block.get("primary_key"))
        if refresh_mode is not None:
            self.add_problems(block, (), label, primary_key_problems(refresh_mode, primary_key))
        snapshots = self.read_snapshots(block, label)

        # Cross-field rules run on whatever parsed, so one bad expression does not hide the others.
        self.add_problems(block, (), label, partition_name_problems(indexed_fields))
        if engine is not None and mode is not None and partition_mode is not None:
            self.add_problems(block, (), label, engine_problems(engine, mode, partition_mode))
        if engine is not None and params is not None:
            self.add_problems(block, (), label, file_layout_problems(engine, _plain(params)))
        if fields_ok and isinstance(enabled, bool):
            max_partitions = refresh.max_partitions if refresh is not None else DEFAULT_MAX_PARTITIONS
            fields = [f for _, f in indexed_fields]
            self.add_problems(block, (), label, partition_count_problems(enabled, fields, max_partitions))

        if (
            len(self.findings) > before
            or engine is None
            or mode is None
            or partition_mode is None
            or refresh is None
            or refresh_mode is None
            or snapshots is None
            or params is None
        ):
            return None, indexed_fields
        acceleration = AccelerationSpec(
            enabled=enabled,
            engine=engine,
            mode=mode,
            partition_by=tuple(f for _, f in indexed_fields),
            partition_mode=partition_mode,
            params=_plain(params),
            refresh=refresh,
            snapshots=snapshots,
            sort_by_line=params.line_of("sort_by") if "sort_by" in params else None,
            primary_key=tuple(primary_key or ()),
            primary_key_line=block.line_of("primary_key") if "primary_key" in block else None,
        )
        return acceleration, indexed_fields

    def read_partition_mode(
        self, params: LineDict | None, engine: Engine | None, label: str
    ) -> PartitionMode | None:
        if params is None or params.get("partition_mode") is None:
            return PartitionMode.FILES
        line = params.line_of("partition_mode")
        value, problem = _enum_value(
            PartitionMode, params["partition_mode"], "acceleration.params.partition_mode"
        )
        if problem:
            self.add(line, f"{label}: {problem}")
            return None
        if engine is not None and engine is not Engine.DUCKDB:
            self.add(
                line,
                f"{label}: acceleration.params.partition_mode applies to engine duckdb only (engine {engine} "
                "always writes one file per partition); remove it or use engine: duckdb",
            )
            return None
        return value

    def read_partition_by(self, block: LineDict, label: str) -> tuple[list[tuple[int, PartitionField]], bool]:
        """The fields that parsed, with their positions, and whether every entry parsed."""
        raw = block.get("partition_by")
        if raw is None:
            return [], True
        if not isinstance(raw, LineList):
            self.add(
                block.line_of("partition_by"),
                f"{label}: acceleration.partition_by must be a list of expressions "
                f"(- bucket(16, id)), got {_kind(raw)}",
            )
            return [], False

        fields: list[tuple[int, PartitionField]] = []
        ok = True
        for index, entry in enumerate(raw):
            line = raw.line_of(index)
            parsed = self.read_partition_entry(index, entry, line, label)
            if parsed is None:
                ok = False
                continue
            name, expression = parsed
            try:
                transform = parse_transform(expression)
            except PartitionExpressionError as err:
                hint = ""
                if expression.count("(") != expression.count(")"):
                    # `[bucket(8, id)]` is two YAML items, `bucket(8` and `id)`: say so, not "bad syntax".
                    hint = (
                        "; unbalanced parentheses: in a [a, b] flow list YAML splits at commas, so quote the "
                        "expression or put it on its own `- ` line"
                    )
                detail = expression_detail(err, expression)
                self.add(line, f"{label}: partition_by[{index}] {json.dumps(expression)}: {detail}{hint}")
                ok = False
                continue
            fields.append((index, PartitionField(name, expression, transform, line=line)))
        return fields, ok

    def read_partition_entry(
        self, index: int, entry: Any, line: int | None, label: str
    ) -> tuple[str, str] | None:
        where = f"{label}: partition_by[{index}]"
        if isinstance(entry, str):
            name, expression = f"expr{index}", entry
        elif isinstance(entry, Mapping):
            if len(entry) != 1:
                keys = one_of(str(k) for k in entry) or "no keys"
                self.add(
                    line,
                    f"{where} is a mapping with {len(entry)} entries ({keys}); each list item is one "
                    "expression or one {name: expression} mapping, so put each on its own `- ` line",
                )
                return None
            ((name, expression),) = entry.items()
            problem = field_name_problem(name)
            if problem:
                self.add(line, f"{where}: {problem}")
                return None
            if not isinstance(expression, str):
                self.add(line, f"{where} ({name}): the expression must be a string, got {_kind(expression)}")
                return None
        else:
            self.add(
                line,
                f"{where} must be an expression string or a single {{name: expression}} mapping, "
                f"got {_kind(entry)}; quote values YAML would read as numbers or booleans",
            )
            return None
        if not expression.strip():
            self.add(line, f"{where} ({name}): the expression is empty")
            return None
        return name, expression.strip()

    def read_refresh(
        self, block: LineDict, label: str, mode: RefreshMode = RefreshMode.FULL
    ) -> RefreshConfig | None:
        raw = self.read_mapping(block, "refresh", "acceleration.refresh", label)
        if raw is None:
            return None
        self.check_keys(raw, REFRESH_KEYS, "refresh.", f"{label}: ")
        values = {
            "schedule": raw.get("schedule"),
            "check_column": raw.get("check_column"),
            "discovery_timeout_s": _default(raw.get("discovery_timeout_s"), DEFAULT_DISCOVERY_TIMEOUT_S),
            "max_partitions": _default(raw.get("max_partitions"), DEFAULT_MAX_PARTITIONS),
            "mode": mode,
            "watermark_column": raw.get("watermark_column"),
            "change_detection": raw.get("change_detection"),
            "late_rows": _default(raw.get("late_rows"), str(LateRows.REWRITE)),
            "max_future_skew_s": _default(raw.get("max_future_skew_s"), DEFAULT_MAX_FUTURE_SKEW_S),
        }
        if self.add_problems(block, ("refresh",), label, refresh_problems(**values)):
            return None
        if isinstance(values["schedule"], str):
            values["schedule"] = values["schedule"].strip()
        return RefreshConfig(
            schedule=values["schedule"],
            check_column=values["check_column"],
            discovery_timeout_s=float(values["discovery_timeout_s"]),
            max_partitions=values["max_partitions"],
            check_column_line=raw.line_of("check_column") if "check_column" in raw else None,
            mode=mode,
            watermark_column=values["watermark_column"],
            watermark_column_line=raw.line_of("watermark_column") if "watermark_column" in raw else None,
            change_detection=values["change_detection"],
            late_rows=LateRows(values["late_rows"]),
            max_future_skew_s=float(values["max_future_skew_s"]),
        )

    def read_snapshots(self, block: LineDict, label: str) -> SnapshotConfig | None:
        raw = self.read_mapping(block, "snapshots", "acceleration.snapshots", label)
        if raw is None:
            return None
        self.check_keys(raw, SNAPSHOT_KEYS, "snapshots.", f"{label}: ")
        mode = self.read_enum(raw, "mode", SnapshotMode, SnapshotMode.DISABLED, "snapshots.mode", label)
        if mode is None:
            return None
        location = raw.get("location")
        if location is not None and not isinstance(location, str):
            self.add(
                raw.line_of("location"),
                f"{label}: snapshots.location must be a string, got {_kind(location)}",
            )
            return None
        location = location.strip() if location else None
        if self.add_problems(block, ("snapshots",), label, snapshot_problems(mode, location)):
            return None
        return SnapshotConfig(mode=mode, location=location)


_T = TypeVar("_T")


def _default(value: _T | None, default: _T) -> _T:
    return default if value is None else value


def _accept_type_text(text: str) -> Any:
    """Stands in for `parse_arrow_type` when types are not checked (no pyarrow at DAG parse time)."""
