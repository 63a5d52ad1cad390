"""What every source connector offers the refresh pipeline: schema, partition survey, reads, fingerprints."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from airflow_partitions.exceptions import DiscoveryTimeoutError
from airflow_partitions.keys import Scalar

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.transforms import Transform

KeyTuple = tuple[Scalar, ...]

# The fingerprint of a partition that no source file or row maps to: stable, and unlike any digest.
EMPTY_FINGERPRINT = "empty"
FINGERPRINT_HEX_CHARS = 24


def digest(parts: Iterable[str]) -> str:
    """A short, stable content digest of text parts (order matters; callers sort when it must not)."""
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(part.encode("utf-8"))
        hasher.update(b"\n")
    return hasher.hexdigest()[:FINGERPRINT_HEX_CHARS]


# A partition fingerprint starts with the tag of the source schema its rows were read under, so a change of
# any column's type changes every partition's fingerprint: a version never mixes two schemas. Short, as
# every planned item carries its fingerprint through XCom.
SCHEMA_TAG_PREFIX = "s"
SCHEMA_TAG_HEX_CHARS = 8


def schema_tag(schema: pa.Schema) -> str:
    """`s<8 hex>`: a short digest of the column names and Arrow types (metadata ignored)."""
    lines = [f"{field.name}\t{field.type}" for field in schema]
    return SCHEMA_TAG_PREFIX + digest(lines)[:SCHEMA_TAG_HEX_CHARS]


def tagged_fingerprint(tag: str, fingerprint: str) -> str:
    """`fingerprint` prefixed with the schema tag (`s<hex>/<fingerprint>`); `EMPTY` stays as is."""
    if not tag or fingerprint == EMPTY_FINGERPRINT:
        return fingerprint
    return f"{tag}/{fingerprint}"


def fingerprint_schema_tag(fingerprint: str | None) -> str | None:
    """The schema tag a recorded fingerprint starts with, or None (no rows, or recorded without one)."""
    head, separator, _ = (fingerprint or "").partition("/")
    if separator and head.startswith(SCHEMA_TAG_PREFIX) and len(head) == 1 + SCHEMA_TAG_HEX_CHARS:
        return head
    return None


class Deadline:
    """A wall-clock budget shared by every step of one discovery; `check` raises once it is spent."""

    def __init__(self, seconds: float | None, what: str = "partition discovery") -> None:
        self.seconds = seconds
        self.what = what
        self._start = time.monotonic()

    def remaining(self) -> float | None:
        """Seconds left (never negative), or None for no limit."""
        if self.seconds is None:
            return None
        return max(0.0, self.seconds - (time.monotonic() - self._start))

    def expired(self) -> bool:
        remaining = self.remaining()
        return remaining is not None and remaining <= 0.0

    def check(self, step: str) -> None:
        if self.expired():
            raise self.error(step)

    def error(self, step: str) -> DiscoveryTimeoutError:
        return DiscoveryTimeoutError(
            f"{self.what} did not finish within {self.seconds:g} s (while {step}); raise "
            "`refresh: {discovery_timeout: <seconds>}` in the spec, or use a static partition such as "
            "bucket(N, col), or lay the source out in Hive directories so discovery can list instead of scan"
        )


@dataclass(frozen=True)
class SourceSurvey:
    """What one look at the source found: the partition keys present (dynamic discovery) and fingerprints.

    `keys` is None when the caller did not ask for keys. Fingerprints are either per partition (`per_key`,
    looked up through `projection`, the field positions the source layout determines) or one for the
    whole source, which then stands for every partition: any change refreshes all of them. Every
    fingerprint but the empty one starts with `schema_tag` (see `schema_tag()`), the source schema the
    rows are read under.
    """

    keys: list[KeyTuple] | None
    whole_fingerprint: str
    per_key: Mapping[KeyTuple, str] | None = None
    projection: tuple[int, ...] = ()
    granularity: str = "source"  # "source" | "partition"
    notes: tuple[str, ...] = field(default_factory=tuple)
    schema_tag: str = ""

    def fingerprint(self, key: Sequence[Scalar]) -> str:
        """The fingerprint of the source data that can feed the partition `key`."""
        if self.per_key is None:
            return self.whole_fingerprint
        projected = tuple(key[i] for i in self.projection)
        return self.per_key.get(projected, EMPTY_FINGERPRINT)


@dataclass(frozen=True)
class RowsSince:
    """The rows an append refresh reads: `column` past `after` (strictly greater), or, with `after` None,
    every row whose `column` is not NULL. NULL values are never past a watermark."""

    column: str
    after: Any = None

    def arrow_expression(self, arrow_type: pa.DataType) -> Any:
        """The condition as a `pyarrow.compute.Expression` (pushed to Parquet row groups by a dataset)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        field_ref = pc.field(self.column)
        if self.after is None:
            return field_ref.is_valid()
        return field_ref > pa.scalar(self.after, type=arrow_type)

    def filter_table(self, table: pa.Table) -> pa.Table:
        """The rows of `table` past the watermark."""
        import pyarrow.compute as pc

        column = table.column(self.column)
        if self.after is None:
            return table.filter(pc.is_valid(column))
        import pyarrow as pa

        mask = pc.greater(column, pa.scalar(self.after, type=column.type))
        return table.filter(pc.fill_null(mask, False))


@runtime_checkable
class Source(Protocol):
    """A readable source of rows: files (local or S3, parquet/csv/jsonl) or a Postgres table."""

    kind: str

    def describe(self) -> str:
        """A short human description for logs and errors."""
        ...

    def schema(self) -> pa.Schema:
        """The Arrow schema of the source rows (connecting to the source if needed)."""
        ...

    def survey(
        self,
        transforms: Sequence[Transform],
        *,
        need_keys: bool,
        check_column: str | None,
        deadline: Deadline,
    ) -> SourceSurvey:
        """Distinct partition keys (when `need_keys`) and per-partition or whole-source fingerprints."""
        ...

    def can_read_partition(self, transforms: Sequence[Transform]) -> bool:
        """True when one partition's rows can be read without scanning the rest of the source."""
        ...

    def partition_read_hint(self, transforms: Sequence[Transform], key: KeyTuple) -> Any:
        """JSON-safe facts a later `read_partition` needs (e.g. the partition's files), taken now."""
        ...

    def read_partition(self, transforms: Sequence[Transform], key: KeyTuple, hint: Any) -> pa.Table:
        """The rows of one partition, read with the predicate pushed down to the source."""
        ...

    def read_partition_since(
        self, transforms: Sequence[Transform], key: KeyTuple, hint: Any, since: RowsSince
    ) -> pa.Table:
        """The rows of one partition past a watermark (append refresh), the condition pushed down too."""
        ...

    def read_all(self, *, deadline: Deadline | None = None) -> pa.Table:
        """Every row of the source as Arrow (tests and small sources)."""
        ...

    def count_null_rows(self, column: str) -> int:
        """How many source rows have a NULL `column` (an append refresh reports those it cannot read)."""
        ...

    def read_columns(self, columns: Sequence[str]) -> pa.Table:
        """`columns` of every source row, in the source's types (the projection pushed down): what an
        append refresh counts per partition to find the rows it cannot append."""
        ...

    def spark_frame(
        self,
        spark: Any,
        transforms: Sequence[Transform],
        keys: Sequence[KeyTuple] | None,
        *,
        work_dir: str,
        since: RowsSince | None = None,
    ) -> Any:
        """A Spark DataFrame of the source rows, pruned to what can feed `keys` where the source allows,
        and to the rows past `since` where the source can skip the others (the caller filters too)."""
        ...

    def to_json(self) -> dict[str, Any]:
        """What identifies the source (kind, location, params), secrets masked: fit to print or to write in a
        stage manifest, never to reopen the source from (the spec holds the secrets)."""
        ...


# --- connection resolution ------------------------------------------------------------------------

ConnectionResolver = Callable[[str], str]
_resolver: ConnectionResolver | None = None


def set_connection_resolver(resolver: ConnectionResolver | None) -> None:
    """Install the function that turns a connection id into a URL (the Airflow layer installs one)."""
    global _resolver
    _resolver = resolver


def connection_resolver() -> ConnectionResolver | None:
    return _resolver


def merged_params(*layers: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for layer in layers:
        if layer:
            out.update(layer)
    return out
