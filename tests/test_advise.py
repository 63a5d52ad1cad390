"""The partition advisor on a generated dataset with planted skew and a known workload.

`advise` must name the planted hot keys, and the layout it recommends must be the one a brute-force
replay confirms: every candidate it simulated is re-partitioned for real (a refresh of the same source
under that `partition_by`), the workload runs through the real reader, and the bytes of the files each
plan opens are counted. Shapes recorded without values (the default) must lead to the same answer. Sort
advice is checked against a real Parquet file written sorted by the advised column.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_partitions.advisor import advise
from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.read.read_stats import LOG_NAME, STATS_DIRECTORY, ReadStatsLog
from airflow_partitions.refresh import refresh_dataset

DATASET = "orders"
ROWS = 6000
USERS = 300
HOT = {"DE": 0.45, "FR": 0.30}
SMALL = [f"c{i:02d}" for i in range(17)] + ["a/b=c%'", "", "Ünï", "x y"]
TARGET_FILE_BYTES = 16 * 1024
ROW_GROUP_ROWS = 256


def make_source(root: Path) -> Path:
    rng = random.Random(7)
    countries: list[str | None] = []
    for _ in range(ROWS):
        draw = rng.random()
        if draw < HOT["DE"]:
            countries.append("DE")
        elif draw < HOT["DE"] + HOT["FR"]:
            countries.append("FR")
        elif draw < 0.99:
            countries.append(rng.choice(SMALL))
        else:
            countries.append(None)
    table = pa.table(
        {
            "id": pa.array([None if i % 401 == 0 else i for i in range(ROWS)], pa.int64()),
            "user_id": pa.array(
                [None if i % 503 == 0 else rng.randrange(USERS) for i in range(ROWS)], pa.int64()
            ),
            "country": pa.array(countries, pa.string()),
            "ts": pa.array(
                [dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=17 * i) for i in range(ROWS)],
                pa.timestamp("us", tz="UTC"),
            ),
            "amount": pa.array([rng.random() * 100 for _ in range(ROWS)], pa.float64()),
        }
    )
    src = root / "src"
    src.mkdir(parents=True)
    pq.write_table(table, src / "orders.parquet")
    return src


def write_spec(root: Path, src: Path, name: str, fields: Any, params: str = "") -> Path:
    lines = [
        f"accelerator_dir: {root / name}",
        "datasets:",
        f"  - name: {DATASET}",
        f"    from: file:{src}",
        "    params: {file_format: parquet}",
        "    acceleration:",
    ]
    if params:
        lines.append(f"      params: {{{params}}}")
    lines.append("      partition_by:")
    lines += [f"        - {field}: {json.dumps(expression)}" for field, expression in fields]
    path = root / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def workload() -> list[str]:
    rng = random.Random(11)
    lookups = [f"user_id = {rng.randrange(USERS)}" for _ in range(30)]
    by_country = [f"country = '{c}'" for c in ("c03", "c07", "c11", "Ünï", "c15")]
    return lookups + by_country


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("advise")
    src = make_source(root)
    spec = write_spec(root, src, "current", [("c", "country")], params="read_stats: literals")
    refresh_dataset(str(spec), DATASET, strategy="arrow")
    return {"root": root, "src": src, "spec": spec}


def run_workload(spec: Path) -> None:
    with PartitionedDatasetReader(spec, DATASET) as reader:
        for where in workload():
            reader.read(where)


def brute_force(
    root: Path, src: Path, candidates: list[Any], monkeypatch: pytest.MonkeyPatch
) -> dict[str, float]:
    """Bytes read per query of every candidate, re-partitioned for real and replayed through the reader
    (the rows checked against DuckDB over the source)."""
    monkeypatch.setenv("AP_READ_STATS", "0")
    source = duckdb.connect()
    source.execute(f"CREATE VIEW {DATASET} AS SELECT * FROM read_parquet('{src}/*.parquet')")
    measured: dict[str, float] = {}
    for number, candidate in enumerate(candidates):
        spec = write_spec(root, src, f"brute{number}", [tuple(f) for f in candidate.fields])
        refresh_dataset(str(spec), DATASET, strategy="arrow")
        total = 0
        with PartitionedDatasetReader(spec, DATASET) as reader:
            for where in workload():
                plan = reader.plan(where)
                total += sum(f.bytes for f in plan.files)
                (expected,) = source.execute(f"SELECT count(*) FROM {DATASET} WHERE {where}").fetchone()
                assert reader.read_plan(plan).num_rows == expected, f"{candidate.name}: {where}"
        measured[candidate.name] = total / len(workload())
    monkeypatch.delenv("AP_READ_STATS")
    return measured


def test_advise_names_the_hot_keys_and_the_layout_a_brute_force_replay_confirms(
    planted: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AP_READ_STATS", raising=False)
    spec = planted["spec"]
    run_workload(spec)
    advice = advise(spec, DATASET, target_file_bytes=TARGET_FILE_BYTES, row_group_rows=ROW_GROUP_ROWS)
    skewed = [item["key_path"] for item in advice.findings["skewed"]]
    assert skewed == ["c=DE", "c=FR"], "the planted hot keys, largest first"
    assert [k["key_path"] for k in advice.findings["top_keys"][:2]] == ["c=DE", "c=FR"]
    assert advice.workload["replayed"] == len(workload()), "recorded with values: replayed exactly"
    never = advice.findings["never_read"]
    assert never["count"] == 0, "the user_id lookups open every country"
    assert never["of"] == len(SMALL) + 3
    unpruned = [item["filter"] for item in advice.findings["prune_nothing"]]
    assert unpruned, "a filter on a non-partition column opens every partition"
    assert unpruned == ['"user_id" = ?'], "grouped by shape, not by value"
    # min / max statistics rule a few small countries out of some lookups: those pruned something.
    assert 20 <= advice.findings["prune_nothing"][0]["reads"] <= 30

    eligible = [c for c in advice.candidates if c.eligible]
    assert len(eligible) >= 4
    measured = brute_force(planted["root"], planted["src"], eligible, monkeypatch)
    best = min(measured, key=measured.__getitem__)
    assert advice.winner is not None
    assert not advice.winner.current, "the current layout reads every partition for a user_id lookup"
    assert measured[advice.winner.name] <= measured[best] * 1.05, (advice.winner.name, measured)
    assert measured[advice.winner.name] < measured["current"] / 2, measured
    # The simulated figures track the real ones: bytes per query within a fifth for every candidate.
    for candidate in eligible:
        assert candidate.bytes_per_query == pytest.approx(measured[candidate.name], rel=0.2), candidate.name
    yaml_text = advice.to_json()["partition_by_yaml"]
    assert yaml_text.startswith("partition_by:\n  - ")
    assert "user_id" in yaml_text

    # Recorded as shapes only (the default): values drawn from the data lead to the same layout.
    log = ReadStatsLog(Path(planted["root"]) / "current" / DATASET / STATS_DIRECTORY)
    assert log.path.name == LOG_NAME
    log.clear()
    monkeypatch.setenv("AP_READ_STATS", "1")
    run_workload(spec)
    assert log.records()[0]["filter"] == '"user_id" = ?'
    shapes = advise(spec, DATASET, target_file_bytes=TARGET_FILE_BYTES, row_group_rows=ROW_GROUP_ROWS)
    assert shapes.workload["sampled_shapes"] == 2
    assert shapes.winner is not None
    assert measured[shapes.winner.name] <= measured[best] * 1.05, (shapes.winner.name, measured)


def test_sort_advice_counts_the_row_groups_sorting_skips(
    planted: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AP_READ_STATS", raising=False)
    spec = planted["spec"]
    ReadStatsLog(Path(planted["root"]) / "current" / DATASET / STATS_DIRECTORY).clear()
    run_workload(spec)
    advice = advise(spec, DATASET, target_file_bytes=TARGET_FILE_BYTES, row_group_rows=ROW_GROUP_ROWS)
    (item,) = [a for a in advice.sort_advice if a["column"] == "user_id"]
    assert item["supported"] is True
    assert item["sort_by"] == ["user_id"]
    assert item["large_partitions"] == 2, "DE and FR are over two row groups"
    assert item["row_groups_read_sorted"] < item["row_groups_read_now"] / 3, item
    assert "sort_by: [user_id]" in item["text"]

    # The same layout written for real, sorted by user_id in ROW_GROUP_ROWS-row groups: the row groups
    # whose footer statistics can hold a looked-up user match the simulation.
    monkeypatch.setenv("AP_READ_STATS", "0")
    sorted_spec = write_spec(
        planted["root"],
        planted["src"],
        "sorted",
        [("c", "country")],
        params=f"sort_by: [user_id], row_group_rows: {ROW_GROUP_ROWS}",
    )
    refresh_dataset(str(sorted_spec), DATASET, strategy="arrow")
    lookups = [w for w in workload() if w.startswith("user_id")]
    read = 0
    for directory in ("c=DE", "c=FR"):
        (path,) = (planted["root"] / "sorted" / DATASET / directory).glob("*.parquet")
        metadata = pq.ParquetFile(path).metadata
        column = metadata.schema.names.index("user_id")
        for where in lookups:
            value = int(where.split("=")[1])
            for group in range(metadata.num_row_groups):
                stats = metadata.row_group(group).column(column).statistics
                read += int(stats is None or not stats.has_min_max or stats.min <= value <= stats.max)
    real = read / len(lookups)
    assert item["row_groups_read_sorted"] == pytest.approx(real, abs=0.5), (item, real)


def test_status_partitions_flags_the_skewed_partitions(planted: dict[str, Any]) -> None:
    """`status --partitions --json`, the Partitions page's document, marks the planted hot keys."""
    from airflow_partitions.cli.status import dataset_status
    from airflow_partitions.spec import load_spec

    project = load_spec(planted["spec"])
    report = dataset_status(project, project.dataset(DATASET), partitions=True)
    assert sorted(p["key_path"] for p in report["partitions"] if p["skew"]) == ["c=DE", "c=FR"]
    assert report["layout"]["skewed_count"] == 2
    assert report["layout"]["files"] == len(report["partitions"])


def test_advise_command_prints_text_and_json(
    planted: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow_partitions.cli.main import main

    spec = str(planted["spec"])
    assert main(["advise", spec, DATASET, "--json", "--target-file-bytes", str(TARGET_FILE_BYTES)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [s["key_path"] for s in document["findings"]["skewed"]] == ["c=DE", "c=FR"]
    assert document["winner"]["name"] in {c["name"] for c in document["candidates"]}
    assert main(["advise", spec, DATASET, "--target-file-bytes", str(TARGET_FILE_BYTES)]) == 0
    text = capsys.readouterr().out
    assert "SKEW: 2 partition(s)" in text
    assert "recommended: " in text
    assert "partition_by:" in text
    assert main(["advise", spec, DATASET, "--target-file-bytes", "0"]) == 2, "a typed error, exit 2"
    assert "target_file_bytes must be a positive integer" in capsys.readouterr().err
