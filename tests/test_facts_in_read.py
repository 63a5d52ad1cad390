"""A forced refresh (a selection, or every partition) that streams a flat file source learns the per-file
facts of new or changed files while it routes their rows, instead of reading them once more for the
survey: the facts kept, and the fingerprints recorded, are those a survey reading the files gives.

After a `partition_by` change every file's facts are relearnt under the new transforms: the first
selective refresh then reads the source once, not twice.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest
from matrix_support import MatrixSource, key_path, rows_by_key
from test_changed_files import month_rows
from test_conservation_matrix import DATASET, check_equals_source, write_spec

from airflow_partitions.catalog import open_catalog
from airflow_partitions.refresh import plan_refresh, refresh_dataset
from airflow_partitions.refresh.arrow_stream import learn_facts_in_read, settled_plan
from airflow_partitions.sources import keep_file_facts, open_dataset_source
from airflow_partitions.sources.base import Deadline
from airflow_partitions.sources.file_facts import (
    STATE_FILE,
    FactsLearner,
    FileFactsState,
    facts_context,
    learn_facts,
)
from airflow_partitions.spec import load_spec
from airflow_partitions.transforms import parse_transform
from airflow_partitions.write.routing import partition_groups

BUCKETS = [("b", "bucket(8, n_int)")]


def hostile(seed: int, count: int) -> pa.Table:
    """Rows over several months, NULLs in every column (the partition column too)."""
    return pa.concat_tables(month_rows(seed, month, count, with_nulls=True) for month in (1, 2, 3))


def test_facts_learnt_batch_by_batch_equal_those_of_one_read() -> None:
    table = hostile(3, 15)
    table = table.set_column(1, "n_int", pa.array([None if i % 5 == 0 else i * 7 for i in range(len(table))]))
    expressions = [
        "bucket(8, n_int)",
        "truncate(2, s)",
        "date_trunc('day', ts)",
        "bucket(3, amount)",
        "ts_naive",
        "d",
    ]
    transforms = [
        parse_transform(text).bind(table.schema.field(parse_transform(text).source_columns[0]).type)
        for text in expressions
    ]
    whole = learn_facts(table, transforms)
    for size in (1, 4, 13, len(table)):
        learner = FactsLearner(table.schema, transforms)
        learner.add(table.schema.empty_table(), [])  # a file's leading empty table adds nothing
        for start in range(0, len(table), size):
            batch = table.slice(start, size)
            _, keys = partition_groups(batch, transforms)
            learner.add(batch, [key.values for key in keys])
        learnt = learner.facts()
        assert learnt.rows == whole.rows
        assert whole.keys is not None
        assert learnt.keys is not None
        assert set(learnt.keys) == set(whole.keys), f"batches of {size}: other keys"
        assert learnt.stats == whole.stats, f"batches of {size}: other column statistics"


def _fresh_source(spec: Path) -> object:
    project = load_spec(spec)
    dataset = project.dataset(DATASET)
    return keep_file_facts(open_dataset_source(dataset), Path(project.accelerator_dir) / DATASET)


def _recorded(spec: Path) -> dict[str, str | None]:
    project = load_spec(spec)
    snapshot = open_catalog(project, project.dataset(DATASET)).snapshot()
    return {path: entry.source_fingerprint for path, entry in snapshot.partitions.items()}


def _surveyed(spec: Path, paths: set[str]) -> dict[str, str]:
    """The fingerprints of `paths` as an ordinary survey gives them (reading every file's facts; the kept
    facts are left as they were)."""
    project = load_spec(spec)
    state = Path(project.accelerator_dir) / DATASET / STATE_FILE
    kept = state.read_bytes() if state.exists() else None
    try:
        state.unlink(missing_ok=True)
        surveying = _fresh_source(spec)
        plan = plan_refresh(project, DATASET, partitions=sorted(paths), source=surveying)  # type: ignore[arg-type]
        assert surveying.facts_reads, "the survey read the files"  # type: ignore[attr-defined]
    finally:
        state.unlink(missing_ok=True)
        if kept is not None:
            state.write_bytes(kept)
    return {item.key_path: item.fingerprint for item in plan.items}


@pytest.mark.parametrize("kind", ["parquet", "csv"])
def test_a_selective_refresh_learns_new_files_in_its_read(kind: str, tmp_path: Path) -> None:
    source = MatrixSource(kind, tmp_path)
    source.write([hostile(1, 8), hostile(2, 8)])
    spec = write_spec(tmp_path, source, "parquet", BUCKETS)
    refresh_dataset(spec, DATASET, strategy="arrow")
    added = hostile(5, 6)
    source._write_chunk(3, added)
    wanted = sorted(rows_by_key(added, BUCKETS))[0]
    reading = _fresh_source(spec)
    refresh_dataset(spec, DATASET, partitions=[wanted], strategy="arrow", source=reading)  # type: ignore[arg-type]
    assert reading.facts_reads == [], "the new file's facts come from the refresh's own read"  # type: ignore[attr-defined]
    # Recorded as a survey reading the new file records it: the next plan reads no file and refreshes
    # the new file's other buckets only.
    later = _fresh_source(spec)
    plan = plan_refresh(load_spec(spec), DATASET, source=later)  # type: ignore[arg-type]
    assert later.facts_reads == [], "the facts learnt in the read were kept"  # type: ignore[attr-defined]
    assert {item.key_path for item in plan.items} == set(rows_by_key(added, BUCKETS)) - {wanted}
    assert _recorded(spec)[wanted] == _surveyed(spec, {wanted})[wanted]
    refresh_dataset(spec, DATASET, strategy="arrow")
    check_equals_source(spec, source.expected(), BUCKETS, filters=6, seed=4)


def test_first_refresh_after_a_partition_by_change_reads_the_source_once(tmp_path: Path) -> None:
    source = MatrixSource("parquet", tmp_path)
    source.write([hostile(1, 10), hostile(2, 10), hostile(3, 10)])
    spec = write_spec(tmp_path, source, "parquet", BUCKETS)
    refresh_dataset(spec, DATASET, strategy="arrow")
    wider = [("b", "bucket(16, n_int)")]
    spec = write_spec(tmp_path, source, "parquet", wider)
    rng = random.Random(32)
    selected = {key_path((rng.randrange(16),), wider), key_path((None,), wider)}
    reading = _fresh_source(spec)
    refresh_dataset(spec, DATASET, partitions=sorted(selected), strategy="arrow", source=reading)  # type: ignore[arg-type]
    assert reading.facts_reads == [], "no survey read of the files under the new partition_by"  # type: ignore[attr-defined]
    project = load_spec(spec)
    dataset = project.dataset(DATASET)
    state = reading.facts_state  # type: ignore[attr-defined]
    transforms = [f.transform for f in dataset.acceleration.partition_by]
    schema = reading.schema()  # type: ignore[attr-defined]
    bound = [t.bind(schema.field(t.source_columns[0]).type) for t in transforms]
    kept = state.load(facts_context(schema, bound))
    assert len(kept) == 3, "every file's facts kept under the new partition_by"
    # Against an ordinary survey of the same files (every file read for its facts).
    surveying = open_dataset_source(dataset)
    surveying.facts_state = FileFactsState(None)  # type: ignore[attr-defined]
    survey = surveying.survey(bound, need_keys=False, check_column=None, deadline=Deadline(None))
    assert len(surveying.facts_reads) == 3  # type: ignore[attr-defined]
    recorded = _recorded(spec)
    for path in selected:
        key = next(k for k in [(None,), *[(i,) for i in range(16)]] if key_path(k, wider) == path)
        assert recorded[path] == survey.fingerprint(key), f"{path}: recorded another fingerprint"
    refresh_dataset(spec, DATASET, strategy="arrow")
    check_equals_source(spec, source.expected(), wider, filters=6, seed=5)


def test_a_refresh_without_a_streamed_read_reads_the_pending_facts(tmp_path: Path) -> None:
    source = MatrixSource("parquet", tmp_path)
    source.write([hostile(1, 8), hostile(2, 8)])
    spec = write_spec(tmp_path, source, "parquet", BUCKETS)
    refresh_dataset(spec, DATASET, strategy="arrow")
    added = hostile(4, 5)
    source._write_chunk(3, added)
    paths = [key_path((i,), BUCKETS) for i in range(8)]
    expected = _surveyed(spec, set(paths))
    deferring = _fresh_source(spec)
    learn_facts_in_read(deferring)  # type: ignore[arg-type]
    plan = plan_refresh(load_spec(spec), DATASET, partitions=paths, source=deferring)  # type: ignore[arg-type]
    assert deferring.facts_reads == []  # type: ignore[attr-defined]
    doubted = {item.key_path: item.fingerprint for item in plan.items}
    # Until learnt, the new file can feed every partition: the fingerprints of those it does not feed
    # hold it too (and so differ from the survey's), the others are the survey's.
    fed = set(rows_by_key(added, BUCKETS))
    assert {path for path in paths if doubted[path] != expected[path]} == set(paths) - fed
    settled = settled_plan(plan, deferring, None)  # type: ignore[arg-type]
    assert deferring.facts_reads == ["chunk3-v0.parquet"]  # type: ignore[attr-defined]
    assert {item.key_path: item.fingerprint for item in settled.items} == expected
