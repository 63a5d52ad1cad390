"""`verify` proves an acceleration equals its source partition by partition, and `--repair` restores it.

Real parquet sources of hostile rows (NULLs in every column, partition columns included; unicode, `/ = %`
and quotes; -0.0, NaN, timestamps with offsets), every engine (parquet, duckdb files and tables, arrow),
a real Postgres source. Drift is injected on the source side (a file rewritten, an UPDATE / DELETE /
INSERT) and on the acceleration side (a partition republished through the catalog API with different but
valid files). Every injected drift is found in exactly the partitions it touched; an unchanged dataset
verifies clean.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from matrix_support import hostile_chunks, multiset_difference, rows_by_key
from test_arrow_refresh import COMPOSITE, DATASET, read_back, write_source, write_spec

from airflow_partitions.catalog import RowCertificate
from airflow_partitions.catalog.model import file_key_path
from airflow_partitions.cli.main import main as cli_main
from airflow_partitions.refresh import refresh_dataset
from airflow_partitions.refresh.commit import partition_spec_info
from airflow_partitions.refresh.pipeline import load_project
from airflow_partitions.refresh.verify import last_verify, verify_dataset
from airflow_partitions.storage import get_storage
from airflow_partitions.table import open_handle
from airflow_partitions.transforms import parse_transform
from airflow_partitions.write.row_hash import RowTally, tally_by_partition, tally_rows

ENGINES = ["parquet", "duckdb", "duckdb_tables", "arrow"]


# --- the row hash ---------------------------------------------------------------------------------


def test_row_hash_tells_null_empty_and_null_text_apart() -> None:
    """NULL, '' and 'NULL' are three different rows; so are 0.0 and -0.0 (the files keep the sign)."""
    schema = pa.schema([("s", pa.string())])
    tallies = {
        repr(value): tally_rows(pa.table({"s": pa.array([value], pa.string())}), schema)
        for value in (None, "", "NULL")
    }
    assert len({t.total for t in tallies.values()}) == 3, tallies
    doubles = pa.schema([("x", pa.float64())])
    zero = tally_rows(pa.table({"x": [0.0]}), doubles)
    negative_zero = tally_rows(pa.table({"x": [-0.0]}), doubles)
    assert zero != negative_zero
    # Every NaN is one NaN: a NaN rewritten with another payload is the same value.
    nan_bits = pa.array([0x7FF8000000000001], pa.int64()).view(pa.float64())
    assert tally_rows(pa.table({"x": nan_bits}), doubles) == tally_rows(
        pa.table({"x": [float("nan")]}), doubles
    )


def test_row_hash_is_order_independent_and_counts_duplicates() -> None:
    schema = pa.schema([("a", pa.int64()), ("b", pa.string())])
    table = pa.table({"a": [1, 2, 3], "b": ["x", None, "z"]}, schema=schema)
    reversed_rows = table.take(pa.array([2, 1, 0]))
    assert tally_rows(table, schema) == tally_rows(reversed_rows, schema)
    doubled = pa.concat_tables([table, table.slice(0, 1)])
    once = tally_rows(table, schema)
    assert tally_rows(doubled, schema) != once
    # A duplicate adds its row's hash again (a xor would cancel a pair out).
    assert tally_rows(pa.concat_tables([table, table]), schema).total != 0
    # The hash of a union is the sum of the parts' (what an append's certificate relies on).
    first, second = tally_rows(table.slice(0, 1), schema), tally_rows(table.slice(1), schema)
    assert first.certificate().plus(second.certificate()) == once.certificate()


def test_row_hash_sees_column_order_and_values_swapped_between_columns() -> None:
    schema = pa.schema([("a", pa.string()), ("b", pa.string())])
    one = pa.table({"a": ["x"], "b": ["y"]}, schema=schema)
    swapped = pa.table({"a": ["y"], "b": ["x"]}, schema=schema)
    assert tally_rows(one, schema) != tally_rows(swapped, schema)


def test_row_hash_is_the_same_in_another_process() -> None:
    """The certificate recorded by one process is checked by another: the hash must not be seeded."""
    code = (
        "import pyarrow as pa, datetime as dt;"
        "from airflow_partitions.write.row_hash import tally_rows;"
        "u = dt.timezone.utc;"
        "t = pa.table({'s': ['a', None, ''], 'ts': pa.array([dt.datetime(2026, 1, 1, 5, tzinfo=u),"
        " None, dt.datetime(1970, 1, 1, tzinfo=u)], pa.timestamp('us', tz='UTC'))});"
        "print(tally_rows(t, t.schema).row_hash)"
    )
    table = pa.table(
        {
            "s": ["a", None, ""],
            "ts": pa.array(
                [dt.datetime(2026, 1, 1, 5, tzinfo=dt.UTC), None, dt.datetime(1970, 1, 1, tzinfo=dt.UTC)],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=_env_with_random_seed()
    )
    assert other.stdout.strip() == tally_rows(table, table.schema).row_hash


def _env_with_random_seed() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONHASHSEED"] = "12345"
    return env


def test_timestamps_hash_as_the_instant_they_store() -> None:
    """A timestamp read with an offset is the instant: +02:00 05:00 equals UTC 03:00."""
    utc = pa.schema([("ts", pa.timestamp("us", tz="UTC"))])
    offset = pa.array(
        [dt.datetime(2026, 1, 1, 5, tzinfo=dt.timezone(dt.timedelta(hours=2)))],
        pa.timestamp("us", tz="+02:00"),
    )
    same_instant = pa.array([dt.datetime(2026, 1, 1, 3, tzinfo=dt.UTC)], pa.timestamp("us", tz="UTC"))
    assert tally_rows(pa.table({"ts": offset}), utc) == tally_rows(pa.table({"ts": same_instant}), utc)


def test_tally_by_partition_routes_like_a_refresh() -> None:
    """Per-partition tallies add up to the whole, NULL keys included."""
    table = pa.concat_tables(hostile_chunks(3))
    transforms = [parse_transform(expr) for _, expr in COMPOSITE]
    transforms = [t.bind(table.schema.field(t.source_column).type) for t in transforms]
    tallies = tally_by_partition(table, table.schema, transforms)
    assert sum(t.rows for t in tallies.values()) == table.num_rows
    total = RowTally()
    for tally in tallies.values():
        total.add(tally.rows, tally.total)
    assert total == tally_rows(table, table.schema)
    assert any(None in key.values for key in tallies)


def test_partition_groups_name_the_keys_route_rows_finds() -> None:
    """The group of each row is the partition `route_rows` puts it in (NULL keys included)."""
    from airflow_partitions.write.routing import partition_groups, route_rows

    table = pa.concat_tables(hostile_chunks(5))
    transforms = [parse_transform(expr) for _, expr in COMPOSITE]
    transforms = [t.bind(table.schema.field(t.source_column).type) for t in transforms]
    groups, keys = partition_groups(table, transforms)
    routed = route_rows(table, transforms)
    assert sorted(map(repr, keys)) == sorted(map(repr, routed))
    codes = groups.to_pylist()
    for index, key in enumerate(keys):
        ids = sorted(table.column("id").filter(pa.array([c == index for c in codes])).to_pylist())
        assert ids == sorted(routed[key].column("id").to_pylist()), key


# --- files source, every engine ---------------------------------------------------------------------


def build(tmp_path: Path, engine: str, seed: int = 11) -> tuple[Path, list[pa.Table]]:
    chunks = hostile_chunks(seed)
    write_source(tmp_path, chunks)
    spec = write_spec(tmp_path, engine, COMPOSITE)
    refresh_dataset(spec, DATASET, strategy="arrow")
    return spec, chunks


def verdicts(report: Any) -> dict[str, str]:
    return {c.key_path: str(c.verdict) for c in report.differing}


def source_key_of(chunks: list[pa.Table], chunk: int, row: int) -> str:
    table = pa.concat_tables(chunks)
    offset = sum(c.num_rows for c in chunks[:chunk]) + row
    return next(
        path
        for path, rows in rows_by_key(table, COMPOSITE).items()
        if table.column("id")[offset].as_py() in rows.column("id").to_pylist()
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_unchanged_dataset_verifies_clean_and_certified(tmp_path: Path, engine: str) -> None:
    spec, chunks = build(tmp_path, engine)
    report = verify_dataset(spec, DATASET)
    assert report.ok, [c.to_json() for c in report.differing]
    total = sum(c.num_rows for c in chunks)
    assert sum(c.source_rows for c in report.partitions) == total
    assert sum(c.acceleration_rows for c in report.partitions) == total
    # Every partition carries the certificate its commit computed, and the files still match it: known
    # by their checksums, and read back and hashed (`deep`).
    assert all(c.certificate_matches is True for c in report.partitions)
    deep = verify_dataset(spec, DATASET, deep=True, record=False)
    assert deep.ok
    assert all(c.certificate_matches is True and c.checked_by == "recomputed" for c in deep.partitions)
    recorded = last_verify(open_handle(load_project(spec), load_project(spec).dataset(DATASET)).catalog)
    assert recorded is not None
    assert recorded["result"] == "equal"


def _rewrite_chunk(tmp_path: Path, chunks: list[pa.Table], index: int, table: pa.Table) -> None:
    chunks[index] = table
    pq.write_table(table, tmp_path / "src" / f"chunk{index}.parquet")


@pytest.mark.parametrize("engine", ENGINES)
def test_source_drift_is_found_in_exactly_the_touched_partitions(tmp_path: Path, engine: str) -> None:
    spec, chunks = build(tmp_path, engine)
    expected: dict[str, str] = {}
    first = chunks[0]
    # A changed value (the partition columns kept: same partition, same count, different rows).
    changed_at = 5
    amount = pa.array(
        [
            v if i != changed_at else (v + 1 if v is not None else 7)
            for i, v in enumerate(first.column("n_int").to_pylist())
        ],
        pa.int64(),
    )
    first = first.set_column(first.schema.get_field_index("n_int"), "n_int", amount)
    expected[source_key_of(chunks, 0, changed_at)] = "drifted"
    # A value changed to NULL (a non-partition column) in another row.
    nulled_at = 9
    x = first.column("x").to_pylist()
    if x[nulled_at] is None:
        x[nulled_at] = 1.5
    else:
        x[nulled_at] = None
    first = first.set_column(first.schema.get_field_index("x"), "x", pa.array(x, pa.float64()))
    expected[source_key_of(chunks, 0, nulled_at)] = "drifted"
    _rewrite_chunk(tmp_path, chunks, 0, first)
    # A row deleted, and a row added (copy of another row with a new id).
    second = chunks[1]
    deleted_key = source_key_of(chunks, 1, 3)
    deleted_id = second.column("id")[3].as_py()
    _rewrite_chunk(tmp_path, chunks, 1, second.filter(pc.not_equal(second.column("id"), deleted_id)))
    added = chunks[2].slice(4, 1)
    added = added.set_column(0, "id", pa.array([42], pa.int64()))
    added_key = source_key_of(chunks, 2, 4)
    _rewrite_chunk(tmp_path, chunks, 2, pa.concat_tables([chunks[2], added]))
    report = verify_dataset(spec, DATASET)
    found = verdicts(report)
    for key in (deleted_key, added_key):
        assert key in found, f"{key} not reported: {found}"
    for key, verdict in expected.items():
        assert found.get(key) == verdict, (key, found)
    assert set(found) == {*expected, deleted_key, added_key}
    assert not report.ok
    # The CLI reports the same and exits 1; --repair fixes it in one commit and verifies clean.
    assert cli_main(["verify", str(spec), DATASET, "--json"]) == 1
    versions_before = open_handle(load_project(spec), load_project(spec).dataset(DATASET)).catalog.latest()
    assert cli_main(["verify", str(spec), DATASET, "--repair", "--strategy", "arrow"]) == 0
    catalog = open_handle(load_project(spec), load_project(spec).dataset(DATASET)).catalog
    assert versions_before is not None
    assert catalog.latest().version == versions_before.version + 1  # type: ignore[union-attr]
    assert verify_dataset(spec, DATASET).ok
    missing, extra = multiset_difference(read_back(spec), pa.concat_tables(chunks))
    assert not missing
    assert not extra


def _republish(spec: Path, changes: dict[str, pa.Table], dataset_name: str = DATASET) -> None:
    """Publish `changes` (key path -> rows) as those partitions' files through the catalog API: valid
    files with their own sizes and checksums, the old certificates kept (as a wrong writer would). A
    partition of an older spec (`@<spec id>/...`) gets its files where a write puts them."""
    project = load_project(spec)
    dataset = project.dataset(dataset_name)
    catalog = open_handle(project, dataset).catalog
    snapshot = catalog.latest()
    assert snapshot is not None
    storage = get_storage(dataset.acceleration)
    root = open_handle(project, dataset).local_root
    upserts = []
    for key_path, table in changes.items():
        entry = snapshot.partitions[key_path]
        files = storage.write(table, root, file_key_path(key_path)) if table.num_rows else []
        published = storage.publish(root, files) if files else []
        upserts.append(entry.with_files(published))
    catalog.commit(
        base_version=snapshot.version,
        upserts=upserts,
        partition_spec=partition_spec_info(dataset),
        operation="write",
    )


def _partition_rows(spec: Path, key_path: str, dataset_name: str = DATASET) -> pa.Table:
    project = load_project(spec)
    dataset = project.dataset(dataset_name)
    snapshot = open_handle(project, dataset).catalog.latest()
    assert snapshot is not None
    entry = snapshot.partitions[key_path]
    return get_storage(dataset.acceleration).read(open_handle(project, dataset).local_root, entry.files)


@pytest.mark.parametrize("engine", ENGINES)
def test_acceleration_drift_is_found_and_repaired(tmp_path: Path, engine: str) -> None:
    spec, chunks = build(tmp_path, engine)
    sizes = {path: rows.num_rows for path, rows in rows_by_key(pa.concat_tables(chunks), COMPOSITE).items()}
    big = sorted((path for path, n in sizes.items() if n >= 3), key=lambda p: -sizes[p])
    changed, shrunk, moved_from, moved_to, nulled = big[:5]
    tables = {path: _partition_rows(spec, path) for path in (changed, shrunk, moved_from, moved_to, nulled)}
    # A changed value: a string column edited in one row.
    s = tables[changed].column("n_int").to_pylist()
    s[0] = (s[0] or 0) + 1
    tables[changed] = tables[changed].set_column(
        tables[changed].schema.get_field_index("n_int"), "n_int", pa.array(s, pa.int64())
    )
    # A missing row.
    tables[shrunk] = tables[shrunk].slice(1)
    # A row moved to another partition's file (the totals unchanged).
    row = tables[moved_from].slice(0, 1)
    tables[moved_from] = tables[moved_from].slice(1)
    tables[moved_to] = pa.concat_tables([tables[moved_to], row])
    # A value changed to NULL.
    x = tables[nulled].column("d").to_pylist()
    x[0] = None if x[0] is not None else dt.date(2026, 1, 1)
    tables[nulled] = tables[nulled].set_column(
        tables[nulled].schema.get_field_index("d"), "d", pa.array(x, pa.date32())
    )
    _republish(spec, tables)
    report = verify_dataset(spec, DATASET)
    found = verdicts(report)
    assert found == dict.fromkeys([changed, shrunk, moved_from, moved_to, nulled], "drifted"), found
    # The files no longer hold what their commits certified.
    assert all(c.certificate_matches is False for c in report.differing)
    repaired = verify_dataset(spec, DATASET, repair=True, strategy="arrow")
    assert repaired.ok
    assert sorted(repaired.repaired) == sorted(found)
    assert verify_dataset(spec, DATASET).ok
    missing, extra = multiset_difference(read_back(spec), pa.concat_tables(chunks))
    assert not missing
    assert not extra


def test_extra_and_missing_partitions(tmp_path: Path) -> None:
    """A partition only the acceleration has is extra; one only the source has is missing."""
    spec, chunks = build(tmp_path, "parquet")
    by_key = rows_by_key(pa.concat_tables(chunks), COMPOSITE)
    gone = sorted(by_key)[-1]
    ids = by_key[gone].column("id")
    for index, chunk in enumerate(chunks):
        _rewrite_chunk(tmp_path, chunks, index, chunk.filter(pc.invert(pc.is_in(chunk.column("id"), ids))))
    # The acceleration loses a partition through the catalog (as a bad removal would).
    project = load_project(spec)
    dataset = project.dataset(DATASET)
    catalog = open_handle(project, dataset).catalog
    snapshot = catalog.latest()
    assert snapshot is not None
    lost = sorted(p for p in by_key if p != gone)[0]
    catalog.commit(
        base_version=snapshot.version, upserts=[], removes=[lost], partition_spec=partition_spec_info(dataset)
    )
    report = verify_dataset(spec, DATASET)
    assert verdicts(report) == {gone: "extra", lost: "missing"}
    assert report.counts() == {"equal": len(by_key) - 2, "drifted": 0, "missing": 1, "extra": 1}
    # Narrowed to the two partitions: the same verdicts, read from those partitions only.
    narrowed = verify_dataset(spec, DATASET, partitions=[gone, lost])
    assert verdicts(narrowed) == {gone: "extra", lost: "missing"}
    assert len(narrowed.partitions) == 2
    assert verify_dataset(spec, DATASET, repair=True, strategy="arrow").ok
    assert verify_dataset(spec, DATASET).ok


def test_where_selects_partitions(tmp_path: Path) -> None:
    spec, _ = build(tmp_path, "parquet")
    report = verify_dataset(spec, DATASET, where="cf = true")
    assert report.ok
    assert report.partitions
    assert all(c.key_path.endswith("cf=true") for c in report.partitions)


def test_cli_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, _ = build(tmp_path, "arrow")
    assert cli_main(["verify", str(spec), DATASET, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["result"] == "equal"
    assert out["counts"]["drifted"] == 0
    assert all(p["verdict"] == "equal" for p in out["partitions"])
    # status shows the last verify, in text and JSON.
    assert cli_main(["status", str(spec), DATASET, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["datasets"][0]["last_verify"]["result"] == "equal"
    assert cli_main(["status", str(spec), DATASET]) == 0
    assert "last verify   equal" in capsys.readouterr().out


def test_certificates_in_status_and_checkpoints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The certificate survives the catalog's checkpoint and shows in `status --partitions --json`."""
    spec, _ = build(tmp_path, "parquet")
    project = load_project(spec)
    dataset = project.dataset(DATASET)
    catalog = open_handle(project, dataset).catalog
    snapshot = catalog.latest()
    assert snapshot is not None
    from airflow_partitions.catalog.state import decode_checkpoint, encode_checkpoint

    reloaded = decode_checkpoint(encode_checkpoint(snapshot), where="test")
    for path, entry in snapshot.partitions.items():
        assert isinstance(entry.certificate, RowCertificate)
        assert reloaded.partitions[path].certificate == entry.certificate
    assert cli_main(["status", str(spec), DATASET, "--partitions", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    text = json.dumps(out)
    some = next(iter(snapshot.partitions.values()))
    assert some.certificate is not None
    assert some.certificate.row_hash in text


# --- Airflow: certificates on asset events, the VerifyOperator ------------------------------------------


@pytest.mark.airflow
@pytest.mark.spark
def test_spark_written_partitions_are_certified_and_verify_operator_repairs(tmp_path: Path) -> None:
    """Partitions the Spark executors write carry the certificate they computed; the commit's asset
    events carry them by partition key; `VerifyOperator` passes, fails on injected drift, repairs it."""
    from airflow.sdk import Asset
    from test_operators import commit, context, latest, make_spec, stage_and_refresh

    from airflow_partitions.exceptions import VerifyDriftError
    from airflow_partitions.operators import VerifyOperator
    from airflow_partitions.operators.commit import asset_partition_key

    spec = make_spec(tmp_path)
    refreshed = stage_and_refresh(spec)
    assert refreshed.stage is not None
    assert refreshed.stage["mode"] == "written"
    asset = Asset(name="sales", uri=(tmp_path / "acc" / "sales").as_uri())
    _, ctx = commit(spec, refreshed, outlets=[asset])
    snapshot = latest(spec)
    extra = ctx["outlet_events"][asset].extra
    assert extra["certificates"] == {
        asset_partition_key(entry.key): entry.certificate.to_json() for entry in snapshot.partitions.values()
    }
    assert len(extra["certificates"]) == 6
    # The executors' certificates are the row hashes of the files as verify recomputes them.
    result = VerifyOperator(task_id="verify", spec_path=spec, dataset="sales").execute(context())
    assert result["ok"]
    assert result["counts"]["equal"] == 6
    assert result["partitions"] == []

    key_path = sorted(snapshot.partitions)[0]
    rows = _partition_rows(spec, key_path, "sales")
    _republish(spec, {key_path: rows.slice(1)}, "sales")
    with pytest.raises(VerifyDriftError, match="1 partition"):
        VerifyOperator(task_id="verify", spec_path=spec, dataset="sales").execute(context())
    repaired = VerifyOperator(
        task_id="verify", spec_path=spec, dataset="sales", repair=True, strategy="arrow"
    ).execute(context())
    assert repaired["ok"]
    assert repaired["repaired"] == [key_path]
    assert repaired["result"] == "repaired"
    assert VerifyOperator(task_id="verify", spec_path=spec, dataset="sales").execute(context())["ok"]


# --- a Postgres source ----------------------------------------------------------------------------------

PG_DAY = "day=2026-02-02T00%3A00%3A00%2B00%3A00"


def _create_hostile_orders(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.orders (id bigint PRIMARY KEY, note text, total numeric(12, 2), "
            "x double precision, placed_at timestamptz, updated_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute("CREATE INDEX orders_placed ON public.orders (placed_at)")
        notes = [None, "", "NULL", "Zürich/Ost", "a=b%c", 'it\'s "quoted"']
        doubles = [0.0, -0.0, None, float("nan"), 1.5, -2.25]
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO public.orders (id, note, total, x, placed_at) VALUES (%s, %s, %s, %s, %s)",
                [
                    (
                        i,
                        notes[i % len(notes)],
                        None if i % 9 == 0 else f"{i * 1.25:.2f}",
                        doubles[i % len(doubles)],
                        None
                        if i % 11 == 0
                        else dt.datetime(
                            2026, 2, 1 + i % 4, i % 24, tzinfo=dt.timezone(dt.timedelta(hours=2))
                        ),
                    )
                    for i in range(60)
                ],
            )


def _pg_spec(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(
        f"accelerator_dir: {tmp_path / 'acc'}\n"
        "datasets:\n"
        "  - name: orders\n"
        "    from: postgres:public.orders\n"
        f"    params: {{url: '{url}'}}\n"
        "    acceleration:\n"
        "      engine: duckdb\n"
        "      partition_by: [{day: \"date_trunc('day', placed_at)\"}]\n"
        "      refresh: {check_column: updated_at}\n"
    )
    return path


@pytest.mark.postgres
def test_postgres_drift_found_per_partition_and_repaired(pg_database: str, tmp_path: Path) -> None:
    import psycopg

    _create_hostile_orders(pg_database)
    spec = _pg_spec(tmp_path, pg_database)
    summary = refresh_dataset(spec, "orders")
    assert summary.stage_mode == "pushdown"
    clean = verify_dataset(spec, "orders")
    assert clean.ok, [c.to_json() for c in clean.differing]
    assert sum(c.source_rows for c in clean.partitions) == 60
    assert any(c.key_path.endswith("%NULL") for c in clean.partitions), "the NULL partition is checked too"

    with psycopg.connect(pg_database, autocommit=True) as conn:
        # In place, updated_at kept: the change fingerprint (count + max) cannot see these; verify must.
        conn.execute("UPDATE public.orders SET total = total + 1 WHERE id = 13")  # 2026-02-02
        conn.execute("UPDATE public.orders SET note = NULL WHERE id = 3")  # a text -> NULL, 2026-02-04
        conn.execute("UPDATE public.orders SET x = 0.0 WHERE id = 7")  # -0.0 -> 0.0, 2026-02-04
        conn.execute(  # a row moved from 2026-02-03 to 2026-02-01
            "UPDATE public.orders SET placed_at = '2026-02-01 05:00:00+00' WHERE id = 2"
        )
    found = verdicts(verify_dataset(spec, "orders"))
    days = {day: f"day=2026-02-0{day}T00%3A00%3A00%2B00%3A00" for day in (1, 2, 3, 4)}
    assert found == dict.fromkeys([days[1], days[2], days[3], days[4]], "drifted"), found
    # Narrowed to one day: the partition's WHERE is pushed down to Postgres.
    one = verify_dataset(spec, "orders", partitions=[PG_DAY])
    assert [c.key_path for c in one.partitions] == [PG_DAY]
    assert verdicts(one) == {PG_DAY: "drifted"}

    repaired = verify_dataset(spec, "orders", repair=True)
    assert repaired.ok
    assert sorted(repaired.repaired) == sorted(found)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("DELETE FROM public.orders WHERE placed_at IS NULL")  # the NULL partition emptied
        conn.execute(
            "INSERT INTO public.orders (id, note, placed_at) VALUES (500, 'late', '2026-03-09 01:00+00')"
        )
    found = verdicts(verify_dataset(spec, "orders"))
    assert found == {"day=%NULL": "extra", "day=2026-03-09T00%3A00%3A00%2B00%3A00": "missing"}, found
    assert cli_main(["verify", str(spec), "orders", "--repair"]) == 0
    assert verify_dataset(spec, "orders").ok
    # A full read equals the source row for row (hash per row, NULLs and types included).
    project = load_project(spec)
    from airflow_partitions.sources import open_source

    source = open_source(project.dataset("orders").source).read_all()
    missing, extra = multiset_difference(read_back_dataset(spec, "orders"), source)
    assert not missing
    assert not extra


@pytest.mark.postgres
def test_postgres_verify_streams_batches(pg_database: str, tmp_path: Path, monkeypatch: Any) -> None:
    """The Postgres side of verify is read batch by batch (a table many batches long), whole and per
    partition, and still finds one changed value among 6,000 rows."""
    import psycopg

    from airflow_partitions.sources import open_source, postgres

    _create_hostile_orders(pg_database)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO public.orders (id, note, total, x, placed_at) SELECT g, repeat('é/=%', g % 40), "
            "g * 0.25, CASE WHEN g % 7 = 0 THEN NULL ELSE g / 3.0 END, "
            "'2026-02-01 00:00:00+02'::timestamptz + (g % 96) * interval '1 hour' "
            "FROM generate_series(1000, 6939) g"
        )
    spec = _pg_spec(tmp_path, pg_database)
    refresh_dataset(spec, "orders")
    monkeypatch.setattr(postgres, "STREAM_BATCH_BYTES", 16 << 10)
    source = open_source(load_project(spec).dataset("orders").source)
    batches = list(source.read_batches())
    assert len(batches) > 10, "the table is many batches long"
    streamed = pa.Table.from_batches(batches)
    missing, extra = multiset_difference(streamed, source.read_all())
    assert not missing
    assert not extra

    clean = verify_dataset(spec, "orders")
    assert clean.ok, [c.to_json() for c in clean.differing]
    assert clean.source_read == "postgres-stream"
    assert sum(c.source_rows for c in clean.partitions) == 6000
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("UPDATE public.orders SET note = 'changed' WHERE id = 4264")  # 2026-02-02 14:00 UTC
    assert verdicts(verify_dataset(spec, "orders")) == {PG_DAY: "drifted"}
    one = verify_dataset(spec, "orders", partitions=[PG_DAY])
    assert one.source_read == "per partition"
    assert verdicts(one) == {PG_DAY: "drifted"}
    assert sum(c.source_rows for c in one.partitions) > 1000


def read_back_dataset(spec: Path, dataset: str) -> pa.Table:
    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

    hook = PartitionedDatasetHook(dataset=dataset, spec_path=str(spec))
    try:
        return hook.read()
    finally:
        hook.reader.close()


@pytest.mark.postgres
def test_append_certificates_add_up_and_verify_names_the_late_row(pg_database: str, tmp_path: Path) -> None:
    """An appended partition's certificate is its old rows' plus the new ones' (the files agree), and the
    late row an append cannot see is named by verify as its partition's drift, then repaired."""
    import psycopg
    from test_refresh_modes import create_events, events_spec, insert_events

    create_events(pg_database)
    # late_rows: report, so the append leaves the late row out (the default rewrites its partition whole).
    project = events_spec(
        tmp_path, pg_database, "{day: \"date_trunc('day', created_at)\"}", late_rows="report"
    )
    refresh_dataset(project, "events")
    day1 = "day=2026-03-01T00%3A00%3A00%2B00%3A00"
    catalog = open_handle(project, project.dataset("events")).catalog
    before = catalog.latest()
    assert before is not None
    watermark = max(f.stats["created_at"].max for f in before.partitions[day1].files)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        insert_events(conn, range(100, 110), day=1, hour=23)
        conn.execute("INSERT INTO public.events VALUES (300, 'late', 1, 'x', %s)", (watermark,))
    summary = refresh_dataset(project, "events")
    assert summary.refresh_mode == "append"
    assert summary.appended_rows == 10
    after = catalog.latest()
    assert after is not None
    entry = after.partitions[day1]
    old = before.partitions[day1].certificate
    assert entry.certificate is not None
    assert old is not None
    assert entry.certificate.rows == old.rows + 10
    report = verify_dataset(project, "events")
    assert verdicts(report) == {day1: "drifted"}
    (check,) = report.differing
    assert (check.source_rows, check.acceleration_rows) == (entry.rows + 1, entry.rows)
    assert check.certificate_matches is True, "the files hold exactly what the append certified"
    assert verify_dataset(project, "events", repair=True).ok
    assert verify_dataset(project, "events").ok


def test_verify_after_a_changed_partition_by_routes_every_partition_under_the_new_one(tmp_path: Path) -> None:
    """With partition_by changed and nothing moved yet, every stored partition is of the old spec: verify
    reads them all, counts their rows under the new spec's keys, and finds each partition equal."""
    spec, chunks = build(tmp_path, "parquet")
    spec.write_text(spec.read_text().replace("bucket(4, s)", "bucket(5, s)"), encoding="utf-8")
    report = verify_dataset(spec, DATASET)
    assert report.ok, [c.to_json() for c in report.differing]
    total = sum(c.num_rows for c in chunks)
    assert report.old_rows == total
    assert sum(c.old_layout_rows for c in report.partitions) == total
    assert sorted(c.key_path for c in report.partitions) == sorted(
        rows_by_key(
            pa.concat_tables(chunks), [(n, e.replace("bucket(4, s)", "bucket(5, s)")) for n, e in COMPOSITE]
        )
    )
    assert all(c.old_layout and c.old_layout[0].startswith("@") for c in report.partitions)
    assert cli_main(["verify", str(spec), DATASET]) == 0
    # Selecting by the new keys plans on the switched view without committing it: nothing written.
    version = report.version
    first = report.partitions[0]
    selected = verify_dataset(spec, DATASET, partitions=[first.key_path])
    assert selected.ok, [c.to_json() for c in selected.differing]
    assert [(c.key_path, c.source_rows, c.old_layout_rows) for c in selected.partitions] == [
        (first.key_path, first.source_rows, first.source_rows)
    ]
    catalog = open_handle(load_project(spec), load_project(spec).dataset(DATASET)).catalog
    assert catalog.latest().version == version  # type: ignore[union-attr]


def test_writes_keep_certificates_that_match_their_files(tmp_path: Path) -> None:
    """An append through the write API adds the new rows' certificate to the partition's; an upsert that
    rewrites a partition certifies what it wrote; verify finds the files match them."""
    import numpy as np

    from airflow_partitions.write.commit import append, upsert

    source = tmp_path / "src"
    source.mkdir()
    table = pa.table(
        {
            "id": pa.array(np.arange(200, dtype=np.int64)),
            "s": pa.array([None if i % 7 == 0 else ("" if i % 5 == 0 else f"v{i}") for i in range(200)]),
            "x": pa.array([-0.0 if i % 3 == 0 else i / 4 for i in range(200)], pa.float64()),
        }
    )
    pq.write_table(table, source / "rows.parquet")
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"accelerator_dir: {tmp_path / 'acc'}\n"
        "datasets:\n"
        "  - name: w\n"
        f"    from: file:{source}\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        "      engine: parquet\n"
        "      primary_key: [id]\n"
        '      partition_by: [{b: "bucket(4, id)"}]\n',
        encoding="utf-8",
    )
    refresh_dataset(spec, "w", strategy="arrow")
    project = load_project(spec)
    more = table.slice(0, 20).set_column(0, "id", pa.array(np.arange(1000, 1020, dtype=np.int64)))
    append(open_handle(project, project.dataset("w")), more)
    pq.write_table(pa.concat_tables([table, more]), source / "rows.parquet")
    check_certificates(spec, project, expect_all=True)
    # An upsert rewrites files: a partition that lost rows from kept files has no certificate until its
    # next refresh; one rewritten whole, or untouched, keeps a true one.
    changed = table.slice(40, 10).set_column(1, "s", pa.array(["changed"] * 10))
    upsert(open_handle(project, project.dataset("w")), changed)
    unchanged = table.filter(pc.invert(pc.is_in(table.column("id"), changed.column("id"))))
    pq.write_table(pa.concat_tables([unchanged, changed, more]), source / "rows.parquet")
    check_certificates(spec, project, expect_all=False)


def check_certificates(spec: Path, project: Any, *, expect_all: bool) -> None:
    snapshot = open_handle(project, project.dataset("w")).catalog.latest()
    assert snapshot is not None
    with_rows = [e for e in snapshot.partitions.values() if e.files]
    if expect_all:
        assert all(e.certificate is not None for e in with_rows)
    report = verify_dataset(spec, "w")
    assert report.ok, [c.to_json() for c in report.differing]
    by_path = {c.key_path: c for c in report.partitions}
    for entry in with_rows:
        expected = True if entry.certificate is not None else None
        assert by_path[entry.key_path].certificate_matches is expected, entry.key_path


# --- the source side in one DuckDB aggregate equals the Arrow routing ------------------------------------

# Bucket (grouped by raw value, applied in Arrow), calendar fields computed in SQL over dates, tz-aware
# and naive timestamps, and an identity; NULL keys in every field.
PARITY_FIELDS = (
    *COMPOSITE,
    ("td", "date_trunc('day', ts)"),
    ("th", "date_trunc('hour', ts_naive)"),
    ("tm", "date_part('month', ts)"),
)


def _drifting_parquet_chunks(chunks: list[pa.Table]) -> list[pa.Table]:
    """The chunks with their own physical types: millisecond timestamps, a large string, date64, and
    a file without the `flag` column (read as NULL) -- what the source unifies."""
    first = chunks[0].set_column(
        chunks[0].schema.get_field_index("ts_naive"),
        "ts_naive",
        pc.cast(pc.floor_temporal(chunks[0].column("ts_naive"), unit="millisecond"), pa.timestamp("ms")),
    )
    second = chunks[1].drop_columns(["flag"])
    second = second.set_column(
        second.schema.get_field_index("s"), "s", second.column("s").cast(pa.large_string())
    )
    third = chunks[2].set_column(
        chunks[2].schema.get_field_index("d"), "d", chunks[2].column("d").cast(pa.date64())
    )
    return [first, second, third]


def _source_tallies_both_ways(spec: Path) -> tuple[dict[str, RowTally], dict[str, RowTally], str]:
    from airflow_partitions.refresh.pipeline import bind_dataset, resolve_dataset
    from airflow_partitions.refresh.verify import _tally_whole_source
    from airflow_partitions.sources import open_dataset_source

    project = load_project(spec)
    dataset = resolve_dataset(project, DATASET)
    source = open_dataset_source(dataset)
    bound = bind_dataset(dataset, source)
    transforms = [f.transform for f in bound.acceleration.partition_by]
    names = bound.acceleration.partition_names
    schema = source.schema()
    fast, how = _tally_whole_source(source, schema, transforms)
    reference = tally_by_partition(source.read_all(), schema, transforms)
    return (
        {key.path(names): tally for key, tally in fast.items()},
        {key.path(names): tally for key, tally in reference.items()},
        how,
    )


@pytest.mark.parametrize(
    ("kind", "read"),
    [
        ("parquet", "duckdb"),
        ("drifting", "duckdb"),
        ("csv", "arrow-stream"),
        ("json", "arrow-stream"),
        ("hive", "arrow-stream"),
    ],
)
def test_source_side_in_duckdb_equals_the_arrow_routing(tmp_path: Path, kind: str, read: str) -> None:
    """Per partition, the count and hash of the one-aggregate source read equal those of the connector's
    whole Arrow read routed by the dataset's transforms: hostile rows (NULLs everywhere, unicode, -0.0,
    NaN, instants written with offsets and without), Parquet files whose types drift, CSV and JSON."""
    from matrix_support import MatrixSource

    chunks = hostile_chunks(23)
    matrix = MatrixSource("parquet" if kind == "drifting" else kind, tmp_path, hive_columns=("flag",))
    matrix.write(_drifting_parquet_chunks(chunks) if kind == "drifting" else chunks)
    lines = [f"accelerator_dir: {tmp_path / 'acc'}", "datasets:", f"  - name: {DATASET}"]
    lines += matrix.spec_lines()
    lines += ["    acceleration:", "      engine: parquet", "      partition_by:"]
    lines += [f'        - {name}: "{expr}"' for name, expr in PARITY_FIELDS]
    spec = tmp_path / "spec.yaml"
    spec.write_text("\n".join(lines) + "\n", encoding="utf-8")
    fast, reference, how = _source_tallies_both_ways(spec)
    assert how == read
    assert sum(t.rows for t in reference.values()) == sum(c.num_rows for c in chunks)
    assert fast == reference
    assert any("%NULL" in path for path in fast), "NULL keys are partitions too"
    # And the dataset refreshed from that source verifies clean through the same read.
    refresh_dataset(spec, DATASET, strategy="arrow")
    assert verify_dataset(spec, DATASET).ok


def test_certificates_stand_for_intact_files_and_deep_reads_them_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A partition whose files still hash to the catalog's SHA-256s is known by the certificate bound to
    them; a file rewritten in place (the catalog's checksum now stale) is read and its drift found;
    `--deep` reads every partition, and finds the same."""
    spec, _ = build(tmp_path, "parquet")
    clean = verify_dataset(spec, DATASET)
    assert clean.ok
    assert clean.checked_by() == {"certificate": len(clean.partitions), "recomputed": 0}
    assert all(c.checked_by == "certificate" for c in clean.partitions)
    deep = verify_dataset(spec, DATASET, deep=True)
    assert deep.ok
    assert deep.checked_by() == {"certificate": 0, "recomputed": len(deep.partitions)}
    assert [(c.source_hash, c.acceleration_hash) for c in deep.partitions] == [
        (c.source_hash, c.acceleration_hash) for c in clean.partitions
    ]
    # One partition's file rewritten under the catalog's feet with one row fewer.
    project = load_project(spec)
    dataset = project.dataset(DATASET)
    snapshot = open_handle(project, dataset).catalog.latest()
    assert snapshot is not None
    entry = max(snapshot.partitions.values(), key=lambda e: e.rows)
    file = open_handle(project, dataset).local_root / entry.files[0].path
    pq.write_table(pq.read_table(file).slice(1), file)
    for report in (verify_dataset(spec, DATASET), verify_dataset(spec, DATASET, deep=True)):
        assert verdicts(report) == {entry.key_path: "drifted"}
        (check,) = report.differing
        assert check.checked_by == "recomputed"
        assert check.certificate_matches is False
    assert cli_main(["verify", str(spec), DATASET, "--deep", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["deep"] is True
    assert out["checked_by"]["certificate"] == 0
    assert out["source_read"] == "duckdb"


def test_a_certificate_kept_with_other_files_is_not_trusted(tmp_path: Path) -> None:
    """A partition republished with new, valid files but its old certificate (a writer that does not
    certify): the certificate is bound to the old files, so the new ones are read and the drift found."""
    spec, _ = build(tmp_path, "parquet")
    snapshot = open_handle(load_project(spec), load_project(spec).dataset(DATASET)).catalog.latest()
    assert snapshot is not None
    key_path = max(snapshot.partitions.values(), key=lambda e: e.rows).key_path
    _republish(spec, {key_path: _partition_rows(spec, key_path).slice(1)})
    report = verify_dataset(spec, DATASET)
    assert verdicts(report) == {key_path: "drifted"}
    assert report.differing[0].checked_by == "recomputed"


def test_parquet_files_duckdb_reads_otherwise_are_streamed_through_the_connector(tmp_path: Path) -> None:
    """INT96 timestamps (Arrow reads nanoseconds, DuckDB microseconds) and a file name DuckDB would take
    as a pattern: the source is read through the connector's batches, with the same tallies."""
    chunks = hostile_chunks(31)
    source = tmp_path / "src"
    source.mkdir()
    pq.write_table(chunks[0], source / "int96.parquet", use_deprecated_int96_timestamps=True)
    pq.write_table(chunks[1], source / "b.parquet", use_deprecated_int96_timestamps=True)
    spec = write_spec(tmp_path, "parquet", COMPOSITE)
    fast, reference, how = _source_tallies_both_ways(spec)
    assert how == "arrow-stream"
    assert fast == reference
    for file in source.iterdir():
        file.unlink()
    pq.write_table(chunks[0], source / "a[1].parquet")
    pq.write_table(chunks[1], source / "b.parquet")
    fast, reference, how = _source_tallies_both_ways(spec)
    assert how == "arrow-stream"
    assert fast == reference
    assert sum(t.rows for t in fast.values()) == chunks[0].num_rows + chunks[1].num_rows
