"""The Postgres source against the real server: schema, partition statistics, pushdown SQL, connections."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from airflow_partitions.exceptions import DiscoveryTimeoutError, SourceError
from airflow_partitions.sources import set_connection_resolver
from airflow_partitions.sources.base import Deadline
from airflow_partitions.sources.files import filter_to_key
from airflow_partitions.sources.pg_sql import partition_sql, preimage_predicate, sql_literal
from airflow_partitions.sources.postgres import PostgresSource, connection_url_from_env, jdbc_settings
from airflow_partitions.transforms import parse_transform

pytestmark = pytest.mark.postgres

EVENTS_DDL = """
CREATE TABLE public.events (
    id integer PRIMARY KEY,
    region text,
    amount numeric(10, 2),
    created_at timestamptz NOT NULL,
    local_ts timestamp,
    day date,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX events_created ON public.events (created_at);
"""


def fill_events(url: str, rows: int = 60) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(EVENTS_DDL)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO public.events (id, region, amount, created_at, local_ts, day) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                [
                    (
                        i,
                        [None, "EU", "US", "it's/odd"][i % 4],
                        Decimal(i) / 4,
                        dt.datetime(2026, 1, 1 + i % 5, i % 24, tzinfo=dt.UTC),
                        dt.datetime(2025, 12, 30, 23) + dt.timedelta(hours=i),
                        dt.date(2026, 1 + i % 3, 1 + i % 28),
                    )
                    for i in range(rows)
                ],
            )


@pytest.fixture
def events(pg_database: str) -> PostgresSource:
    fill_events(pg_database)
    return PostgresSource("public", "events", url=pg_database)


def bound(source: PostgresSource, expr: str) -> Any:
    transform = parse_transform(expr)
    return transform.bind(source.schema().field(transform.source_column).type)


def test_schema_is_canonical_arrow(events: PostgresSource) -> None:
    schema = events.schema()
    assert schema.field("id").type == pa.int32()
    assert schema.field("amount").type == pa.decimal128(10, 2)
    assert schema.field("created_at").type == pa.timestamp("us", "UTC")
    assert schema.field("local_ts").type == pa.timestamp("us")
    assert schema.field("day").type == pa.date32()
    table = events.read_all()
    assert table.schema == schema
    assert table.num_rows == 60
    assert sorted(table.column("amount").to_pylist())[:2] == [Decimal("0.00"), Decimal("0.25")]


EXPRESSIONS = [
    "region",
    "date_trunc('day', created_at)",
    "date_trunc('week', local_ts)",
    "date_trunc('month', day)",
    "date_part('year', created_at)",
    "date_part('week', local_ts)",
    "date_part('hour', created_at)",
    "truncate(7, id)",
    "truncate(2, region)",
    "id % 4",
    "bucket(5, id)",
]


def test_postgres_partition_values_equal_arrow_evaluation(events: PostgresSource) -> None:
    """Discovery computed in Postgres must give exactly the keys `Transform.apply` gives on the rows."""
    rows = events.read_all()
    for expr in EXPRESSIONS:
        transform = bound(events, expr)
        survey = events.survey([transform], need_keys=True, check_column=None, deadline=Deadline(30))
        expected = set(transform.apply(rows.column(transform.source_column)).to_pylist())
        assert {key[0] for key in survey.keys or []} == expected, f"keys of {expr} differ from Arrow's"
        if transform.name != "bucket":
            assert partition_sql(transform) is not None, f"{expr} should be computed inside Postgres"


def test_fingerprints_move_only_for_changed_partitions(events: PostgresSource, pg_database: str) -> None:
    transforms = [bound(events, "region")]
    with_check = events.survey(transforms, need_keys=True, check_column="updated_at", deadline=Deadline(30))
    with_xmin = events.survey(transforms, need_keys=True, check_column=None, deadline=Deadline(30))
    assert any("xmin" in note for note in with_xmin.notes)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "UPDATE public.events SET amount = amount + 1, updated_at = now() + interval '1 s' WHERE id = 1"
        )
        conn.execute("DELETE FROM public.events WHERE id = 2")
    after_check = events.survey(transforms, need_keys=True, check_column="updated_at", deadline=Deadline(30))
    after_xmin = events.survey(transforms, need_keys=True, check_column=None, deadline=Deadline(30))
    for before, after in ((with_check, after_check), (with_xmin, after_xmin)):
        moved = {k for k in before.keys or [] if before.fingerprint(k) != after.fingerprint(k)}
        assert moved == {("EU",), ("US",)}, "id 1 (EU) was updated and id 2 (US) deleted; nothing else"


def test_update_without_check_column_change_is_seen_through_xmin(
    events: PostgresSource, pg_database: str
) -> None:
    transforms = [bound(events, "region")]
    before = events.survey(transforms, need_keys=True, check_column=None, deadline=Deadline(30))
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("UPDATE public.events SET amount = 99 WHERE id = 3")  # updated_at untouched
    after = events.survey(transforms, need_keys=True, check_column=None, deadline=Deadline(30))
    assert before.fingerprint(("it's/odd",)) != after.fingerprint(("it's/odd",))
    assert before.fingerprint(("EU",)) == after.fingerprint(("EU",))


def test_discovery_timeout_cancels_the_query(events: PostgresSource, pg_database: str) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "CREATE VIEW public.slow_events AS "
            "SELECT e.* FROM public.events e WHERE pg_sleep(0.05)::text = ''"
        )
    slow = PostgresSource("public", "slow_events", url=pg_database)
    transform = bound(slow, "region")
    with pytest.raises(DiscoveryTimeoutError, match=r"did not finish within 0\.5 s"):
        slow.survey([transform], need_keys=True, check_column=None, deadline=Deadline(0.5))


def test_pushdown_reads_exactly_one_partition(events: PostgresSource) -> None:
    day = bound(events, "date_trunc('day', created_at)")
    assert events.can_read_partition([day]), "created_at is indexed: per-partition ranges are cheap"
    assert not events.can_read_partition([bound(events, "region")]), "no index on region: one scan instead"
    assert not events.can_read_partition([bound(events, "bucket(4, id)")]), "bucket has no range preimage"
    key = (dt.datetime(2026, 1, 3, tzinfo=dt.UTC),)
    rows = events.read_partition([day], key, None)
    everything = events.read_all()
    expected = filter_to_key(everything, [day], key)
    assert rows.num_rows == expected.num_rows == 12
    assert sorted(rows.column("id").to_pylist()) == sorted(expected.column("id").to_pylist())


def test_prefix_ranges_use_code_point_order(pg_database: str) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.words (w text)")
        conn.execute("INSERT INTO public.words VALUES ('ab'), ('aB'), ('a_'), ('Ab'), ('abc'), (NULL), ('b')")
    words = PostgresSource("public", "words", url=pg_database, params={"pushdown": "always"})
    prefix = bound(words, "truncate(2, w)")
    for key in ("ab", "aB", "a_", "Ab", None):
        got = sorted(words.read_partition([prefix], (key,), None).column("w").to_pylist(), key=str)
        everything = words.read_all()
        want = sorted(filter_to_key(everything, [prefix], (key,)).column("w").to_pylist(), key=str)
        assert got == want, f"partition {key!r}"
    assert "COLLATE" in preimage_predicate(prefix, "ab")


def test_sql_literals_escape_quotes_and_keep_types() -> None:
    assert sql_literal("it's") == "'it''s'"
    assert sql_literal(dt.datetime(2026, 1, 1, tzinfo=dt.UTC)).startswith("TIMESTAMPTZ '2026-01-01T00:00:00")
    assert sql_literal(b"\x00\xff") == "'\\x00ff'::bytea"
    with pytest.raises(SourceError):
        sql_literal("nul\x00byte")


# --- connections ------------------------------------------------------------------------------------


@pytest.fixture
def clean_resolver() -> Iterator[None]:
    # Before as well: an Airflow test earlier in this process may have installed Airflow's resolver.
    set_connection_resolver(None)
    yield
    set_connection_resolver(None)


def test_connection_id_resolves_through_the_installed_resolver(
    events: PostgresSource, pg_database: str, clean_resolver: None
) -> None:
    asked: list[str] = []

    def resolver(conn_id: str) -> str:
        asked.append(conn_id)
        return pg_database

    set_connection_resolver(resolver)
    source = PostgresSource("public", "events", connection_id="warehouse")
    assert source.read_all().num_rows == 60
    assert asked == ["warehouse"]


def test_connection_id_from_airflow_env_uri(
    events: PostgresSource, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    airflow_uri = pg_database.replace("postgresql://", "postgres://") + "?__extra__=%7B%7D"
    monkeypatch.setenv("AIRFLOW_CONN_MY_PG", airflow_uri)
    assert connection_url_from_env("my_pg") == airflow_uri
    source = PostgresSource("public", "events", connection_id="my_pg")
    assert source.schema().names[0] == "id"


def test_unresolvable_connection_and_missing_table_are_clear(pg_database: str, clean_resolver: None) -> None:
    with pytest.raises(SourceError, match="cannot resolve Postgres connection 'nowhere'"):
        _ = PostgresSource("public", "events", connection_id="nowhere").url
    with pytest.raises(SourceError, match="cannot read the columns"):
        PostgresSource("public", "missing_table", url=pg_database).schema()


def test_jdbc_settings_move_credentials_out_of_the_url() -> None:
    url, props = jdbc_settings("postgresql://alice:s%40cret@db.example:6432/sales?sslmode=require")
    assert url == "jdbc:postgresql://db.example:6432/sales?sslmode=require"
    assert props == {"user": "alice", "password": "s@cret"}


def test_filter_to_key_matches_nulls_only_to_null() -> None:
    table = pa.table({"r": ["a", None, "a", None]})
    transform = parse_transform("r").bind(pa.string())
    assert filter_to_key(table, [transform], (None,)).num_rows == 2
    assert pc.all(pc.equal(filter_to_key(table, [transform], ("a",)).column("r"), "a")).as_py()
