"""Postgres tables as sources: schema, per-partition statistics, pushed-down partition reads, Spark reads.

Connection details come from a URL, or from a connection id turned into a URL by the installed resolver
(the Airflow layer installs one; without it `AIRFLOW_CONN_<ID>` URIs in the environment are understood).
Metadata queries and pushed-down reads go through ADBC (Arrow end to end); Spark reads the table either
through the PostgreSQL JDBC driver (parallel, scales to clusters) or through ADBC (one Arrow stream from the
driver process). Per-partition fingerprints are the row count, the max of `refresh.check_column` (or of the
row version `xmin` when no check column is configured) and an order-independent sum of hashes of the row
versions (`xmin`; the row's text for a view), so an UPDATE that keeps the max is seen too.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from airflow_partitions.exceptions import DiscoveryTimeoutError, SourceError
from airflow_partitions.sources.base import (
    Deadline,
    KeyTuple,
    RowsSince,
    SourceSurvey,
    connection_resolver,
    digest,
    schema_tag,
    tagged_fingerprint,
)
from airflow_partitions.sources.files import filter_to_key
from airflow_partitions.sources.pg_expressions import MULTI_BUCKET_PUSHDOWN_REFUSED, postgres_expression
from airflow_partitions.sources.pg_sql import partition_sql, preimage_predicate, quote_ident, sql_literal
from airflow_partitions.sources.spark import quote_column, spark_schema
from airflow_partitions.spec.masking import (
    mask_secrets,
    mask_url_passwords,
    masked_params,
    unencoded_password_problem,
)
from airflow_partitions.transforms.expression import ExpressionTransform
from airflow_partitions.transforms.multi_bucket import MultiBucketTransform

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.transforms import Transform

READERS = ("auto", "jdbc", "adbc")
# `auto`: ADBC on a local Spark master (measured faster: benchmarks/bench_refresh.py, Postgres section),
# JDBC on a cluster, where executors read in parallel and nothing funnels through the driver.
DEFAULT_READER = "auto"
PUSHDOWN_MODES = ("auto", "always", "never")
_QUERY_CANCELED = "57014"
# Keys up to this many are pushed to the source as one OR of ranges when the stage reads a subset.
MAX_PUSHED_RANGES = 512
# Bytes of one batch of a streamed read (`read_batches`), the ADBC driver's hint.
STREAM_BATCH_BYTES = 16 << 20
# The per-partition sum of row-version hashes is kept below 2**40 in SQL, so adding up the groups of one
# partition (when its expression is applied here) stays far inside int64.
_VERSION_HASH_MODULUS = 1 << 40


@dataclass(frozen=True, slots=True)
class PostgresTable:
    """A schema-qualified table name, as Postgres resolves it (already case-folded)."""

    schema: str
    name: str

    @property
    def sql(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"


def connection_url_from_env(connection_id: str) -> str | None:
    """A Postgres URL from `AIRFLOW_CONN_<ID>` (URI or JSON form), so the core runs without Airflow."""
    raw = os.environ.get(f"AIRFLOW_CONN_{connection_id.upper()}")
    if not raw:
        return None
    raw = raw.strip()
    if raw.startswith("{"):
        data = json.loads(raw)
        user = quote(str(data.get("login") or ""), safe="")
        password = quote(str(data.get("password") or ""), safe="")
        auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        port = f":{data['port']}" if data.get("port") else ""
        return f"postgresql://{auth}{data.get('host') or 'localhost'}{port}/{data.get('schema') or ''}"
    return raw


def normalise_url(url: str) -> str:
    """`postgres://` and `postgresql+driver://` to `postgresql://`; Airflow-only query args dropped.

    A URL whose password holds an unencoded `@` or `#` is refused before any driver sees it: the driver
    would print a piece of the password as a host name.
    """
    unencoded = unencoded_password_problem(url)
    if unencoded is not None:
        raise SourceError(f"the Postgres URL {unencoded}")
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme not in ("postgres", "postgresql"):
        raise SourceError(f"Postgres URL must start with postgresql://, got {parts.scheme}://")
    query = [(k, v) for k, v in parse_qsl(parts.query) if not k.startswith("__") and k != "extra"]
    rest = url.split("://", 1)[1].split("?", 1)[0]
    return f"postgresql://{rest}" + (f"?{urlencode(query)}" if query else "")


def jdbc_settings(url: str) -> tuple[str, dict[str, str]]:
    """(`jdbc:postgresql://host:port/db?...`, {user, password}) for Spark's JDBC reader."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    database = parts.path.lstrip("/")
    query = f"?{parts.query}" if parts.query else ""
    properties: dict[str, str] = {}
    if parts.username:
        properties["user"] = unquote(parts.username)
    if parts.password:
        properties["password"] = unquote(parts.password)
    return f"jdbc:postgresql://{host}{port}/{database}{query}", properties


def canonical_type(field: pa.Field) -> pa.DataType:
    """The Arrow type a Postgres column is read as, the same through ADBC and JDBC.

    NUMERIC(p, s) becomes decimal(p, s); unconstrained NUMERIC becomes decimal(38, 18), as Spark's JDBC
    reader does; other driver-specific (opaque) types are read as their text or bytes storage.
    """
    import pyarrow as pa

    metadata = field.metadata or {}
    pg_type = (metadata.get(b"POSTGRESQL:type") or b"").decode()
    if pg_type == "numeric":
        typmod = int((metadata.get(b"POSTGRESQL:typmod") or b"-1").decode())
        if typmod < 4:
            return pa.decimal128(38, 18)
        precision, scale = (typmod - 4) >> 16, (typmod - 4) & 0xFFFF
        return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
    if isinstance(field.type, pa.BaseExtensionType):
        return field.type.storage_type
    return field.type


def conform_table(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Cast a driver result to the canonical schema (drops extension types and field metadata)."""
    import pyarrow as pa

    columns = []
    for target in schema:
        column = table.column(target.name)
        if isinstance(column.type, pa.BaseExtensionType):
            column = pa.chunked_array(
                [chunk.storage for chunk in column.chunks], type=column.type.storage_type
            )
        if column.type != target.type:
            column = column.cast(target.type)
        columns.append(column)
    return pa.table(columns, schema=schema)


def _group_expressions(
    transforms: Sequence[Transform], notes: list[str]
) -> tuple[list[list[str]], list[bool]]:
    """Per partition field, what the survey groups by in Postgres and whether that is the partition value
    itself (else the raw source column(s), and the transform runs here: a note says why)."""
    group_parts: list[list[str]] = []
    exact: list[bool] = []
    for transform in transforms:
        pushed = partition_sql(transform)
        exact.append(pushed is not None)
        group_parts.append(
            [pushed] if pushed is not None else [quote_ident(c) for c in transform.source_columns]
        )
        if isinstance(transform, MultiBucketTransform):
            notes.append(
                f"partition expression {transform.canonical!r} is grouped by its columns in Postgres "
                f"and hashed here: {MULTI_BUCKET_PUSHDOWN_REFUSED}"
            )
        if pushed is None and isinstance(transform, ExpressionTransform):
            refused = postgres_expression(transform).refused
            notes.append(
                f"partition expression {transform.canonical!r} is grouped by its column in Postgres and "
                f"computed in DuckDB: {refused}"
            )
    return group_parts, exact


class PostgresSource:
    """One Postgres table (or view) read through ADBC for metadata and pushdown, Spark for staging."""

    kind = "postgres"

    def __init__(
        self,
        table_schema: str,
        table_name: str,
        *,
        url: str | None = None,
        connection_id: str | None = None,
        params: Mapping[str, Any] | None = None,
        schema: pa.Schema | None = None,
        declared_schema: pa.Schema | None = None,
    ) -> None:
        self.table = PostgresTable(table_schema, table_name)
        self.declared_schema = declared_schema
        if schema is not None:
            # Known from a stage manifest: a finalize task then skips the column query.
            self.__dict__["_schema"] = schema
        self.params: dict[str, Any] = dict(params or {})
        self._url = url
        self.connection_id = connection_id
        reader = str(self.params.get("reader", DEFAULT_READER)).lower()
        if reader not in READERS:
            raise SourceError(f"params.reader {reader!r} is not one of {', '.join(READERS)}")
        self.reader = reader
        pushdown = str(self.params.get("pushdown", "auto")).lower()
        if pushdown not in PUSHDOWN_MODES:
            raise SourceError(f"params.pushdown {pushdown!r} is not one of {', '.join(PUSHDOWN_MODES)}")
        self.pushdown = pushdown
        # An exported snapshot every read joins (change data capture's first copy, `pg_cdc`), or None.
        self.snapshot: str | None = None

    def describe(self) -> str:
        via = f"connection {self.connection_id!r}" if self.connection_id and not self._url else "a URL"
        return f"Postgres table {self.table} (via {via})"

    # --- connections --------------------------------------------------------------------------

    @cached_property
    def url(self) -> str:
        """The resolved connection URL (never logged: it may carry a password)."""
        if self._url:
            return normalise_url(self._url)
        if not self.connection_id:
            raise SourceError(f"{self.describe()} has neither params.url nor params.connection_id")
        resolver = connection_resolver()
        resolved = resolver(self.connection_id) if resolver is not None else None
        resolved = resolved or connection_url_from_env(self.connection_id)
        if not resolved:
            raise SourceError(
                f"cannot resolve Postgres connection {self.connection_id!r}: run inside Airflow (which "
                f"resolves connection ids), set AIRFLOW_CONN_{self.connection_id.upper()}, or give "
                "params.url: postgresql://user@host:5432/db"
            )
        return normalise_url(resolved)

    @contextmanager
    def connect(self, *, statement_timeout_s: float | None = None) -> Iterator[Any]:
        """An ADBC connection in UTC, optionally with a server-side statement timeout."""
        import adbc_driver_postgresql.dbapi as adbc

        try:
            conn = adbc.connect(self.url)
        except Exception as err:
            raise SourceError(f"cannot connect to {self.describe()}: {clean_error(err)}") from err
        try:
            with conn.cursor() as cur:
                cur.execute("SET TIME ZONE 'UTC'")
                cur.execute("SET standard_conforming_strings = on")
                if statement_timeout_s is not None:
                    cur.execute(f"SET statement_timeout = {max(1, int(statement_timeout_s * 1000))}")
                if self.snapshot is not None:
                    # ADBC opened a transaction; it reads the database as the snapshot saw it.
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    snapshot = self.snapshot.replace("'", "''")
                    cur.execute(f"SET TRANSACTION SNAPSHOT '{snapshot}'")
            yield conn
        finally:
            conn.close()

    def query_arrow(self, sql: str, parameters: Sequence[Any] | None = None, **connect: Any) -> pa.Table:
        with self.connect(**connect) as conn, conn.cursor() as cur:
            cur.execute(sql, parameters=tuple(parameters) if parameters else None)
            return cur.fetch_arrow_table()

    # --- schema -------------------------------------------------------------------------------

    @cached_property
    def _raw_schema(self) -> pa.Schema:
        try:
            return self.query_arrow(f"SELECT * FROM {self.table.sql} LIMIT 0").schema
        except SourceError:
            raise
        except Exception as err:
            raise SourceError(
                f"cannot read the columns of {self.describe()}: {clean_error(err)}; check that the table "
                "exists and the connection's user may SELECT from it"
            ) from err

    @cached_property
    def _schema(self) -> pa.Schema:
        import pyarrow as pa

        schema = pa.schema([pa.field(f.name, canonical_type(f)) for f in self._raw_schema])
        if self.declared_schema is not None:
            # The table's own types are what every reader gets; a `schema:` saying otherwise is refused
            # rather than ignored.
            mismatched = [
                f"{f.name}: declared {f.type}, the table has "
                + (str(schema.field(f.name).type) if f.name in schema.names else "no such column")
                for f in self.declared_schema
                if f.name not in schema.names or schema.field(f.name).type != f.type
            ]
            if mismatched:
                raise SourceError(
                    f"the dataset's schema: does not match {self.describe()} ({'; '.join(mismatched)}); "
                    "declare the table's types under schema: (or remove the block), or cast the column "
                    "in a view and read that"
                )
        return schema

    def schema(self) -> pa.Schema:
        return self._schema

    @cached_property
    def relation_kind(self) -> str:
        """`r` table, `p` partitioned table, `v` view, `m` materialised view, `f` foreign table."""
        table = self.query_arrow(
            "SELECT c.relkind::text AS kind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = $1 AND c.relname = $2",
            (self.table.schema, self.table.name),
        )
        kinds = table.column("kind").to_pylist()
        if not kinds:
            raise SourceError(f"{self.describe()} does not exist")
        return str(kinds[0])

    @cached_property
    def indexed_leading_columns(self) -> frozenset[str]:
        """Columns that lead some index of the table (a range predicate on them avoids a full scan)."""
        table = self.query_arrow(
            "SELECT a.attname::text AS col FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0] "
            "WHERE n.nspname = $1 AND c.relname = $2",
            (self.table.schema, self.table.name),
        )
        return frozenset(table.column("col").to_pylist())

    # --- survey (discovery and fingerprints) --------------------------------------------------

    def survey(
        self,
        transforms: Sequence[Transform],
        *,
        need_keys: bool,
        check_column: str | None,
        deadline: Deadline,
    ) -> SourceSurvey:
        import pyarrow as pa

        names = [f"k{i}" for i in range(len(transforms))]
        notes: list[str] = []
        group_parts, exact = _group_expressions(transforms, notes)
        watermark, changes = self._change_expressions(check_column, notes)
        group_sql = [sql for parts in group_parts for sql in parts]
        unique_groups = list(dict.fromkeys(group_sql))
        select = ", ".join(f"{sql} AS g{unique_groups.index(sql)}" for sql in unique_groups)
        group_by = ", ".join(str(i + 1) for i in range(len(unique_groups)))
        if watermark == "NULL::bigint":
            changes = "0::bigint"
        sql = (
            f"SELECT {select}, count(*) AS n, {watermark} AS w, {changes} AS h "
            f"FROM {self.table.sql} AS ap_row GROUP BY {group_by}"
        )
        remaining = deadline.remaining()
        if remaining is not None and remaining <= 0:
            raise deadline.error(f"querying {self.table}")
        try:
            result = self.query_arrow(sql, statement_timeout_s=remaining)
        except Exception as err:
            if _QUERY_CANCELED in str(err):
                raise deadline.error(f"running SELECT ... GROUP BY on {self.table}") from err
            raise SourceError(
                f"partition discovery query on {self.describe()} failed: {clean_error(err)}"
            ) from err
        deadline.check(f"reading the partition statistics of {self.table}")
        arrays = [
            self._partition_values(
                [result.column(f"g{unique_groups.index(sql_text)}") for sql_text in parts],
                transform,
                is_exact,
            )
            for transform, parts, is_exact in zip(transforms, group_parts, exact, strict=True)
        ]
        watermark_column = result.column("w")
        if isinstance(watermark_column.type, pa.BaseExtensionType):
            watermark_column = pa.chunked_array(
                [c.storage for c in watermark_column.chunks], type=watermark_column.type.storage_type
            )
        stats = pa.table(
            {
                **dict(zip(names, arrays, strict=True)),
                "n": result.column("n"),
                "w": watermark_column,
                "h": result.column("h"),
            }
        )
        per_partition = stats.group_by(names).aggregate([("n", "sum"), ("w", "max"), ("h", "sum")])
        deadline.check(f"aggregating the partition statistics of {self.table}")
        key_columns = [per_partition.column(name).to_pylist() for name in names]
        counts = per_partition.column("n_sum").to_pylist()
        maxima = per_partition.column("w_max").to_pylist()
        hashes = per_partition.column("h_sum").to_pylist()
        volatile = watermark == "NULL::bigint"
        tag = schema_tag(self.schema())
        per_key: dict[KeyTuple, str] = {}
        for index, key in enumerate(zip(*key_columns, strict=True)):
            token = f"volatile:{time.time_ns()}" if volatile else _watermark_text(maxima[index])
            parts = [f"rows={counts[index]}", f"max={token}", f"versions={hashes[index]}"]
            per_key[tuple(key)] = tagged_fingerprint(tag, digest(parts))
        whole = tagged_fingerprint(tag, digest(sorted(f"{k!r}={v}" for k, v in per_key.items())))
        return SourceSurvey(
            keys=list(per_key) if need_keys else None,
            whole_fingerprint=whole,
            per_key=per_key,
            projection=tuple(range(len(transforms))),
            granularity="partition",
            notes=tuple(notes),
            schema_tag=tag,
        )

    def _change_expressions(self, check_column: str | None, notes: list[str]) -> tuple[str, str]:
        """(the per-group watermark, the per-group sum of row version hashes) in the survey's SELECT."""
        stored = self.relation_kind in ("r", "p", "m")
        # Count + max alone miss an UPDATE that keeps the max (a value changed below it, or a transaction
        # that commits after a younger one): an order-independent sum of a hash of each row's version
        # (xmin, new on every UPDATE; of the row's text for a view) sees every change.
        versions = "hashtext(xmin::text)" if stored else "hashtext(ap_row::text)"
        changes = f"(sum({versions}::bigint) % {_VERSION_HASH_MODULUS})::bigint"
        if check_column:
            return f"max({quote_ident(check_column)})", changes
        if stored:
            notes.append("no refresh.check_column: change detection uses the row version (xmin)")
            return "max(xmin::text::bigint)", changes
        notes.append(
            f"{self.table} is a view and has no refresh.check_column: every partition is treated as "
            "changed on each refresh (set refresh.check_column to an updated_at column to fix)"
        )
        return "NULL::bigint", changes

    def _partition_values(self, grouped: list[Any], transform: Transform, is_exact: bool) -> Any:
        """The grouped column(s) of one field in the survey as its partition values: cast when Postgres
        computed them, else the transform applied to the grouped source values."""
        import pyarrow as pa

        arrays = []
        for column in grouped:
            if isinstance(column.type, pa.BaseExtensionType):
                column = pa.chunked_array([c.storage for c in column.chunks], type=column.type.storage_type)
            arrays.append(column.combine_chunks() if column.num_chunks != 1 else column.chunk(0))
        if is_exact:
            return arrays[0].cast(transform.result_type)
        raw = [
            array.cast(self.schema().field(name).type)
            for array, name in zip(arrays, transform.source_columns, strict=True)
        ]
        return transform.apply_columns(raw)

    # --- pushed-down reads --------------------------------------------------------------------

    def can_read_partition(self, transforms: Sequence[Transform]) -> bool:
        if self.pushdown == "never" or not transforms:
            return False
        if not all(getattr(t, "monotonic", False) and getattr(t, "has_preimage", True) for t in transforms):
            return False
        if self.pushdown == "always":
            return True
        # Without an index each partition's WHERE is a full table scan: N partitions, N scans.
        return any(t.source_column in self.indexed_leading_columns for t in transforms)

    def partition_read_hint(self, transforms: Sequence[Transform], key: KeyTuple) -> Any:
        return None

    def _key_predicate(self, transforms: Sequence[Transform], key: KeyTuple) -> str:
        clauses = [preimage_predicate(t, v) for t, v in zip(transforms, key, strict=True)]
        return " AND ".join(f"({c})" for c in clauses) or "TRUE"

    def read_where(self, where: str = "TRUE") -> pa.Table:
        """Rows matching a WHERE clause built by this module (never from user text), canonical types."""
        columns = ", ".join(quote_ident(name) for name in self.schema().names)
        try:
            raw = self.query_arrow(f"SELECT {columns} FROM {self.table.sql} WHERE {where}")
        except SourceError:
            raise
        except Exception as err:
            raise SourceError(f"cannot read {self.describe()}: {clean_error(err)}") from err
        return conform_table(raw, self.schema())

    def read_batches(
        self, where: str = "TRUE", *, transforms: Sequence[Transform] = (), key: KeyTuple | None = None
    ) -> pa.RecordBatchReader:
        """Rows matching a WHERE clause built by this module, canonical types, as a stream of batches
        (about `STREAM_BATCH_BYTES` each) read as they arrive, never held whole; with `key`, only the rows
        of that partition (the exact filter of `read_partition`). The connection closes with the stream."""
        import adbc_driver_postgresql as adbc_postgresql
        import pyarrow as pa

        schema = self.schema()
        columns = ", ".join(quote_ident(name) for name in schema.names)
        if key is not None:
            where = f"({where}) AND ({self._key_predicate(transforms, key)})"
        option = adbc_postgresql.StatementOptions.BATCH_SIZE_HINT_BYTES.value

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                with self.connect() as conn, conn.cursor() as cur:
                    cur.adbc_statement.set_options(**{option: str(STREAM_BATCH_BYTES)})
                    cur.execute(f"SELECT {columns} FROM {self.table.sql} WHERE {where}")
                    for batch in cur.fetch_record_batch():
                        table = conform_table(pa.Table.from_batches([batch]), schema)
                        if key is not None:
                            table = filter_to_key(table, transforms, key)
                        yield from table.to_batches()
            except SourceError:
                raise
            except Exception as err:
                raise SourceError(f"cannot read {self.describe()}: {clean_error(err)}") from err

        return pa.RecordBatchReader.from_batches(schema, batches())

    def read_partition(self, transforms: Sequence[Transform], key: KeyTuple, hint: Any) -> pa.Table:
        # The range comes from the transform's preimage; the exact filter guards its edges.
        return filter_to_key(self.read_where(self._key_predicate(transforms, key)), transforms, key)

    def read_partition_since(
        self, transforms: Sequence[Transform], key: KeyTuple, hint: Any, since: RowsSince
    ) -> pa.Table:
        where = f"({self._key_predicate(transforms, key)}) AND {since_predicate(since)}"
        return filter_to_key(self.read_where(where), transforms, key)

    def read_all(self, *, deadline: Deadline | None = None) -> pa.Table:
        return self.read_where()

    def read_changed(self, columns: Sequence[str], column: str, after: Any, upper: Any = None) -> pa.Table:
        """`columns` of the rows whose `column` is at or past `after` (and at most `upper`), canonical
        types. `after` None: every row whose `column` is not NULL."""
        import pyarrow as pa

        quoted = quote_ident(column)
        clauses = [f"{quoted} IS NOT NULL" if after is None else f"{quoted} >= {sql_literal(after)}"]
        if upper is not None:
            clauses.append(f"{quoted} <= {sql_literal(upper)}")
        listing = ", ".join(quote_ident(name) for name in columns)
        sql = f"SELECT {listing} FROM {self.table.sql} WHERE {' AND '.join(clauses)}"
        try:
            raw = self.query_arrow(sql)
        except SourceError:
            raise
        except Exception as err:
            raise SourceError(f"cannot read {self.describe()}: {clean_error(err)}") from err
        schema = self.schema()
        return conform_table(raw, pa.schema([schema.field(name) for name in columns]))

    def read_columns(self, columns: Sequence[str]) -> pa.Table:
        """`columns` of every row (only those cross the wire), canonical types."""
        import pyarrow as pa

        wanted = list(dict.fromkeys(columns))
        listing = ", ".join(quote_ident(name) for name in wanted)
        try:
            raw = self.query_arrow(f"SELECT {listing} FROM {self.table.sql}")
        except SourceError:
            raise
        except Exception as err:
            raise SourceError(f"cannot read {self.describe()}: {clean_error(err)}") from err
        schema = self.schema()
        return conform_table(raw, pa.schema([schema.field(name) for name in wanted]))

    def count_below_watermarks(
        self, transforms: Sequence[Transform], column: str, thresholds: Sequence[Any], bound: Any
    ) -> pa.Table | None:
        """Per partition value and watermark bucket, the rows counted in Postgres (only counts cross the
        wire): `k0..` the partition values, `b` the number of `thresholds` (sorted) at or below the row's
        `column` (NULL for a NULL one), `n` the rows, `f` those past `bound` (None: none counted). None
        when some partition expression has no Postgres form (the caller reads the columns instead)."""
        import pyarrow as pa

        group_sql = [partition_sql(t) for t in transforms]
        if any(sql is None for sql in group_sql) or not thresholds:
            return None
        quoted = quote_ident(column)
        array = "ARRAY[" + ", ".join(sql_literal(t) for t in thresholds) + "]"
        keys = [f"{sql} AS k{i}" for i, sql in enumerate(group_sql)]
        future = f"count(*) FILTER (WHERE {quoted} > {sql_literal(bound)})" if bound is not None else "0"
        select = ", ".join([*keys, f"width_bucket({quoted}, {array}) AS b"])
        group_by = ", ".join(str(i + 1) for i in range(len(keys) + 1))
        sql = f"SELECT {select}, count(*) AS n, {future} AS f FROM {self.table.sql} GROUP BY {group_by}"
        try:
            result = self.query_arrow(sql)
        except SourceError:
            raise
        except Exception as err:
            raise SourceError(f"cannot count the rows of {self.describe()}: {clean_error(err)}") from err
        columns: dict[str, Any] = {}
        for i, transform in enumerate(transforms):
            column_data = result.column(f"k{i}")
            if isinstance(column_data.type, pa.BaseExtensionType):
                column_data = pa.chunked_array(
                    [c.storage for c in column_data.chunks], type=column_data.type.storage_type
                )
            columns[f"k{i}"] = column_data.cast(transform.result_type)
        for name in ("b", "n", "f"):
            columns[name] = result.column(name).cast(pa.int64())
        return pa.table(columns)

    def oldest_open_write(self) -> dt.datetime | None:
        """When the oldest transaction of another session that has written (holds a transaction id) in
        this database started, or None. Its rows become visible only when it commits, stamped with times
        from before rows committed since (`now()` is the transaction's start)."""
        sql = (
            "SELECT min(xact_start) AS started FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_xid IS NOT NULL"
        )
        try:
            value = self.query_arrow(sql).column("started")[0].as_py()
        except SourceError:
            raise
        except Exception as err:
            raise SourceError(
                f"cannot list the open transactions of {self.describe()}: {clean_error(err)}"
            ) from err
        return value

    def count_null_rows(self, column: str) -> int:
        sql = f"SELECT count(*) AS n FROM {self.table.sql} WHERE {quote_ident(column)} IS NULL"
        try:
            return int(self.query_arrow(sql).column("n")[0].as_py())
        except SourceError:
            raise
        except Exception as err:
            raise SourceError(f"cannot count rows of {self.describe()}: {clean_error(err)}") from err

    # --- Spark --------------------------------------------------------------------------------

    def _subset_predicate(
        self, transforms: Sequence[Transform], keys: Sequence[KeyTuple] | None
    ) -> str | None:
        """One SQL OR of the keys' ranges, when every field can be pushed down and keys are few."""
        if keys is None or not keys or len(keys) > MAX_PUSHED_RANGES:
            return None
        if not all(getattr(t, "monotonic", False) and getattr(t, "has_preimage", True) for t in transforms):
            return None
        return " OR ".join(f"({self._key_predicate(transforms, key)})" for key in keys)

    def spark_frame(
        self,
        spark: Any,
        transforms: Sequence[Transform],
        keys: Sequence[KeyTuple] | None,
        *,
        work_dir: str,
        since: RowsSince | None = None,
    ) -> Any:
        where = self._subset_predicate(transforms, keys)
        if since is not None:
            where = f"({where}) AND {since_predicate(since)}" if where else since_predicate(since)
        struct = spark_schema(self.schema())
        if self.reader_for(spark) == "adbc":
            exported = Path(work_dir) / "source" / "adbc-0.parquet"
            self.export_parquet(where or "TRUE", exported)
            return spark.read.schema(struct).parquet(str(exported.parent))
        jdbc_url, properties = jdbc_settings(self.url)
        columns = ", ".join(quote_ident(name) for name in self.schema().names)
        query = f"SELECT {columns} FROM {self.table.sql}" + (f" WHERE {where}" if where else "")
        reader = (
            spark.read.format("jdbc")
            .option("url", jdbc_url)
            .option("driver", "org.postgresql.Driver")
            .option("dbtable", f"({query}) AS ap_source")
            .option("fetchsize", str(self.params.get("fetchsize", 10_000)))
            .option("sessionInitStatement", "SET TIME ZONE 'UTC'; SET standard_conforming_strings = on")
        )
        for name, value in properties.items():
            reader = reader.option(name, value)
        bounds = self._jdbc_partitioning()
        if bounds is not None:
            column, low, high, count = bounds
            reader = (
                reader.option("partitionColumn", column)
                .option("lowerBound", str(low))
                .option("upperBound", str(high))
                .option("numPartitions", str(count))
            )
        try:
            frame = reader.load()
        except Exception as err:
            text = str(err)
            if "org.postgresql.Driver" in text or "ClassNotFoundException" in text:
                raise SourceError(
                    "Spark cannot find the PostgreSQL JDBC driver: install libpostgresql-jdbc-java (puts "
                    "/usr/share/java/postgresql.jar on the session's spark.jars) or set params.reader: adbc"
                ) from err
            raise SourceError(f"Spark cannot read {self.describe()}: {clean_error(err)}") from err
        return frame.select(
            *[frame[quote_column(f.name)].cast(f.dataType).alias(f.name) for f in struct.fields]
        )

    def reader_for(self, spark: Any) -> str:
        """The reader to use with this Spark session (`params.reader`, `auto` deciding by the master)."""
        if self.reader != "auto":
            return self.reader
        try:
            master = str(spark.conf.get("spark.master", ""))
        except Exception:  # a Connect server may not expose its master: assume a cluster
            master = ""
        return "adbc" if master.startswith("local") else "jdbc"

    def export_parquet(self, where: str, target: Path) -> int:
        """Stream the rows matching `where` through ADBC into one uncompressed parquet file; row count.

        Batches are written as they arrive, so the table never has to fit in memory.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = self.schema()
        columns = ", ".join(quote_ident(name) for name in schema.names)
        target.parent.mkdir(parents=True, exist_ok=True)
        rows = 0
        try:
            with (
                self.connect() as conn,
                conn.cursor() as cur,
                pq.ParquetWriter(str(target), schema, compression="none") as writer,
            ):
                cur.execute(f"SELECT {columns} FROM {self.table.sql} WHERE {where}")
                for batch in cur.fetch_record_batch():
                    table = conform_table(pa.Table.from_batches([batch]), schema)
                    writer.write_table(table)
                    rows += table.num_rows
        except SourceError:
            raise
        except Exception as err:
            raise SourceError(f"cannot read {self.describe()}: {clean_error(err)}") from err
        return rows

    def _jdbc_partitioning(self) -> tuple[str, int, int, int] | None:
        """(column, min, max, partitions) to split a JDBC read over an integer primary key, or None."""
        count = int(self.params.get("jdbc_partitions", os.cpu_count() or 2))
        if count < 2:
            return None
        table = self.query_arrow(
            "SELECT a.attname::text AS col, format_type(a.atttypid, a.atttypmod) AS type FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0] "
            "WHERE n.nspname = $1 AND c.relname = $2 AND i.indisprimary",
            (self.table.schema, self.table.name),
        )
        rows = table.to_pylist()
        if not rows or rows[0]["type"] not in ("integer", "bigint", "smallint"):
            return None
        column = rows[0]["col"]
        bounds = self.query_arrow(
            f"SELECT min({quote_ident(column)})::bigint AS lo, max({quote_ident(column)})::bigint AS hi "
            f"FROM {self.table.sql}"
        ).to_pylist()[0]
        if bounds["lo"] is None or bounds["hi"] <= bounds["lo"]:
            return None
        return quote_ident(column), int(bounds["lo"]), int(bounds["hi"]) + 1, count

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "scheme": "postgres",
            "location": str(self.table),
            "table_schema": self.table.schema,
            "table_name": self.table.name,
            "params": masked_params(self.params),
            "connection_id": self.connection_id,
            "url": mask_url_passwords(self._url) if self._url else None,
        }


def since_predicate(since: RowsSince) -> str:
    """`since` as SQL: `column > literal`, or `column IS NOT NULL` before any watermark."""
    column = quote_ident(since.column)
    if since.after is None:
        return f"{column} IS NOT NULL"
    return f"{column} > {sql_literal(since.after)}"


def _watermark_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dt.datetime | dt.date | Decimal):
        return value.isoformat() if not isinstance(value, Decimal) else str(value)
    return repr(value)


def clean_error(err: BaseException) -> str:
    """The first line of the driver's message, secrets masked (a quoted connection URL's password, any
    secret of a loaded spec)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return mask_secrets(text)[:500]


__all__ = ["DEFAULT_READER", "DiscoveryTimeoutError", "PostgresSource", "canonical_type", "jdbc_settings"]
