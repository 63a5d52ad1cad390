"""Read statistics: every read and query appends one record (filter shape, pruning, rows, time) to a bounded
log beside the catalog; literals only when asked; switched off by `AP_READ_STATS=0` or
`acceleration.params.read_stats: false`; concurrent writers never corrupt it; a torn line is skipped.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_partitions.exceptions import SpecValidationError
from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.read.read_stats import (
    LOG_NAME,
    STATS_DIRECTORY,
    ReadRecord,
    ReadStatsLog,
    add_metrics_sink,
    remove_metrics_sink,
)
from airflow_partitions.refresh import refresh_dataset

DATASET = "ev"
SECRET = "secret-ü/=%'x"


def make_dataset(root: Path, *, params: str = "") -> Path:
    src = root / "src"
    src.mkdir(parents=True)
    n = 400
    table = pa.table(
        {
            "id": pa.array([None if i % 97 == 0 else i for i in range(n)], pa.int64()),
            "user": pa.array(
                [None if i % 31 == 0 else (SECRET if i == 5 else f"u{i % 20}") for i in range(n)]
            ),
            "ts": pa.array(
                [dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(hours=i) for i in range(n)],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )
    pq.write_table(table, src / "a.parquet")
    spec = root / "s.yaml"
    lines = [
        f"accelerator_dir: {root / 'acc'}",
        "datasets:",
        f"  - name: {DATASET}",
        f"    from: file:{src}",
        "    params: {file_format: parquet}",
        "    acceleration:",
    ]
    if params:
        lines.append(f"      params: {{{params}}}")
    lines += ["      partition_by:", '        - b: "bucket(4, user)"']
    spec.write_text("\n".join(lines) + "\n", encoding="utf-8")
    refresh_dataset(str(spec), DATASET, strategy="arrow")
    return spec


def log_path(root: Path) -> Path:
    return root / "acc" / DATASET / STATS_DIRECTORY / LOG_NAME


def test_reads_and_queries_record_shape_pruning_rows_without_literals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AP_READ_STATS", raising=False)
    spec = make_dataset(tmp_path)
    seen: list[ReadRecord] = []
    add_metrics_sink(seen.append)
    try:
        with PartitionedDatasetReader(spec, DATASET) as reader:
            point = reader.read(f"\"user\" = '{SECRET.replace(chr(39), chr(39) * 2)}'")
            window = reader.read("ts >= '2026-01-02' AND ts < '2026-01-03'")
            counted = reader.query("SELECT count(*) AS n FROM ev WHERE id IN (1, 2, 3) OR id IS NULL")
            everything = reader.read()
    finally:
        remove_metrics_sink(seen.append)
    assert point.num_rows == 1
    text = log_path(tmp_path).read_text(encoding="utf-8")
    assert SECRET not in text, "literals are not recorded unless asked"
    assert "2026-01-02" not in text
    records = ReadStatsLog(log_path(tmp_path).parent).records()
    assert [r["kind"] for r in records] == ["read", "read", "query", "read"]
    first, second, third, fourth = records
    assert first["filter"] == '"user" = ?'
    assert first["columns"] == ["user"]
    assert first["ops"] == ["="]
    assert first["partitions"] == 1, "a point read opens one bucket"
    assert first["partitions_total"] >= 4
    # Four buckets and the NULL partition (NULL users), one file each.
    assert first["files"] == 1
    assert first["files_total"] == 5
    assert first["rows"] == 1
    assert first["bytes"] > 0
    assert first["ms"] > 0
    # A two-sided range keeps its width (not its values): a one-day window.
    assert second["tree"][0] == "range"
    assert second["tree"][-1] == 86400.0
    assert second["rows"] == window.num_rows == 24
    assert set(third["ops"]) >= {"IN", "IS NULL", "OR"}
    assert third["rows"] == counted.num_rows == 1
    assert fourth["filter"] is None
    assert fourth["rows"] == everything.num_rows == 400
    assert [r.rows for r in seen] == [1, 24, 1, 400], "the metrics sinks see every record"


def test_literals_are_recorded_when_asked_and_replay_the_filter(tmp_path: Path, monkeypatch) -> None:
    from airflow_partitions.read.read_stats import filter_sql

    monkeypatch.delenv("AP_READ_STATS", raising=False)
    spec = make_dataset(tmp_path, params="read_stats: literals")
    where = "ts >= '2026-01-02T05:00:00+00:00' AND ts < '2026-01-03' AND \"user\" IN ('u1', 'u2')"
    with PartitionedDatasetReader(spec, DATASET) as reader:
        expected = reader.read(where)
        (record,) = ReadStatsLog(log_path(tmp_path).parent).records()
        replayed = reader.read(filter_sql(record["tree"]))
    assert "'u1'" in record["filter"]
    assert replayed.sort_by("id").equals(expected.sort_by("id")), "the recorded filter reads the same rows"


@pytest.mark.parametrize(("env", "params"), [("0", ""), ("", "read_stats: false")])
def test_read_stats_switch_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str, params: str
) -> None:
    monkeypatch.setenv("AP_READ_STATS", env)
    spec = make_dataset(tmp_path, params=params)
    with PartitionedDatasetReader(spec, DATASET) as reader:
        reader.read("id = 3")
    assert not log_path(tmp_path).exists()


def test_bad_switches_are_typed_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_partitions.spec import load_spec

    monkeypatch.delenv("AP_READ_STATS", raising=False)
    spec = make_dataset(tmp_path)
    text = spec.read_text(encoding="utf-8").replace(
        "    acceleration:\n", "    acceleration:\n      params: {read_stats: maybe}\n"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(text, encoding="utf-8")
    with pytest.raises(SpecValidationError, match="read_stats must be true"):
        load_spec(bad)
    monkeypatch.setenv("AP_READ_STATS", "sometimes")
    with pytest.raises(SpecValidationError, match="AP_READ_STATS"):
        PartitionedDatasetReader(spec, DATASET)


def _append_many(directory: str, writer: int, count: int) -> None:
    log = ReadStatsLog(Path(directory), max_bytes=10**9)
    for number in range(count):
        log.append({"partitions": number, "writer": writer, "pad": "x" * 300})


def test_concurrent_writers_interleave_whole_lines_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    directory = tmp_path / STATS_DIRECTORY
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_append_many, args=(str(directory), w, 300)) for w in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
        assert worker.exitcode == 0
    log = ReadStatsLog(directory, max_bytes=10**9)
    records = log.records()
    assert len(records) == 1200
    for writer in range(4):
        assert [r["partitions"] for r in records if r["writer"] == writer] == list(range(300))
    # A writer that died mid-line leaves a torn record: it is skipped, and the next record is intact.
    with open(log.path, "ab") as handle:
        handle.write(b'\n{"partitions": 9, "wri')
    log.append({"partitions": 1, "writer": 99})
    records = log.records()
    assert len(records) == 1201
    assert records[-1]["writer"] == 99


def test_the_log_is_bounded(tmp_path: Path) -> None:
    log = ReadStatsLog(tmp_path, max_bytes=4096)
    for number in range(500):
        log.append({"partitions": number, "pad": "y" * 100})
    sizes = [p.stat().st_size for p in (log.path, log.rotated) if p.exists()]
    assert log.rotated.exists()
    assert sum(sizes) <= 2 * 4096 + 200
    numbers = [r["partitions"] for r in log.records()]
    assert numbers == sorted(numbers), "the newest records are kept, in order"
    assert numbers[-1] == 499


def test_a_read_only_log_directory_never_fails_a_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AP_READ_STATS", raising=False)
    spec = make_dataset(tmp_path)
    directory = log_path(tmp_path).parent
    directory.parent.joinpath(STATS_DIRECTORY).write_text("not a directory")  # where the log would go
    with PartitionedDatasetReader(spec, DATASET) as reader:
        assert reader.read("id = 3").num_rows == 1
    assert directory.is_file(), "nothing was written in its place"


def test_hook_reads_reach_a_statsd_listener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads through the hook (the Airflow layer) become Airflow Stats metrics on a real StatsD socket."""
    from airflow.sdk._shared.observability.metrics import stats as shared
    from test_operators import StatsdListener

    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook
    from airflow_partitions.hooks.stats import record_read

    monkeypatch.delenv("AP_READ_STATS", raising=False)
    spec = make_dataset(tmp_path)
    listener = StatsdListener()
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PORT", str(listener.port))
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PREFIX", "airflow")
    monkeypatch.setattr(shared, "_factory", None)
    monkeypatch.setattr(shared, "_backend", None)
    hook = PartitionedDatasetHook(dataset=DATASET, spec_path=str(spec))
    try:
        assert hook.read("id = 3").num_rows == 1
        assert hook.read("id >= 0").num_rows == 395  # five NULL ids (i % 97 == 0); every bucket opened
        assert listener.wait_for("airflow.dataset_acceleration_read_rows.ev", 2) == [(1.0, "c"), (395.0, "c")]
        logged = ReadStatsLog(log_path(tmp_path).parent).records()
        files = listener.wait_for("airflow.dataset_acceleration_read_files.ev", 2)
        assert files == [(float(r["files"]), "c") for r in logged], "the same figures as the log"
        durations = listener.wait_for("airflow.dataset_acceleration_read_duration.ev", 2)
        assert all(kind == "ms" for _value, kind in durations)
        assert listener.wait_for("airflow.dataset_acceleration_read_unpruned.ev", 1) == [(1.0, "c")]
    finally:
        hook.reader.close()
        remove_metrics_sink(record_read)
        listener.close()
