"""Fresh Postgres metadata databases for Airflow in tests: one per stack or test session, dropped after."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

PG_HOST = os.environ.get("AP_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("AP_TEST_PG_PORT", "5432"))
PG_USER = os.environ.get("AP_TEST_PG_USER", "postgres")


@dataclass(frozen=True)
class MetadataDatabase:
    """One throw-away Postgres database; `sqlalchemy_url` is what Airflow's `sql_alchemy_conn` takes."""

    name: str

    @property
    def sqlalchemy_url(self) -> str:
        return f"postgresql+psycopg2://{PG_USER}@{PG_HOST}:{PG_PORT}/{self.name}"

    @property
    def sqlalchemy_async_url(self) -> str:
        # Airflow derives an asyncpg URL otherwise; psycopg 3 (installed) speaks async too.
        return f"postgresql+psycopg://{PG_USER}@{PG_HOST}:{PG_PORT}/{self.name}"

    @property
    def libpq_url(self) -> str:
        return f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{self.name}"

    def connect(self) -> Any:
        """A psycopg connection to this database (autocommit), for checking what Airflow recorded."""
        import psycopg

        return psycopg.connect(self.libpq_url, autocommit=True)


def _admin_connect() -> Any:
    import psycopg

    return psycopg.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", autocommit=True)


def create_database(prefix: str = "ap_airflow") -> MetadataDatabase:
    """Create an empty database with a unique name."""
    database = MetadataDatabase(f"{prefix}_{uuid.uuid4().hex[:12]}")
    with _admin_connect() as conn:
        conn.execute(f'CREATE DATABASE "{database.name}"')
    return database


def drop_database(database: MetadataDatabase) -> None:
    """Drop the database, closing whatever connections are still open on it."""
    with _admin_connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database.name}" WITH (FORCE)')


@contextmanager
def in_process_metadata_db(dags_folder: str | None = None) -> Iterator[MetadataDatabase]:
    """Point this process's Airflow at a fresh, migrated Postgres database for `dag.test()` runs.

    `dag.test()` needs a metadata database. A per-session database keeps concurrent test runs apart
    (a shared SQLite file would not), and restoring the previous settings afterwards leaves the process
    as it was.
    """
    from airflow import settings
    from airflow.configuration import conf
    from airflow.utils import db

    database = create_database("ap_dagtest")
    options = {
        ("database", "sql_alchemy_conn"): database.sqlalchemy_url,
        ("database", "sql_alchemy_conn_async"): database.sqlalchemy_async_url,
    }
    if dags_folder is not None:
        options[("core", "dags_folder")] = dags_folder
    previous = {option: conf.get(*option) if conf.has_option(*option) else None for option in options}
    for (section, key), value in options.items():
        conf.set(section, key, value)
    settings.configure_vars()
    settings.reconfigure_orm()
    try:
        db.initdb()
        yield database
    finally:
        settings.dispose_orm(do_log=False)
        for (section, key), old_value in previous.items():
            if old_value is None:
                conf.remove_option(section, key)
            else:
                conf.set(section, key, old_value)
        settings.configure_vars()
        settings.configure_orm()
        drop_database(database)
