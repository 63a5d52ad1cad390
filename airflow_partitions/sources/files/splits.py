"""A Parquet file source cut into splits that other processes read with pyarrow (the Spark stage's
executors, `refresh/split_read.py`): whole files, or runs of row groups of a large file, grouped into tasks
of about equal bytes; and `SplitReader`, the picklable recipe that reads one split as the source reads it
(the source schema, drifting files unified, S3 reached with the source's own settings)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import SourceError
from airflow_partitions.objectstore import S3Location, S3Settings, S3Store
from airflow_partitions.sources.files.arrow_reads import ArrowFiles, FileReader
from airflow_partitions.sources.files.formats import ParquetRules
from airflow_partitions.sources.files.place import SourceFile

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True, slots=True)
class Split:
    """One file of the source, or a run of its row groups (`row_groups`; None: the whole file)."""

    path: str
    size: int  # bytes of the file this split reads (its share of a file cut by row groups)
    row_groups: tuple[int, ...] | None = None


@dataclass(frozen=True)
class SplitReader:
    """Reads splits of a Parquet file source anywhere (pickled into a Spark job): local files, or the
    objects of `bucket` reached with the source's S3 settings as the driver resolved them (they travel in
    the job only, never in a log or a manifest); `schema` is the source schema, serialized. Sources with
    Hive directory columns are not split (their values come from the listing)."""

    describe: str
    schema: bytes
    bucket: str | None = None
    s3_settings: S3Settings | None = None
    _files: list[ArrowFiles] = field(default_factory=list, compare=False, repr=False)

    def arrow_schema(self) -> pa.Schema:
        import pyarrow as pa

        return pa.ipc.read_schema(pa.py_buffer(self.schema))

    def _arrow(self) -> ArrowFiles:
        if not self._files:  # the filesystem built once per process that reads
            reader = FileReader(ParquetRules(), self._filesystem(), self.describe)
            self._files.append(ArrowFiles(reader, (), ""))
        return self._files[0]

    def _filesystem(self) -> Any:
        if self.bucket is None:
            from pyarrow import fs  # lazy: loads pyarrow

            return fs.LocalFileSystem()
        return S3Store.at(S3Location(self.bucket, ""), self.s3_settings).bucket_filesystem()

    def batches(self, split: Split, schema: pa.Schema, *, batch_rows: int) -> Iterator[pa.Table]:
        """The rows of `split` typed as `schema`; `SourceError` naming the file when it cannot be read."""
        source_file = SourceFile(split.path, split.path, split.size, "")
        return self._arrow().file_batches(
            source_file, schema, row_groups=split.row_groups, batch_rows=batch_rows
        )


def with_driver_credentials(settings: S3Settings) -> S3Settings:
    """`settings` with the credentials this process's AWS chain resolves when they name none: executors
    do not share the driver's environment (variables, profile), so the job carries what the driver uses."""
    import dataclasses

    if settings.aws_access_key_id is not None:
        return settings
    import boto3  # lazy: loads boto3

    credentials = boto3.Session().get_credentials()
    if credentials is None:
        return settings
    frozen = credentials.get_frozen_credentials()
    return dataclasses.replace(
        settings,
        aws_access_key_id=frozen.access_key,
        aws_secret_access_key=frozen.secret_key,
        aws_session_token=frozen.token,
    )


def file_splits(files: Sequence[SourceFile], filesystem: Any, target: int, describe: str) -> list[Split]:
    """`files` as splits of about `target` bytes: a file up to `target` whole, a larger one cut into runs
    of its row groups (its footer read here); in listing order."""
    import pyarrow.parquet as pq

    splits: list[Split] = []
    for source_file in files:
        if source_file.size <= target:
            splits.append(Split(source_file.path, source_file.size))
            continue
        try:
            groups = pq.read_metadata(source_file.path, filesystem=filesystem).num_row_groups
        except (OSError, ValueError) as err:
            raise SourceError(f"cannot read the footer of {source_file.path} ({describe}): {err}") from err
        pieces = min(groups, math.ceil(source_file.size / target))
        if pieces <= 1:
            splits.append(Split(source_file.path, source_file.size))
            continue
        bounds = [round(groups * n / pieces) for n in range(pieces + 1)]
        for first, end in itertools.pairwise(bounds):
            share = source_file.size * (end - first) // groups
            splits.append(Split(source_file.path, share, tuple(range(first, end))))
    return splits


def group_splits(splits: Sequence[Split], tasks: int, open_cost: int) -> list[tuple[Split, ...]]:
    """Splits packed in order into at most `tasks` tasks of about equal bytes (each split also costs
    `open_cost`, as Spark packs file splits); a task holds at least one split."""
    count = max(1, min(tasks, len(splits)))
    total = sum(split.size + open_cost for split in splits)
    grouped: list[tuple[Split, ...]] = []
    current: list[Split] = []
    done = 0  # bytes of the splits placed so far
    for position, split in enumerate(splits):
        current.append(split)
        done += split.size + open_cost
        left = len(splits) - position - 1  # splits still to place
        wanted = count - len(grouped) - 1  # tasks still to fill after this one
        # Close the task at its share of the bytes, or when each later task needs one of the splits left.
        if wanted > 0 and (done * count >= total * (len(grouped) + 1) or left == wanted):
            grouped.append(tuple(current))
            current = []
    if current:
        grouped.append(tuple(current))
    return grouped
