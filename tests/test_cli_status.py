"""`airflow-partitions status` and `vacuum` on a real spec file and real catalogs."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_partitions.catalog import Catalog, PartitionEntry, PartitionSpecInfo, open_catalog
from airflow_partitions.cli.main import main
from airflow_partitions.cli.vacuum import parse_duration
from airflow_partitions.exceptions import CatalogError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.spec import load_spec

SPEC_TEXT = """\
accelerator_dir: accel
datasets:
  - name: sales
    from: file:data/
    params: {file_format: parquet}
    acceleration:
      engine: parquet
      partition_by:
        - region: region
  - name: events
    from: file:events/
    params: {file_format: parquet}
    acceleration:
      engine: duckdb
      partition_by:
        - bucket(4, id)
      params: {partition_mode: tables}
"""


@pytest.fixture
def spec_path(tmp_path: Path) -> Path:
    path = tmp_path / "datasets.yaml"
    path.write_text(SPEC_TEXT)
    return path


def sales_catalog(spec_path: Path) -> tuple[Catalog, PartitionSpecInfo]:
    project = load_spec(spec_path)
    dataset = project.dataset("sales")
    catalog = open_catalog(project, dataset)
    spec = PartitionSpecInfo.from_fields(
        [(f.name, f.canonical, "string") for f in dataset.acceleration.partition_by]
    )
    assert spec.spec_id == dataset.acceleration.partition_spec_id
    return catalog, spec


def refresh(
    catalog: Catalog,
    spec: PartitionSpecInfo,
    rows_by_region: dict[str, int],
    refreshed_at: dt.datetime | None = None,
) -> int:
    assert catalog.storage is not None
    assert catalog.data_root is not None
    entries = []
    for region, rows in rows_by_region.items():
        key = PartitionKey((region,))
        table = pa.table({"region": [region] * rows, "amount": list(range(rows))})
        files = catalog.storage.write(table, catalog.data_root, key.path(spec.names))
        entries.append(
            PartitionEntry.from_files(
                key, spec, files, source_fingerprint=f"{region}:{rows}", refreshed_at=refreshed_at
            )
        )
    newest = catalog.latest()
    return catalog.commit(
        base_version=newest.version if newest else None, upserts=entries, partition_spec=spec
    )


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_status_reports_versions_partitions_rows_and_bytes(
    spec_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog, spec = sales_catalog(spec_path)
    refresh(catalog, spec, {"eu": 3, "us": 5})
    refresh(catalog, spec, {"eu": 4, "a/b=c": 1})
    code, out = run_cli(capsys, "status", str(spec_path))
    assert code == 0
    assert "sales  (engine parquet;" in out
    assert "version       2 (refresh" in out
    assert "2 retained from 1" in out
    assert "partitions    3\n" in out
    assert "rows          10\n" in out
    assert "events  (engine duckdb, partition_mode tables;" in out
    assert "no committed version yet" in out

    code, out = run_cli(capsys, "status", str(spec_path), "sales", "--json", "--partitions")
    report = json.loads(out)["datasets"]
    assert [d["name"] for d in report] == ["sales"]
    sales = report[0]
    snapshot = Catalog(catalog.store, "sales").snapshot()
    assert sales["latest_version"] == 2
    assert sales["partition_count"] == 3
    assert sales["rows"] == 10
    assert sales["bytes"] == snapshot.total_bytes > 0
    assert sales["spec_matches_catalog"] is True
    assert [v["version"] for v in sales["recent_versions"]] == [1, 2]
    assert sales["recent_versions"][1]["partitions_changed"] == 2
    assert {p["key"]: p["rows"] for p in sales["partitions"]} == {
        "region=a%2Fb=c": 1,
        "region=eu": 4,
        "region=us": 5,
    }

    code, out = run_cli(capsys, "status", str(spec_path), "sales", "--partitions")
    assert "region=a%2Fb=c" in out
    assert "region=us" in out


def test_status_warns_when_partition_by_changed(spec_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    catalog, spec = sales_catalog(spec_path)
    refresh(catalog, spec, {"eu": 1})
    spec_path.write_text(SPEC_TEXT.replace("- region: region", '- region: "truncate(2, region)"', 1))
    code, out = run_cli(capsys, "status", str(spec_path), "sales")
    assert code == 0
    assert "WARNING: partition_by in the spec differs" in out
    assert "refresh --full" in out


def test_vacuum_cli_dry_run_then_retain_versions(spec_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    catalog, spec = sales_catalog(spec_path)
    for rows in (1, 2, 3):
        refresh(catalog, spec, {"eu": rows})
    assert catalog.data_root is not None
    files_before = sorted(p for p in catalog.data_root.rglob("part-*"))
    old = dt.datetime.now().timestamp() - 3 * 3600
    for path in files_before:
        os.utime(path, (old, old))
    code, out = run_cli(
        capsys, "vacuum", str(spec_path), "sales", "--retain-versions", "1", "--grace", "0s", "--dry-run"
    )
    assert code == 0
    assert "dry run" in out
    assert "would delete 2 (1..2)" in out
    assert sorted(catalog.data_root.rglob("part-*")) == files_before

    code, out = run_cli(
        capsys, "vacuum", str(spec_path), "sales", "--retain-versions", "1", "--grace", "0s", "--json"
    )
    report: dict[str, Any] = json.loads(out)
    assert report["removed_versions"] == [1, 2]
    assert report["oldest_retained_version"] == 3
    assert len(report["removed_files"]) == 2
    assert report["bytes_freed"] > 0
    remaining = Catalog(catalog.store, "sales").latest()
    assert remaining is not None
    (entry,) = remaining.partitions.values()
    assert sorted(catalog.data_root.rglob("part-*")) == [catalog.data_root / entry.files[0].path]

    code, out = run_cli(capsys, "vacuum", str(spec_path), "events")
    assert code == 0
    assert "nothing to vacuum" in out


def test_vacuum_cli_rejects_bad_arguments(spec_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["--retain-versions", "0"],
        ["--older-than", "soon"],
        ["--retain-versions", "2", "--older-than", "1d"],
    ):
        with pytest.raises(SystemExit) as exited:
            main(["vacuum", str(spec_path), "sales", *argv])
        assert exited.value.code == 2
    assert "error" in capsys.readouterr().err
    assert main(["status", str(spec_path), "nope"]) == 2
    assert "no dataset 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7d", dt.timedelta(days=7)),
        ("12h", dt.timedelta(hours=12)),
        ("1d12h", dt.timedelta(days=1, hours=12)),
        ("30m", dt.timedelta(minutes=30)),
        ("45s", dt.timedelta(seconds=45)),
        ("2w", dt.timedelta(weeks=2)),
        ("1.5h", dt.timedelta(minutes=90)),
        ("0s", dt.timedelta(0)),
    ],
)
def test_parse_duration(text: str, expected: dt.timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "7", "d", "7 days", "-1h", "1h-", "7x"])
def test_parse_duration_rejects_garbage(text: str) -> None:
    with pytest.raises(CatalogError, match="invalid duration"):
        parse_duration(text)


@pytest.mark.s3
def test_catalog_location_on_s3_keeps_files_local(
    spec_path: Path,
    s3_server: dict[str, Any],
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import boto3

    monkeypatch.setenv("AIRFLOW_PARTITIONS_CATALOG_URL", f"s3://{s3_bucket}/team")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server["endpoint_url"])
    catalog, spec = sales_catalog(spec_path)
    assert catalog.store.describe() == f"s3://{s3_bucket}/team"
    for rows in range(1, 12):
        refresh(catalog, spec, {"eu": rows})
    keys = [o["Key"] for o in boto3.client("s3", **s3_server).list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert keys
    assert all(k.startswith("team/sales/_catalog/") for k in keys)
    assert catalog.data_root == spec_path.parent / "accel" / "sales"
    assert list(catalog.data_root.rglob("part-*.parquet"))
    code, out = run_cli(capsys, "status", str(spec_path), "sales", "--json")
    assert code == 0
    report = json.loads(out)["datasets"][0]
    assert report["catalog"] == f"s3://{s3_bucket}/team/sales/_catalog"
    assert report["latest_version"] == 11
    assert report["rows"] == 11
    assert list((catalog.data_root / "_catalog_cache").iterdir()), "the checkpoint was cached on the host"


@pytest.mark.s3
def test_vacuum_cli_snapshots_with_the_same_retention(
    tmp_path: Path,
    s3_server: dict[str, str],
    s3_bucket: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_partitions.snapshots import upload_partition_snapshot, upload_snapshot_manifest

    location = f"s3://{s3_bucket}/snap"
    path = tmp_path / "datasets.yaml"
    path.write_text(
        SPEC_TEXT.replace(
            "        - region: region\n",
            f"        - region: region\n      snapshots: {{mode: enabled, location: '{location}'}}\n",
            1,
        )
    )
    catalog, spec = sales_catalog(path)
    assert catalog.data_root is not None
    for rows in (1, 2, 3):
        refresh(catalog, spec, {"eu": rows})
        snapshot = catalog.latest()
        assert snapshot is not None
        for entry in snapshot.partitions.values():
            upload_partition_snapshot(s3_server, location, catalog.data_root, entry, dataset="sales")
        upload_snapshot_manifest(s3_server, location, "sales", snapshot)
    # The CLI reaches S3 the way the AWS tools do: endpoint and keys from the environment.
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server["endpoint_url"])

    code, out = run_cli(
        capsys, "vacuum", str(path), "sales", "--snapshots", "--retain-versions", "1", "--dry-run"
    )
    assert code == 0
    assert "newest version 3, retained 1, 2, 3" in out, "everything is within the 1 h grace period"

    code, out = run_cli(
        capsys,
        "vacuum",
        str(path),
        "sales",
        "--snapshots",
        "--retain-versions",
        "1",
        "--grace",
        "0s",
        "--json",
    )
    assert code == 0
    document = json.loads(out)
    assert document["snapshots"]["expired_versions"] == [1, 2]
    assert document["snapshots"]["deleted_objects"] == 2
    assert document["removed_versions"] == [1, 2], "the catalog is vacuumed with the same retention"

    assert main(["vacuum", str(path), "events", "--snapshots"]) == 2
    assert "only the owner of a snapshot" in capsys.readouterr().err


def test_vacuum_cli_compacts_the_shared_tables_file_and_reports_its_bytes(
    spec_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow_partitions.refresh.commit import partition_spec_info

    project = load_spec(spec_path)
    dataset = project.dataset("events")
    catalog = open_catalog(project, dataset)
    spec = partition_spec_info(dataset)
    assert catalog.storage is not None
    assert catalog.data_root is not None
    shared = Path(catalog.data_root) / "_tables.duckdb"
    for version in range(6):
        entries = []
        for bucket in range(4):
            key = PartitionKey((bucket,))
            ids = range(version * 10_000 + bucket, version * 10_000 + 3000, 4)
            table = pa.table({"id": list(ids), "note": [f"'v{version}' \"{i}\" ✓" for i in ids]})
            files = catalog.storage.write(table, catalog.data_root, key.path(spec.names))
            published = catalog.storage.publish(catalog.data_root, files)
            entries.append(PartitionEntry.from_files(key, spec, published))
        newest = catalog.latest()
        catalog.commit(base_version=newest.version if newest else None, upserts=entries, partition_spec=spec)
    before = shared.stat().st_size

    code, out = run_cli(
        capsys, "vacuum", str(spec_path), "events", "--retain-versions", "1", "--grace", "0s", "--json"
    )
    assert code == 0
    (compaction,) = json.loads(out)["shared_files"]
    assert compaction["path"] == "_tables.duckdb"
    assert compaction["bytes_before"] == before
    assert compaction["bytes_after"] == shared.stat().st_size
    assert compaction["compacted"] is True
    assert compaction["bytes_after"] < before / 2, compaction

    code, out = run_cli(capsys, "vacuum", str(spec_path), "events", "--retain-versions", "1", "--grace", "0s")
    assert code == 0
    assert "shared file  _tables.duckdb" in out


def test_freshness_sla_counts_partitions_refreshed_too_long_ago(
    spec_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`freshness: 2h`: partitions last refreshed more than 2 hours ago miss the SLA (status and the page)."""
    spec_path.write_text(SPEC_TEXT.replace("  - name: sales\n", "  - name: sales\n    freshness: 2h\n"))
    catalog, spec = sales_catalog(spec_path)
    refresh(catalog, spec, {"eu": 3, "us": 5})
    code, out = run_cli(capsys, "status", str(spec_path), "sales", "--json")
    assert code == 0
    assert json.loads(out)["datasets"][0]["freshness"] == {
        "sla_seconds": 7200,
        "overdue": 0,
        "overdue_partitions": [],
        "met": True,
    }
    # EU last refreshed three hours ago: past the 2h SLA; US is recent.
    refresh(catalog, spec, {"eu": 4}, refreshed_at=dt.datetime.now(dt.UTC) - dt.timedelta(hours=3))
    code, out = run_cli(capsys, "status", str(spec_path), "sales", "--json")
    freshness = json.loads(out)["datasets"][0]["freshness"]
    assert freshness["overdue"] == 1
    assert not freshness["met"]
    assert freshness["overdue_partitions"] == ["region=eu"]


@pytest.mark.parametrize(("text", "message"), [("soon", "invalid duration 'soon'"), ("0h", "longer than 0")])
def test_a_bad_freshness_is_refused_with_how_to_write_one(spec_path: Path, text: str, message: str) -> None:
    from airflow_partitions.exceptions import SpecValidationError

    spec_path.write_text(SPEC_TEXT.replace("  - name: sales\n", f"  - name: sales\n    freshness: {text}\n"))
    with pytest.raises(SpecValidationError, match=message):
        load_spec(spec_path)
