"""Triggers: `serialize()` round trips, and `run()` against real files and a real catalog."""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib
import json
from pathlib import Path
from typing import Any

import pytest
from airflow_e2e.sample import append_sales, sample_spec, write_sales

from airflow_partitions.triggers import PartitionFreshnessTrigger, SourceChangeTrigger

pytestmark = pytest.mark.airflow

TRIGGERS = [
    SourceChangeTrigger(
        spec_path="/specs/datasets.yaml", dataset="sales", where="region = 'EU'", poll_interval=7
    ),
    SourceChangeTrigger(spec_path="/specs/datasets.yaml", dataset="sales"),
    PartitionFreshnessTrigger(
        spec_path="/specs/datasets.yaml",
        dataset="sales",
        refreshed_after="2026-01-01T00:00:00+00:00",
        where="day >= '2026-01-01'",
        min_partitions=3,
        poll_interval=30,
    ),
]


@pytest.mark.parametrize("trigger", TRIGGERS, ids=lambda t: type(t).__name__)
def test_serialize_round_trips(trigger: Any) -> None:
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert cls is type(trigger), "the classpath names the trigger's own class"
    assert json.loads(json.dumps(kwargs)) == kwargs, "kwargs are plain JSON"
    rebuilt = cls(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)


def test_serialize_survives_airflow_trigger_encoding() -> None:
    """What the scheduler stores for a deferred task: Airflow's own trigger encoding round trip."""
    from airflow.serialization.encoders import encode_trigger
    from airflow.serialization.serialized_objects import BaseSerialization

    trigger = TRIGGERS[2]
    encoded = encode_trigger(trigger)
    classpath = encoded["classpath"]
    kwargs = {key: BaseSerialization.deserialize(value) for key, value in encoded["kwargs"].items()}
    assert classpath.endswith("PartitionFreshnessTrigger")
    assert kwargs == trigger.serialize()[1]


async def _first_event(trigger: Any, timeout: float = 120.0) -> Any:
    async def first() -> Any:
        async for event in trigger.run():
            return event
        return None

    return await asyncio.wait_for(first(), timeout)


@pytest.fixture(scope="module")
def refreshed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dt.datetime]:
    from airflow_partitions.refresh import refresh_dataset

    root = tmp_path_factory.mktemp("triggers")
    write_sales(root / "sales", rows=30, days=1)
    spec = root / "spec.yaml"
    spec.write_text(sample_spec(accelerator_dir=root / "acc", sales_dir=root / "sales"))
    before = dt.datetime.now(dt.UTC)
    refresh_dataset(str(spec), "sales")
    return spec, root / "sales", before


@pytest.mark.spark
def test_source_change_trigger_fires_when_rows_arrive(refreshed: tuple[Path, Path, dt.datetime]) -> None:
    spec, sales, _ = refreshed
    trigger = SourceChangeTrigger(spec_path=str(spec), dataset="sales", poll_interval=0.2)

    async def scenario() -> Any:
        waiting = asyncio.ensure_future(_first_event(trigger))
        await asyncio.sleep(1.0)
        assert not waiting.done(), "no event while the source is unchanged"
        await asyncio.to_thread(append_sales, sales, rows=3, days=1, regions=("EU",), name="new.parquet")
        return await waiting

    event = asyncio.run(scenario())
    assert event.payload["status"] == "success"
    assert event.payload["changed_count"] >= 1
    assert "region=EU/day=2026-01-01T00%3A00%3A00" in event.payload["changed"]


@pytest.mark.spark
def test_freshness_trigger_fires_for_fresh_partitions(refreshed: tuple[Path, Path, dt.datetime]) -> None:
    spec, _, before = refreshed
    trigger = PartitionFreshnessTrigger(
        spec_path=str(spec), dataset="sales", refreshed_after=before.isoformat(), where="region = 'US'"
    )
    event = asyncio.run(_first_event(trigger))
    assert event.payload["status"] == "success"
    assert event.payload["selected"] == 1
    assert event.payload["stale"] == []


def test_trigger_reports_a_typed_error_as_an_event(tmp_path: Path) -> None:
    trigger = SourceChangeTrigger(
        spec_path=str(tmp_path / "missing.yaml"), dataset="sales", poll_interval=0.1
    )
    event = asyncio.run(_first_event(trigger, timeout=30))
    assert event.payload["status"] == "error"
    assert event.payload["error_type"] == "SpecValidationError"
    assert "spec file not found" in event.payload["message"]
