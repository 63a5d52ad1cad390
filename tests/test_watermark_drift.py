"""Watermark modes never drift silently: late rows, rows from transactions open at the last refresh,
future-dated rows, rows whose watermark moved, and in-place updates the Postgres fingerprint must see.

Each test is one way an incremental refresh used to leave the acceleration different from its source
without saying so; after every refresh the full read is compared with the source row for row.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from test_refresh_modes import (
    TEXTS,
    accelerated,
    accounts_project,
    assert_equals_source,
    create_events,
    events_spec,
)

from airflow_partitions.catalog import open_catalog
from airflow_partitions.cli.main import main
from airflow_partitions.exceptions import LateRowsError
from airflow_partitions.keys import PartitionKey, value_to_json
from airflow_partitions.refresh import refresh_dataset
from airflow_partitions.refresh.modes import audit_appends, partition_watermark
from airflow_partitions.refresh.pipeline import bind_dataset
from airflow_partitions.refresh.plan import PartitionWorkItem, Reason
from airflow_partitions.sources import open_dataset_source
from airflow_partitions.spec import load_spec
from airflow_partitions.spec.model import ProjectSpec

pytestmark = pytest.mark.postgres

BY_REGION = '{r: "region"}'
BY_DAY = "{day: \"date_trunc('day', created_at)\"}"


def with_refresh_options(tmp_path: Path, options: str) -> ProjectSpec:
    """The spec `events_spec` wrote, with more `refresh:` options."""
    spec = tmp_path / "spec.yaml"
    lines = [
        f"      refresh: {{watermark_column: created_at, {options}}}"
        if line.startswith("      refresh: ")
        else line
        for line in spec.read_text().splitlines()
    ]
    spec.write_text("\n".join(lines) + "\n")
    return load_spec(spec)


def create_indexed_events(url: str) -> None:
    """`create_events`, with region indexed too: each partition is read by its own query (no Spark)."""
    create_events(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE INDEX events_region ON public.events (region)")


def region_of(url: str, row_id: int) -> str | None:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT region FROM public.events WHERE id = %s", (row_id,)).fetchone()
    assert row is not None
    return row[0]


def test_append_takes_a_late_row(pg_database: str, tmp_path: Path) -> None:
    """A row inserted at or below its partition's watermark: the partition is rewritten and reported."""
    create_events(pg_database)
    project = events_spec(tmp_path, pg_database, BY_DAY)
    refresh_dataset(project, "events")
    before = assert_equals_source(project, "events")
    day1 = "day=2026-03-01T00%3A00%3A00%2B00%3A00"
    watermark = max(f.stats["created_at"].max for f in before.partitions[day1].files)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO public.events VALUES (500, 'late', 1, 'x', %s), (501, 'tie', 2, '', %s)",
            (watermark - dt.timedelta(hours=3), watermark),
        )
    summary = refresh_dataset(project, "events")
    assert summary.late_rows == {day1: 2}, "the partition and the count are named"
    assert summary.late_rows_policy == "rewrite"
    assert summary.appended_rows == 0, "the partition was rewritten whole, not appended to"
    assert_equals_source(project, "events")
    assert refresh_dataset(project, "events").late_rows == {}, "nothing left behind"


def test_append_reports_or_refuses_late_rows_as_configured(
    pg_database: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    create_indexed_events(pg_database)
    events_spec(tmp_path, pg_database, BY_REGION)
    project = with_refresh_options(tmp_path, "late_rows: report")
    refresh_dataset(project, "events")
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("INSERT INTO public.events VALUES (500, 'late', 1, 'a/b', '2026-01-01T00:00:00Z')")
    spec = str(tmp_path / "spec.yaml")
    capsys.readouterr()
    assert main(["refresh", spec, "events", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["late_rows"] == {"r=a%2Fb": 1}
    assert summary["late_rows_policy"] == "report"
    assert any("late_rows: report" in note for note in summary["notes"])
    assert_equals_source(project, "events", leaving_out={500})
    assert main(["status", spec, "events", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)["datasets"][0]
    assert status["conservation"]["late_rows"] == {"r=a%2Fb": 1}, "the commit record keeps it"
    assert main(["status", spec, "events"]) == 0
    assert "NOT taken (late_rows: report): r=a%2Fb +1" in capsys.readouterr().out
    # Reported again on every refresh while it lasts, although the partition's fingerprint is unchanged.
    assert refresh_dataset(project, "events").late_rows == {"r=a%2Fb": 1}

    project = with_refresh_options(tmp_path, "late_rows: fail")
    with pytest.raises(LateRowsError, match=r"r=a%2Fb \(\+1\)") as raised:
        refresh_dataset(project, "events")
    assert raised.value.late_rows == {"r=a%2Fb": 1}


def test_append_takes_an_insert_of_a_transaction_open_at_the_last_refresh(
    pg_database: str, tmp_path: Path
) -> None:
    """T1 inserts with ts = now() and stays open, T2 inserts later and commits, refresh, T1 commits: the
    next refresh takes T1's row (it is below the watermark T2's row set)."""
    create_indexed_events(pg_database)
    project = events_spec(tmp_path, pg_database, BY_REGION)
    refresh_dataset(project, "events")
    with psycopg.connect(pg_database) as slow:
        slow.execute("INSERT INTO public.events VALUES (600, 'slow', 1, 'plain', now())")
        with psycopg.connect(pg_database, autocommit=True) as fast:
            fast.execute("INSERT INTO public.events VALUES (601, 'fast', 1, 'plain', now())")
        refresh_dataset(project, "events")
        assert_equals_source(project, "events")  # 600 is not visible yet
        slow.commit()
    summary = refresh_dataset(project, "events")
    assert summary.late_rows == {"r=plain": 1}
    assert_equals_source(project, "events")


def test_append_does_not_duplicate_a_row_whose_watermark_moved(pg_database: str, tmp_path: Path) -> None:
    create_indexed_events(pg_database)
    project = events_spec(tmp_path, pg_database, BY_REGION)
    refresh_dataset(project, "events")
    region = region_of(pg_database, 7)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("UPDATE public.events SET created_at = now(), note = 'moved' WHERE id = 7")
    summary = refresh_dataset(project, "events")
    assert summary.late_rows is not None
    assert list(summary.late_rows.values()) == [-1], f"{region}: one row left the committed range"
    assert_equals_source(project, "events")


def test_a_future_row_does_not_stop_the_watermark(pg_database: str, tmp_path: Path) -> None:
    create_indexed_events(pg_database)
    project = events_spec(tmp_path, pg_database, BY_REGION)
    refresh_dataset(project, "events")
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO public.events VALUES (700, 'future', 1, 'plain', now() + interval '30 days')"
        )
    summary = refresh_dataset(project, "events")
    assert summary.future_rows == {"r=plain": 1}, "the future row is named, with its partition"
    assert_equals_source(project, "events")
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("INSERT INTO public.events VALUES (701, 'ordinary', 1, 'plain', now())")
    again = refresh_dataset(project, "events")
    assert again.future_rows == {"r=plain": 1}
    assert any("watermark in the future" in note for note in again.notes)
    assert_equals_source(project, "events")


def test_postgres_fingerprint_sees_an_update_below_the_max(pg_database: str, tmp_path: Path) -> None:
    """`check_column` count + max misses an UPDATE that keeps updated_at below the partition's max."""
    create_indexed_events(pg_database)
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: events\n"
        "    from: postgres:public.events\n"
        f"    params: {{url: '{pg_database}', reader: adbc}}\n"
        "    acceleration:\n"
        f"      partition_by: [{BY_REGION}]\n"
        "      refresh: {check_column: created_at}\n"
    )
    project = load_spec(tmp_path / "spec.yaml")
    refresh_dataset(project, "events")
    region = region_of(pg_database, 3)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("UPDATE public.events SET note = %s WHERE id = 3", (TEXTS[7] + " changed",))
    summary = refresh_dataset(project, "events")
    assert summary.refreshed == 1, f"the partition of id 3 ({region!r}) is refreshed"
    assert_equals_source(project, "events")


# --- refresh_mode changes on a watermark ----------------------------------------------------------


def test_changes_takes_an_update_of_a_transaction_open_at_the_last_refresh(
    pg_database: str, tmp_path: Path
) -> None:
    """T1 updates id 8 (ts = now()) and stays open, T2 updates id 9 and commits, refresh, T1 commits:
    the next refresh takes id 8 (the read stopped before the oldest open transaction)."""
    project = accounts_project(tmp_path, pg_database)
    refresh_dataset(project, "accounts")
    with psycopg.connect(pg_database) as slow:
        slow.execute(
            "UPDATE public.accounts SET note = 'slow', region = 'k=v', updated_at = now() WHERE id = 8"
        )
        with psycopg.connect(pg_database, autocommit=True) as fast:
            fast.execute("UPDATE public.accounts SET note = 'fast', updated_at = now() WHERE id = 9")
        during = refresh_dataset(project, "accounts")
        assert any("oldest open transaction" in note for note in during.notes)
        slow.commit()
    refresh_dataset(project, "accounts")
    assert_equals_source(project, "accounts")


def test_changes_is_not_stopped_by_a_future_row(pg_database: str, tmp_path: Path) -> None:
    project = accounts_project(tmp_path, pg_database)
    refresh_dataset(project, "accounts")
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("UPDATE public.accounts SET updated_at = now() + interval '30 days' WHERE id = 4")
    summary = refresh_dataset(project, "accounts")
    assert summary.future_rows is not None
    assert list(summary.future_rows.values()) == [1], "the future row is named, with its partition"
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("UPDATE public.accounts SET note = 'after', updated_at = now() WHERE id = 5")
        conn.execute("INSERT INTO public.accounts VALUES (99, 'plain', 1, 'new', now())")
    refresh_dataset(project, "accounts")
    assert_equals_source(project, "accounts")


class ColumnsOnly:
    """The same Postgres source without its SQL counting, so the audit reads the columns instead."""

    def __init__(self, source: Any) -> None:
        self._source = source

    def __getattr__(self, name: str) -> Any:
        if name == "count_below_watermarks":
            raise AttributeError(name)
        return getattr(self._source, name)


class CountsInSql(ColumnsOnly):
    """The Postgres source, remembering what its SQL counting returned."""

    counted: list[Any]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def count_below_watermarks(self, *args: Any) -> Any:
        result = self._source.count_below_watermarks(*args)
        self.counted = [*getattr(self, "counted", []), result]
        return result


@pytest.mark.parametrize("partition_by", [BY_REGION, BY_DAY])
def test_postgres_counts_the_audit_in_sql_as_the_columns_count_it(
    pg_database: str, tmp_path: Path, partition_by: str
) -> None:
    """The audit counted by Postgres (width_bucket over the watermarks) equals the one counted from the
    projected columns, NULL partition values and NULL, tied, late and future watermarks included."""
    create_indexed_events(pg_database)
    project = events_spec(tmp_path, pg_database, partition_by)
    refresh_dataset(project, "events")
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO public.events VALUES (800, 'late', 1, NULL, '2026-03-01T00:00:00Z'), "
            "(801, 'null', 1, 'a/b', NULL), (802, 'future', 1, 'plain', now() + interval '9 days'), "
            "(803, 'tie', 1, 'k=v', (SELECT max(created_at) FROM public.events WHERE region = 'k=v'))"
        )
        conn.execute("DELETE FROM public.events WHERE id = 5")
    source = open_dataset_source(project.dataset("events"))
    dataset = bind_dataset(project.dataset("events"), source)
    snapshot = open_catalog(project, dataset).latest()
    assert snapshot is not None
    items = [
        PartitionWorkItem(
            key=tuple(entry.key.to_json()),
            key_path=path,
            reason=Reason.FORCED,
            fingerprint="",
            append=True,
            watermark=value_to_json(partition_watermark(entry, "created_at")),
        )
        for path, entry in snapshot.partitions.items()
    ]
    in_sql = CountsInSql(source)
    counted = audit_appends(items, dataset, in_sql, snapshot)  # type: ignore[arg-type]
    assert in_sql.counted, "the audit asked Postgres to count"
    assert in_sql.counted[0] is not None, "Postgres counted (no columns read)"
    assert counted == audit_appends(items, dataset, ColumnsOnly(source), snapshot)  # type: ignore[arg-type]
    assert counted.late
    assert counted.future


# --- refresh_mode changes, change_detection watermark: what the watermark cannot see -------------


def watermark_changes_project(tmp_path: Path, url: str, late_rows: str = "rewrite") -> ProjectSpec:
    """`accounts_project` with the watermark variant named, and `refresh.late_rows`."""
    project = accounts_project(tmp_path, url)
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        spec.read_text().replace(
            "refresh: {watermark_column: updated_at}",
            f"refresh: {{watermark_column: updated_at, change_detection: watermark, late_rows: {late_rows}}}",
        )
    )
    assert project.dataset("accounts").acceleration.refresh.mode == "changes"
    return load_spec(spec)


def r_path(region: str | None) -> str:
    return PartitionKey((region,)).path(["r"])


def delete_and_insert_late(url: str) -> dict[str, int]:
    """A hard DELETE (id 5), an ordinary update (id 7, now), and late rows stamped below the watermark:
    one in id 7's partition (touched by the changes), one in another, one with a NULL partition value.
    Returns what the changes cannot see, per partition: source minus acceleration."""
    late = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM public.accounts WHERE id = 5")
        conn.execute("UPDATE public.accounts SET note = 'seen', updated_at = now() WHERE id = 7")
        conn.execute(
            "INSERT INTO public.accounts VALUES (98, %s, 1.5, 'late, touched', %s), "
            "(99, '100%%', NULL, 'late', %s), (97, NULL, 2, '', %s)",
            (TEXTS[7 % 4], late, late, late),
        )
    return {r_path(TEXTS[5 % 4]): -1, r_path(TEXTS[7 % 4]): 1, r_path("100%"): 1, r_path(None): 1}


def test_changes_watermark_takes_a_hard_delete_and_late_rows(pg_database: str, tmp_path: Path) -> None:
    """late_rows: rewrite (the default): the partitions are named and rewritten whole in the refresh."""
    project = watermark_changes_project(tmp_path, pg_database)
    refresh_dataset(project, "accounts")
    expected = delete_and_insert_late(pg_database)
    summary = refresh_dataset(project, "accounts")
    assert summary.late_rows == expected, "each partition the watermark could not see, with its count"
    assert summary.late_rows_policy == "rewrite"
    assert_equals_source(project, "accounts")
    again = refresh_dataset(project, "accounts")
    assert again.late_rows == {}, "nothing left behind"
    assert again.refresh_mode == "changes", "back to merging changes"
    assert_equals_source(project, "accounts")
    with psycopg.connect(pg_database, autocommit=True) as conn:
        held = {path: entry.rows for path, entry in accelerated(project, "accounts")[0].partitions.items()}
        conn.execute("TRUNCATE public.accounts")
    emptied = refresh_dataset(project, "accounts")
    assert emptied.late_rows == {path: -rows for path, rows in held.items()}, "every partition, named"
    snapshot = open_catalog(project, project.dataset("accounts")).latest()
    assert snapshot is not None
    assert not snapshot.partitions, "the partitions of a TRUNCATEd table are removed"


def test_changes_watermark_reports_or_refuses_what_it_cannot_see(
    pg_database: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = watermark_changes_project(tmp_path, pg_database, "report")
    refresh_dataset(project, "accounts")
    expected = delete_and_insert_late(pg_database)
    spec = str(tmp_path / "spec.yaml")
    capsys.readouterr()
    assert main(["refresh", spec, "accounts", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["late_rows"] == expected
    assert summary["late_rows_policy"] == "report"
    reported = "after the changes, changes merged as usual (late_rows: report)"
    assert any(reported in note for note in summary["notes"])
    _, table = accelerated(project, "accounts")
    with psycopg.connect(pg_database) as conn:
        ids = {row[0] for row in conn.execute("SELECT id FROM public.accounts").fetchall()}
    assert sorted(table.column("id").to_pylist()) == sorted(ids - {97, 98, 99} | {5}), (
        "exactly the rows named are the ones missing or extra; the update of id 7 is merged"
    )
    assert main(["status", spec, "accounts", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)["datasets"][0]
    assert status["conservation"]["late_rows"] == expected, "the commit record keeps it"
    assert refresh_dataset(project, "accounts").late_rows == expected, "named again while it lasts"

    project = with_late_rows(tmp_path, "fail")
    catalog = open_catalog(project, project.dataset("accounts"))
    version = catalog.latest().version
    with pytest.raises(LateRowsError, match=r"Nothing was published") as raised:
        refresh_dataset(project, "accounts")
    assert raised.value.late_rows == expected
    assert open_catalog(project, project.dataset("accounts")).latest().version == version


def with_late_rows(tmp_path: Path, policy: str) -> ProjectSpec:
    spec = tmp_path / "spec.yaml"
    text = spec.read_text()
    for old in ("rewrite", "report", "fail"):
        text = text.replace(f"late_rows: {old}", f"late_rows: {policy}")
    spec.write_text(text)
    return load_spec(spec)
