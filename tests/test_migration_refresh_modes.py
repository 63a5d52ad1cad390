"""Watermark refreshes during a re-partitioning: `refresh_mode: append` and `changes` stay incremental
(no full rebuild), move into the current layout only the old partitions holding rows of the partitions
they change, and never leave a row in two layouts or in none.

After every step a full read equals the source and 30 random filters equal DuckDB over the source
(`test_repartition.Scenario.check`), on the hostile rows of `matrix_support` (NULLs in partition columns,
unicode, `/ = %`, quotes, timestamps with offsets).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from matrix_support import SCHEMA
from test_repartition import TRANSITIONS, Scenario

from airflow_partitions.catalog import open_catalog
from airflow_partitions.refresh.pipeline import refresh_dataset
from airflow_partitions.write.routing import route_to_paths

APPEND_TRANSITIONS = ["bucket-8-to-16", "day-to-month"]


class AppendScenario(Scenario):
    """`refresh_mode: append` on the watermark `id` (new rows get larger ids; late rows smaller ones)."""

    MODE = "      refresh_mode: append\n      refresh: {watermark_column: id, late_rows: rewrite}\n"

    def __init__(self, root: Path, seed: int, partition_by: list[str], spark: Any) -> None:
        super().__init__(root, seed, partition_by)
        self.spark = spark
        self.add_mode()
        self.late_id = 10**12 - 1

    def add_mode(self) -> None:
        text = self.spec.read_text(encoding="utf-8")
        self.spec.write_text(text.replace("      engine: parquet\n", "      engine: parquet\n" + self.MODE))

    def set_partition_by(self, partition_by: list[str]) -> None:
        super().set_partition_by(partition_by)
        self.add_mode()

    def versions(self) -> list[Any]:
        project = self.project
        return open_catalog(project, project.dataset("events")).versions()

    def landing_in_one_partition(self, rows: pa.Table) -> pa.Table:
        """The rows of `rows` routed (under the current partition_by) to its most frequent non-NULL key."""
        bound = self.dataset().bind(SCHEMA)
        transforms = [f.transform for f in bound.acceleration.partition_by]
        routed = route_to_paths(rows, transforms, bound.acceleration.partition_names)
        groups = [part for path, (_, part) in routed.items() if "NULL" not in path]
        return max(groups, key=lambda part: part.num_rows)

    def append_refresh(self, rows: pa.Table | None = None) -> Any:
        """New source rows, then an append refresh: must stay an append, never a rebuild."""
        rows = rows if rows is not None else self.new_rows(self.rng.randint(1, 12))
        self.source = pa.concat_tables([self.source, rows])
        self.save_source()
        return self.refresh_incrementally()

    def refresh_incrementally(self) -> Any:
        before = len(self.versions())
        summary = refresh_dataset(str(self.spec), "events", spark=self.spark)
        assert summary.refresh_mode == "append", summary.notes
        for info in self.versions()[before:]:
            assert not info.replace_all, f"no rebuild during the migration: {info}"
            assert info.operation in ("refresh", "repartition"), info
        return summary

    def late_rows(self) -> None:
        """Rows below every watermark (smaller ids): the audit finds them, `rewrite` rewrites their
        partitions whole after moving their old holders."""
        rows = self.new_rows(self.rng.randint(1, 4))
        ids = pa.array(range(self.late_id - rows.num_rows + 1, self.late_id + 1), pa.int64())
        self.late_id -= rows.num_rows
        self.append_refresh(rows.set_column(0, "id", ids))

    def source_delete(self) -> None:
        """Rows deleted from the source only: fewer rows at or below the watermark, rewritten whole."""
        ids = self.rng.sample(self.source.column("id").to_pylist(), 2)
        self.source = self.source.filter(pc.invert(pc.is_in(self.source.column("id"), pa.array(ids))))
        self.save_source()
        self.refresh_incrementally()

    def append_one_partition(self) -> None:
        self.append_refresh(self.landing_in_one_partition(self.new_rows(40)))


@pytest.mark.spark
@pytest.mark.parametrize("transition", APPEND_TRANSITIONS)
def test_append_refresh_during_a_migration_moves_only_what_it_changes(
    spark: Any, tmp_path: Path, transition: str
) -> None:
    old, new = TRANSITIONS[transition]
    scenario = AppendScenario(tmp_path, 41 + APPEND_TRANSITIONS.index(transition), old, spark)
    scenario.full_refresh()
    scenario.check("first refresh")
    scenario.set_partition_by(new)
    scenario.batch()
    scenario.check("first batch")
    left = scenario.snapshot().other_layout()
    assert left[0] > 2

    # New rows of one current partition: only the old partitions holding its rows move.
    scenario.append_one_partition()
    scenario.check("append into one partition")
    after = scenario.snapshot()
    assert 0 < after.other_layout()[0] < left[0], "some old partitions moved, the others are left"
    assert scenario.versions()[-1].operation == "refresh"

    steps = [
        scenario.append_refresh,
        scenario.late_rows,
        scenario.batch,
        scenario.append_rows,  # the write path, between refreshes
        scenario.source_delete,
        scenario.append_refresh,
        scenario.late_rows,
        scenario.append_one_partition,
    ]
    scenario.rng.shuffle(steps)
    for step in steps:
        step()
        scenario.check(step.__name__)
    while scenario.snapshot().other_layout()[0]:
        scenario.batch()
    scenario.append_refresh()
    scenario.check("append after the migration")
