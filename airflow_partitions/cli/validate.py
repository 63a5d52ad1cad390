"""`airflow-partitions validate SPEC`: report every problem in a spec file, or summarise its datasets.

Two passes. The offline rules need only the file. Then, unless `--offline`, each dataset's source is
opened the way a refresh opens it and its real schema read (a file's footer or first rows, an `s3://`
object's footer, a Postgres table's columns), bounded by the dataset's `refresh.discovery_timeout_s`: an
unknown column or a column type a transform cannot take is an error now, not at the first refresh. A
source that cannot be reached is a warning naming the source and the reason (an error with
`--require-sources`). Secrets from `params:` never appear in the output.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import AirflowPartitionsError, S3SettingsError, SpecValidationError

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.spec import DatasetSpec, ProjectSpec

UNKNOWN_TYPE = "?"
# Messages quoted from a driver or a filesystem are cut here: the first line says what went wrong.
MAX_REASON_CHARS = 400


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check a dataset spec file (and each dataset against its source) and summarise its datasets",
        description=(
            "Load a dataset spec the way a DAG does, then read each dataset's source schema (a file's "
            "footer or first rows, an s3:// footer, a Postgres table's columns) and check the partition "
            "expressions and refresh.check_column against it. Prints every problem found (exit status 1), "
            "or a summary of the datasets (exit status 0). A source that cannot be reached within "
            "refresh.discovery_timeout_s is a warning unless --require-sources."
        ),
    )
    parser.add_argument("spec", metavar="SPEC", help="path of the spec YAML file, e.g. dags/datasets.yaml")
    parser.add_argument("--json", action="store_true", help="print a machine-readable JSON document instead")
    parser.add_argument(
        "--offline",
        action="store_true",
        help="check the spec file only; do not open the sources",
    )
    parser.add_argument(
        "--require-sources",
        action="store_true",
        help="a source that cannot be reached or read is an error (exit status 1), not a warning",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        default=None,
        help="seconds to wait for each source (default: the dataset's refresh.discovery_timeout_s)",
    )
    parser.set_defaults(func=run)


# --- checking the sources -------------------------------------------------------------------------


@dataclass
class SourceCheck:
    """What reading one dataset's source schema found.

    `status`: `ok` (schema read, the spec binds to it), `invalid` (`errors` say what does not fit the
    schema, or which source param the connector refused), `unreachable` (no schema: `reason` says why)
    or `skipped` (`--offline`).
    """

    dataset: str
    source: str
    status: str
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    reason: str | None = None
    schema: pa.Schema | None = None
    bound: DatasetSpec | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "source": self.source,
            "errors": self.errors,
            "warnings": self.warnings,
            "reason": self.reason,
            "source_schema": None if self.schema is None else {f.name: str(f.type) for f in self.schema},
        }


def _dataset_secrets(dataset: DatasetSpec, source: Any) -> list[str]:
    """Every secret string the dataset's source may put in a message (params, a resolved URL's password)."""
    from airflow_partitions.spec.masking import secret_values, url_password  # lazy: loads sqlglot

    secrets = secret_values(dataset.source.params)
    resolved = getattr(source, "__dict__", {}).get("url") if source is not None else None
    if isinstance(resolved, str):
        secrets += url_password(resolved)
    return secrets


def _reason(error: BaseException, secrets: list[str]) -> str:
    """One masked line saying why a source could not be read."""
    from airflow_partitions.spec.masking import mask_secrets  # lazy: loads sqlglot

    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    # Our own errors explain themselves; anything else is named so a bug does not pass for a bad source.
    prefix = "" if isinstance(error, AirflowPartitionsError) else f"{type(error).__name__}: "
    line = mask_secrets(f"{prefix}{first}".strip() or type(error).__name__, secrets)
    return line if len(line) <= MAX_REASON_CHARS else line[: MAX_REASON_CHARS - 3] + "..."


def declared_schema_warnings(dataset: DatasetSpec, schema: pa.Schema) -> list[str]:
    """Where the spec's `schema:` block disagrees with the schema the source itself reports."""
    declared = dataset.declared_schema()
    if declared is None:
        return []
    warnings: list[str] = []
    where = f"dataset {dataset.name!r}: schema"
    for declared_field in declared:
        matches = schema.get_all_field_indices(declared_field.name)
        if not matches:
            warnings.append(
                f"{where}.{declared_field.name}: the source has no column {declared_field.name!r}; "
                f"its columns are {', '.join(schema.names)}"
            )
            continue
        actual = schema.field(matches[0]).type
        if actual != declared_field.type:
            warnings.append(
                f"{where}.{declared_field.name} declares {declared_field.type}, but the source's own schema "
                f"has {actual}; check that the declared type is what the source holds"
            )
    return warnings


def _misconfigured(outcome: dict[str, Any]) -> bool:
    """Whether the source failed on the spec's own settings (params), which no retry would fix."""

    return bool(outcome.get("misconfigured")) or isinstance(outcome.get("error"), S3SettingsError)


def _start_check(dataset: DatasetSpec, timeout_s: float) -> Callable[[], SourceCheck]:
    """Start reading the source in a daemon thread; the returned function waits for the result.

    The read runs in its own thread because neither a TCP connect nor a footer read can be interrupted
    from outside: past its deadline the thread is abandoned (daemon threads do not hold up the exit).
    """
    from airflow_partitions.sources import open_source  # lazy: loads sqlglot
    from airflow_partitions.spec import validate_against_schema  # lazy: loads sqlglot
    from airflow_partitions.spec.masking import mask_url_passwords  # lazy: loads sqlglot

    label = mask_url_passwords(dataset.source.uri)
    outcome: dict[str, Any] = {}

    def work() -> None:
        source: Any = None
        try:
            # Opened exactly as the refresh opens it, so the schema checked is the schema refreshed.
            # Opening does no I/O: what fails here is the spec's params, not the source's reachability.
            source = open_source(dataset.source)
        except Exception as err:
            outcome["error"], outcome["misconfigured"] = err, True
            outcome["secrets"] = _dataset_secrets(dataset, None)
            return
        try:
            schema = source.schema()
            outcome["schema"] = schema
            outcome["errors"] = validate_against_schema(dataset, schema)
            if not outcome["errors"]:
                outcome["bound"] = dataset.bind(schema)
            outcome["warnings"] = declared_schema_warnings(dataset, schema)
        except Exception as err:
            outcome["error"] = err
        finally:
            outcome["secrets"] = _dataset_secrets(dataset, source)

    thread = threading.Thread(target=work, name=f"validate-{dataset.name}", daemon=True)
    deadline = time.monotonic() + timeout_s
    thread.start()

    def wait() -> SourceCheck:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            return SourceCheck(
                dataset.name,
                label,
                "unreachable",
                reason=f"no answer within {timeout_s:g} s (refresh.discovery_timeout_s or --timeout)",
            )
        if "error" in outcome and _misconfigured(outcome):
            message = _reason(outcome["error"], outcome.get("secrets", []))
            return SourceCheck(
                dataset.name,
                label,
                "invalid",
                errors=[f"dataset {dataset.name!r}: source {label}: {message}"],
            )
        if "error" in outcome:
            return SourceCheck(
                dataset.name,
                label,
                "unreachable",
                reason=_reason(outcome["error"], outcome.get("secrets", [])),
            )
        errors = list(outcome["errors"])
        return SourceCheck(
            dataset.name,
            label,
            "invalid" if errors else "ok",
            errors=errors,
            warnings=list(outcome["warnings"]),
            schema=outcome["schema"],
            bound=outcome.get("bound"),
        )

    return wait


def check_sources(project: ProjectSpec, *, timeout_s: float | None = None) -> list[SourceCheck]:
    """Check every dataset against its source, all at once, each within its own timeout."""
    waits = [
        _start_check(dataset, timeout_s or dataset.acceleration.refresh.discovery_timeout_s)
        for dataset in project.datasets
    ]
    return [wait() for wait in waits]


# --- the command ----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from airflow_partitions.spec import describe_project, load_spec  # lazy: loads sqlglot

    if args.timeout is not None and not args.timeout > 0:
        print(f"--timeout must be a positive number of seconds, got {args.timeout:g}", file=sys.stderr)
        return 2
    if args.offline and args.require_sources:
        print(
            "--offline skips the sources and --require-sources requires them; give one of the two",
            file=sys.stderr,
        )
        return 2
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

    if args.offline:
        checks = [SourceCheck(d.name, d.source.uri, "skipped", reason="--offline") for d in project.datasets]
    else:
        checks = check_sources(project, timeout_s=args.timeout)
    errors = [message for check in checks for message in check.errors]
    warnings = [message for check in checks for message in check.warnings]
    for check in checks:
        if check.status == "unreachable":
            message = f"dataset {check.dataset!r}: source {check.source} could not be checked: {check.reason}"
            (errors if args.require_sources else warnings).append(message)
    valid = not errors

    # Result types as the source gives them, where the source was read.
    bound = {check.dataset: check.bound for check in checks if check.bound is not None}
    shown = replace(project, datasets=tuple(bound.get(d.name, d) for d in project.datasets))
    summary = describe_project(shown)
    by_name = {check.dataset: check for check in checks}
    for dataset in summary["datasets"]:
        dataset["check"] = by_name[dataset["name"]].to_json()
    if args.json:
        document = {"valid": valid, "errors": errors, "warnings": warnings, **summary}
        print(json.dumps(document, indent=2, default=str))
    elif valid:
        print(render_summary(summary))
        if warnings:
            print()
            print(render_warnings(warnings, checks))
    else:
        print(render_source_errors(str(project.path or args.spec), checks, errors, warnings))
    return 0 if valid else 1


# --- rendering ------------------------------------------------------------------------------------


def _table(rows: list[list[str]], indent: str) -> list[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows
    ]


def _columns(schema: Any) -> str:
    return ", ".join(f"{name} {kind}" for name, kind in schema.items())


def _check_line(check: dict[str, Any] | None) -> str | None:
    if check is None:
        return None
    status = check["status"]
    if status == "skipped":
        return "  checked     not against the source (--offline)"
    if status == "unreachable":
        return "  checked     not against the source: it could not be read (see the warnings)"
    columns = len(check["source_schema"] or {})
    return f"  checked     against the source schema ({columns} column(s)): partition fields fit"


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
        if refresh.get("change_detection_reason"):
            lines.append(f"  changes     {refresh['change_detection_reason']}")
        where = f" -> {snapshots['location']}" if snapshots["location"] else ""
        lines.append(f"  snapshots   {snapshots['mode']}{where}")
        check_line = _check_line(dataset.get("check"))
        if check_line:
            lines.append(check_line)
    if any_unknown:
        lines += [
            "",
            f"{UNKNOWN_TYPE} = result type known once the source schema is read; declare a `schema:` block "
            "in the dataset to check it here",
        ]
    return "\n".join(lines)


def render_warnings(warnings: list[str], checks: list[SourceCheck]) -> str:
    lines = [f"{len(warnings)} warning(s):"] + [f"  {message}" for message in warnings]
    if any(check.status == "unreachable" for check in checks):
        lines.append(
            "  (a source that cannot be read is not checked; --require-sources makes that an error, "
            "--offline skips the sources)"
        )
    return "\n".join(lines)


def render_source_errors(path: str, checks: list[SourceCheck], errors: list[str], warnings: list[str]) -> str:
    """Every problem found against the sources, grouped by dataset, each dataset with its source columns."""
    lines = [f"{path}: {len(errors)} error(s) against the sources"]
    for check in checks:
        mine = [e for e in errors if e in check.errors or e.startswith(f"dataset {check.dataset!r}: source ")]
        if not mine:
            continue
        lines.append("")
        if check.schema is not None:
            columns = _columns({f.name: str(f.type) for f in check.schema})
            lines.append(f"dataset {check.dataset!r} ({check.source}; columns: {columns})")
        else:
            lines.append(f"dataset {check.dataset!r} ({check.source})")
        lines += [f"  {message}" for message in mine]
    if warnings:
        lines += ["", render_warnings(warnings, checks)]
    return "\n".join(lines)
