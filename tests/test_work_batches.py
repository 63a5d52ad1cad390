"""Batches of work items: when discovery maps one task per partition and when per batch, how batches are
balanced and labelled, and how the operators' XCom decoding opens them again (no Spark, no Airflow run)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from airflow_partitions.exceptions import RefreshError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.refresh.plan import (
    BATCH_LABEL_LIMIT,
    PartitionWorkItem,
    Reason,
    WorkBatch,
    batch_bounds,
    is_batch_json,
    mapped_work,
    unbatched_items_json,
)


def items(values: list[Any], name: str = "k") -> list[PartitionWorkItem]:
    return [
        PartitionWorkItem(
            key=(value,),
            key_path=PartitionKey((value,)).path((name,)),
            reason=Reason.NEW,
            fingerprint=f"fp{i}",
        )
        for i, value in enumerate(values)
    ]


@pytest.mark.parametrize(
    ("count", "batches", "sizes"),
    [
        (10, 3, [4, 3, 3]),
        (3001, 100, [31] + [30] * 99),
        (1025, 1024, [2] + [1] * 1023),
        (5, 5, [1] * 5),
        (2, 7, [1, 1]),  # never an empty batch
    ],
)
def test_batches_are_contiguous_and_balanced(count: int, batches: int, sizes: list[int]) -> None:
    bounds = batch_bounds(count, batches)
    assert [stop - start for start, stop in bounds] == sizes
    assert bounds[0][0] == 0
    assert bounds[-1][1] == count
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds)), "contiguous"


def test_one_task_per_partition_up_to_the_limit_then_exactly_limit_batches() -> None:
    work = items(list(range(8)))
    at_limit = mapped_work(work, 8)
    assert at_limit == [item.to_json() for item in work], "at the threshold nothing changes"
    assert not any(is_batch_json(value) for value in at_limit)

    over = mapped_work(work, 3)
    assert len(over) == 3
    assert all(is_batch_json(value) for value in over)
    assert [len(value["items"]) for value in over] == [3, 3, 2]
    assert [value["batch"] for value in over] == [0, 1, 2]
    assert unbatched_items_json(over) == [item.to_json() for item in work], "the plan's order, every item"
    assert WorkBatch.from_json(over[1]).items == tuple(work[3:6])


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(RefreshError, match="max_mapped_tasks"):
        mapped_work(items([1]), 0)


def test_batch_labels_name_count_and_ends_within_airflow_limit() -> None:
    hostile = [None, "a/b", "x=y", "ü ñ", "", "50%"]
    batch = WorkBatch(4, tuple(items(hostile, "region")))
    assert batch.label == "6 partitions: region=%NULL .. region=50%25"
    assert WorkBatch(0, tuple(items(["EU"], "region"))).label == "1 partition: region=EU"

    long_values = ["α" * 400, "β" * 400]
    label = WorkBatch(1, tuple(items(long_values, "name"))).label
    assert len(label) <= BATCH_LABEL_LIMIT
    assert label.startswith("2 partitions: name=ααα")
    assert " .. name=βββ" in label


def test_xcom_decoding_opens_batches() -> None:
    from airflow_partitions.operators.xcom import (
        mapped_work_from_xcom,
        partition_results_from_xcom,
        plan_from_xcom,
    )
    from airflow_partitions.refresh.plan import DiscoveryKind, RefreshPlan

    work = items(list(range(5)))
    plan = RefreshPlan(
        dataset="d",
        spec_id="s",
        partition_names=("k",),
        base_version=None,
        items=tuple(work),
        removed=(),
        unchanged=0,
        discovered=5,
        discovery=DiscoveryKind.DYNAMIC,
        fingerprint_granularity="source",
    )
    mapped = mapped_work(work, 2)
    assert plan_from_xcom(plan.without_items().to_json(), mapped).items == tuple(work)
    assert isinstance(mapped_work_from_xcom(mapped[0]), WorkBatch)
    assert mapped_work_from_xcom(work[0].to_json()) == work[0]

    result = {
        "key": [1],
        "key_path": "k=1",
        "spec_id": "s",
        "files": [],
        "rows": 0,
        "bytes": 0,
        "refreshed_at": "2026-01-01T00:00:00Z",
        "source_fingerprint": "fp",
    }
    other = {**result, "key": [2], "key_path": "k=2"}
    # Batch tasks return lists; a failed task's missing value is left out; a lone batch's list is its own.
    opened = partition_results_from_xcom([[result, other], None, [result]])
    assert [r.key_path for r in opened] == ["k=1", "k=2", "k=1"]
    assert [r.key_path for r in partition_results_from_xcom([result, other])] == ["k=1", "k=2"]


def test_threshold_is_the_smaller_of_airflow_and_provider_limits() -> None:
    from airflow.configuration import conf

    from airflow_partitions.exceptions import OrchestrationError
    from airflow_partitions.operators.discovery import max_mapped_tasks

    saved = {
        (section, option): conf.get(section, option) if conf.has_option(section, option) else None
        for section, option in (("core", "max_map_length"), ("airflow_partitions", "max_mapped_tasks"))
    }
    if not conf.has_section("airflow_partitions"):
        conf.add_section("airflow_partitions")
    try:
        conf.set("core", "max_map_length", "1024")
        conf.set("airflow_partitions", "max_mapped_tasks", "300")
        assert max_mapped_tasks() == 300
        conf.set("core", "max_map_length", "200")
        assert max_mapped_tasks() == 200, "Airflow's own limit wins when smaller"
        conf.set("airflow_partitions", "max_mapped_tasks", "0")
        with pytest.raises(OrchestrationError, match="max_mapped_tasks"):
            max_mapped_tasks()
    finally:
        for (section, option), value in saved.items():
            if value is None:
                conf.remove_option(section, option)
            else:
                conf.set(section, option, value)


def test_provider_declares_the_option() -> None:
    from airflow_partitions.provider_info import get_provider_info

    option = get_provider_info()["config"]["airflow_partitions"]["options"]["max_mapped_tasks"]
    assert option["type"] == "integer"
    assert option["default"] == "1024"
    assert "max_map_length" in option["description"]
