"""Every validation rule of the spec: each broken rule has its own message naming the dataset and place."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_partitions.exceptions import SpecValidationError
from airflow_partitions.spec import load_spec, parse_spec


def errors_for(text: str, base_dir: Path | None = None) -> list[str]:
    """The messages of the SpecValidationError that loading `text` must raise."""
    with pytest.raises(SpecValidationError) as caught:
        parse_spec(textwrap.dedent(text), base_dir=base_dir or Path("/tmp"))
    return caught.value.errors


def spec_text(acceleration: dict[str, Any] | None = None, **dataset: Any) -> str:
    """A one-dataset spec in YAML; `acceleration` defaults to one bucket field."""
    entry: dict[str, Any] = {"name": "taxi_trips", "from": "file:data/taxi/"}
    entry.update(dataset)
    entry["acceleration"] = acceleration if acceleration is not None else {"partition_by": ["bucket(8, id)"]}
    return yaml.safe_dump({"datasets": [entry]}, sort_keys=False)


def only_error(text: str) -> str:
    errors = errors_for(text)
    assert len(errors) == 1, errors
    return errors[0]


# --- YAML itself ----------------------------------------------------------------------------------


def test_yaml_syntax_error_reports_line_and_column() -> None:
    error = only_error(
        """
        datasets:
          - name: trips
            from: file:x/
             acceleration: {partition_by: [id]}
        """
    )
    assert error.startswith("line 5, column ")
    assert "YAML syntax error" in error


def test_unquoted_preset_gets_a_quoting_hint() -> None:
    error = only_error(
        """
        datasets:
          - name: trips
            from: file:x/
            acceleration:
              partition_by: [id]
              refresh: {schedule: @hourly}
        """
    )
    assert error.startswith("line 7, column ")
    assert 'quote the value, e.g. schedule: "@hourly"' in error


def test_unquoted_cron_gets_a_quoting_hint() -> None:
    error = only_error(
        """
        datasets:
          - name: trips
            from: file:x/
            acceleration:
              partition_by: [id]
              refresh:
                schedule: */5 * * * *
        """
    )
    assert error.startswith("line 8, column ")
    assert "must be quoted" in error


def test_duplicate_yaml_keys_are_reported_not_silently_overwritten() -> None:
    error = only_error(
        """
        datasets:
          - name: trips
            from: file:x/
            acceleration:
              engine: duckdb
              partition_by: [id]
              engine: arrow
        """
    )
    assert error == (
        "line 8: duplicate key 'engine' (first defined on line 6); remove one of them, YAML would silently "
        "keep only the last"
    )


def test_merge_key_overrides_are_not_duplicates(tmp_path: Path) -> None:
    text = """
    datasets:
      - name: base
        from: file:x/
        acceleration: &accel
          engine: duckdb
          partition_by: [id]
      - name: trips
        from: file:y/
        acceleration:
          <<: *accel
          engine: arrow
    """
    project = parse_spec(textwrap.dedent(text), base_dir=tmp_path)
    assert project.dataset("trips").acceleration.engine.value == "arrow"
    assert project.dataset("base").acceleration.engine.value == "duckdb"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "line 1: the spec is empty; expected a mapping with a `datasets:` list"),
        ("- a\n- b\n", "line 1: the spec must be a mapping with a `datasets:` list, got a list"),
        ("accelerator_dir: x\n", "line 1: the spec has no `datasets:` list; declare at least one dataset"),
        ("datasets: []\n", "line 1: `datasets:` is empty; declare at least one dataset"),
        ("datasets: trips\n", "line 1: `datasets:` must be a list of datasets, got a string 'trips'"),
        (
            "datasets:\n  - just-a-string\n",
            "line 2: datasets[0] must be a mapping with name, from and acceleration, "
            "got a string 'just-a-string'",
        ),
        (
            "accelerator_dir: 5\ndatasets: []\n",
            "line 1: accelerator_dir must be a directory path, got an integer 5",
        ),
    ],
)
def test_document_shape_errors(text: str, expected: str) -> None:
    assert expected in errors_for(text)


# --- datasets -------------------------------------------------------------------------------------


def test_missing_dataset_name() -> None:
    text = yaml.safe_dump({"datasets": [{"from": "file:x/", "acceleration": {"partition_by": ["id"]}}]})
    assert only_error(text).endswith("datasets[0]: name is required")


@pytest.mark.parametrize("name", ["taxi-trips", "2024_trips", "taxi trips", 7])
def test_dataset_name_must_be_an_identifier(name: Any) -> None:
    error = only_error(spec_text(name=name))
    assert f"dataset name {name!r} must be an identifier" in error


def test_duplicate_dataset_names_name_both_lines() -> None:
    error = only_error(
        """
        datasets:
          - name: trips
            from: file:x/
            acceleration: {partition_by: [id]}
          - name: Trips
            from: file:y/
            acceleration: {partition_by: [id]}
        """
    )
    assert error == (
        "line 6: dataset 'Trips' (datasets[1]) is defined more than once (as 'trips'; names ignore case): "
        "first on line 3; dataset names must be unique"
    )


def test_missing_from_and_acceleration() -> None:
    errors = errors_for(yaml.safe_dump({"datasets": [{"name": "trips"}]}))
    assert any("dataset 'trips': from is required (file:path, s3://bucket/prefix" in e for e in errors), (
        errors
    )
    assert any("dataset 'trips': acceleration is required" in e for e in errors), errors


@pytest.mark.parametrize(
    ("from_text", "fragment"),
    [
        ("data/taxi", "from 'data/taxi' has no scheme; write file:data/taxi"),
        ("gs://bucket/x", "unsupported source scheme 'gs'; use one of file:, s3://, postgres:"),
        ("s3a://bucket/x", "s3a:// and s3n:// are Hadoop spellings; write s3://"),
        (
            "postgress:orders",
            "unsupported source scheme 'postgress'; use one of file:, s3://, postgres: "
            "(did you mean 'postgres'?)",
        ),
        ("s3:bucket/x", "write S3 locations as s3://bucket/prefix"),
        ("s3://Bad_Bucket/x", "bucket name 'Bad_Bucket' is invalid"),
        ("s3:///x", "bucket name '' is invalid"),
        ("file://host/share/x", "file URIs must be local (file:/path or file:///path)"),
        ("file:", "from 'file:' names no path"),
        ("postgres:a.b.c", "is not a table name; write postgres:schema.table or postgres:table"),
        ("postgres:orders;drop", "is not a table name"),
        ("postgres:", "from 'postgres:' names no table; write postgres:schema.table"),
    ],
)
def test_bad_from(from_text: str, fragment: str) -> None:
    error = only_error(spec_text(**{"from": from_text}))
    assert error.startswith("line 3: dataset 'taxi_trips': "), error
    assert fragment in error


def test_from_must_be_a_string() -> None:
    assert "dataset 'taxi_trips': from must be a string, got an integer 5" in only_error(
        spec_text(**{"from": 5})
    )


def test_unknown_file_format_lists_the_valid_ones() -> None:
    error = only_error(spec_text(params={"file_format": "parqet"}))
    assert (
        "unknown params.file_format 'parqet'; valid values: parquet, csv, json (did you mean 'parquet'?)"
        in error
    )


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"file_format": "csv"}, "params.file_format applies to file and s3 sources only"),
        ({"url": "postgresql://h/db", "connection_id": "pg"}, "give both connection_id and url"),
        ({"url": "mysql://h/db"}, "params.url 'mysql://h/db' must start with postgresql:// or postgres://"),
        ({"connection_id": ""}, "params.connection_id must be a non-empty string"),
    ],
)
def test_postgres_params(params: dict[str, str], fragment: str) -> None:
    error = only_error(spec_text(**{"from": "postgres:public.orders", "params": params}))
    assert fragment in error
    assert "dataset 'taxi_trips'" in error


def test_typo_in_source_params_is_caught() -> None:
    error = only_error(spec_text(params={"file_fromat": "csv", "delimiter": ";"}))
    assert "unknown key params.file_fromat (did you mean 'file_format'?)" in error


def test_unknown_dataset_key_suggests_the_right_one() -> None:
    error = only_error(spec_text(acceleraton={"engine": "arrow"}))
    assert "dataset 'taxi_trips': unknown key acceleraton (did you mean 'acceleration'?)" in error
    assert "allowed keys: name, from, params, acceleration, schema" in error


def test_unknown_top_level_key() -> None:
    text = "acelerator_dir: x\n" + spec_text()
    assert only_error(text) == (
        "line 1: unknown key acelerator_dir (did you mean 'accelerator_dir'?); "
        "allowed keys: accelerator_dir, local_scratch_dir, datasets"
    )


# --- acceleration ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("acceleration", "fragment"),
    [
        (
            {"engine": "duckdbb", "partition_by": ["id"]},
            "unknown engine 'duckdbb'; valid values: parquet, duckdb, arrow (did you mean 'duckdb'?)",
        ),
        (
            {"engine": "cayenne", "partition_by": ["id"]},
            "unknown engine 'cayenne'; valid values: parquet, duckdb, arrow",
        ),
        ({"mode": "disk", "partition_by": ["id"]}, "unknown mode 'disk'; valid values: file, memory"),
        (
            {"engine": "duckdb", "params": {"partition_mode": "table"}, "partition_by": ["id"]},
            "unknown acceleration.params.partition_mode 'table'; valid values: files, tables "
            "(did you mean 'tables'?)",
        ),
        (
            {"snapshots": {"mode": "on"}, "partition_by": ["id"]},
            "unknown snapshots.mode 'on'; valid values: enabled, bootstrap_only, disabled",
        ),
        (
            {"engine": ["duckdb"], "partition_by": ["id"]},
            "engine must be one of parquet, duckdb, arrow, got a list",
        ),
    ],
)
def test_unknown_enum_values_list_the_valid_ones(acceleration: dict[str, Any], fragment: str) -> None:
    error = only_error(spec_text(acceleration))
    assert error.startswith("line "), error
    assert f"dataset 'taxi_trips': {fragment}" in error


def test_duckdb_requires_mode_file() -> None:
    error = only_error(spec_text({"engine": "duckdb", "mode": "memory", "partition_by": ["id"]}))
    assert "dataset 'taxi_trips': engine duckdb requires mode: file (got mode: memory)" in error


def test_parquet_requires_mode_file() -> None:
    error = only_error(spec_text({"engine": "parquet", "mode": "memory", "partition_by": ["id"]}))
    assert "engine parquet requires mode: file (got mode: memory)" in error


def test_arrow_accepts_both_modes(tmp_path: Path) -> None:
    for mode in ("memory", "file"):
        project = parse_spec(
            spec_text({"engine": "arrow", "mode": mode, "partition_by": ["id"]}), base_dir=tmp_path
        )
        assert project.datasets[0].acceleration.mode.value == mode


@pytest.mark.parametrize("engine", ["parquet", "arrow"])
@pytest.mark.parametrize("partition_mode", ["files", "tables"])
def test_partition_mode_is_for_duckdb_only(engine: str, partition_mode: str) -> None:
    error = only_error(
        spec_text({"engine": engine, "params": {"partition_mode": partition_mode}, "partition_by": ["id"]})
    )
    assert (
        "dataset 'taxi_trips': acceleration.params.partition_mode applies to engine duckdb only "
        f"(engine {engine} always writes one file per partition)"
    ) in error


def test_typo_in_acceleration_params_is_caught() -> None:
    error = only_error(
        spec_text({"engine": "duckdb", "params": {"partition_mod": "tables"}, "partition_by": ["id"]})
    )
    assert "unknown key acceleration.params.partition_mod (did you mean 'partition_mode'?)" in error


@pytest.mark.parametrize(
    ("acceleration", "fragment"),
    [
        ({"partitionby": ["id"]}, "unknown key acceleration.partitionby (did you mean 'partition_by'?)"),
        (
            {"partition_by": ["id"], "refresh": {"shedule": "@daily"}},
            "unknown key refresh.shedule (did you mean 'schedule'?)",
        ),
        (
            {"partition_by": ["id"], "snapshots": {"mode": "disabled", "locaton": "s3://b-1/x"}},
            "unknown key snapshots.locaton (did you mean 'location'?)",
        ),
        (
            {"partition_by": ["id"], "refresh": {"cadence": "@daily"}},
            "unknown key refresh.cadence; allowed keys: schedule",
        ),
    ],
)
def test_unknown_keys_with_did_you_mean(acceleration: dict[str, Any], fragment: str) -> None:
    errors = errors_for(spec_text(acceleration))
    assert any(fragment in e and "dataset 'taxi_trips'" in e for e in errors), errors


def test_acceleration_must_be_a_mapping() -> None:
    text = yaml.safe_dump({"datasets": [{"name": "t", "from": "file:x/", "acceleration": "duckdb"}]})
    assert "dataset 't': acceleration must be a mapping, got a string 'duckdb'" in only_error(text)


def test_enabled_must_be_boolean() -> None:
    error = only_error(spec_text({"enabled": "sometimes", "partition_by": ["id"]}))
    assert "acceleration.enabled must be true or false, got a string 'sometimes'" in error


def test_enabled_acceleration_needs_partition_fields(tmp_path: Path) -> None:
    error = only_error(spec_text({"engine": "arrow"}))
    assert "dataset 'taxi_trips': acceleration.partition_by is empty; list at least one expression" in error
    # A disabled acceleration may leave partition_by out.
    parse_spec(spec_text({"enabled": False}), base_dir=tmp_path)


def test_partition_by_must_be_a_list() -> None:
    error = only_error(spec_text({"partition_by": "bucket(8, id)"}))
    assert "acceleration.partition_by must be a list of expressions (- bucket(16, id)), got a string" in error


def test_bucket_partitions_beyond_max_partitions() -> None:
    error = only_error(
        spec_text(
            {"partition_by": ["bucket(200, a)", "bucket(100, b)"], "refresh": {"max_partitions": 10_000}}
        )
    )
    assert (
        "partition_by yields 20301 bucket partitions (each field's buckets plus its NULL partition), "
        "more than refresh.max_partitions (10000)"
    ) in error, "201 x 101: every bucket field also has a NULL partition"


# --- partition_by entries -------------------------------------------------------------------------


def test_multi_entry_mapping_is_rejected_with_both_keys() -> None:
    error = only_error(
        """
        datasets:
          - name: events
            from: file:x/
            acceleration:
              engine: arrow
              partition_by:
                - year: "date_part('year', created_at)"
                  month: "date_part('month', created_at)"
        """
    )
    assert error.startswith(
        "line 8: dataset 'events': partition_by[0] is a mapping with 2 entries (year, month)"
    )
    assert "put each on its own" in error


def test_empty_mapping_entry() -> None:
    error = only_error(spec_text({"partition_by": [{}]}))
    assert "partition_by[0] is a mapping with 0 entries" in error


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        (
            5,
            "partition_by[0] must be an expression string or a single {name: expression} mapping, "
            "got an integer 5",
        ),
        (True, "got a boolean true; quote values YAML would read as numbers or booleans"),
        (["id"], "got a list"),
        ({"day": 5}, "partition_by[0] (day): the expression must be a string, got an integer 5"),
        ({"day": None}, "partition_by[0] (day): the expression must be a string, got null"),
        ("   ", "partition_by[0] (expr0): the expression is empty"),
    ],
)
def test_non_string_expressions(entry: Any, fragment: str) -> None:
    error = only_error(spec_text({"partition_by": [entry]}))
    assert error.startswith("line 6: dataset 'taxi_trips': partition_by[0]"), error
    assert fragment in error


@pytest.mark.parametrize("name", ["my day", "1st", "day-of-week"])
def test_partition_name_must_be_an_identifier(name: str) -> None:
    error = only_error(spec_text({"partition_by": [{name: "date_trunc('day', ts)"}]}))
    assert f"partition field name {name!r} must be an identifier" in error


def test_duplicate_partition_names() -> None:
    errors = errors_for(
        spec_text(
            {
                "engine": "arrow",
                "partition_by": [
                    {"day": "date_trunc('day', ts)"},
                    {"Day": "date_trunc('day', updated_at)"},
                    "region",
                ],
            }
        )
    )
    assert len(errors) == 1, errors
    assert (
        "partition_by[1] \"date_trunc('day', updated_at)\": duplicate partition name 'Day' (already used by "
        "partition_by[0])"
    ) in errors[0]
    # `region` sits at position 2 and is auto-named expr2; an explicit expr2 after it collides.
    errors = errors_for(spec_text({"engine": "arrow", "partition_by": ["region", "id % 4", {"expr1": "x"}]}))
    assert any("duplicate partition name 'expr1' (already used by partition_by[1])" in e for e in errors), (
        errors
    )


# --- refresh and snapshots ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("refresh", "fragment"),
    [
        ({"schedule": "@hourlyy"}, "unknown schedule preset '@hourlyy'; use one of @once"),
        ({"schedule": "0 * * *"}, "schedule '0 * * *' has 4 field(s); a cron expression has 5"),
        ({"schedule": "0 24 * * *"}, "refresh.schedule '0 24 * * *': hour value 24 is outside 0-23"),
        ({"schedule": "*/0 * * * *"}, "minute step '0' must be a positive integer"),
        ({"schedule": "0 0 * FOO *"}, "month value 'FOO' is not a number or one of JAN"),
        ({"schedule": "0 0 10-2 * *"}, "day of month range '10-2' runs backwards"),
        ({"schedule": 5}, "refresh.schedule must be a string, got 5"),
        (
            {"discovery_timeout_s": -1},
            "refresh.discovery_timeout_s must be a positive number of seconds, got -1",
        ),
        (
            {"discovery_timeout_s": "soon"},
            "refresh.discovery_timeout_s must be a positive number of seconds, got 'soon'",
        ),
        (
            {"discovery_timeout_s": True},
            "refresh.discovery_timeout_s must be a positive number of seconds, got True",
        ),
        ({"max_partitions": 0}, "refresh.max_partitions must be a positive integer, got 0"),
        ({"max_partitions": 2.5}, "refresh.max_partitions must be a positive integer, got 2.5"),
        ({"check_column": ""}, "refresh.check_column must be a column name, got ''"),
        ({"late_rows": "ignore"}, "refresh.late_rows must be one of rewrite, report, fail, got 'ignore'"),
        (
            {"max_future_skew_s": -1},
            "refresh.max_future_skew_s must be a number of seconds, 0 or more, got -1",
        ),
        (
            {"max_future_skew_s": "5m"},
            "refresh.max_future_skew_s must be a number of seconds, 0 or more, got '5m'",
        ),
    ],
)
def test_bad_refresh_params(refresh: dict[str, Any], fragment: str) -> None:
    error = only_error(spec_text({"partition_by": ["id"], "refresh": refresh}))
    assert "dataset 'taxi_trips'" in error
    assert fragment in error


def test_watermark_refresh_options_default_and_load() -> None:
    """`late_rows` defaults to rewrite and `max_future_skew_s` to 300 s; both are read as written."""
    from airflow_partitions.spec.model import LateRows

    plain = parse_spec(spec_text({"partition_by": ["id"]}), base_dir=Path("/tmp"))
    refresh = plain.dataset("taxi_trips").acceleration.refresh
    assert (refresh.late_rows, refresh.max_future_skew_s) == (LateRows.REWRITE, 300.0)
    text = spec_text({"partition_by": ["id"], "refresh": {"late_rows": "fail", "max_future_skew_s": 0}})
    loaded = parse_spec(text, base_dir=Path("/tmp")).dataset("taxi_trips").acceleration.refresh
    assert (loaded.late_rows, loaded.max_future_skew_s) == (LateRows.FAIL, 0.0)


@pytest.mark.parametrize(
    "schedule",
    [
        "@hourly",
        "@daily",
        "@continuous",
        "0 */2 * * *",
        "15,45 8-18 * * MON-FRI",
        "0 0 L * ?",
        "0 0 * JAN,JUL 1#2",
    ],
)
def test_valid_schedules(tmp_path: Path, schedule: str) -> None:
    project = parse_spec(
        spec_text({"partition_by": ["id"], "refresh": {"schedule": schedule}}), base_dir=tmp_path
    )
    assert project.datasets[0].acceleration.refresh.schedule == schedule


@pytest.mark.parametrize("mode", ["enabled", "bootstrap_only"])
def test_snapshots_need_a_location(mode: str) -> None:
    error = only_error(spec_text({"partition_by": ["id"], "snapshots": {"mode": mode}}))
    assert (
        f"dataset 'taxi_trips': snapshots mode {mode} needs a location (snapshots.location: s3://bucket/prefix)"
        in error
    )


@pytest.mark.parametrize(
    ("location", "fragment"),
    [
        ("/local/dir", "snapshots.location '/local/dir' must be an s3://bucket/prefix URL"),
        ("s3://UPPER/x", "bucket name 'UPPER' is invalid"),
    ],
)
def test_snapshot_location_must_be_s3(location: str, fragment: str) -> None:
    error = only_error(
        spec_text({"partition_by": ["id"], "snapshots": {"mode": "enabled", "location": location}})
    )
    assert fragment in error


# --- expressions (parse_transform errors get the dataset, position and expression) ----------------


@pytest.mark.parametrize(
    ("expression", "keywords"),
    [
        ("date_trunc('day', ts) AS d", ["aliases its result"]),
        ("(SELECT max(id) FROM t)", ["contains a subquery"]),
        ("max(id)", ["aggregate function max()"]),
        ("row_number() OVER (ORDER BY id)", ["window function"]),
        ("UNNEST(tags)", ["contains unnest"]),
        ("EXISTS (SELECT 1)", ["contains exists"]),
        ("bucket(8, ?)", ["placeholder"]),
        ("42", ["references no column"]),
        ("concat(a, b)", ["references 2 columns"]),
        ("a + b", ["references 2 columns"]),
        ("md5(id)", ["md5(id)", "not in the partition expression function set"]),
        ("id + random()", ["random()", "not deterministic"]),
        ("bucket(0, id)", ["bucket n = 0", "positive integer literal ≤ 1000000"]),
        ("bucket(1000001, id)", ["bucket n = 1000001", "≤ 1000000"]),
        ("bucket(-3, id)", ["bucket n", "positive integer"]),
        ("bucket(n, id)", ["references 2 columns"]),
        ("bucket(2.5, id)", ["bucket n = 2.5", "integer literal"]),
    ],
)
def test_expression_errors_name_dataset_position_and_expression(expression: str, keywords: list[str]) -> None:
    error = only_error(spec_text({"engine": "arrow", "partition_by": ["region", {"k": expression}]}))
    prefix = f"dataset 'taxi_trips': partition_by[1] {json.dumps(expression)}: "
    assert prefix in error, error
    detail = error.split(prefix, 1)[1].lower()
    for keyword in keywords:
        assert keyword in detail.replace(",", ""), error


def test_unquoted_comma_in_flow_list_gets_a_hint() -> None:
    errors = errors_for(
        """
        datasets:
          - name: orders
            from: postgres:orders
            acceleration:
              partition_by: [truncate(1000, amount)]
        """
    )
    assert len(errors) == 2, errors
    assert errors[0].startswith("line 6: dataset 'orders': partition_by[0] \"truncate(1000\": ")
    assert errors[1].startswith("line 6: dataset 'orders': partition_by[1] \"amount)\": ")
    for error in errors:
        assert "in a [a, b] flow list YAML splits at commas, so quote the expression" in error


# --- schema: block ---------------------------------------------------------------------------------


def test_declared_schema_catches_unknown_columns_with_did_you_mean() -> None:
    error = only_error(
        spec_text(
            {"partition_by": ["bucket(50, pulocationid)"]},
            schema={"PULocationID": "int32", "fare": "double"},
        )
    )
    assert (
        "dataset 'taxi_trips': partition_by[0] \"bucket(50, pulocationid)\": unknown column 'pulocationid' "
        "(did you mean 'PULocationID'?); columns are PULocationID, fare"
    ) in error


@pytest.mark.parametrize(
    ("column_type", "expression", "fragment"),
    [
        ("double", "fare", "gives double values, but partition values must be string, integer, boolean"),
        ("list<string>", "tags", "gives list<item: string> values, but partition values must be string"),
        ("double", "fare % 3", "column 'fare' has type double, but mod accepts integer columns"),
        ("string", "date_trunc('day', fare)", "column 'fare' has type string, but date_trunc accepts date"),
    ],
)
def test_declared_schema_catches_bad_result_types(column_type: str, expression: str, fragment: str) -> None:
    column = "tags" if expression == "tags" else "fare"
    error = only_error(spec_text({"partition_by": [expression]}, schema={column: column_type}))
    assert error.startswith(f"line 8: dataset 'taxi_trips': partition_by[0] {json.dumps(expression)}: "), (
        error
    )
    assert fragment in error


@pytest.mark.parametrize(
    ("expression", "schema", "fragments"),
    [
        (
            "multi_bucket(8, tenant)",
            {"tenant": "string"},
            ["calls multi_bucket with 2 argument(s)", "two or more columns", "for one column write bucket"],
        ),
        (
            "multi_bucket(0, tenant, user_id)",
            {"tenant": "string", "user_id": "int64"},
            ["has multi_bucket N = 0", "N must be a positive integer literal"],
        ),
        (
            "multi_bucket(tenant, user_id, 8)",
            {"tenant": "string", "user_id": "int64"},
            ["has multi_bucket N = tenant (the arguments are multi_bucket(N, col_a, col_b, ...))"],
        ),
        (
            "multi_bucket(8, tenant, usr_id)",
            {"tenant": "string", "user_id": "int64"},
            ["unknown column 'usr_id' (did you mean 'user_id'?)"],
        ),
        (
            "multi_bucket(8, tenant, active)",
            {"tenant": "string", "active": "bool"},
            [
                "column 'active' has type bool, which multi_bucket cannot hash",
                "the Lance spec defines no bytes for booleans",
                "cast the column in the source",
            ],
        ),
        (
            "multi_bucket(8, tenant, amount)",
            {"tenant": "string", "amount": "decimal128(10, 2)"},
            ["column 'amount' has type decimal128(10, 2)", "no bytes for decimals"],
        ),
        (
            "multi_bucket(8, lower(tenant), user_id)",
            {"tenant": "string", "user_id": "int64"},
            ["as multi_bucket argument 2", "hashes plain columns only"],
        ),
        (
            "bucket(8, tenant, user_id)",
            {"tenant": "string", "user_id": "int64"},
            ["references 2 columns", "multi_bucket(N, a, b, ...) is the one exception"],
        ),
    ],
)
def test_multi_bucket_is_checked_when_the_spec_loads(
    expression: str, schema: dict[str, str], fragments: list[str]
) -> None:
    error = only_error(spec_text({"partition_by": [expression]}, schema=schema))
    assert json.dumps(expression) in error or repr(expression) in error, error
    for fragment in fragments:
        assert fragment in error, error


def test_multi_bucket_binds_to_every_column_type_it_defines() -> None:
    schema = {
        "a": "int8",
        "b": "int16",
        "c": "int32",
        "d": "int64",
        "e": "float",
        "f": "double",
        "g": "date32",
        "h": "timestamp[us]",
        "i": "timestamp[us, tz=UTC]",
        "j": "string",
        "k": "binary",
    }
    expression = f"multi_bucket(16, {', '.join(schema)})"
    text = spec_text({"partition_by": [{"mb": expression}, "a"]}, schema=schema)
    dataset = parse_spec(textwrap.dedent(text), base_dir=Path("/tmp")).datasets[0]
    (field, _) = dataset.acceleration.partition_by
    assert field.source_columns == tuple(schema)
    assert str(field.result_type) == "int32"
    assert len(field.source_types or ()) == len(schema)


def test_declared_schema_checks_check_column() -> None:
    error = only_error(
        spec_text(
            {"partition_by": ["id"], "refresh": {"check_column": "updatd_at"}},
            schema={"id": "int64", "updated_at": "timestamp"},
        )
    )
    assert (
        "dataset 'taxi_trips': refresh.check_column: unknown column 'updatd_at' (did you mean 'updated_at'?)"
        in error
    )


def test_declared_schema_type_errors() -> None:
    errors = errors_for(spec_text(schema={"id": "int128", "ts": "timestamp[xs]", "n": 5}))
    assert len(errors) == 3, errors
    assert any("schema.id: unsupported column type 'int128': unknown type name" in e for e in errors)
    assert any(
        "schema.ts: unsupported column type 'timestamp[xs]': unit 'xs' is not one of" in e for e in errors
    )
    assert any("schema.n must be a type name, got an integer 5" in e for e in errors)


def test_empty_declared_schema() -> None:
    assert "schema is empty" in only_error(spec_text(schema={}))


# --- collecting every error -----------------------------------------------------------------------


def test_every_error_in_a_file_is_reported_in_line_order(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            datasets:
              - name: taxi_trips
                from: file:data/taxi/
                schema: {PULocationID: int32, ts: timestamp, fare: double}
                acceleration:
                  engine: duckdb
                  mode: memory
                  partition_by:
                    - bucket(50, PULocationId)
                    - d: "date_trunc('day', ts) AS d"
                    - year: "date_part('year', ts)"
                      month: "date_part('month', ts)"
                    - fare
                  snapshots: {mode: enabled}
              - name: orders
                from: postgres:public.orders
                acceleration:
                  engine: arrows
                  partition_by: ["truncate(1000, amount)"]
                  refresh: {max_partitions: -5}
              - name: orders
                from: ftp://x
                acceleration: {partition_by: [id]}
            """
        )
    )
    with pytest.raises(SpecValidationError) as caught:
        load_spec(path)
    errors = caught.value.errors
    assert caught.value.path == str(path)
    expected_in_order = [
        ("line 7:", "engine duckdb requires mode: file"),
        ("line 9:", "unknown column 'PULocationId' (did you mean 'PULocationID'?)"),
        ("line 10:", "partition_by[1] \"date_trunc('day', ts) AS d\""),
        ("line 11:", "partition_by[2] is a mapping with 2 entries"),
        ("line 13:", 'partition_by[3] "fare"'),
        ("line 14:", "snapshots mode enabled needs a location"),
        ("line 18:", "dataset 'orders': unknown engine 'arrows'"),
        ("line 20:", "dataset 'orders': refresh.max_partitions must be a positive integer, got -5"),
        ("line 21:", "dataset 'orders' (datasets[2]) is defined more than once"),
        ("line 22:", "unsupported source scheme 'ftp'"),
    ]
    assert len(errors) == len(expected_in_order), "\n".join(errors)
    for error, (line, fragment) in zip(errors, expected_in_order, strict=True):
        assert error.startswith(line), (error, line)
        assert fragment in error, (error, fragment)
    assert str(caught.value).startswith(f"{len(errors)} error(s) in {path}:")
