"""The typed model: partition spec ids, binding to a source schema, and rules enforced on construction."""

from __future__ import annotations

import json
import pickle
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_partitions.exceptions import SpecValidationError
from airflow_partitions.spec import (
    AccelerationSpec,
    DatasetSpec,
    Engine,
    FileFormat,
    Mode,
    PartitionField,
    PartitionMode,
    RefreshConfig,
    SnapshotConfig,
    SnapshotMode,
    SourceRef,
    SourceScheme,
    parse_spec,
    validate_against_schema,
)
from airflow_partitions.transforms import parse_transform


def load_one(text: str, base_dir: Path) -> DatasetSpec:
    project = parse_spec(textwrap.dedent(text), base_dir=base_dir)
    assert len(project.datasets) == 1
    return project.datasets[0]


SPEC = """
datasets:
  - name: taxi_trips
    from: file:taxi/
    acceleration:
      engine: arrow
      partition_by:
        - bucket(50, PULocationID)
        - day: "date_trunc('day', pickup_at)"
      refresh:
        check_column: updated_at
"""


# --- partition spec id ----------------------------------------------------------------------------


def test_same_spec_gives_same_id(tmp_path: Path) -> None:
    first = load_one(SPEC, tmp_path).acceleration
    second = load_one(SPEC, tmp_path / "elsewhere").acceleration
    assert first.partition_spec_id == second.partition_spec_id
    assert len(first.partition_spec_id) == 16
    assert json.loads(first.partition_spec_canonical()) == [
        ["expr0", parse_transform("bucket(50, PULocationID)").canonical],
        ["day", parse_transform("date_trunc('day', pickup_at)").canonical],
    ]


def test_id_ignores_yaml_key_order_and_unrelated_settings(tmp_path: Path) -> None:
    reordered = """
    datasets:
      - acceleration:
          refresh: {schedule: "@daily", max_partitions: 99}
          partition_by:
            - bucket(50, PULocationID)
            - day: "date_trunc('day', pickup_at)"
          engine: arrow
          snapshots: {location: "s3://bucket-a/p", mode: enabled}
        from: file:other/
        name: taxi_trips
    """
    assert (
        load_one(reordered, tmp_path).acceleration.partition_spec_id
        == load_one(SPEC, tmp_path).acceleration.partition_spec_id
    )


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("bucket(50, PULocationID)", "bucket(51, PULocationID)"),
        ("bucket(50, PULocationID)", "bucket(50, DOLocationID)"),
        ("day: \"date_trunc('day', pickup_at)\"", "day: \"date_trunc('hour', pickup_at)\""),
        ("day: \"date_trunc('day', pickup_at)\"", "d: \"date_trunc('day', pickup_at)\""),
    ],
)
def test_changed_expression_or_name_changes_the_id(tmp_path: Path, old: str, new: str) -> None:
    assert old in SPEC
    original = load_one(SPEC, tmp_path).acceleration
    changed = load_one(SPEC.replace(old, new), tmp_path).acceleration
    assert changed.partition_spec_id != original.partition_spec_id
    assert changed.partition_spec_canonical() != original.partition_spec_canonical()


def test_field_order_changes_the_id(tmp_path: Path) -> None:
    swapped = SPEC.replace(
        "        - bucket(50, PULocationID)\n        - day: \"date_trunc('day', pickup_at)\"",
        "        - day: \"date_trunc('day', pickup_at)\"\n        - b: bucket(50, PULocationID)",
    )
    assert swapped != SPEC
    assert (
        load_one(swapped, tmp_path).acceleration.partition_spec_id
        != load_one(SPEC, tmp_path).acceleration.partition_spec_id
    )


def test_id_uses_the_canonical_form_not_the_spelling(tmp_path: Path) -> None:
    spelled = SPEC.replace("bucket(50, PULocationID)", "bucket( 50 ,PULocationID )")
    assert spelled != SPEC
    assert (
        load_one(spelled, tmp_path).acceleration.partition_spec_id
        == load_one(SPEC, tmp_path).acceleration.partition_spec_id
    )


def test_binding_does_not_change_the_id(tmp_path: Path) -> None:
    dataset = load_one(SPEC, tmp_path)
    schema = pa.schema(
        [("PULocationID", pa.int32()), ("pickup_at", pa.timestamp("us")), ("updated_at", pa.timestamp("us"))]
    )
    assert dataset.bind(schema).acceleration.partition_spec_id == dataset.acceleration.partition_spec_id


# --- binding to a schema --------------------------------------------------------------------------


def test_bind_sets_source_and_result_types(tmp_path: Path) -> None:
    dataset = load_one(SPEC, tmp_path)
    assert not dataset.bound
    assert all(f.result_type is None for f in dataset.partition_by)
    schema = pa.schema(
        [("PULocationID", pa.int32()), ("pickup_at", pa.timestamp("us")), ("updated_at", pa.timestamp("us"))]
    )
    bound = dataset.bind(schema)
    assert bound.bound
    assert bound.bound_schema == schema
    assert [f.source_type for f in bound.partition_by] == [pa.int32(), pa.timestamp("us")]
    assert bound.partition_by[0].result_type == pa.int64()
    assert bound.partition_by[1].result_type == pa.timestamp("us")
    # The original stays unbound: bind returns a copy.
    assert not dataset.bound
    # A bound spec can be bound again, e.g. to the real source schema after the declared one.
    rebound = bound.bind(
        pa.schema(
            [("PULocationID", pa.int64()), ("pickup_at", pa.timestamp("ms")), ("updated_at", pa.date32())]
        )
    )
    assert rebound.partition_by[0].source_type == pa.int64()


def test_validate_against_schema_reports_every_problem(tmp_path: Path) -> None:
    dataset = load_one(SPEC, tmp_path)
    schema = pa.schema(
        [("PULocationId", pa.int32()), ("pickup_at", pa.float64()), ("updatedAt", pa.timestamp("us"))]
    )
    problems = validate_against_schema(dataset, schema)
    assert len(problems) == 3, problems
    assert problems[0].startswith(
        "line 8: dataset 'taxi_trips': partition_by[0] \"bucket(50, PULocationID)\": "
        "unknown column 'PULocationID' (did you mean 'PULocationId'?)"
    )
    assert problems[1].startswith(
        "line 9: dataset 'taxi_trips': partition_by[1] \"date_trunc('day', pickup_at)\": "
    )
    assert "double" in problems[1]
    assert "refresh.check_column: unknown column 'updated_at' (did you mean 'updatedAt'?)" in problems[2]
    with pytest.raises(SpecValidationError) as caught:
        dataset.bind(schema)
    assert caught.value.errors == problems


def test_validate_against_schema_is_empty_when_it_binds(tmp_path: Path) -> None:
    dataset = load_one(SPEC, tmp_path)
    schema = pa.schema(
        [("PULocationID", pa.string()), ("pickup_at", pa.timestamp("ns", "UTC")), ("updated_at", pa.int64())]
    )
    assert validate_against_schema(dataset, schema) == []


def test_ambiguous_column(tmp_path: Path) -> None:
    dataset = load_one(SPEC, tmp_path)
    schema = pa.schema(
        [("PULocationID", pa.int32()), ("PULocationID", pa.int64()), ("pickup_at", pa.date32())]
    )
    problems = validate_against_schema(dataset, schema)
    assert any("column 'PULocationID' appears 2 times in the source schema" in p for p in problems), problems


def test_declared_schema_binds_at_load(tmp_path: Path) -> None:
    dataset = load_one(
        """
        datasets:
          - name: events
            from: file:events/
            schema:
              ts: "timestamp[ms, UTC]"
              region: string
              amount: decimal(10,2)
            acceleration:
              engine: arrow
              partition_by:
                - region
                - "date_part('year', ts)"
                - truncate(100, amount)
        """,
        tmp_path,
    )
    assert dataset.bound
    assert dataset.declared_columns == (
        ("ts", "timestamp[ms, UTC]"),
        ("region", "string"),
        ("amount", "decimal(10,2)"),
    )
    assert dataset.declared_schema() == pa.schema(
        [("ts", pa.timestamp("ms", "UTC")), ("region", pa.string()), ("amount", pa.decimal128(10, 2))]
    )
    assert dataset.partition_by[0].result_type == pa.string()
    assert pa.types.is_integer(dataset.partition_by[1].result_type)


# --- rules enforced by the dataclasses themselves -------------------------------------------------


def test_dataclasses_enforce_the_same_rules_in_code() -> None:
    with pytest.raises(SpecValidationError, match="engine duckdb requires mode: file"):
        AccelerationSpec(
            partition_by=(PartitionField("k", "id", parse_transform("id")),),
            engine=Engine.DUCKDB,
            mode=Mode.MEMORY,
        )
    with pytest.raises(SpecValidationError, match="applies to engine duckdb only"):
        AccelerationSpec(
            partition_by=(PartitionField("k", "id", parse_transform("id")),),
            partition_mode=PartitionMode.TABLES,
        )
    with pytest.raises(SpecValidationError, match="duplicate partition name 'K'"):
        AccelerationSpec(
            partition_by=(
                PartitionField("k", "id", parse_transform("id")),
                PartitionField("K", "id % 4", parse_transform("id % 4")),
            )
        )
    with pytest.raises(SpecValidationError, match="partition_by is empty"):
        AccelerationSpec(partition_by=())
    with pytest.raises(SpecValidationError, match="needs a location"):
        SnapshotConfig(mode=SnapshotMode.ENABLED)
    with pytest.raises(SpecValidationError, match="max_partitions must be a positive integer"):
        RefreshConfig(max_partitions=0)
    with pytest.raises(SpecValidationError, match="hour value 25 is outside 0-23"):
        RefreshConfig(schedule="0 25 * * *")
    with pytest.raises(SpecValidationError, match="must be an identifier"):
        PartitionField("bad name", "id", parse_transform("id"))
    with pytest.raises(SpecValidationError, match="is not a table name"):
        SourceRef(SourceScheme.POSTGRES, "a.b.c")
    with pytest.raises(SpecValidationError, match="needs a file_format"):
        SourceRef(SourceScheme.FILE, "/data/x")
    with pytest.raises(SpecValidationError, match="must be resolved to an absolute path"):
        SourceRef(SourceScheme.FILE, "data/x", file_format=FileFormat.CSV)


def test_built_in_code_equals_loaded_from_yaml(tmp_path: Path) -> None:
    loaded = load_one(SPEC, tmp_path)
    built = DatasetSpec(
        name="taxi_trips",
        source=SourceRef(SourceScheme.FILE, str(tmp_path / "taxi"), {}, FileFormat.PARQUET),
        acceleration=AccelerationSpec(
            engine=Engine.ARROW,
            mode=Mode.MEMORY,
            partition_by=(
                PartitionField(
                    "expr0", "bucket(50, PULocationID)", parse_transform("bucket(50, PULocationID)")
                ),
                PartitionField(
                    "day", "date_trunc('day', pickup_at)", parse_transform("date_trunc('day', pickup_at)")
                ),
            ),
            refresh=RefreshConfig(check_column="updated_at"),
        ),
    )
    assert built == loaded
    assert built.acceleration.partition_spec_id == loaded.acceleration.partition_spec_id


def test_specs_pickle_for_other_processes(tmp_path: Path) -> None:
    dataset = load_one(SPEC, tmp_path)
    assert pickle.loads(pickle.dumps(dataset)) == dataset


def test_field_lookup(tmp_path: Path) -> None:
    acceleration = load_one(SPEC, tmp_path).acceleration
    assert acceleration.partition_field("day").source_column == "pickup_at"
    with pytest.raises(KeyError, match="no partition field 'dya'; fields are expr0, day"):
        acceleration.partition_field("dya")
