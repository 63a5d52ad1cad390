"""refresh.change_detection in the spec: `cdc` by default for refresh_mode: changes, `watermark` kept."""

from __future__ import annotations

import pytest

from airflow_partitions.exceptions import SpecValidationError
from airflow_partitions.spec import parse_spec
from airflow_partitions.spec.model import ChangeDetection


def spec(acceleration: str) -> str:
    return (
        "datasets:\n"
        "  - name: t\n"
        "    from: postgres:public.t\n"
        "    acceleration:\n"
        "      primary_key: [id]\n"
        "      partition_by: [region]\n"
        f"{acceleration}"
    )


@pytest.mark.parametrize(
    ("acceleration", "expected"),
    [
        ("      refresh_mode: changes\n", ChangeDetection.CDC),
        ("      refresh_mode: changes\n      refresh: {change_detection: cdc}\n", ChangeDetection.CDC),
        (
            "      refresh_mode: changes\n      refresh: {watermark_column: ts, change_detection: cdc}\n",
            ChangeDetection.CDC,
        ),
        ("      refresh_mode: changes\n      refresh: {watermark_column: ts}\n", ChangeDetection.WATERMARK),
        (
            "      refresh_mode: changes\n"
            "      refresh: {watermark_column: ts, change_detection: watermark}\n",
            ChangeDetection.WATERMARK,
        ),
        ("      refresh_mode: full\n", None),
    ],
)
def test_change_detection_default_and_choice(acceleration: str, expected: ChangeDetection | None) -> None:
    dataset = parse_spec(spec(acceleration)).dataset("t")
    assert dataset.acceleration.refresh.detection == expected


@pytest.mark.parametrize(
    ("acceleration", "message"),
    [
        (
            "      refresh_mode: changes\n      refresh: {change_detection: wal}\n",
            r"refresh.change_detection must be one of cdc, watermark, got 'wal'",
        ),
        (
            "      refresh_mode: changes\n      refresh: {change_detection: watermark}\n",
            r"refresh_mode: changes needs refresh.watermark_column",
        ),
        (
            "      refresh_mode: append\n      refresh: {watermark_column: ts, change_detection: cdc}\n",
            r"refresh.change_detection applies to refresh_mode: changes only",
        ),
    ],
)
def test_change_detection_mistakes_are_refused(acceleration: str, message: str) -> None:
    with pytest.raises(SpecValidationError, match=message):
        parse_spec(spec(acceleration))
