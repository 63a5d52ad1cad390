"""Partition states (fresh, stale, failed, missing, removed) on real files with real Spark refreshes; the
CLI's `status --partitions --json` says the same as the core, and `refresh --failed` refreshes exactly the
remembered failed partitions."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_partitions.cli.main import main
from airflow_partitions.exceptions import PartitionsFailedError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.refresh import refresh_dataset
from airflow_partitions.refresh.failures import FailureStore, PartitionFailure
from airflow_partitions.refresh.partition_states import partition_states
from airflow_partitions.spec import load_spec
from airflow_partitions.spec.masking import remember_secrets
from airflow_partitions.table import open_handle

pytestmark = pytest.mark.spark

REGIONS = [None, "EU", "a/b", "x=y", "ü ñ", ""]


def path_of(region: str | None) -> str:
    return PartitionKey((region,)).path(("region",))


def write_rows(directory: Path, name: str, regions: list[str | None], offset: int = 0) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    ids = list(range(offset, offset + 4 * len(regions)))
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array([regions[i % len(regions)] for i in range(len(ids))], pa.string()),
            "amount": pa.array([i * 0.5 for i in ids], pa.float64()),
        }
    )
    pq.write_table(table, directory / name)


@pytest.fixture
def spec_path(tmp_path: Path) -> Path:
    write_rows(tmp_path / "src", "a.parquet", REGIONS)
    path = tmp_path / "datasets.yaml"
    path.write_text(
        f"accelerator_dir: {tmp_path / 'acc'}\n"
        "datasets:\n"
        "  - name: sales\n"
        f"    from: file:{tmp_path / 'src'}/\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        "      partition_by:\n"
        "        - region: region\n"
    )
    return path


def states_by_path(spec_path: Path) -> dict[str, str]:
    project = load_spec(spec_path)
    report = partition_states(project, project.dataset("sales"))
    assert report.discovery_error is None
    return {p.key_path: str(p.state) for p in report.partitions}


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_states_follow_the_source_failures_and_commits(
    spark: Any, spec_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = load_spec(spec_path)
    dataset = project.dataset("sales")
    everything = {path_of(r) for r in REGIONS}
    assert states_by_path(spec_path) == dict.fromkeys(everything, "missing"), "nothing refreshed yet"

    refresh_dataset(project, dataset, spark=spark)
    assert states_by_path(spec_path) == dict.fromkeys(everything, "fresh")

    # New rows for EU, a new region (missing), and "x=y" gone from the source (removed). A flat file
    # source has one fingerprint for the whole source: every catalogued partition is stale now.
    source = spec_path.parent / "src"
    write_rows(source, "a.parquet", [r for r in REGIONS if r != "x=y"])
    write_rows(source, "b.parquet", ["EU", "new%"], offset=1000)
    # The new partition's directory is taken by a plain file: its write fails.
    blocker = spec_path.parent / "acc" / "sales" / path_of("new%")
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("in the way")
    with pytest.raises(PartitionsFailedError):
        refresh_dataset(project, dataset, spark=spark)

    expected = {
        **dict.fromkeys(everything, "stale"),
        path_of("x=y"): "removed",
        path_of("new%"): "failed",
    }
    assert states_by_path(spec_path) == expected, "nothing was committed: x=y still there"
    failure = FailureStore.for_catalog(open_handle(project, dataset).catalog).failures()[path_of("new%")]
    assert failure.error.startswith(("OSError", "FileExistsError", "NotADirectoryError", "RefreshError"))

    # The CLI's document is the core's: same states, same failure.
    document = cli_json(capsys, "status", str(spec_path), "sales", "--partitions", "--json")
    sales = document["datasets"][0]
    assert {p["key_path"]: p["state"] for p in sales["partitions"]} == expected
    assert sales["states"]["failed"] == 1
    assert sales["states"]["stale"] == len(REGIONS) - 1
    failed_row = next(p for p in sales["partitions"] if p["state"] == "failed")
    assert failed_row["failure"]["error"] == failure.error
    assert failed_row["rows"] is None, "a partition never committed has no rows yet"

    # refresh --failed writes exactly the failed partition; the stale ones stay stale, x=y stays.
    blocker.unlink()
    capsys.readouterr()
    assert main(["refresh", str(spec_path), "sales", "--failed", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["refreshed"] == 1
    assert states_by_path(spec_path) == {**expected, path_of("new%"): "fresh"}
    assert FailureStore.for_catalog(open_handle(project, dataset).catalog).failures() == {}
    capsys.readouterr()
    assert main(["refresh", str(spec_path), "sales", "--failed"]) == 0
    assert "nothing to do" in capsys.readouterr().err

    # A plain refresh publishes EU and removes x=y, which an older retained version still holds.
    refresh_dataset(project, dataset, spark=spark)
    after = states_by_path(spec_path)
    assert after.pop(path_of("x=y")) == "removed"
    assert set(after.values()) == {"fresh"}


def test_failure_records_are_masked_per_partition_and_cleared(tmp_path: Path) -> None:
    from airflow_partitions.objectstore import LocalStore

    remember_secrets(["hunter2-secret"])
    store = FailureStore(LocalStore(tmp_path), "a/b")
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    error = "cannot reach postgres://u:hunter2-secret@db/x"
    store.record(PartitionFailure("k=1", error, now, "d", "r", "t", 3))
    store.record(PartitionFailure("k=%2F", "boom", now))
    on_disk = b"".join(p.read_bytes() for p in tmp_path.rglob("*.json"))
    assert b"hunter2-secret" not in on_disk, "secrets never reach the failure store"
    found = store.failures()
    assert set(found) == {"k=1", "k=%2F"}
    assert found["k=1"].map_index == 3
    assert found["k=1"].dag_id == "d"
    store.clear(["k=1", "never-failed"])
    assert set(store.failures()) == {"k=%2F"}


def test_the_page_knows_a_refreshing_partition_by_every_name_a_run_gives_it() -> None:
    """A running refresh names its partitions by task label (readable key) and a run's conf or
    partition key by any accepted form: each marks the same catalog partition refreshing."""
    from airflow_partitions.plugins.page_data import key_spellings

    zurich = PartitionKey(("Zürich/a=b%", dt.datetime(2026, 1, 1)))
    path = zurich.path(["region", "day"])
    assert key_spellings(path) == {
        path,
        "region=Zürich%2Fa=b%25/day=2026-01-01T00:00:00",
        "Zürich/a=b%25|2026-01-01T00:00:00",
    }
    assert key_spellings(PartitionKey((None,)).path(["region"])) == {"region=%NULL", "%NULL"}
    assert key_spellings(PartitionKey(("",)).path(["region"])) == {"region=", "%EMPTY"}
