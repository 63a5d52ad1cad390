"""Turns Airflow connections into the plain settings the core takes (Postgres URLs for sources), and
hands the secrets of loaded specs to Airflow's secrets masker."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from airflow_partitions.exceptions import OrchestrationError

if TYPE_CHECKING:
    from airflow.sdk import Connection

POSTGRES_CONN_TYPES = frozenset({"postgres", "postgresql"})
# libpq options Airflow's Postgres connection keeps in its extra and that a URL can carry.
_LIBPQ_EXTRA_KEYS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout", "application_name")


def get_connection(conn_id: str) -> Connection:
    """An Airflow connection by id (secrets backends, environment, then the metadata DB)."""
    from airflow.sdk import BaseHook

    try:
        return BaseHook.get_connection(conn_id)
    except Exception as err:
        # The SDK raises its own not-found type; say which id and how to define it.
        raise OrchestrationError(
            f"Airflow connection {conn_id!r} is not defined ({err}); create it in the UI "
            f"(Admin > Connections) or set AIRFLOW_CONN_{conn_id.upper()}"
        ) from err


def postgres_url(connection: Any) -> str:
    """`postgresql://user:password@host:port/database?sslmode=...` for a Postgres Airflow connection."""
    conn_type = (connection.conn_type or "").lower()
    if conn_type and conn_type not in POSTGRES_CONN_TYPES:
        raise OrchestrationError(
            f"connection {connection.conn_id!r} has type {connection.conn_type!r}; a Postgres source needs a "
            "connection of type postgres"
        )
    if not connection.host:
        raise OrchestrationError(f"Postgres connection {connection.conn_id!r} has no host")
    auth = ""
    if connection.login:
        auth = quote(connection.login, safe="")
        if connection.password:
            auth += ":" + quote(connection.password, safe="")
        auth += "@"
    port = f":{connection.port}" if connection.port else ""
    database = quote(connection.schema or "", safe="")
    extra = connection.extra_dejson or {}
    options = {key: str(extra[key]) for key in _LIBPQ_EXTRA_KEYS if extra.get(key) not in (None, "")}
    query = f"?{urlencode(options)}" if options else ""
    return f"postgresql://{auth}{connection.host}{port}/{database}{query}"


def resolve_postgres_connection(conn_id: str) -> str:
    """The resolver the core's Postgres source calls: connection id -> URL."""
    return postgres_url(get_connection(conn_id))


def install_connection_resolver() -> None:
    """Let core sources resolve `params.connection_id` through Airflow's connections (idempotent)."""
    from airflow_partitions.sources.base import set_connection_resolver  # lazy: loads sqlglot

    set_connection_resolver(resolve_postgres_connection)


# Connection URLs fetched asynchronously (in the triggerer), served to the core's synchronous resolver.
_PREFETCHED: dict[str, str] = {}


def _resolve_prefetched_or_live(conn_id: str) -> str:
    if conn_id in _PREFETCHED:
        return _PREFETCHED[conn_id]
    return resolve_postgres_connection(conn_id)


async def aprepare_source_connections(spec_path: str, dataset: str) -> None:
    """In async code (triggers): fetch the dataset's Postgres connection once, before worker threads need it.

    The triggerer only serves connections to async callers; the core, running in a thread, then reads the
    prefetched URL through the installed resolver.
    """
    import asyncio

    from airflow.sdk import BaseHook

    from airflow_partitions.sources.base import set_connection_resolver  # lazy: loads sqlglot
    from airflow_partitions.spec import SourceScheme, load_spec  # lazy: loads sqlglot

    install_secret_masker()
    project = await asyncio.to_thread(load_spec, spec_path)
    source = project.dataset(dataset).source
    if source.scheme is SourceScheme.POSTGRES and source.connection_id:
        try:
            connection = await BaseHook.aget_connection(source.connection_id)
        except Exception as err:
            raise OrchestrationError(
                f"Airflow connection {source.connection_id!r} is not defined ({err}); create it in the UI "
                f"(Admin > Connections) or set AIRFLOW_CONN_{source.connection_id.upper()}"
            ) from err
        _PREFETCHED[source.connection_id] = postgres_url(connection)
    set_connection_resolver(_resolve_prefetched_or_live)


def install_secret_masker() -> None:
    """Register every secret of the specs this process loads (URL passwords, `aws_secret_access_key`, ...)
    with Airflow's secrets masker, so task logs (tracebacks of driver errors included) show `***`."""
    from airflow.sdk.log import mask_secret

    from airflow_partitions.spec.masking import on_secret  # lazy: loads sqlglot

    on_secret(mask_secret)
