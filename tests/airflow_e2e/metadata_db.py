"""Fresh Postgres metadata databases for Airflow in tests: one per stack or test session, dropped after."""

from __future__ import annotations

import atexit
import os
import time
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


# Migrating an empty database to Airflow's schema costs tens of seconds (hundreds of migrations' worth of
# DDL); copying a migrated one costs well under one. Each process migrates one template database, the
# first time it needs a metadata database, and clones it for every database it hands out; the template is
# dropped when the process exits (`drop_migrated_template`, also called by tests/conftest.py at the end of
# a pytest session).
_template: MetadataDatabase | None = None


def migrated_template() -> MetadataDatabase:
    """This process's migrated, otherwise unused metadata database (made on first use)."""
    global _template
    if _template is None:
        from airflow.utils import db

        template = create_database("ap_airflow_template")
        try:
            with _airflow_pointed_at(template):
                db.initdb()
        except BaseException:
            drop_database(template)
            raise
        _template = template
        atexit.register(drop_migrated_template)
    return _template


def drop_migrated_template() -> None:
    global _template
    if _template is not None:
        template, _template = _template, None
        drop_database(template)


def create_migrated_database(prefix: str = "ap_airflow") -> MetadataDatabase:
    """A new database with Airflow's schema, copied from `migrated_template()`."""
    import psycopg

    template = migrated_template()
    database = MetadataDatabase(f"{prefix}_{uuid.uuid4().hex[:12]}")
    for attempt in range(50):
        try:
            with _admin_connect() as conn:
                conn.execute(f'CREATE DATABASE "{database.name}" TEMPLATE "{template.name}"')
            return database
        except psycopg.errors.ObjectInUse:
            # A connection to the template is still closing (its pool was just disposed).
            if attempt == 49:
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")


def drop_database(database: MetadataDatabase) -> None:
    """Drop the database, closing whatever connections are still open on it."""
    with _admin_connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database.name}" WITH (FORCE)')


@contextmanager
def _airflow_pointed_at(database: MetadataDatabase, dags_folder: str | None = None) -> Iterator[None]:
    """This process's Airflow on `database` (and `dags_folder`) inside the block; restored after."""
    from airflow import settings
    from airflow.configuration import conf

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
        yield
    finally:
        settings.dispose_orm(do_log=False)
        for (section, key), old_value in previous.items():
            if old_value is None:
                conf.remove_option(section, key)
            else:
                conf.set(section, key, old_value)
        settings.configure_vars()
        settings.configure_orm()


@contextmanager
def in_process_metadata_db(dags_folder: str | None = None) -> Iterator[MetadataDatabase]:
    """Point this process's Airflow at a fresh, migrated Postgres database for `dag.test()` runs.

    `dag.test()` needs a metadata database. A per-session database keeps concurrent test runs apart
    (a shared SQLite file would not), and restoring the previous settings afterwards leaves the process
    as it was. The database is a copy of `migrated_template()`; `initdb()` still runs on it (it finds the
    schema current and only checks the default pool and the log template, about a second).
    """
    from airflow.utils import db

    database = create_migrated_database("ap_dagtest")
    try:
        with _airflow_pointed_at(database, dags_folder):
            db.initdb()
            yield database
    finally:
        drop_database(database)
