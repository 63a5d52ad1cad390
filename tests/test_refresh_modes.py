"""refresh_mode: append against real sources: only rows past each partition's watermark are read and
added as new files; after every refresh the acceleration is compared with the source row for row.

Hostile rows throughout: NULL watermarks, NULL partition values, quotes, `/`, `=`, `%`, unicode, empty
strings, ties at the watermark.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from faulty_storage import OnePartitionFailingStorage

from airflow_partitions.catalog import open_catalog
from airflow_partitions.cli.main import main
from airflow_partitions.exceptions import RefreshError, SpecValidationError
from airflow_partitions.refresh import plan_refresh, refresh_dataset
from airflow_partitions.sources import open_source
from airflow_partitions.spec import load_spec, parse_spec
from airflow_partitions.spec.model import ProjectSpec
from airflow_partitions.storage import get_storage
from airflow_partitions.table import open_handle

TEXTS = ["a/b", "k=v", "100%", "it's", 'say "hi"', "", None, "é中", "plain"]


def row_hash(row: dict[str, Any]) -> str:
    """A row's identity for the differential check: every value, NULLs and types included."""
    text = json.dumps({k: [type(v).__name__, repr(v)] for k, v in sorted(row.items())}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def accelerated(project: ProjectSpec, name: str) -> tuple[Any, pa.Table]:
    dataset = project.dataset(name)
    catalog = open_catalog(project, dataset)
    snapshot = catalog.latest()
    assert snapshot is not None
    assert catalog.data_root is not None
    files = [f for entry in snapshot.partitions.values() for f in entry.files]
    return snapshot, get_storage(dataset.acceleration).read(catalog.data_root, files)


def assert_equals_source(project: ProjectSpec, name: str, *, leaving_out: set[int] = frozenset()) -> Any:
    """Full read == the source (minus the rows `leaving_out` names by id), by row hash, NULLs and types."""
    snapshot, table = accelerated(project, name)
    source = open_source(project.dataset(name).source).read_all()
    assert table.schema.equals(source.schema), f"{table.schema} != {source.schema}"
    ours = sorted(row_hash(r) for r in table.to_pylist())
    theirs = sorted(row_hash(r) for r in source.to_pylist() if r["id"] not in leaving_out)
    assert len(set(ours)) == len(ours), "no row is in the acceleration twice"
    assert ours == theirs, "the acceleration holds exactly the source rows"
    return snapshot


# --- Postgres ------------------------------------------------------------------------------------


def create_events(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.events (id bigint PRIMARY KEY, note text, amount numeric(10, 2), "
            "region text, created_at timestamptz)"
        )
        conn.execute("CREATE INDEX events_created ON public.events (created_at)")
        insert_events(conn, range(40), day=1)


def insert_events(conn: Any, ids: range, *, day: int, hour: int | None = None) -> None:
    rows = []
    for i in ids:
        created = dt.datetime(2026, 3, day, hour if hour is not None else i % 24, i % 60, tzinfo=dt.UTC)
        rows.append((i, TEXTS[i % len(TEXTS)], f"{i * 1.5:.2f}", TEXTS[(i + 3) % len(TEXTS)], created))
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO public.events (id, note, amount, region, created_at) VALUES (%s, %s, %s, %s, %s)",
            rows,
        )


def events_spec(
    tmp_path: Path, url: str, partition_by: str, *, mode: str = "append", late_rows: str = "rewrite"
) -> ProjectSpec:
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: events\n"
        "    from: postgres:public.events\n"
        f"    params: {{url: '{url}', reader: adbc}}\n"
        "    acceleration:\n"
        f"      refresh_mode: {mode}\n"
        f"      partition_by: [{partition_by}]\n"
        f"      refresh: {{watermark_column: created_at, late_rows: {late_rows}}}\n"
    )
    return load_spec(tmp_path / "spec.yaml")


@pytest.mark.postgres
def test_postgres_append_reads_past_each_partitions_watermark(pg_database: str, tmp_path: Path) -> None:
    create_events(pg_database)
    # late_rows: report, to see what append alone reads (the default rewrites late partitions whole).
    project = events_spec(
        tmp_path, pg_database, "{day: \"date_trunc('day', created_at)\"}", late_rows="report"
    )
    first = refresh_dataset(project, "events")
    assert first.stage_mode == "pushdown", "created_at is indexed: each day is one range query"
    before = assert_equals_source(project, "events")
    day1 = "day=2026-03-01T00%3A00%3A00%2B00%3A00"
    watermark = max(f.stats["created_at"].max for f in before.partitions[day1].files)

    with psycopg.connect(pg_database, autocommit=True) as conn:
        insert_events(conn, range(100, 110), day=1, hour=23)  # past day 1's watermark (23:39)
        insert_events(conn, range(200, 205), day=2)  # a new partition
        # Late rows: at the watermark exactly, and NULL. Append never reads them (a full refresh does).
        conn.execute(
            "INSERT INTO public.events VALUES (300, 'tie', 1, 'x', %s), (301, 'null wm', 1, 'x', NULL)",
            (watermark,),
        )
    plan = plan_refresh(project, "events")
    assert plan.refresh_mode == "append"
    by_path = {item.key_path: item for item in plan.items}
    assert by_path[day1].append
    assert by_path[day1].watermark_value == watermark
    assert not by_path["day=2026-03-02T00%3A00%3A00%2B00%3A00"].append, "a new partition is read whole"

    summary = refresh_dataset(project, "events")
    assert summary.refresh_mode == "append"
    assert summary.appended_rows == 10, "only day 1's rows past the watermark are appended"
    assert summary.rows_written == 10 + 5 + 1, "plus the new day and the new NULL partition, whole"
    assert summary.null_watermark_rows == 0, "the first NULL row came with its new (NULL) partition"
    after = assert_equals_source(project, "events", leaving_out={300})
    kept = set(before.partitions[day1].files)
    assert kept < set(after.partitions[day1].files), "day 1 keeps its files and gains a new one"
    assert after.partitions[day1].rows == before.partitions[day1].rows + 10

    # A later NULL row lands in the committed NULL partition, whose rows are all below any watermark:
    # not read, and reported. Nothing else is new, so nothing is appended (and nothing duplicated).
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("INSERT INTO public.events VALUES (302, 'null again', 2, '%', NULL)")
    again = refresh_dataset(project, "events")
    assert again.appended_rows == 0
    assert again.null_watermark_rows == 1, "the late NULL row is reported, not silently skipped"
    assert_equals_source(project, "events", leaving_out={300, 302})

    # The periodic full refresh rewrites every partition from all its rows: the late rows arrive.
    full = refresh_dataset(project, "events", full=True)
    assert full.refresh_mode == "full"
    assert_equals_source(project, "events")


@pytest.mark.postgres
@pytest.mark.spark
@pytest.mark.parametrize("late_rows", ["report", "rewrite"])
def test_postgres_append_through_spark_moves_nothing_twice(
    spark: Any, pg_database: str, tmp_path: Path, late_rows: str
) -> None:
    """`report`: only the rows past the watermarks are written, the late NULL row is reported; `rewrite`:
    its partition is rewritten whole by the executors in the same job as the appends of the others."""
    create_events(pg_database)
    project = events_spec(tmp_path, pg_database, '{r: "region"}', late_rows=late_rows)
    first = refresh_dataset(project, "events", spark=spark, strategy="spark")
    assert first.stage_mode == "written", "a first refresh writes partitions whole: executors write them"
    before = assert_equals_source(project, "events")
    with psycopg.connect(pg_database, autocommit=True) as conn:
        insert_events(conn, range(100, 120), day=2)
        conn.execute("INSERT INTO public.events VALUES (301, 'null wm', 1, 'a/b', NULL)")
    summary = refresh_dataset(project, "events", spark=spark, strategy="spark")
    assert summary.refresh_mode == "append"
    assert summary.stage_mode == "written", "the executors write the appended files too"
    assert summary.late_rows == {"r=a%2Fb": 1}, "the late NULL row is named, with its partition"
    if late_rows == "report":
        assert summary.appended_rows == summary.rows_written == 20
        after = assert_equals_source(project, "events", leaving_out={301})
        for key_path, entry in before.partitions.items():
            assert set(entry.files) <= set(after.partitions[key_path].files), f"{key_path} kept its files"
        assert summary.null_watermark_rows == 1
        return
    after = assert_equals_source(project, "events")
    rewritten = after.partitions["r=a%2Fb"].rows
    assert summary.rows_written == summary.appended_rows + rewritten, "one partition whole, others appended"
    assert not set(before.partitions["r=a%2Fb"].files) & set(after.partitions["r=a%2Fb"].files)
    assert summary.null_watermark_rows == 0


# --- files --------------------------------------------------------------------------------------


def day_table(day: int, ids: range, *, null_every: int = 0) -> pa.Table:
    created = [
        None if null_every and i % null_every == 0 else dt.datetime(2026, 3, day, i % 24, i % 60) for i in ids
    ]
    return pa.table(
        {
            "id": pa.array(list(ids), type=pa.int64()),
            "note": pa.array([TEXTS[i % len(TEXTS)] for i in ids], type=pa.string()),
            "kind": pa.array([TEXTS[(i + 2) % len(TEXTS)] for i in ids], type=pa.string()),
            "created_at": pa.array(created, type=pa.timestamp("us")),
        }
    )


def files_spec(
    tmp_path: Path, location: Path, partition_by: str, *, late_rows: str = "rewrite"
) -> ProjectSpec:
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: events\n"
        f"    from: file:{location}\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        "      refresh_mode: append\n"
        f"      partition_by: [{partition_by}]\n"
        f"      refresh: {{watermark_column: created_at, late_rows: {late_rows}}}\n"
    )
    return load_spec(tmp_path / "spec.yaml")


def test_hive_files_append_by_pushdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "src"
    for kind in ("a", "b%2Fc"):
        (root / f"kind={kind}").mkdir(parents=True)
        pq.write_table(day_table(1, range(30), null_every=7).drop(["kind"]), root / f"kind={kind}/d1.parquet")
    project = files_spec(tmp_path, root, '{k: "kind"}', late_rows="report")
    assert refresh_dataset(project, "events").stage_mode == "pushdown"
    before = assert_equals_source(project, "events")

    # Day 2 lands in one partition, in row groups of 5 (the watermark prunes day 1's groups); a late
    # file with rows at or below the watermark lands in the other.
    pq.write_table(day_table(2, range(100, 120)).drop(["kind"]), root / "kind=a/d2.parquet", row_group_size=5)
    pq.write_table(day_table(1, range(200, 203)).drop(["kind"]), root / "kind=b%2Fc/late.parquet")
    capsys.readouterr()
    assert main(["refresh", str(tmp_path / "spec.yaml"), "events", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["refresh_mode"] == "append"
    assert summary["appended_rows"] == 20
    assert summary["appended_partitions"] == 2, "both partitions changed; one gained nothing"
    assert summary["late_rows"] == {"k=b%2Fc": 3}, "the late file is named, with its rows"
    late = set(range(200, 203))
    after = assert_equals_source(project, "events", leaving_out=late)
    assert after.partitions["k=a"].rows == before.partitions["k=a"].rows + 20
    assert main(["status", str(tmp_path / "spec.yaml"), "events", "--json", "--partitions"]) == 0
    status = json.loads(capsys.readouterr().out)["datasets"][0]
    assert status["refresh_mode"] == "append"
    assert status["watermark_column"] == "created_at"
    assert status["watermark"] == "2026-03-02T23:59:00", "the newest committed value (day 2, id 119)"
    marks = {p["key_path"]: p["watermark"] for p in status["partitions"]}
    other = next(path for path in marks if path != "k=a")
    assert marks[other] == "2026-03-01T23:23:00", "late rows at or below it were not appended"
    assert main(["status", str(tmp_path / "spec.yaml"), "events"]) == 0
    assert "refresh mode  append; watermark created_at up to 2026-03-02T23:59:00" in capsys.readouterr().out


@pytest.mark.spark
def test_parquet_day_files_append_through_spark(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    for day in (1, 2):
        pq.write_table(
            day_table(day, range(day * 100, day * 100 + 30), null_every=11), root / f"d{day}.parquet"
        )
    project = files_spec(tmp_path, root, '"bucket(3, id)"')
    refresh_dataset(project, "events", spark=spark)
    before = assert_equals_source(project, "events")
    pq.write_table(day_table(3, range(300, 340)), root / "d3.parquet")
    summary = refresh_dataset(project, "events", spark=spark)
    assert summary.stage_mode == "written", "the executors write the appended files too"
    assert summary.refresh_mode == "append"
    assert summary.appended_rows == 40
    after = assert_equals_source(project, "events")
    assert after.total_rows == before.total_rows + 40


def test_changes_without_primary_key_is_refused() -> None:
    text = (
        "datasets:\n"
        "  - name: t\n"
        "    from: postgres:public.t\n"
        "    acceleration:\n"
        "      refresh_mode: changes\n"
        "      partition_by: [region]\n"
        "      refresh: {watermark_column: updated_at}\n"
    )
    with pytest.raises(SpecValidationError, match=r"refresh_mode: changes needs primary_key"):
        parse_spec(text)


# --- refresh_mode: changes ----------------------------------------------------------------------


def create_accounts(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.accounts (id bigint PRIMARY KEY, region text, balance numeric(12, 2), "
            "note text, updated_at timestamptz)"
        )
        conn.execute("CREATE INDEX accounts_updated ON public.accounts (updated_at)")
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO public.accounts VALUES (%s, %s, %s, %s, %s)",
                [
                    (
                        i,
                        TEXTS[i % 4],  # a/b, k=v, 100%, it's
                        None if i % 6 == 0 else f"{i * 2.5:.2f}",
                        TEXTS[(i + 5) % len(TEXTS)],
                        dt.datetime(2026, 5, 1, 8, tzinfo=dt.UTC) + dt.timedelta(minutes=i),
                    )
                    for i in range(30)
                ],
            )


def accounts_project(tmp_path: Path, url: str) -> ProjectSpec:
    """`create_accounts` in Postgres, and a spec refreshing it with refresh_mode changes by region."""
    create_accounts(url)
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: accounts\n"
        "    from: postgres:public.accounts\n"
        f"    params: {{url: '{url}', pushdown: always}}\n"
        "    acceleration:\n"
        "      refresh_mode: changes\n"
        "      primary_key: [id]\n"
        '      partition_by: [{r: "region"}]\n'
        "      refresh: {watermark_column: updated_at}\n"
    )
    return load_spec(tmp_path / "spec.yaml")


@pytest.mark.postgres
@pytest.mark.parametrize("merged_by", ["task", "spark"])
def test_postgres_changes_upserts_moves_and_keeps_ties(
    pg_database: str, tmp_path: Path, merged_by: str, request: pytest.FixtureRequest
) -> None:
    """Changes merged by the refresh's own process (no Spark) or, with a Spark session, by its executors
    (`written` stage: the partition tasks then read no data)."""
    spark = request.getfixturevalue("spark") if merged_by == "spark" else None
    project = accounts_project(tmp_path, pg_database)
    first = refresh_dataset(project, "accounts", spark=spark)
    assert first.refresh_mode == "full", "nothing committed yet: the first refresh reads every row"
    before = assert_equals_source(project, "accounts")
    newest = dt.datetime(2026, 5, 1, 8, 29, tzinfo=dt.UTC)

    with psycopg.connect(pg_database, autocommit=True) as conn:
        later = newest + dt.timedelta(hours=1)
        conn.execute("UPDATE public.accounts SET balance = 999.99, updated_at = %s WHERE id = 1", (later,))
        # id 2 moves from 'k=v' to a new region; id 3 moves to an existing one.
        conn.execute("UPDATE public.accounts SET region = 'é/中', updated_at = %s WHERE id = 2", (later,))
        conn.execute("UPDATE public.accounts SET region = 'a/b', updated_at = %s WHERE id = 3", (later,))
        conn.execute("INSERT INTO public.accounts VALUES (100, NULL, 1, '', %s)", (later,))
        # A tie: committed after the last refresh with the watermark's own timestamp.
        conn.execute("INSERT INTO public.accounts VALUES (101, 'a/b', 2, 'tie', %s)", (newest,))
    plan = plan_refresh(project, "accounts")
    assert plan.refresh_mode == "changes"
    assert plan.changed_rows == 6, "the 4 changed rows, the tie, and the row at the watermark itself"
    assert plan.notes[0].startswith(
        "change detection: change_detection watermark (rows whose updated_at grew): the spec names "
        "refresh.watermark_column and no refresh.change_detection"
    ), "the variant the spec implies is named, with why"
    summary = refresh_dataset(project, "accounts", spark=spark)
    assert summary.refresh_mode == "changes"
    assert summary.stage_mode == ("written" if spark is not None else "changes")
    assert summary.changed_rows == 6, "each changed row merged into exactly one partition"
    after = assert_equals_source(project, "accounts")
    assert after.partitions["r=100%25"].rows == before.partitions["r=100%25"].rows - 1, "id 2 moved out"
    assert after.partitions["r=a%2Fb"].rows == before.partitions["r=a%2Fb"].rows + 2, "id 3 and 101 in"
    untouched = [p for p in before.partitions if p not in {item.key_path for item in plan.items}]
    for key_path in untouched:
        assert after.partitions[key_path].files == before.partitions[key_path].files

    # Nothing changed since: the row at the watermark is read again and replaced by itself.
    assert refresh_dataset(project, "accounts", spark=spark).refresh_mode == "changes"
    assert_equals_source(project, "accounts")

    # A hard delete is no change the watermark reads: the audit of every partition's count names it,
    # and (refresh.late_rows: rewrite, the default) its partition is rewritten whole in the refresh.
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("DELETE FROM public.accounts WHERE id = 7")
    deleted = refresh_dataset(project, "accounts", spark=spark)
    assert deleted.late_rows == {"r=it%27s": -1}, "the partition and the count are named"
    assert_equals_source(project, "accounts")
    assert refresh_dataset(project, "accounts", spark=spark).late_rows == {}


@pytest.mark.postgres
@pytest.mark.spark
def test_a_changes_partition_the_executor_could_not_merge_is_merged_by_its_retry(
    spark: Any, pg_database: str, tmp_path: Path
) -> None:
    """One partition's executor write fails: the stage records it, the other partitions stay the
    executors' files, and that partition's task merges the staged changes itself."""
    from airflow_partitions.refresh import commit_refresh, finalize_partition, stage_refresh
    from airflow_partitions.refresh.stage_layout import StageManifest

    project = accounts_project(tmp_path, pg_database)
    refresh_dataset(project, "accounts", spark=spark)
    later = dt.datetime(2026, 5, 2, tzinfo=dt.UTC)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("UPDATE public.accounts SET region = 'a/b', updated_at = %s WHERE id = 1", (later,))
        conn.execute("INSERT INTO public.accounts VALUES (200, 'a/b', NULL, '', %s)", (later,))
    dataset = project.dataset("accounts")
    plan = plan_refresh(project, dataset)
    assert plan.refresh_mode == "changes"
    victim = "r=a%2Fb"
    stage = stage_refresh(
        open_handle(project, dataset), plan, spark=spark, storage=OnePartitionFailingStorage(victim)
    )
    assert str(stage.mode) == "written"
    assert "No space left" in StageManifest.load(stage.location or "").items[victim]["error"]
    results = [finalize_partition(open_handle(project, dataset), stage, item) for item in plan.items]
    retried = next(r for r in results if r.entry.key_path == victim)
    assert retried.changed_rows == 2, "id 1 moved in, id 200 is new"
    commit_refresh(open_handle(project, dataset), plan, results, stage=stage)
    assert_equals_source(project, "accounts")


def test_a_merge_that_lost_a_changed_row_is_refused() -> None:
    from airflow_partitions.exceptions import ConservationError
    from airflow_partitions.refresh.written import WrittenItem, check_merged_changes

    paths = ["r=a", "r=b", "r=c"]
    fine = {0: WrittenItem(5, 5, (), changed=2), 1: WrittenItem(3, 3, (), changed=0)}
    check_merged_changes("accounts", paths, fine, {0: 2})
    failed = {**fine, 2: WrittenItem(0, 0, (), error="OSError: disk full")}
    check_merged_changes("accounts", paths, failed, {0: 2, 2: 4})  # a failed item fails in its own task
    with pytest.raises(ConservationError, match=r"r=a: 2 changed rows routed to the partition, 1 changed"):
        check_merged_changes("accounts", paths, {0: WrittenItem(5, 5, (), changed=1)}, {0: 2})


def test_changes_needs_a_postgres_source(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    pq.write_table(day_table(1, range(5)), root / "d1.parquet")
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: events\n"
        f"    from: file:{root}\n"
        "    acceleration:\n"
        "      refresh_mode: changes\n"
        "      primary_key: [id]\n"
        '      partition_by: [{k: "kind"}]\n'
        "      refresh: {watermark_column: created_at}\n"
    )
    with pytest.raises(RefreshError, match="refresh_mode: changes reads Postgres sources only"):
        refresh_dataset(load_spec(tmp_path / "spec.yaml"), "events")


@pytest.mark.parametrize(
    ("settings", "schema", "message"),
    [
        (
            "refresh_mode: append",
            "{ts: 'timestamp[us]'}",
            r"refresh_mode: append needs refresh.watermark_column",
        ),
        (
            "refresh_mode: append\n      refresh: {watermark_column: ts}",
            "{ts: 'timestamp[ns]'}",
            r"nanosecond timestamps cannot be an exact watermark.*declare it as `ts: timestamp\[us\]`",
        ),
        (
            "refresh_mode: append\n      refresh: {watermark_column: f}",
            "{ts: 'timestamp[us]', f: double}",
            r"column 'f' is double; a watermark must be an integer, date or timestamp column",
        ),
        (
            "refresh_mode: append\n      refresh: {watermark_column: tss}",
            "{ts: 'timestamp[us]'}",
            r"refresh.watermark_column: unknown column 'tss' \(did you mean 'ts'\?\)",
        ),
        (
            "refresh_mode: changes\n      primary_key: [idd]\n      refresh: {watermark_column: ts}",
            "{id: int64, ts: 'timestamp[us]'}",
            r"primary_key: unknown column 'idd'",
        ),
        ("refresh_mode: sometimes", "{ts: 'timestamp[us]'}", r"unknown refresh_mode 'sometimes'"),
        (
            "primary_key: [id, id]",
            "{id: int64, ts: 'timestamp[us]'}",
            r"primary_key names \['id'\] more than once",
        ),
    ],
)
def test_refresh_mode_settings_are_checked_at_load(settings: str, schema: str, message: str) -> None:
    text = (
        "datasets:\n"
        "  - name: t\n"
        "    from: postgres:public.t\n"
        f"    schema: {schema}\n"
        "    acceleration:\n"
        f"      {settings}\n"
        "      partition_by: [\"date_trunc('day', ts)\"]\n"
    )
    with pytest.raises(SpecValidationError, match=message):
        parse_spec(text)
