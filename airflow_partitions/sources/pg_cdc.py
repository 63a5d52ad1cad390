"""Change data capture from a Postgres logical replication slot (the built-in `pgoutput` plugin).

The slot is read through the SQL functions: `pg_logical_slot_peek_binary_changes` returns the pgoutput
messages of the transactions committed up to a position without consuming them, and the slot's confirmed
position moves only through `pg_replication_slot_advance`, which the refresh calls after the catalog
commit that holds the changes (see docs/ARCHITECTURE.md, "Change data capture"). Peeking twice up to the
same position returns the same messages, so the plan and the stage of one refresh see the same changes.

Messages are decoded here (protocol version 1: Begin, Relation, Insert, Update, Delete, Truncate, Commit;
tuple values in text form) and reduced to the last state of each primary key: a full row to upsert, or a
key to delete. An UPDATE that changes the key deletes the old key and upserts the new one. Text values
are turned into typed rows by Postgres itself (`value::<declared type>` over the column's own type), read
through the same driver as a full read, so a changed row has exactly the types and values a full read
would give.

The publication this module creates sets `REPLICA IDENTITY FULL` on the table: then the old row of an
UPDATE or DELETE carries every column (the dataset's primary key even when the table's own key differs,
and the values of unchanged TOASTed columns, which pgoutput otherwise sends only as "unchanged").
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import ChangeCaptureError, SlotLostError, SourceError, WalLevelError
from airflow_partitions.sources.pg_builtin_sql import quote_ident
from airflow_partitions.sources.postgres import PostgresSource, clean_error, conform_table
from airflow_partitions.spec.renames import ColumnRenames

if TYPE_CHECKING:
    import pyarrow as pa

# The marker column of a staged change table: TRUE for a key to delete (its other columns are NULL).
DELETED_COLUMN = "__ap_deleted"
_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")
_TYPE_CHUNK = 20_000  # rows per typing query


def deleted_mask(changed: pa.Table) -> pa.Array | None:
    """A staged change table's delete marker (TRUE: a key to delete), None for a table without one."""
    if DELETED_COLUMN not in changed.column_names:
        return None
    return changed.column(DELETED_COLUMN).combine_chunks()


def upserted_rows(changed: pa.Table) -> int:
    """Rows of a staged change table that are upserted (not keys to delete)."""
    mask = deleted_mask(changed)
    return changed.num_rows if mask is None else changed.num_rows - int(mask.true_count)


def slot_name_for(dataset: str, identity: str) -> str:
    """A replication slot (and publication) name for one dataset: `ap_<dataset>_<digest>`, the digest
    over `identity` (where the acceleration lives and which table it reads), so two projects reading one
    database never share a slot."""
    digest = hashlib.sha256(f"{identity}|{dataset}".encode()).hexdigest()[:12]
    stem = re.sub(r"[^a-z0-9_]", "_", dataset.lower())[:40]
    return f"ap_{stem}_{digest}"


def lsn_to_int(lsn: str) -> int:
    high, low = lsn.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def int_to_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


@dataclass(frozen=True)
class SlotInfo:
    """What `pg_replication_slots` and the server say about one slot."""

    slot: str
    confirmed_flush_lsn: str | None
    restart_lsn: str | None
    current_lsn: str
    active: bool

    @property
    def lag_bytes(self) -> int | None:
        """WAL written since the slot's confirmed position: what the next refresh would decode."""
        if self.confirmed_flush_lsn is None:
            return None
        return max(0, lsn_to_int(self.current_lsn) - lsn_to_int(self.confirmed_flush_lsn))

    @property
    def retained_bytes(self) -> int | None:
        """WAL the server keeps for this slot (from its restart position)."""
        if self.restart_lsn is None:
            return None
        return max(0, lsn_to_int(self.current_lsn) - lsn_to_int(self.restart_lsn))

    def to_json(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "confirmed_flush_lsn": self.confirmed_flush_lsn,
            "restart_lsn": self.restart_lsn,
            "current_lsn": self.current_lsn,
            "active": self.active,
            "lag_bytes": self.lag_bytes,
            "retained_wal_bytes": self.retained_bytes,
        }


@dataclass
class ChangeSet:
    """The changes of the transactions committed between the slot's position and `upto`, reduced to the
    last state of each key (text values in the table's column order)."""

    upto: str
    upserts: dict[tuple[str | None, ...], list[str | None]] = field(default_factory=dict)
    deletes: set[tuple[str | None, ...]] = field(default_factory=set)
    truncated: bool = False
    transactions: int = 0
    messages: int = 0

    @property
    def empty(self) -> bool:
        return not self.upserts and not self.deletes and not self.truncated


# --- pgoutput decoding --------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self) -> str:
        value = self.data[self.at : self.at + 1].decode("ascii")
        self.at += 1
        return value

    def int8(self) -> int:
        value = self.data[self.at]
        self.at += 1
        return value

    def int16(self) -> int:
        (value,) = struct.unpack_from("!h", self.data, self.at)
        self.at += 2
        return int(value)

    def int32(self) -> int:
        (value,) = struct.unpack_from("!i", self.data, self.at)
        self.at += 4
        return int(value)

    def int64(self) -> int:
        (value,) = struct.unpack_from("!q", self.data, self.at)
        self.at += 8
        return int(value)

    def string(self) -> str:
        end = self.data.index(b"\0", self.at)
        value = self.data[self.at : end].decode("utf-8")
        self.at = end + 1
        return value

    def tuple_data(self) -> list[tuple[str, str | None]]:
        """(kind, text) per column: kind `n` NULL, `u` unchanged TOASTed value, `t` text."""
        values: list[tuple[str, str | None]] = []
        for _ in range(self.int16()):
            kind = self.byte()
            if kind == "t":
                length = self.int32()
                values.append((kind, self.data[self.at : self.at + length].decode("utf-8")))
                self.at += length
            elif kind in ("n", "u"):
                values.append((kind, None))
            else:
                raise ChangeCaptureError(
                    f"pgoutput sent tuple value kind {kind!r}, which text mode never sends"
                )
        return values


@dataclass
class _Relation:
    namespace: str
    name: str
    columns: list[str]


class ChangeDecoder:
    """Folds pgoutput messages, in order, into a `ChangeSet` over `columns` keyed by `keys`."""

    def __init__(
        self,
        table: tuple[str, str],
        columns: Sequence[str],
        keys: Sequence[str],
        upto: str,
        aliases: Mapping[str, str] | None = None,
    ) -> None:
        self.table = table
        self.columns = list(columns)
        # A renamed column's earlier name (current -> stored): changes written before an
        # `ALTER TABLE ... RENAME COLUMN` arrive under a relation message that still has the old name.
        self.aliases = dict(aliases or {})
        self.keys = list(keys)
        self.key_positions = [self.columns.index(k) for k in keys]
        self.relations: dict[int, _Relation] = {}
        self.changes = ChangeSet(upto=upto)

    def feed(self, message: bytes) -> None:
        reader = _Reader(message)
        kind = reader.byte()
        self.changes.messages += 1
        if kind == "R":
            relid = reader.int32()
            namespace, name = reader.string(), reader.string()
            reader.int8()  # replica identity setting
            columns = []
            for _ in range(reader.int16()):
                reader.int8()  # flags (part of the key)
                columns.append(reader.string())
                reader.int32()  # type oid
                reader.int32()  # type modifier
            self.relations[relid] = _Relation(namespace, name, columns)
        elif kind == "C":
            self.changes.transactions += 1
        elif kind in ("I", "U", "D"):
            relation = self._relation(reader.int32())
            if relation is None:
                return
            if kind == "I":
                reader.byte()  # 'N'
                self._upsert(relation, reader.tuple_data(), None)
                return
            marker = reader.byte()
            old = None
            if marker in ("K", "O"):
                old = reader.tuple_data()
                if kind == "U":
                    reader.byte()  # then 'N'
            if kind == "D":
                if old is None:
                    raise ChangeCaptureError(f"a DELETE on {self._name(relation)} came without its old key")
                self._delete(self._key(self._row_key_only(relation, old)))
            else:
                # Only a full old row ('O', REPLICA IDENTITY FULL) holds unchanged TOASTed values.
                self._upsert(relation, reader.tuple_data(), old, full_old=marker == "O")
        elif kind == "T":
            count = reader.int32()
            reader.int8()  # options (CASCADE, RESTART IDENTITY)
            relids = [reader.int32() for _ in range(count)]
            if any(self._relation(relid) is not None for relid in relids):
                self.changes.truncated = True
                self.changes.upserts.clear()
                self.changes.deletes.clear()
        # 'B' begin, 'O' origin, 'Y' type, 'M' message: nothing to apply

    def _relation(self, relid: int) -> _Relation | None:
        relation = self.relations.get(relid)
        if relation is None:
            raise ChangeCaptureError(f"pgoutput sent a change of relation {relid} before describing it")
        return relation if (relation.namespace, relation.name) == self.table else None

    def _name(self, relation: _Relation) -> str:
        return f"{relation.namespace}.{relation.name}"

    def _row(
        self,
        relation: _Relation,
        values: list[tuple[str, str | None]],
        old: list[tuple[str, str | None]] | None,
    ) -> list[tuple[str, str | None]]:
        """`values` in this decoder's column order, an unchanged TOASTed value taken from `old`."""
        by_name = dict(zip(relation.columns, values, strict=True))
        old_by_name = dict(zip(relation.columns, old, strict=True)) if old is not None else {}
        row: list[tuple[str, str | None]] = []
        for wanted in self.columns:
            column = self._carried(wanted, by_name)
            if column not in by_name:
                raise ChangeCaptureError(
                    f"the change stream of {self._name(relation)} carries no column {wanted!r} (generated "
                    "columns are not replicated); read the table with refresh.change_detection: watermark"
                )
            value = by_name[column]
            if value[0] == "u":
                value = old_by_name.get(column, ("u", None))
            row.append(value)
        return row

    def _key(self, row: list[tuple[str, str | None]]) -> tuple[str | None, ...]:
        return tuple(row[p][1] for p in self.key_positions)

    def _upsert(
        self,
        relation: _Relation,
        values: list[tuple[str, str | None]],
        old: list[tuple[str, str | None]] | None,
        *,
        full_old: bool = False,
    ) -> None:
        row = self._row(relation, values, old if full_old else None)
        key = self._key(row)
        previous = self.changes.upserts.get(key)
        unchanged = [i for i, value in enumerate(row) if value[0] == "u"]
        if unchanged and previous is not None:  # the row was written whole earlier in this change set
            for i in unchanged:
                row[i] = ("t", previous[i]) if previous[i] is not None else ("n", None)
            unchanged = []
        if unchanged:
            names = [self.columns[i] for i in unchanged]
            raise ChangeCaptureError(
                f"an UPDATE of {self._name(relation)} left columns {names} out of the change stream "
                f"(unchanged TOASTed values): run `ALTER TABLE {self._name(relation)} REPLICA IDENTITY "
                "FULL` (the publication sets it when it creates it), then refresh with --full"
            )
        if old is not None:
            old_key = self._key(self._row_key_only(relation, old))
            if old_key != key:  # the primary key changed: the old row is gone
                self.changes.upserts.pop(old_key, None)
                self.changes.deletes.add(old_key)
        self.changes.deletes.discard(key)
        self.changes.upserts[key] = [value[1] for value in row]

    def _row_key_only(
        self, relation: _Relation, old: list[tuple[str, str | None]]
    ) -> list[tuple[str, str | None]]:
        by_name = dict(zip(relation.columns, old, strict=True))
        return [by_name.get(self._carried(column, by_name), ("n", None)) for column in self.columns]

    def _carried(self, column: str, by_name: Mapping[str, Any]) -> str:
        """The name `column` has in a relation message: its own, or its name before a rename."""
        if column in by_name:
            return column
        return self.aliases.get(column, column)

    def _delete(self, key: tuple[str | None, ...]) -> None:
        self.changes.upserts.pop(key, None)
        self.changes.deletes.add(key)


# --- the slot -------------------------------------------------------------------------------------


class ChangeStream:
    """One dataset's replication slot and publication (same name) on its Postgres source."""

    def __init__(self, source: PostgresSource, slot: str, renames: ColumnRenames | None = None) -> None:
        if not _SLOT_NAME.match(slot):
            raise ChangeCaptureError(
                f"replication slot name {slot!r} must be 1-63 lower-case letters, digits or underscores"
            )
        self.source = source
        self.slot = slot
        # The dataset's `renamed_columns`: the stream speaks the table's current names, the caller the
        # stored ones (`peek` and `typed` translate).
        self.renames = renames if renames is not None else ColumnRenames()

    @property
    def publication(self) -> str:
        return self.slot

    @contextmanager
    def connect(self) -> Iterator[Any]:
        """An autocommit ADBC connection in UTC (slot functions refuse to run in some transactions)."""
        import adbc_driver_postgresql.dbapi as adbc

        try:
            conn = adbc.connect(self.source.url, autocommit=True)
        except Exception as err:
            raise SourceError(f"cannot connect to {self.source.describe()}: {clean_error(err)}") from err
        try:
            with conn.cursor() as cur:
                cur.execute("SET TIME ZONE 'UTC'")
                cur.execute("SET DateStyle = 'ISO, YMD'")
                cur.execute("SET extra_float_digits = 3")
                # `position` relies on its commit flushing the WAL.
                cur.execute("SET synchronous_commit = on")
            yield conn
        finally:
            conn.close()

    def _rows(self, conn: Any, sql: str, parameters: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        try:
            with conn.cursor() as cur:
                cur.execute(sql, parameters=tuple(parameters) if parameters else None)
                return list(cur.fetch_arrow_table().to_pylist())
        except ChangeCaptureError:
            raise
        except Exception as err:
            raise ChangeCaptureError(
                f"{self.source.describe()}, replication slot {self.slot!r}: {clean_error(err)}"
            ) from err

    def check_server(self, conn: Any) -> None:
        """Refuse a server whose `wal_level` is not `logical`, saying what to change."""
        level = self._rows(conn, "SELECT current_setting('wal_level') AS level")[0]["level"]
        if level != "logical":
            raise WalLevelError(
                f"{self.source.describe()}: the server's wal_level is {level!r}, and change data capture "
                "reads a logical replication slot, which needs wal_level = logical. Run `ALTER SYSTEM SET "
                "wal_level = logical` as a superuser and restart Postgres; or set "
                "`refresh.change_detection: watermark` on the dataset (no deletes, see README)"
            )

    def info(self, conn: Any | None = None) -> SlotInfo | None:
        """The slot's positions (None: there is no such slot)."""
        if conn is None:
            with self.connect() as opened:
                return self.info(opened)
        rows = self._rows(
            conn,
            "SELECT confirmed_flush_lsn::text AS confirmed, restart_lsn::text AS restart, active, "
            "pg_current_wal_lsn()::text AS current FROM pg_replication_slots WHERE slot_name = $1",
            [self.slot],
        )
        if not rows:
            return None
        row = rows[0]
        return SlotInfo(self.slot, row["confirmed"], row["restart"], row["current"], bool(row["active"]))

    def publishes(self, conn: Any) -> bool:
        """Whether the publication holds the table and the table's replica identity is FULL (a table
        dropped and re-created leaves the publication: its changes would not reach the slot)."""
        table = self.source.table
        rows = self._rows(
            conn,
            "SELECT c.relreplident::text AS identity, EXISTS (SELECT 1 FROM pg_publication_tables p "
            "WHERE p.pubname = $1 AND p.schemaname = $2 AND p.tablename = $3) AS published "
            f"FROM pg_class c WHERE c.oid = '{_regclass(table.sql)}'::regclass",
            [self.publication, table.schema, table.name],
        )
        return bool(rows) and rows[0]["identity"] == "f" and bool(rows[0]["published"])

    def publish(self, conn: Any) -> None:
        """Set REPLICA IDENTITY FULL on the table and put it in the publication (created if need be)."""
        table = self.source.table.sql
        if self.publishes(conn):
            return
        identity = self._rows(
            conn,
            f"SELECT relreplident::text AS identity FROM pg_class WHERE oid = '{_regclass(table)}'::regclass",
        )[0]["identity"]
        if identity != "f":
            self._rows(conn, f"ALTER TABLE {table} REPLICA IDENTITY FULL")
        exists = self._rows(
            conn, "SELECT 1 AS one FROM pg_publication WHERE pubname = $1", [self.publication]
        )
        if not exists:
            self._rows(conn, f'CREATE PUBLICATION "{self.publication}" FOR TABLE {table}')
        elif not self.publishes(conn):
            self._rows(conn, f'ALTER PUBLICATION "{self.publication}" SET TABLE {table}')

    def create(self, conn: Any) -> tuple[str, str | None]:
        """Publish the table (`publish`) and create the slot: (the slot's start, the snapshot it exported).

        The slot is created over a replication connection with an exported snapshot, the state of the
        database at exactly the slot's start; the connection stays open (so the snapshot stays importable)
        until `release_snapshot`, and `self.source.snapshot` names it, so the first copy is read at it:
        no change lies both in the copy and in the stream, none in neither. Without the REPLICATION
        privilege the slot is created through `pg_create_logical_replication_slot` (no snapshot: the copy
        is read afterwards and the stream replays the changes in between, idempotently by primary key).
        """
        self.publish(conn)
        exported = self._create_exporting()
        if exported is not None:
            return exported
        rows = self._rows(
            conn,
            "SELECT lsn::text AS lsn FROM pg_create_logical_replication_slot($1, 'pgoutput')",
            [self.slot],
        )
        return str(rows[0]["lsn"]), None

    def _create_exporting(self) -> tuple[str, str] | None:
        import psycopg

        try:
            replication = psycopg.connect(self.source.url, autocommit=True, replication="database")
        except psycopg.Error:
            return None  # no REPLICATION privilege, or no replication connections allowed
        try:
            cur = psycopg.ClientCursor(replication)  # the replication protocol takes simple queries only
            old_syntax = replication.info.server_version < 150000
            option = "EXPORT_SNAPSHOT" if old_syntax else "(SNAPSHOT 'export')"
            cur.execute(f'CREATE_REPLICATION_SLOT "{self.slot}" LOGICAL pgoutput {option}')
            row = cur.fetchone()
        except psycopg.Error as err:
            replication.close()
            raise ChangeCaptureError(
                f"cannot create replication slot {self.slot!r} on {self.source.describe()}: "
                f"{clean_error(err)}"
            ) from err
        assert row is not None
        start, snapshot = str(row[1]), str(row[2])
        release_snapshot(self.slot)
        _EXPORTED[self.slot] = (replication, self.source)
        self.source.snapshot = snapshot
        return start, snapshot

    def drop(self) -> dict[str, bool]:
        """Drop the slot and the publication of this dataset (each when it exists)."""
        with self.connect() as conn:
            slot = bool(
                self._rows(
                    conn, "SELECT 1 AS one FROM pg_replication_slots WHERE slot_name = $1", [self.slot]
                )
            )
            if slot:
                self._rows(conn, "SELECT pg_drop_replication_slot($1) IS NULL AS dropped", [self.slot])
            publication = bool(
                self._rows(conn, "SELECT 1 AS one FROM pg_publication WHERE pubname = $1", [self.publication])
            )
            if publication:
                self._rows(conn, f'DROP PUBLICATION "{self.publication}"')
        return {"slot": slot, "publication": publication}

    def position(self, conn: Any) -> str:
        """A WAL position every transaction committed so far lies before, flushed to disk: the WAL insert
        position, read in a transaction whose synchronous commit flushes the WAL up to past it."""
        rows = self._rows(
            conn,
            "WITH here AS (SELECT pg_current_wal_insert_lsn() AS lsn, txid_current() AS xid) "
            "SELECT lsn::text AS lsn FROM here",
        )
        return str(rows[0]["lsn"])

    def advance(self, conn: Any, lsn: str) -> None:
        """Move the slot's confirmed position to `lsn` (never backwards)."""
        info = self.info(conn)
        if info is None:
            raise SlotLostError(_lost_message(self.source.describe(), self.slot, lsn))
        if info.confirmed_flush_lsn is not None and lsn_to_int(info.confirmed_flush_lsn) >= lsn_to_int(lsn):
            return
        self._rows(
            conn,
            "SELECT end_lsn::text AS lsn FROM pg_replication_slot_advance($1, $2::pg_lsn)",
            [self.slot, lsn],
        )

    def peek(self, conn: Any, upto: str, columns: Sequence[str], keys: Sequence[str]) -> ChangeSet:
        """The changes of the transactions committed before `upto` that the slot has not confirmed."""
        cached = _PEEKED.get((self.slot, upto))
        info = self.info(conn)
        if info is None:
            raise SlotLostError(_lost_message(self.source.describe(), self.slot, upto))
        if cached is not None and cached[0] == info.confirmed_flush_lsn:
            return cached[1]
        decoder = ChangeDecoder(
            (self.source.table.schema, self.source.table.name),
            self.renames.current_names(columns),
            self.renames.current_names(keys),
            upto,
            aliases={new: old for old, new in self.renames.pairs},
        )
        with conn.cursor() as cur:
            try:
                cur.execute(
                    "SELECT data FROM pg_logical_slot_peek_binary_changes($1, $2::pg_lsn, NULL, "
                    "'proto_version', '1', 'publication_names', $3)",
                    parameters=(self.slot, upto, self.publication),
                )
                for batch in cur.fetch_record_batch():
                    for message in batch.column(0).to_pylist():
                        decoder.feed(message)
            except ChangeCaptureError:
                raise
            except Exception as err:
                raise ChangeCaptureError(
                    f"cannot read replication slot {self.slot!r} of {self.source.describe()}: "
                    f"{clean_error(err)}"
                ) from err
        _PEEKED.clear()
        _PEEKED[(self.slot, upto)] = (info.confirmed_flush_lsn, decoder.changes)
        return decoder.changes

    def typed(self, conn: Any, changes: ChangeSet, schema: pa.Schema, keys: Sequence[str]) -> pa.Table:
        """The change set as one table of `schema` plus `DELETED_COLUMN`: rows to upsert, then keys to
        delete (other columns NULL), each value cast by Postgres from its text to the column's type.
        `schema` and `keys` name stored columns, and so does the table returned."""
        import pyarrow as pa

        schema = self.renames.to_current(schema)
        keys = self.renames.current_names(keys)

        types = self.column_types(conn)
        names = list(schema.names)
        missing = [n for n in names if n not in types]
        if missing:
            raise ChangeCaptureError(
                f"{self.source.describe()} has no column(s) {missing}; refresh with --full"
            )
        rows = list(changes.upserts.values())
        key_rows = [list(key) for key in changes.deletes]
        upserts = self._cast(conn, names, types, rows, schema)
        deleted = self._cast(conn, list(keys), types, key_rows, pa.schema([schema.field(k) for k in keys]))
        deleted_full = pa.table(
            {
                name: deleted.column(name)
                if name in keys
                else pa.nulls(deleted.num_rows, schema.field(name).type)
                for name in names
            },
            schema=schema,
        )
        table = pa.concat_tables([conform_table(upserts, schema), deleted_full])
        marker = pa.array([False] * upserts.num_rows + [True] * deleted.num_rows, pa.bool_())
        table = table.append_column(pa.field(DELETED_COLUMN, pa.bool_(), nullable=False), marker)
        return self.renames.to_stored(table)

    def column_types(self, conn: Any) -> dict[str, str]:
        table = self.source.table.sql
        rows = self._rows(
            conn,
            "SELECT attname::text AS name, format_type(atttypid, atttypmod) AS type FROM pg_attribute "
            f"WHERE attrelid = '{_regclass(table)}'::regclass AND attnum > 0 AND NOT attisdropped",
        )
        return {str(row["name"]): str(row["type"]) for row in rows}

    def _cast(
        self,
        conn: Any,
        names: list[str],
        types: Mapping[str, str],
        rows: list[list[str | None]],
        schema: pa.Schema,
    ) -> pa.Table:
        import pyarrow as pa

        selects = ", ".join(
            f"(r.v->>{i})::{types[name]} AS {quote_ident(name)}" for i, name in enumerate(names)
        )
        sql = (
            f"SELECT {selects} FROM jsonb_array_elements($1::text::jsonb) WITH ORDINALITY AS r(v, n) "
            "ORDER BY r.n"
        )
        parts = []
        for start in range(0, len(rows), _TYPE_CHUNK):
            chunk = rows[start : start + _TYPE_CHUNK]
            with conn.cursor() as cur:
                cur.execute(sql, parameters=(json.dumps(chunk, ensure_ascii=False),))
                parts.append(conform_table(cur.fetch_arrow_table(), schema))
        return pa.concat_tables(parts) if parts else schema.empty_table()


# Replication connections holding a slot's exported snapshot open, by slot, with the source reading at it.
_EXPORTED: dict[str, tuple[Any, PostgresSource]] = {}


def release_snapshot(slot: str | None = None, *, source: object = None) -> None:
    """Close the connection holding `slot`'s exported snapshot (or those `source` reads at); the source
    reads the live table again."""
    for name, (connection, reading) in list(_EXPORTED.items()):
        if name == slot or (source is not None and reading is source):
            del _EXPORTED[name]
            reading.snapshot = None
            connection.close()


def adopt_snapshot(source: Any) -> None:
    """Let `source` (opened again for one partition of the first copy) read at the snapshot this process
    holds for its table, if any."""
    for _, reading in _EXPORTED.values():
        if getattr(source, "kind", None) == "postgres" and (reading.url, reading.table) == (
            source.url,
            source.table,
        ):
            source.snapshot = reading.snapshot


# The last peek of this process, by (slot, upto), with the slot position it started from: the plan and
# the stage of one refresh in one process decode the stream once.
_PEEKED: dict[tuple[str, str], tuple[str | None, ChangeSet]] = {}


def _regclass(table_sql: str) -> str:
    return table_sql.replace("'", "''")


def _lost_message(described: str, slot: str, lsn: str) -> str:
    return (
        f"{described}: replication slot {slot!r} is gone (dropped, or invalidated by "
        f"max_slot_wal_keep_size) while the acceleration continues from WAL position {lsn}; the changes "
        "since then cannot be recovered. Run `airflow-partitions refresh SPEC DATASET --full` to copy the "
        "table again and re-create the slot"
    )
