"""Every error this package raises on purpose: one flat module, small hierarchies, one line each."""

from __future__ import annotations


class AirflowPartitionsError(Exception):
    """Base class of every error raised on purpose by airflow-partitions."""


# --- spec and expressions -------------------------------------------------------------------------


class PartitionSpecError(AirflowPartitionsError):
    """A dataset spec or partition expression is invalid; the message says what and how to fix it."""


class PartitionExpressionError(PartitionSpecError):
    """A partition_by expression cannot be used as a partition transform."""


class SpecValidationError(PartitionSpecError):
    """A spec file broke one or more rules; `.errors` lists every message."""

    def __init__(self, errors: list[str], path: str | None = None) -> None:
        self.errors = list(errors)
        self.path = path
        where = f" in {path}" if path else ""
        bullet = "\n  - "
        super().__init__(f"{len(self.errors)} error(s){where}:{bullet}{bullet.join(self.errors)}")


class DatasetNotFoundError(PartitionSpecError):
    """A dataset name is not declared in the spec; the message lists the names that are."""


class PartitionSpecChangedError(PartitionSpecError):
    """partition_by changed while partitions written with the old expressions exist."""


# --- values and keys ------------------------------------------------------------------------------


class PartitionValueError(AirflowPartitionsError):
    """A partition value cannot be encoded, decoded or compared."""


class UnknownPartitionError(PartitionValueError):
    """A partition key given to a read names no partition of the dataset's version."""


# --- storage and catalog --------------------------------------------------------------------------


class StorageError(AirflowPartitionsError):
    """A partition file could not be written or read."""


class CatalogError(AirflowPartitionsError):
    """The catalog is missing, unreadable or inconsistent."""


class VersionNotFoundError(CatalogError):
    """The requested catalog version does not exist or was vacuumed."""


class CommitConflictError(CatalogError):
    """A concurrent commit changed the same partitions since this commit's base version."""

    def __init__(self, message: str, *, partitions: tuple[str, ...] = (), version: int | None = None) -> None:
        super().__init__(message)
        self.partitions = partitions  # key paths both commits touched
        self.version = version  # the concurrent version that conflicted


class TagError(CatalogError):
    """A version tag cannot be written, moved, deleted or read (bad name, missing version)."""


class UnknownTagError(TagError, VersionNotFoundError):
    """A read named a tag the dataset does not have; `.known` lists the tags it has."""

    def __init__(self, message: str, *, tag: str, known: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.tag = tag
        self.known = known


class SparkLayoutError(AirflowPartitionsError):
    """Spark cannot be given the layout asked for (no bucket field, or a column the layout needs is
    missing); the message says what Spark can be told instead."""


class CatalogIntegrityError(CatalogError):
    """A commit record or checkpoint differs from the digest written with it (edited or damaged)."""

    def __init__(
        self, message: str, *, dataset: str | None = None, version: int | None = None, key: str | None = None
    ) -> None:
        super().__init__(message)
        self.dataset = dataset  # the dataset whose catalog failed the check
        self.version = version  # the version of the record or checkpoint that failed
        self.key = key  # the store key of the object that failed


class CommitFilesMissingError(CatalogError):
    """Files a commit would publish are gone from storage (e.g. vacuumed meanwhile); nothing was published."""

    def __init__(self, message: str, *, missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing  # paths (relative to the dataset root) that do not exist


# --- filters and pruning --------------------------------------------------------------------------


class FilterError(AirflowPartitionsError):
    """A filter or query is malformed, names an unknown column, or compares incompatible types."""


class UnsafeQueryError(FilterError):
    """A query is not a single read-only statement."""


# --- sources, discovery, refresh ------------------------------------------------------------------


class SourceError(AirflowPartitionsError):
    """A source cannot be reached, listed or read."""


class DiscoveryError(AirflowPartitionsError):
    """Partition discovery failed (timeout, too many partitions, unreadable source)."""


class DiscoveryTimeoutError(DiscoveryError):
    """Dynamic discovery did not finish within its timeout."""


class TooManyPartitionsError(DiscoveryError):
    """Discovery found more partitions than the configured cap."""


class RefreshError(AirflowPartitionsError):
    """Refreshing a partition failed."""


class LateRowsError(RefreshError):
    """An append refresh under `refresh.late_rows: fail` found partitions it cannot bring up to date."""

    def __init__(self, message: str, late_rows: dict[str, int]) -> None:
        super().__init__(message)
        self.late_rows = late_rows


class PartitionsFailedError(RefreshError):
    """Some partitions failed to refresh and nothing was committed; `.failed` maps key path to the error."""

    def __init__(self, message: str, failed: dict[str, str], summary: object = None) -> None:
        super().__init__(message)
        self.failed = dict(failed)
        self.summary = summary


class ChangeCaptureError(RefreshError):
    """Change data capture from a Postgres replication slot cannot go on (server setting, slot, table)."""


class WalLevelError(ChangeCaptureError):
    """The Postgres server's `wal_level` is not `logical`, so no replication slot can stream changes."""


class SlotLostError(ChangeCaptureError):
    """The replication slot a committed version continues from is gone: its changes cannot be recovered."""


# --- snapshots ------------------------------------------------------------------------------------


class SnapshotError(AirflowPartitionsError):
    """A snapshot upload or bootstrap failed (credentials, checksum mismatch, missing object)."""


class S3SettingsError(SnapshotError, SourceError):
    """S3 settings (endpoint, credentials, addressing style) are malformed; used by sources and snapshots."""


# --- orchestration (Airflow layer, backfill CLI) --------------------------------------------------


class RunConfError(AirflowPartitionsError):
    """A refresh run's conf / params (`partitions`, `where`, `full_refresh`, `snapshot`) is malformed."""


class OrchestrationError(AirflowPartitionsError):
    """An Airflow connection, operator argument or DAG wiring is invalid."""


class AirflowApiError(AirflowPartitionsError):
    """The Airflow REST API could not be reached, refused the credentials, or rejected a request."""


class SchemaDriftError(SourceError):
    """Source files disagree on a column's type and no lossless widening unifies them."""


class SchemaMixedRefreshError(DiscoveryError):
    """A partial refresh would publish partitions under a source schema the other partitions were not
    written with; a plain (or full) refresh rewrites every partition under the new schema."""


class SnapshotIntegrityError(SnapshotError):
    """A snapshot object's bytes differ from the SHA-256 recorded when it was published."""

    def __init__(self, message: str, *, uri: str, expected: str | None, actual: str) -> None:
        super().__init__(message)
        self.uri = uri  # the object that failed the check
        self.expected = expected  # the recorded SHA-256 hex (None: no digest was recorded)
        self.actual = actual  # the SHA-256 hex of the bytes read


# --- row conservation -----------------------------------------------------------------------------


class ConservationError(RefreshError):
    """Rows were lost or gained between source, stage and written files; nothing was published.

    `.partitions` maps each offending key path (or a bracketed label for a whole-stage count) to
    `(expected, actual)`; `expected` is None when only "at least one row" is known (discovery found it).
    """

    def __init__(
        self,
        dataset: str,
        partitions: dict[str, tuple[int | None, int]],
        *,
        expected: str,
        actual: str,
        hint: str = "",
    ) -> None:
        self.dataset = dataset
        self.partitions = dict(partitions)
        self.expected = expected  # what the first count is, e.g. "rows routed by the stage"
        self.actual = actual  # what the second count is, e.g. "rows in the written files"
        self.hint = hint
        self.summary: object = None  # a `RefreshSummary` when raised by `refresh_dataset`
        shown = sorted(self.partitions.items())
        listed = "; ".join(
            f"{path}: {'at least 1' if want is None else want} {expected}, {got} {actual}"
            for path, (want, got) in shown[:10]
        )
        more = f" (and {len(shown) - 10} more)" if len(shown) > 10 else ""
        super().__init__(
            f"dataset {dataset!r}: row counts differ in {len(shown)} partition(s) ({listed}{more}); nothing "
            "was published and the previous catalog version stays current." + (f" {hint}" if hint else "")
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild_conservation_error,
            (self.dataset, self.partitions, self.expected, self.actual, self.hint),
        )


def _rebuild_conservation_error(
    dataset: str,
    partitions: dict[str, tuple[int | None, int]],
    expected: str,
    actual: str,
    hint: str,
) -> ConservationError:
    return ConservationError(dataset, partitions, expected=expected, actual=actual, hint=hint)


class VerifyDriftError(RefreshError):
    """`verify` found partitions whose acceleration differs from the source (drifted, missing or extra)."""


class ObjectStoreError(CatalogError, SnapshotError, SourceError):
    """An object store call (read, write, list, delete) failed; raised for catalogs, snapshots and sources."""


class QueryLimitError(FilterError):
    """A query ran past its time or memory limit, or was given an invalid one; `.limit` names which."""

    def __init__(self, message: str, *, limit: str | None = None) -> None:
        super().__init__(message)
        self.limit = limit


class CommitOutcomeUnknownError(ObjectStoreError):
    """A commit's write failed and reading it back failed too: it may or may not be published.

    Commit again with `commit_id=err.commit_id`: a published one is then recognised, not repeated.
    """

    def __init__(self, message: str, *, commit_id: str, version: int) -> None:
        super().__init__(message)
        self.commit_id = commit_id  # the token the unknown record carries, if it was written
        self.version = version  # the version it tried to create


class WriteError(AirflowPartitionsError):
    """A write (append, upsert, delete) was refused or failed; nothing of it was published."""


class WriteSchemaError(WriteError):
    """The rows of a write do not fit the dataset's schema; `.missing`, `.extra` and `.uncastable` name
    the columns."""

    def __init__(
        self,
        message: str,
        *,
        missing: tuple[str, ...] = (),
        extra: tuple[str, ...] = (),
        uncastable: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.missing = missing
        self.extra = extra
        self.uncastable = uncastable

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_write_schema_error, (str(self), self.missing, self.extra, self.uncastable))


def _rebuild_write_schema_error(
    message: str, missing: tuple[str, ...], extra: tuple[str, ...], uncastable: tuple[str, ...]
) -> WriteSchemaError:
    return WriteSchemaError(message, missing=missing, extra=extra, uncastable=uncastable)


class WriteKeyError(WriteError):
    """An upsert or delete by key has no key columns, unknown ones, or incoming rows repeating a key."""


class WriteThroughError(WriteError):
    """A write-through reached the source (committed there) but not the acceleration. `.source_rows` is
    what the source transaction wrote, `.partitions` the acceleration partitions to refresh to catch up."""

    def __init__(self, message: str, *, source_rows: int, partitions: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.source_rows = source_rows
        self.partitions = partitions

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_write_through_error, (str(self), self.source_rows, self.partitions))


def _rebuild_write_through_error(
    message: str, source_rows: int, partitions: tuple[str, ...]
) -> WriteThroughError:
    return WriteThroughError(message, source_rows=source_rows, partitions=partitions)


class CompactionError(AirflowPartitionsError):
    """A compaction was asked for with bad arguments or cannot run on the catalog as it is."""


class ExampleInitError(AirflowPartitionsError):
    """`airflow-partitions init` cannot write the example (its files are already there, or bad options)."""


class SparkUnreachableError(RefreshError, OrchestrationError):
    """The Spark master or Spark Connect server a refresh was sent to did not accept a connection.

    `.url` is the master / server URL as configured, `.timeout` the seconds each address was given.
    """

    def __init__(self, message: str, *, url: str, timeout: float) -> None:
        super().__init__(message)
        self.url = url
        self.timeout = timeout

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_spark_unreachable_error, (str(self), self.url, self.timeout))


def _rebuild_spark_unreachable_error(message: str, url: str, timeout: float) -> SparkUnreachableError:
    return SparkUnreachableError(message, url=url, timeout=timeout)


class SparkNoExecutorsError(SparkUnreachableError):
    """A cluster master accepted the refresh's application but granted it no executor in time (no worker
    alive, or none with the cores and memory asked for); the session was stopped and nothing ran."""

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_spark_no_executors_error, (str(self), self.url, self.timeout))


def _rebuild_spark_no_executors_error(message: str, url: str, timeout: float) -> SparkNoExecutorsError:
    return SparkNoExecutorsError(message, url=url, timeout=timeout)
