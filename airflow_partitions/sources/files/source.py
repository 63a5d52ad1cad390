"""`FileSource`: the `Source` of parquet, CSV and JSON-lines files on a local disk or S3, as paths,
directories or globs; it holds what is learnt of the files and hands each job to its module."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import SourceError
from airflow_partitions.sources.base import (
    Deadline,
    KeyTuple,
    RowsSince,
    SourceSurvey,
    digest,
    schema_tag,
    tagged_fingerprint,
)
from airflow_partitions.sources.file_facts import FileFacts, FileFactsState
from airflow_partitions.sources.files.arrow_reads import ArrowFiles, FileReader, filter_to_key, typed
from airflow_partitions.sources.files.formats import (
    FileFormatRules,
    declared_format,
    format_from_name,
    format_rules,
)
from airflow_partitions.sources.files.partitions import (
    HiveGroups,
    PendingFacts,
    files_by_facts,
    hive_groups,
    hive_projection,
    kept_keys,
    learn_file_facts,
    map_by_facts,
    static_keys,
)
from airflow_partitions.sources.files.place import S3Files, SourceFile, hive_columns_of, open_place
from airflow_partitions.sources.files.schemas import FileSchemas, source_schema
from airflow_partitions.sources.files.spark_read import SparkFileRead
from airflow_partitions.sources.files.splits import Split, SplitReader, file_splits, with_driver_credentials
from airflow_partitions.spec.masking import masked_params

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as pads

    from airflow_partitions.transforms import Transform

# Files up to this size are read (a Parquet footer, a small CSV or JSON parsed) to tell a directory of
# 0-row files from a partition; larger ones are taken as holding rows.
_ROW_CHECK_BYTES = 1 << 20


class FileSource:
    """Files on a local disk or S3 (`s3://bucket/prefix`), one format, optionally Hive-partitioned."""

    kind = "files"

    def __init__(
        self,
        location: str,
        *,
        params: Mapping[str, Any] | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        scheme: str = "file",
        schema: pa.Schema | None = None,
        declared_schema: pa.Schema | None = None,
    ) -> None:
        self.location = location
        # The spec's `schema:` block: its types win over what the files say (see `_schema`).
        self.declared_schema = declared_schema.remove_metadata() if declared_schema is not None else None
        self.params: dict[str, Any] = dict(params or {})
        self.base_dir = str(base_dir) if base_dir is not None else None
        self.scheme = scheme
        self.place = open_place(location, scheme=scheme, params=self.params, base_dir=self.base_dir)
        self.is_s3 = self.place.remote
        self._files: list[SourceFile] | None = None
        # Per-file facts (keys, column ranges) and where they are kept: see `use_file_facts`.
        self.facts_state: FileFactsState | None = None
        # Relative paths of the files read to learn their facts, in order (what a refresh had to open).
        self.facts_reads: list[str] = []
        # Set by a refresh that reads every file whole whatever the survey finds (a forced refresh of
        # every bucket key or of a selection, streamed): the survey then leaves new files' facts pending
        # (`pending_facts`) for that read to learn, instead of reading them first.
        self.defer_file_facts = False
        self.pending_facts: PendingFacts | None = None
        # Row counts of small files by fingerprint line, for the life of this source object.
        self._row_counts: dict[str, int] = {}
        self._group_cache: tuple[tuple[str, ...], HiveGroups] | None = None
        if schema is not None:
            # Known from a stage manifest: a finalize task then reads its files without listing the source.
            self.__dict__["_schema"] = schema

    # --- location and listing -----------------------------------------------------------------

    def describe(self) -> str:
        return f"{self.file_format} files at {self.location}"

    @property
    def root(self) -> str:
        return self.place.root

    @cached_property
    def file_format(self) -> str:
        declared = declared_format(self.params, self.location)
        if declared:
            return declared
        guess = format_from_name(self.location)
        if guess is None:
            guesses = {format_from_name(f.relative) for f in self.list_files()[:50]}
            guesses.discard(None)
            if len(guesses) == 1:
                guess = guesses.pop()
        if guess is None:
            raise SourceError(
                f"cannot tell the format of {self.location}; set `params: {{file_format: parquet|csv|json}}`"
            )
        return guess

    def list_files(self, *, refresh: bool = False) -> list[SourceFile]:
        """Every data file of the source, sorted by path (cached; `refresh=True` lists again)."""
        if self._files is None or refresh:
            files = sorted(self.place.files(), key=lambda f: f.relative)
            if not files:
                raise SourceError(
                    f"no data files found at {self.location}; check the path, glob and that files are not "
                    "hidden (names starting with '.' or '_' are skipped)"
                )
            self._files = files
        return self._files

    @property
    def filesystem(self) -> Any:
        return self.place.filesystem

    @cached_property
    def hive_columns(self) -> tuple[str, ...]:
        """Hive partition column names shared by every file's directories, or () if the layout is not Hive."""
        return hive_columns_of(self.list_files())

    # --- Arrow side ---------------------------------------------------------------------------

    @cached_property
    def _rules(self) -> FileFormatRules:
        return format_rules(self.file_format, self.params, self.location)

    @cached_property
    def _reader(self) -> FileReader:
        return FileReader(self._rules, self.filesystem, self.describe())

    @property
    def _arrow(self) -> ArrowFiles:
        # Built per use: `hive_columns` may be given by a read hint after the source was opened.
        return ArrowFiles(self._reader, self.hive_columns, self.place.hive_base())

    def _dataset(self, files: Sequence[SourceFile], schema: pa.Schema | None = None) -> pads.Dataset:
        return self._arrow.dataset(files, schema)

    def _typed(self, data: Any, schema: pa.Schema) -> Any:
        return typed(data, schema)

    # --- schema -------------------------------------------------------------------------------

    @cached_property
    def _schema(self) -> pa.Schema:
        """The one schema of every row: each file's own schema unified losslessly, the declared types on top.

        Every file is asked (parquet footers; the first block of a CSV or JSON file), not just the first:
        files whose types drift would otherwise be read under a schema they do not have.
        """
        files = self.list_files()
        hive_fields = self._arrow.hive_fields(files)
        schemas = self.file_schemas(files)
        return source_schema(files, schemas, hive_fields, self.declared_schema, self._rules, self.describe())

    @cached_property
    def _file_schemas(self) -> FileSchemas:
        return FileSchemas(self._reader.file_schema, self.place.read_parallelism)

    def file_schemas(self, files: Sequence[SourceFile]) -> dict[str, pa.Schema]:
        """Each file's own schema (cached per path, size and version), read in parallel."""
        return self._file_schemas.of(files)

    def schema(self) -> pa.Schema:
        return self._schema

    def _file_hive_values(self) -> dict[str, dict[str, Any]]:
        """Per file path, its typed Hive values (as pyarrow parsed them from the directories)."""
        return self._arrow.hive_values(self.list_files(), self.schema())

    # --- survey -------------------------------------------------------------------------------

    def hive_projection(self, transforms: Sequence[Transform]) -> tuple[int, ...]:
        """Positions of the partition fields whose source column is a Hive directory column."""
        return hive_projection(transforms, self.hive_columns)

    def _groups(self, transforms: Sequence[Transform]) -> HiveGroups:
        projection = self.hive_projection(transforms)
        files = self.list_files() if projection else []
        return hive_groups(transforms, files, projection, self._file_hive_values)

    def _cached_groups(self, transforms: Sequence[Transform]) -> HiveGroups:
        cache_key = tuple(t.canonical for t in transforms)
        if self._group_cache is None or self._group_cache[0] != cache_key:
            self._group_cache = (cache_key, self._groups(transforms))
        return self._group_cache[1]

    def _may_hold_rows(self, group: Sequence[SourceFile]) -> bool:
        """False only when every file of `group` was read and holds no row. A file above
        `_ROW_CHECK_BYTES` is taken as holding rows unread: doubt keeps the key (an empty partition then
        fails the refresh's conservation check loudly; a dropped key would lose rows)."""
        if any(f.size > _ROW_CHECK_BYTES for f in group):
            return True
        return any(self._file_rows(f) != 0 for f in group)

    def _file_rows(self, source_file: SourceFile) -> int | None:
        """The rows of one small file, remembered per version; None when it cannot be read here."""
        line = source_file.fingerprint_line()
        if line not in self._row_counts:
            rows = self._reader.file_rows(source_file)
            if rows is None:
                return None
            self._row_counts[line] = rows
        return self._row_counts[line]

    def survey(
        self,
        transforms: Sequence[Transform],
        *,
        need_keys: bool,
        check_column: str | None,
        deadline: Deadline,
    ) -> SourceSurvey:
        files = self.list_files(refresh=True)
        deadline.check(f"listing {self.location}")
        tag = schema_tag(self.schema())
        whole = tagged_fingerprint(tag, digest(f.fingerprint_line() for f in files))
        projection, groups = self._groups(transforms)
        per_key = {
            partial: tagged_fingerprint(tag, digest(f.fingerprint_line() for f in group))
            for partial, group in groups.items()
        }
        keys: list[KeyTuple] | None = None
        notes: list[str] = []
        if need_keys and projection and len(projection) == len(transforms):
            # Every field is decided by the directories: the listing is the discovery, less the directories
            # whose files hold no row (a partition is a key some row has).
            keys = [
                tuple(partial[projection.index(i)] for i in range(len(transforms)))
                for partial, group in groups.items()
                if self._may_hold_rows(group)
            ]
            notes.append("keys listed from Hive directories")
        if check_column:
            notes.append("check_column is ignored for file sources: file sizes and versions are compared")
        if not projection and transforms and self.facts_state is not None:
            mapped = self._survey_by_facts(transforms, files, need_keys, tag, deadline, notes)
            if mapped is not None:
                return SourceSurvey(
                    keys=mapped[0],
                    whole_fingerprint=whole,
                    per_key=mapped[1],
                    projection=tuple(range(len(transforms))),
                    granularity="partition",
                    notes=tuple(notes),
                    schema_tag=tag,
                )
        elif not projection and transforms:
            notes.append("no per-file facts kept for this source: any change refreshes every partition")
        if need_keys and keys is None:
            keys = self._scan_distinct(transforms, deadline)
            notes.append("keys scanned (SELECT DISTINCT over the partition expressions)")
        return SourceSurvey(
            keys=keys,
            whole_fingerprint=whole,
            per_key=per_key if projection else None,
            projection=projection,
            granularity="partition" if projection else "source",
            notes=tuple(notes),
            schema_tag=tag,
        )

    def _scan_distinct(self, transforms: Sequence[Transform], deadline: Deadline) -> list[KeyTuple]:
        files, schema = self.list_files(), self.schema()
        return self._arrow.distinct_keys(files, schema, transforms, deadline, self.location)

    # --- per-file facts (no Hive layout) ------------------------------------------------------

    def use_file_facts(self, path: str | os.PathLike[str] | None) -> None:
        """Keep per-file facts in `path` (a JSON file, written atomically), or in memory for None.

        Without a call the source keeps none: fingerprints are then one for the whole source.
        """
        if self.facts_state is None or (path is not None and self.facts_state.path != Path(path)):
            self.facts_state = FileFactsState(Path(path) if path is not None else None)

    def file_facts(
        self, transforms: Sequence[Transform], files: Sequence[SourceFile], deadline: Deadline | None = None
    ) -> dict[str, FileFacts]:
        """The facts of `files` by fingerprint line: kept ones, and the others learnt now (one read of each
        new file's partition columns) and kept, for the files listed now only."""
        assert self.facts_state is not None
        schema = self.schema()

        def read_columns(source_file: SourceFile, columns: list[str]) -> pa.Table:
            return self._arrow.read([source_file], schema, columns=columns)

        return learn_file_facts(
            self.facts_state, schema, transforms, files, read_columns, self.facts_reads, deadline
        )

    def _survey_by_facts(
        self,
        transforms: Sequence[Transform],
        files: Sequence[SourceFile],
        need_keys: bool,
        tag: str,
        deadline: Deadline,
        notes: list[str],
    ) -> tuple[list[KeyTuple] | None, dict[KeyTuple, str]] | None:
        """Keys (when asked) and per-partition fingerprints from per-file facts; None when the partitions
        are not known (see `map_by_facts`)."""
        if self.defer_file_facts and not need_keys:
            deferred = self._defer_facts(transforms, files, tag, notes)
            if deferred is not None:
                return None, deferred
        reads_before = len(self.facts_reads)
        facts = self.file_facts(transforms, files, deadline)
        read = len(self.facts_reads) - reads_before
        keys: list[KeyTuple] | None = None
        if need_keys and all(f.keys is not None for f in facts.values()):
            keys = kept_keys(facts)
            notes.append(
                f"keys from per-file facts ({read} new or changed file(s) read, {len(files) - read} kept)"
            )
        elif need_keys:
            keys = self._scan_distinct(transforms, deadline)
            notes.append("keys scanned (SELECT DISTINCT over the partition expressions)")
        per_key = map_by_facts(transforms, facts, keys, self.schema(), tag, notes)
        return None if per_key is None else (keys, per_key)

    def _defer_facts(
        self, transforms: Sequence[Transform], files: Sequence[SourceFile], tag: str, notes: list[str]
    ) -> dict[KeyTuple, str] | None:
        """Per-partition fingerprints with the files without kept facts left pending (each feeding every
        partition until the refresh's read learns it); None when none is pending or the keys are not
        every bucket."""
        assert self.facts_state is not None
        keys = static_keys(transforms)
        pending = PendingFacts.of(self.facts_state, self.schema(), transforms, files, tag) if keys else None
        if keys is None or pending is None:
            return None
        self.pending_facts = pending
        notes.append(
            f"{len(pending.files)} new or changed file(s) learnt as the refresh reads them "
            f"({len(pending.kept)} kept)"
        )
        return pending.fingerprints(keys)

    def settle_pending_facts(
        self, learnt: Mapping[str, FileFacts] | None, keys: Sequence[KeyTuple]
    ) -> dict[KeyTuple, str] | None:
        """The fingerprints of `keys` once the pending files' facts are known: `learnt` by the refresh's
        read (None when nothing is pending, or when a pending file was not learnt: the survey's fingerprints
        then stand, holding it), else, with `learnt` None, read as the survey reads them."""
        pending, self.pending_facts = self.pending_facts, None
        if pending is None:
            return None
        if learnt is not None:
            return pending.settle(learnt, keys)
        files = [
            *pending.files.values(),
            *(f for f in self.list_files() if f.fingerprint_line() in pending.kept),
        ]
        return pending.fingerprints(keys, self.file_facts(pending.transforms, files))

    def read_batches_by_file(
        self, *, batch_rows: int = 256 * 1024, readahead: int = 2
    ) -> Iterator[tuple[str, pa.Table]]:
        """`read_batches`, one file after the other, each batch with its file's fingerprint line (a file
        that holds no row gives one empty table)."""
        schema = self.schema()
        parquet = self.file_format == "parquet"
        for source_file in self.list_files():
            line = source_file.fingerprint_line()
            yield line, schema.empty_table()
            for batch in self._arrow.batches(
                [source_file], schema, parquet=parquet, batch_rows=batch_rows, readahead=readahead
            ):
                yield line, batch

    # --- reads --------------------------------------------------------------------------------

    def can_read_partition(self, transforms: Sequence[Transform]) -> bool:
        return bool(transforms) and len(self.hive_projection(transforms)) == len(transforms)

    def partition_read_hint(self, transforms: Sequence[Transform], key: KeyTuple) -> Any:
        """The partition's files and the Hive columns, so a reader elsewhere need not list the source."""
        projection, groups = self._cached_groups(transforms)
        partial = tuple(key[i] for i in projection)
        return {"paths": [f.path for f in groups.get(partial, [])], "hive": list(self.hive_columns)}

    def _hinted_paths(self, transforms: Sequence[Transform], key: KeyTuple, hint: Any) -> list[str]:
        """The files of the partition `key` named by `hint` (a `partition_read_hint`, or paths)."""
        if hint is None:
            hint = self.partition_read_hint(transforms, key)
        if isinstance(hint, Mapping):
            self.__dict__.setdefault("hive_columns", tuple(hint.get("hive", ())))
            return list(hint.get("paths", ()))
        return list(hint)

    def read_files(self, paths: Sequence[str]) -> pa.Table:
        """The rows of the given files of this source (with Hive columns), in the source schema."""
        schema = self.schema()
        if not paths:
            return schema.empty_table()
        return self._arrow.read([SourceFile(p, p, 0, "") for p in paths], schema)

    def read_columns(self, columns: Sequence[str]) -> pa.Table:
        """`columns` of every row; Parquet reads only those columns (Hive ones from the paths)."""
        schema = self.schema()
        files = self.list_files()
        wanted = list(dict.fromkeys(columns))
        if not files:
            return schema.empty_table().select(wanted)
        if self.file_format != "parquet":
            return self.read_all().select(wanted)
        return self._arrow.read(files, schema, columns=wanted)

    def read_partition(self, transforms: Sequence[Transform], key: KeyTuple, hint: Any) -> pa.Table:
        paths = self._hinted_paths(transforms, key, hint)
        return filter_to_key(self.read_files(paths), transforms, key)

    def read_partition_since(
        self, transforms: Sequence[Transform], key: KeyTuple, hint: Any, since: RowsSince
    ) -> pa.Table:
        """Like `read_partition`, keeping the rows past `since`; Parquet row groups (and so whole files)
        whose statistics put every value at or below the watermark are not read."""
        paths = self._hinted_paths(transforms, key, hint)
        schema = self.schema()
        if self.file_format != "parquet" or not paths:
            return filter_to_key(since.filter_table(self.read_files(paths)), transforms, key)
        files = [SourceFile(p, p, 0, "") for p in paths]
        condition = since.arrow_expression(schema.field(since.column).type)
        table = self._arrow.read(files, schema, condition=condition)
        return filter_to_key(since.filter_table(table), transforms, key)

    def read_all(self, *, deadline: Deadline | None = None) -> pa.Table:
        return self.read_files([f.path for f in self.list_files()])

    def read_batches(self, *, batch_rows: int = 256 * 1024, readahead: int = 2) -> Iterator[pa.Table]:
        """Every row of the source (as `read_all`: Hive columns, drifting files unified, the source
        schema's types) as a stream of tables of at most `batch_rows` rows, read as they are consumed,
        never held whole."""
        schema = self.schema()
        files = self.list_files()
        if not files:
            return
        yield from self._arrow.batches(
            files, schema, parquet=self.file_format == "parquet", batch_rows=batch_rows, readahead=readahead
        )

    def count_null_rows(self, column: str) -> int:
        """Parquet: summed from the footers' NULL counts (no data read) where every row group records one,
        else counted from the one column; other formats: read and counted."""
        import pyarrow.compute as pc

        schema = self.schema()
        files = self.list_files()
        if not files:
            return 0
        if self.file_format == "parquet" and column not in self.hive_columns:
            from_footers = self._reader.footer_null_count(files, column)
            if from_footers is not None:
                return from_footers
        if self.file_format == "parquet":
            try:
                return int(self._dataset(files, schema).count_rows(filter=pc.field(column).is_null()))
            except (OSError, ValueError) as err:
                raise self._arrow.read_error(files, schema, err) from err
        return int(self.read_all().column(column).null_count)

    # --- Spark side ---------------------------------------------------------------------------

    def files_for_keys(
        self, transforms: Sequence[Transform], keys: Sequence[KeyTuple] | None
    ) -> list[SourceFile]:
        """The files that can hold rows of `keys` (all files unless the Hive layout narrows it)."""
        files = self.list_files()
        if keys is None:
            return files
        projection, groups = self._cached_groups(transforms)
        if not projection:
            if self.facts_state is None or not transforms:
                return files
            return files_by_facts(self.facts_state, self.schema(), transforms, keys, files)
        wanted = {tuple(k[i] for i in projection) for k in keys}
        return sorted((f for partial in wanted for f in groups.get(partial, [])), key=lambda f: f.relative)

    def spark_frame(
        self,
        spark: Any,
        transforms: Sequence[Transform],
        keys: Sequence[KeyTuple] | None,
        *,
        work_dir: str,
        since: RowsSince | None = None,
    ) -> Any:
        """The source rows in Spark, under `schema()` exactly (see `sources/files/spark_read.py`).

        `since` is left to the caller's filter on the frame, which Spark pushes into the Parquet scan
        (row groups whose statistics hold no row past the watermark are skipped).
        """
        schema = self.schema()
        files = self.files_for_keys(transforms, keys)
        read = SparkFileRead(
            rules=self._rules,
            place=self.place,
            schema=schema,
            hive_columns=self.hive_columns,
            file_schemas=self.file_schemas,
            hive_values=self._file_hive_values,
            describe=self.describe(),
            spark_scheme=self.params.get("spark_scheme"),
        )
        whole_listing = len(files) == len(self.list_files())
        return read.frame(spark, files, whole_listing=whole_listing, work_dir=work_dir)

    def split_reader(self) -> SplitReader:
        """What another process needs to read splits of this Parquet source (`sources/files/splits.py`)."""
        schema = self.schema().serialize().to_pybytes()
        if isinstance(self.place, S3Files):
            settings = with_driver_credentials(self.place.settings)
            return SplitReader(self.describe(), schema, self.place.store.bucket, settings)
        return SplitReader(self.describe(), schema)

    def splits(self, files: Sequence[SourceFile], target: int) -> list[Split]:
        """`files` (of this Parquet source) as splits of about `target` bytes (`file_splits`)."""
        return file_splits(files, self.filesystem, target, self.describe())

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "scheme": "s3" if self.is_s3 else "file",
            "location": self.location,
            "params": masked_params(self.params),
            "base_dir": self.base_dir,
        }
