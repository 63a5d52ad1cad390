"""refresh.change_detection in the spec: `cdc` by default for refresh_mode: changes, `watermark` kept."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_partitions.cli.main import main
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


@pytest.mark.parametrize(
    ("refresh", "said"),
    [
        (
            "",
            "change_detection cdc (a logical replication slot: inserts, updates, deletes, TRUNCATE), the "
            "default of refresh_mode: changes",
        ),
        (
            "      refresh: {watermark_column: ts}\n",
            "change_detection watermark (rows whose ts grew): the spec "
            "names refresh.watermark_column and no refresh.change_detection, as specs written before change "
            "data capture did",
        ),
        (
            "      refresh: {watermark_column: ts, change_detection: cdc}\n",
            "change_detection cdc, as refresh.change_detection says",
        ),
    ],
)
def test_validate_says_which_change_detection_and_why(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], refresh: str, said: str
) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(spec("      refresh_mode: changes\n" + refresh))
    assert main(["validate", str(path), "--offline"]) == 0
    assert f"  changes     {said}" in capsys.readouterr().out
    assert main(["validate", str(path), "--offline", "--json"]) == 0
    described = json.loads(capsys.readouterr().out)["datasets"][0]["acceleration"]["refresh"]
    assert described["change_detection_reason"].startswith(said)
    assert described["change_detection"] == said.split()[1].rstrip(",")
