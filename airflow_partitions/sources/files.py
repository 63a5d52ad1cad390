"""File sources: parquet, CSV and JSON-lines files on a local disk or S3, as paths, directories or globs.

Hive-style directories (`col=value/`) are detected: when a partition expression reads a Hive column, each
file maps to one partition value without being opened, so fingerprints are per partition, discovery can
list instead of scan, and a partition can be read from its own files (pushdown). Without such a layout,
per-file facts learnt once per file (`sources/file_facts.py`: its distinct keys, else its column ranges)
map each file to the partitions it can feed, so fingerprints are per partition there too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import ObjectStoreError, SchemaDriftError, SourceError
from airflow_partitions.objectstore import (
    S3Location,
    S3Settings,
    S3Store,
    parse_s3_location,
    shared_s3_client,
)
from airflow_partitions.sources.base import (
    EMPTY_FINGERPRINT,
    Deadline,
    KeyTuple,
    RowsSince,
    SourceSurvey,
    digest,
    schema_tag,
    tagged_fingerprint,
)
from airflow_partitions.sources.file_facts import (
    FileFacts,
    FileFactsState,
    facts_context,
    files_by_key,
    learn_facts,
)
from airflow_partitions.sources.schema import unify_types
from airflow_partitions.spec.masking import masked_params

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.dataset as pads

    from airflow_partitions.transforms import Transform

FORMAT_ALIASES = {
    "parquet": "parquet",
    "pq": "parquet",
    "csv": "csv",
    "tsv": "csv",
    "json": "json",
    "jsonl": "json",
    "ndjson": "json",
}
_GLOB_CHARS = frozenset("*?[")
# The most bucket combinations files are mapped onto by their column ranges (more: refresh them all).
STATIC_MAPPING_LIMIT = 100_000
_COMPRESSION_SUFFIXES = (".gz", ".bz2", ".zst", ".lz4")
# Spark and pyarrow agree on skipping these: job markers, checksums, hidden files.
_IGNORED_SUFFIXES = (".crc",)
# Files up to this size are read (a Parquet footer, a small CSV or JSON parsed) to tell a directory of
# 0-row files from a partition; larger ones are taken as holding rows.
_ROW_CHECK_BYTES = 1 << 20


def csv_convert_options(schema: pa.Schema | None = None) -> pacsv.ConvertOptions:
    """The one CSV rule, for CSV sources and CSV files given to writes: an empty field is NULL, quoted
    (`""`) or not, and only an empty field; the text NULL, NA, N/A, #N/A, null, nan ... is that string.

    As Spark reads CSV sources. pyarrow's default would also read those texts as NULL (a region `NA` would
    land in the NULL partition). With `schema`, values are parsed as its types, not inferred.
    """
    import pyarrow.csv as pacsv

    return pacsv.ConvertOptions(
        null_values=[""],
        strings_can_be_null=True,
        quoted_strings_can_be_null=True,
        column_types={f.name: f.type for f in schema} if schema is not None else None,
    )


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One data file: `path` as its Arrow filesystem knows it, `relative` to the source root."""

    path: str
    relative: str
    size: int
    version: str  # local: modification time in ns; S3: the ETag

    def fingerprint_line(self) -> str:
        return f"{self.relative}\t{self.size}\t{self.version}"

    @property
    def directories(self) -> tuple[str, ...]:
        return PurePosixPath(self.relative).parts[:-1]


def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """Compile a path glob: `*` and `?` stay within one directory level, a whole `**` spans any depth."""
    out: list[str] = []
    segments = pattern.split("/")
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
            continue
        i = 0
        while i < len(segment):
            ch = segment[i]
            if ch == "*":
                out.append("[^/]*")
            elif ch == "?":
                out.append("[^/]")
            elif ch == "[":
                end = segment.find("]", i + 2)
                if end == -1:
                    out.append(re.escape(ch))
                else:
                    body = segment[i + 1 : end]
                    if body.startswith("!"):
                        body = "^" + body[1:]
                    out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
                    i = end
            else:
                out.append(re.escape(ch))
            i += 1
        if not last:
            out.append("/")
    return re.compile("".join(out))


def _is_hidden(name: str, *, directory: bool) -> bool:
    if directory and "=" in name:
        return False
    return name.startswith((".", "_")) or name.endswith(_IGNORED_SUFFIXES)


def _format_from_name(name: str) -> str | None:
    lowered = name.lower()
    for suffix in _COMPRESSION_SUFFIXES:
        lowered = lowered.removesuffix(suffix)
    ext = lowered.rsplit(".", 1)[-1] if "." in lowered else ""
    return FORMAT_ALIASES.get(ext)


def _hive_segment(segment: str) -> tuple[str, str] | None:
    name, sep, value = segment.partition("=")
    if not sep or not name:
        return None
    return name, value


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
        self._file_schemas: dict[str, pa.Schema] = {}
        self.params: dict[str, Any] = dict(params or {})
        self.base_dir = str(base_dir) if base_dir is not None else None
        self.scheme = scheme
        self.is_s3 = scheme in ("s3", "s3a") or location.startswith(("s3://", "s3a://"))
        self._root, self._pattern = self._split_location()
        self._files: list[SourceFile] | None = None
        # Per-file facts (keys, column ranges) and where they are kept: see `use_file_facts`.
        self.facts_state: FileFactsState | None = None
        # Relative paths of the files read to learn their facts, in order (what a refresh had to open).
        self.facts_reads: list[str] = []
        if schema is not None:
            # Known from a stage manifest: a finalize task then reads its files without listing the source.
            self.__dict__["_schema"] = schema

    # --- location and listing -----------------------------------------------------------------

    def _split_location(self) -> tuple[str, re.Pattern[str] | None]:
        """(root the files live under, glob pattern relative to it or None)."""
        if self.is_s3:
            location = _s3_path(self.location)
            path = f"{location.bucket}/{location.prefix}".rstrip("/")
        else:
            raw = self.location.removeprefix("file://")
            raw = os.path.expanduser(raw)
            if not os.path.isabs(raw):
                raw = os.path.join(self.base_dir or os.getcwd(), raw)
            path = os.path.normpath(raw)
        parts = path.split("/")
        first_glob = next((i for i, part in enumerate(parts) if _GLOB_CHARS & set(part)), None)
        if first_glob is None:
            return path, None
        if self.is_s3 and first_glob == 0:
            raise SourceError(f"S3 location {self.location!r} has a glob in the bucket name")
        root = "/".join(parts[:first_glob]) or "/"
        return root, glob_to_regex("/".join(parts[first_glob:]))

    def describe(self) -> str:
        return f"{self.file_format} files at {self.location}"

    @property
    def root(self) -> str:
        return self._root

    @cached_property
    def file_format(self) -> str:
        declared = self.params.get("file_format") or self.params.get("format")
        if declared:
            fmt = FORMAT_ALIASES.get(str(declared).lower())
            if fmt is None:
                raise SourceError(
                    f"unknown file_format {declared!r} for {self.location}; use parquet, csv or json (lines)"
                )
            return fmt
        guess = _format_from_name(self.location)
        if guess is None:
            files = self.list_files()
            guesses = {_format_from_name(f.relative) for f in files[:50]}
            guesses.discard(None)
            if len(guesses) == 1:
                guess = guesses.pop()
        if guess is None:
            raise SourceError(
                f"cannot tell the format of {self.location}; set `params: {{file_format: parquet|csv|json}}`"
            )
        return guess

    def _matches(self, relative: str) -> bool:
        if self._pattern is None:
            return True
        if self._pattern.fullmatch(relative):
            return True
        # A glob that matches a directory (e.g. Hive partitions) selects every file under it.
        parts = relative.split("/")
        return any(self._pattern.fullmatch("/".join(parts[:n])) for n in range(1, len(parts)))

    def list_files(self, *, refresh: bool = False) -> list[SourceFile]:
        """Every data file of the source, sorted by path (cached; `refresh=True` lists again)."""
        if self._files is None or refresh:
            files = sorted(self._list_s3() if self.is_s3 else self._list_local(), key=lambda f: f.relative)
            if not files:
                raise SourceError(
                    f"no data files found at {self.location}; check the path, glob and that files are not "
                    "hidden (names starting with '.' or '_' are skipped)"
                )
            self._files = files
        return self._files

    def _list_local(self) -> Iterator[SourceFile]:
        root = self._root
        if os.path.isfile(root):
            st = os.stat(root)
            yield SourceFile(root, os.path.basename(root), st.st_size, str(st.st_mtime_ns))
            return
        if not os.path.isdir(root):
            raise SourceError(f"source path {root} does not exist (from {self.location!r})")
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not _is_hidden(d, directory=True))
            for name in filenames:
                if _is_hidden(name, directory=False):
                    continue
                full = os.path.join(dirpath, name)
                relative = os.path.relpath(full, root).replace(os.sep, "/")
                if not self._matches(relative):
                    continue
                st = os.stat(full)
                yield SourceFile(full, relative, st.st_size, str(st.st_mtime_ns))

    @cached_property
    def s3_settings(self) -> S3Settings:
        return S3Settings.from_source_params(self.params)

    def _list_s3(self) -> Iterator[SourceFile]:
        root = _s3_path(self._root)
        bucket, key = root.bucket, root.prefix
        store = S3Store(shared_s3_client(self.s3_settings), bucket)
        # Try the root as one object first: `s3://b/data.parquet` names a file, not a prefix.
        if key and self._pattern is None:
            try:
                head = store.head(key)
            except ObjectStoreError:
                head = None
            if head is not None:
                yield SourceFile(
                    f"{bucket}/{key}",
                    key.rsplit("/", 1)[-1],
                    int(head["ContentLength"]),
                    str(head["ETag"]).strip('"'),
                )
                return
        prefix = f"{key}/" if key else ""
        for obj in store.list(prefix):
            if obj.key.endswith("/"):
                continue
            relative = obj.key[len(prefix) :]
            parts = relative.split("/")
            if any(_is_hidden(p, directory=True) for p in parts[:-1]) or _is_hidden(
                parts[-1], directory=False
            ):
                continue
            if not self._matches(relative):
                continue
            yield SourceFile(f"{bucket}/{obj.key}", relative, obj.size, obj.etag or "")

    # --- Arrow side ---------------------------------------------------------------------------

    @cached_property
    def filesystem(self) -> Any:
        from pyarrow import fs

        return self.s3_settings.arrow_filesystem() if self.is_s3 else fs.LocalFileSystem()

    @cached_property
    def hive_columns(self) -> tuple[str, ...]:
        """Hive partition column names shared by every file's directories, or () if the layout is not Hive."""
        files = self.list_files()
        names: tuple[str, ...] | None = None
        for f in files:
            segments = [_hive_segment(d) for d in f.directories]
            if any(s is None for s in segments):
                return ()
            these = tuple(s[0] for s in segments if s is not None)
            if names is None:
                names = these
            elif these != names:
                return ()
        return names or ()

    def _arrow_format(self, schema: pa.Schema | None = None) -> pads.FileFormat:
        """The pyarrow format; with `schema`, CSV and JSON values are parsed as its types, not inferred."""
        import pyarrow.csv as pacsv
        import pyarrow.dataset as pads
        import pyarrow.json as pajson

        physical = self._physical_schema(schema) if schema is not None else None
        if self.file_format == "parquet":
            return pads.ParquetFileFormat()
        if self.file_format == "csv":
            delimiter = self._csv_delimiter()
            header = bool(self.params.get("header", True))
            read_options = pacsv.ReadOptions(autogenerate_column_names=not header)
            convert_options = csv_convert_options(physical)
            return pads.CsvFileFormat(
                parse_options=pacsv.ParseOptions(delimiter=str(delimiter)),
                read_options=read_options,
                convert_options=convert_options,
            )
        if physical is None:
            return pads.JsonFileFormat()
        return pads.JsonFileFormat(
            parse_options=pajson.ParseOptions(
                explicit_schema=self._parse_schema(physical), unexpected_field_behavior="ignore"
            )
        )

    def _csv_delimiter(self) -> str:
        delimiter = self.params.get("delimiter") or self.params.get("csv_delimiter")
        if delimiter is None:
            delimiter = "\t" if self.location.lower().endswith(".tsv") else ","
        return str(delimiter)

    def _physical_schema(self, schema: pa.Schema) -> pa.Schema:
        """`schema` without the Hive directory columns: the columns the files themselves hold."""
        import pyarrow as pa

        hive = set(self.hive_columns)
        return pa.schema([f for f in schema if f.name not in hive])

    def _hive_base(self) -> str:
        root = self._root
        if not self.is_s3 and os.path.isfile(root):
            return os.path.dirname(root)
        return root

    def _parse_schema(self, schema: pa.Schema) -> pa.Schema:
        """`schema` as the files are parsed: JSON dates as text (pyarrow's JSON parser takes a date only as a
        number of days), which `_typed` then casts to the date type, strictly."""
        import pyarrow as pa

        if self.file_format != "json":
            return schema
        return pa.schema([pa.field(f.name, pa.string()) if pa.types.is_date(f.type) else f for f in schema])

    def _typed(self, data: Any, schema: pa.Schema) -> Any:
        """A table or batch read under `_parse_schema(schema)`, with `schema`'s types (ArrowInvalid, a
        ValueError, for a value that is not one: `2027-01-01T05:00` is not a date)."""
        import pyarrow as pa

        for index, name in enumerate(data.schema.names):
            if name in schema.names and data.schema.field(name).type != schema.field(name).type:
                column = data.column(index).cast(schema.field(name).type)
                data = data.set_column(index, pa.field(name, column.type), column)
        return data

    def _dataset(self, files: Sequence[SourceFile], schema: pa.Schema | None = None) -> pads.Dataset:
        import pyarrow.dataset as pads

        paths = [f.path for f in files]
        file_format = self._arrow_format(schema)
        if schema is not None:
            schema = self._parse_schema(schema)
        if not self.hive_columns:
            return pads.dataset(paths, schema=schema, format=file_format, filesystem=self.filesystem)
        if schema is not None:
            partitioning: Any = pads.partitioning(pa_schema_subset(schema, self.hive_columns), flavor="hive")
        else:
            partitioning = pads.HivePartitioning.discover(infer_dictionary=False)
        return pads.dataset(
            paths,
            schema=schema,
            format=file_format,
            filesystem=self.filesystem,
            partitioning=partitioning,
            partition_base_dir=self._hive_base(),
        )

    # --- schema -------------------------------------------------------------------------------

    @cached_property
    def _schema(self) -> pa.Schema:
        """The one schema of every row: each file's own schema unified losslessly, the declared types on top.

        Every file is asked (parquet footers; the first block of a CSV or JSON file), not just the first:
        files whose types drift would otherwise be read under a schema they do not have.
        """
        import pyarrow as pa

        files = self.list_files()
        declared = {f.name: f.type for f in self.declared_schema} if self.declared_schema is not None else {}
        hive_fields = self._hive_fields(files)
        hive_names = {f.name for f in hive_fields}
        merged = self._unified_file_types(files, skip=hive_names, declared=set(declared))
        fields: list[pa.Field] = []
        for name, data_type in merged.items():
            if name in declared:
                data_type = declared[name]
            elif self.file_format != "parquet" and pa.types.is_timestamp(data_type):
                # Text inference picks seconds when no sample had a fraction (later values may have one),
                # and nanoseconds for long fractions, which Spark cannot hold: microseconds either way.
                data_type = pa.timestamp("us", data_type.tz)
            fields.append(pa.field(name, data_type))
        fields += [pa.field(f.name, declared.get(f.name, f.type)) for f in hive_fields]
        absent = [name for name in declared if name not in merged and name not in hive_names]
        if absent and self.file_format != "json":
            raise SourceError(
                f"the spec's schema: declares column(s) {absent} that no file of {self.describe()} has "
                f"(files have {list(merged) + sorted(hive_names)}); fix the names under schema:"
            )
        # A JSON key no sampled line had is still a column the spec says exists (NULL where absent).
        fields += [pa.field(name, declared[name]) for name in absent]
        return pa.schema(fields)

    def _hive_fields(self, files: Sequence[SourceFile]) -> list[pa.Field]:
        """The Hive directory columns with the types pyarrow infers from every file's directories."""
        if not self.hive_columns:
            return []
        try:
            schema = self._dataset(files).schema
        except (OSError, ValueError) as err:
            raise SourceError(f"cannot read the Hive directory values of {self.describe()}: {err}") from err
        return [schema.field(name) for name in self.hive_columns]

    def _unified_file_types(
        self, files: Sequence[SourceFile], *, skip: set[str], declared: set[str]
    ) -> dict[str, pa.DataType]:
        """Column -> one type for every file (first-seen order); `SchemaDriftError` when none is lossless."""
        schemas = self.file_schemas(files)
        merged: dict[str, tuple[pa.DataType, SourceFile]] = {}
        for source_file in files:
            for field in schemas[source_file.path]:
                if field.name in skip:
                    continue
                seen = merged.get(field.name)
                if seen is None:
                    merged[field.name] = (field.type, source_file)
                    continue
                if field.name in declared or seen[0] == field.type:
                    continue
                unified = unify_types(seen[0], field.type) or self._text_fallback(seen[0], field.type)
                if unified is None:
                    raise SchemaDriftError(
                        f"column {field.name!r} of {self.describe()} is {seen[0]} in {seen[1].relative} "
                        f"but {field.type} in {source_file.relative}, and no lossless type holds both; "
                        f"declare its type under the dataset's schema: (e.g. `{field.name}: "
                        f"{seen[0]}`) so every file is read as that type, or rewrite the files with "
                        "one type"
                    )
                merged[field.name] = (unified, seen[1])
        return {name: data_type for name, (data_type, _) in merged.items()}

    def _text_fallback(self, left: pa.DataType, right: pa.DataType) -> pa.DataType | None:
        """In a text format a column some files infer as string is read as string everywhere: the text
        itself is kept (in JSON only where the other files also hold text, e.g. timestamps)."""
        import pyarrow as pa

        if self.file_format == "parquet" or pa.string() not in (left, right):
            return None
        other = right if left == pa.string() else left
        temporal = pa.types.is_temporal(other)
        return pa.string() if self.file_format == "csv" or temporal else None

    def file_schemas(self, files: Sequence[SourceFile]) -> dict[str, pa.Schema]:
        """Each file's own schema (cached per path, size and version), read in parallel."""
        from concurrent.futures import ThreadPoolExecutor

        def cache_key(source_file: SourceFile) -> str:
            return f"{source_file.path}\t{source_file.size}\t{source_file.version}"

        missing = [f for f in files if cache_key(f) not in self._file_schemas]
        if missing:
            workers = min(16 if self.is_s3 else 4, len(missing))
            with ThreadPoolExecutor(max_workers=workers) as pool:
                for source_file, schema in zip(
                    missing, pool.map(self._read_file_schema, missing), strict=True
                ):
                    self._file_schemas[cache_key(source_file)] = schema
        return {f.path: self._file_schemas[cache_key(f)] for f in files}

    def _read_file_schema(self, source_file: SourceFile) -> pa.Schema:
        import pyarrow.dataset as pads

        try:
            if self.file_format == "parquet":
                import pyarrow.parquet as pq

                schema = pq.read_schema(source_file.path, filesystem=self.filesystem)
            else:
                schema = pads.dataset(
                    [source_file.path], format=self._arrow_format(), filesystem=self.filesystem
                ).schema
        except (OSError, ValueError) as err:
            raise SourceError(
                f"cannot read the schema of {source_file.relative} ({self.describe()}): {err}"
            ) from err
        return schema.remove_metadata()

    def schema(self) -> pa.Schema:
        return self._schema

    def _file_hive_values(self) -> dict[str, dict[str, Any]]:
        """Per file path, its typed Hive values (as pyarrow parsed them from the directories)."""
        import pyarrow.dataset as pads

        dataset = self._dataset(self.list_files(), self.schema())
        out: dict[str, dict[str, Any]] = {}
        for fragment in dataset.get_fragments():
            out[fragment.path] = pads.get_partition_keys(fragment.partition_expression)
        return out

    def hive_projection(self, transforms: Sequence[Transform]) -> tuple[int, ...]:
        """Positions of the partition fields whose source column is a Hive directory column."""
        hive = set(self.hive_columns)
        return tuple(i for i, t in enumerate(transforms) if all(c in hive for c in t.source_columns))

    def _groups(
        self, transforms: Sequence[Transform]
    ) -> tuple[tuple[int, ...], dict[KeyTuple, list[SourceFile]]]:
        projection = self.hive_projection(transforms)
        groups: dict[KeyTuple, list[SourceFile]] = {}
        if not projection:
            return projection, groups
        values = self._file_hive_values()
        for f in self.list_files():
            hive = values.get(f.path, {})
            partial = tuple(transforms[i].apply_row(hive) for i in projection)
            groups.setdefault(partial, []).append(f)
        return projection, groups

    def _may_hold_rows(self, group: Sequence[SourceFile]) -> bool:
        """False only when every file of `group` was read and holds no row. A file above
        `_ROW_CHECK_BYTES` is taken as holding rows unread: doubt keeps the key (an empty partition then
        fails the refresh's conservation check loudly; a dropped key would lose rows)."""
        if any(f.size > _ROW_CHECK_BYTES for f in group):
            return True
        return any(self._file_rows(f) != 0 for f in group)

    def _file_rows(self, source_file: SourceFile) -> int | None:
        """The rows of one small file (a Parquet footer; CSV and JSON parsed), remembered per version;
        None when it cannot be read here (the refresh's own read reports why)."""
        line = source_file.fingerprint_line()
        known = self._row_counts.get(line)
        if known is not None:
            return known
        import pyarrow.dataset as pads
        import pyarrow.parquet as pq

        try:
            if self.file_format == "parquet":
                rows = pq.read_metadata(source_file.path, filesystem=self.filesystem).num_rows
            else:
                fmt = self._arrow_format()
                rows = pads.dataset([source_file.path], format=fmt, filesystem=self.filesystem).count_rows()
        except (OSError, ValueError):
            return None
        self._row_counts[line] = rows
        return rows

    @cached_property
    def _row_counts(self) -> dict[str, int]:
        """Row counts of small files by fingerprint line, for the life of this source object."""
        return {}

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
                keys, per_key = mapped
                return SourceSurvey(
                    keys=keys,
                    whole_fingerprint=whole,
                    per_key=per_key,
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
        context = facts_context(schema, transforms)
        known = self.facts_state.load(context)
        current = {f.fingerprint_line(): known.get(f.fingerprint_line()) for f in files}
        missing = [f for f in files if current[f.fingerprint_line()] is None]
        columns = sorted({c for t in transforms for c in t.source_columns})
        for source_file in missing:
            if deadline is not None:
                deadline.check(f"reading the partition columns of {source_file.relative}")
            try:
                table = self._typed(self._dataset([source_file], schema).to_table(columns=columns), schema)
            except (OSError, ValueError) as err:
                raise self._read_error([source_file], schema, err) from err
            self.facts_reads.append(source_file.relative)
            current[source_file.fingerprint_line()] = learn_facts(table, transforms)
        learnt = {line: facts for line, facts in current.items() if facts is not None}
        if missing or len(learnt) != len(known):
            self.facts_state.save(context, learnt)
        return learnt

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
        are not known (static discovery and a file whose keys were not kept): the whole-source
        fingerprint then stands for every partition."""
        reads_before = len(self.facts_reads)
        facts = self.file_facts(transforms, files, deadline)
        read = len(self.facts_reads) - reads_before
        keyed = all(f.keys is not None for f in facts.values())
        if need_keys and keyed:
            keys: list[KeyTuple] | None = list(dict.fromkeys(k for f in facts.values() for k in f.keys or ()))
            notes.append(
                f"keys from per-file facts ({read} new or changed file(s) read, {len(files) - read} kept)"
            )
        elif need_keys:
            keys = self._scan_distinct(transforms, deadline)
            notes.append("keys scanned (SELECT DISTINCT over the partition expressions)")
        else:
            keys = None
        if keys is not None:
            mapped_keys = keys
        elif keyed:
            mapped_keys = list(dict.fromkeys(k for f in facts.values() for k in f.keys or ()))
        else:
            # Static (bucket-only) discovery and a file whose keys were not kept: map onto every bucket.
            static = _static_keys(transforms)
            if static is None:
                notes.append("too many partitions to map files onto: any change refreshes every partition")
                return None
            mapped_keys = static
        fields = [(f"k{i}", t.canonical) for i, t in enumerate(transforms)]
        by_key, by_stats, _ = files_by_key(mapped_keys, facts, fields, self.schema(), transforms)
        if by_stats:
            notes.append(
                f"{by_stats} file(s) hold too many partition keys to keep: mapped to partitions by their "
                "column ranges"
            )
        per_key = {
            key: tagged_fingerprint(tag, digest(sorted(lines))) if lines else EMPTY_FINGERPRINT
            for key, lines in by_key.items()
        }
        notes.append("changed files mapped to the partitions they can feed (per-file facts)")
        return keys, per_key

    def _scan_distinct(self, transforms: Sequence[Transform], deadline: Deadline) -> list[KeyTuple]:
        import pyarrow as pa

        columns = sorted({c for t in transforms for c in t.source_columns})
        files = self.list_files()
        schema = self.schema()
        dataset = self._dataset(files, schema)
        names = [f"k{i}" for i in range(len(transforms))]
        partials: list[pa.Table] = []
        pending_rows = 0
        batches = dataset.to_batches(columns=columns, batch_size=1 << 18)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except (OSError, ValueError) as err:
                raise self._read_error(files, schema, err) from err
            deadline.check(f"scanning {self.location} for distinct partition values")
            if batch.num_rows == 0:
                continue
            try:
                batch = self._typed(batch, schema)
            except (OSError, ValueError) as err:
                raise self._read_error(files, schema, err) from err
            arrays = [t.apply_table(batch) for t in transforms]
            distinct = pa.table(dict(zip(names, arrays, strict=True))).group_by(names).aggregate([])
            partials.append(distinct)
            pending_rows += distinct.num_rows
            if pending_rows > 1 << 16 and len(partials) > 1:
                partials = [pa.concat_tables(partials).group_by(names).aggregate([])]
                pending_rows = partials[0].num_rows
        deadline.check(f"scanning {self.location} for distinct partition values")
        if not partials:
            return []
        table = pa.concat_tables(partials).group_by(names).aggregate([])
        columns_py = [table.column(name).to_pylist() for name in names]
        return list(zip(*columns_py, strict=True))

    # --- reads --------------------------------------------------------------------------------

    def can_read_partition(self, transforms: Sequence[Transform]) -> bool:
        return bool(transforms) and len(self.hive_projection(transforms)) == len(transforms)

    def partition_read_hint(self, transforms: Sequence[Transform], key: KeyTuple) -> Any:
        """The partition's files and the Hive columns, so a reader elsewhere need not list the source."""
        projection, groups = self._cached_groups(transforms)
        partial = tuple(key[i] for i in projection)
        return {"paths": [f.path for f in groups.get(partial, [])], "hive": list(self.hive_columns)}

    def _cached_groups(
        self, transforms: Sequence[Transform]
    ) -> tuple[tuple[int, ...], dict[KeyTuple, list[SourceFile]]]:
        cache_key = tuple(t.canonical for t in transforms)
        cached = getattr(self, "_group_cache", None)
        if cached is None or cached[0] != cache_key:
            cached = (cache_key, self._groups(transforms))
            self._group_cache = cached
        return cached[1]

    def read_files(self, paths: Sequence[str]) -> pa.Table:
        """The rows of the given files of this source (with Hive columns), in the source schema."""
        schema = self.schema()
        if not paths:
            return schema.empty_table()
        files = [SourceFile(p, p, 0, "") for p in paths]
        try:
            return self._typed(self._dataset(files, schema).to_table(), schema)
        except (OSError, ValueError) as err:
            raise self._read_error(files, schema, err) from err

    def read_columns(self, columns: Sequence[str]) -> pa.Table:
        """`columns` of every row; Parquet reads only those columns (Hive ones from the paths)."""
        schema = self.schema()
        files = self.list_files()
        wanted = list(dict.fromkeys(columns))
        if not files:
            return schema.empty_table().select(wanted)
        if self.file_format != "parquet":
            return self.read_all().select(wanted)
        try:
            return self._typed(self._dataset(files, schema).to_table(columns=wanted), schema)
        except (OSError, ValueError) as err:
            raise self._read_error(files, schema, err) from err

    def _read_error(self, files: Sequence[SourceFile], schema: pa.Schema, err: BaseException) -> SourceError:
        """The error of a failed read, naming the file (found by reading them one by one) and the value."""
        for source_file in files:
            try:
                self._typed(self._dataset([source_file], schema).to_table(), schema)
            except (OSError, ValueError) as file_err:
                return SourceError(self._bad_file_message(source_file, schema, file_err))
        return SourceError(f"cannot read {len(files)} file(s) of {self.describe()}: {err}")

    def _bad_file_message(self, source_file: SourceFile, schema: pa.Schema, err: BaseException) -> str:
        import pyarrow as pa

        if self.file_format == "parquet":
            # The dataset's cast error names neither the column nor the file: find the column.
            try:
                import pyarrow.parquet as pq

                own = pq.read_schema(source_file.path, filesystem=self.filesystem)
                for target in schema:
                    if target.name not in own.names or own.field(target.name).type == target.type:
                        continue
                    column = pq.read_table(
                        source_file.path, columns=[target.name], filesystem=self.filesystem
                    )
                    try:
                        column.column(target.name).cast(target.type)
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as cast_err:
                        return (
                            f"column {target.name!r} of {source_file.path} ({self.describe()}) is "
                            f"{own.field(target.name).type} there, and a value cannot become "
                            f"{target.type} (the source schema) without loss: {cast_err}; declare the "
                            f"column's type under the dataset's schema: (e.g. `{target.name}: "
                            f"{own.field(target.name).type}`), or rewrite the files with one type"
                        )
            except (OSError, ValueError):
                pass
        return (
            f"cannot read {source_file.path} ({self.describe()}): {err}; declare the column's type under "
            "the dataset's schema: (values with a zone offset need e.g. `timestamp[us, UTC]`), or fix the "
            "value in the file. Nothing is read as NULL in its place"
        )

    def read_partition(self, transforms: Sequence[Transform], key: KeyTuple, hint: Any) -> pa.Table:
        if hint is None:
            hint = self.partition_read_hint(transforms, key)
        if isinstance(hint, Mapping):
            self.__dict__.setdefault("hive_columns", tuple(hint.get("hive", ())))
            paths = list(hint.get("paths", ()))
        else:
            paths = list(hint)
        return filter_to_key(self.read_files(paths), transforms, key)

    def read_partition_since(
        self, transforms: Sequence[Transform], key: KeyTuple, hint: Any, since: RowsSince
    ) -> pa.Table:
        """Like `read_partition`, keeping the rows past `since`; Parquet row groups (and so whole files)
        whose statistics put every value at or below the watermark are not read."""
        if hint is None:
            hint = self.partition_read_hint(transforms, key)
        if isinstance(hint, Mapping):
            self.__dict__.setdefault("hive_columns", tuple(hint.get("hive", ())))
            paths = list(hint.get("paths", ()))
        else:
            paths = list(hint)
        schema = self.schema()
        if self.file_format != "parquet" or not paths:
            return filter_to_key(since.filter_table(self.read_files(paths)), transforms, key)
        files = [SourceFile(p, p, 0, "") for p in paths]
        condition = since.arrow_expression(schema.field(since.column).type)
        try:
            table = self._typed(self._dataset(files, schema).to_table(filter=condition), schema)
        except (OSError, ValueError) as err:
            raise self._read_error(files, schema, err) from err
        return filter_to_key(since.filter_table(table), transforms, key)

    def read_all(self, *, deadline: Deadline | None = None) -> pa.Table:
        return self.read_files([f.path for f in self.list_files()])

    def read_batches(self, *, batch_rows: int = 256 * 1024, readahead: int = 2) -> Iterator[pa.Table]:
        """Every row of the source (as `read_all`: Hive columns, drifting files unified, the source
        schema's types) as a stream of tables of at most `batch_rows` rows, read as they are consumed,
        never held whole.

        A Parquet file is scanned one row group at a time (pyarrow's dataset scanner otherwise decodes a
        whole file ahead of a slow consumer); a CSV or JSON file as one scan of `readahead` batches ahead.
        """
        import pyarrow as pa

        schema = self.schema()
        files = self.list_files()
        if not files:
            return
        try:
            dataset = self._dataset(files, schema)
            for fragment in dataset.get_fragments():
                pieces = fragment.split_by_row_group() if self.file_format == "parquet" else [fragment]
                for piece in pieces:
                    for batch in piece.to_batches(
                        schema=dataset.schema, batch_size=batch_rows, batch_readahead=readahead
                    ):
                        yield self._typed(pa.Table.from_batches([batch]), schema)
        except (OSError, ValueError) as err:
            raise self._read_error(files, schema, err) from err

    def _footer_null_count(self, files: Sequence[SourceFile], column: str) -> int | None:
        """NULLs of `column` over `files` from their Parquet footers; None if one cannot tell (no such
        column in a file, or a row group without a NULL count)."""
        import pyarrow.parquet as pq

        total = 0
        for source_file in files:
            try:
                metadata = pq.read_metadata(source_file.path, filesystem=self.filesystem)
            except (OSError, ValueError):
                return None
            paths = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
            if column not in paths:
                return None
            index = paths.index(column)
            for group in range(metadata.num_row_groups):
                statistics = metadata.row_group(group).column(index).statistics
                if statistics is None or not statistics.has_null_count:
                    return None
                total += statistics.null_count
        return total

    def count_null_rows(self, column: str) -> int:
        """Parquet: summed from the footers' NULL counts (no data read) where every row group records one,
        else counted from the one column; other formats: read and counted."""
        import pyarrow.compute as pc

        schema = self.schema()
        files = self.list_files()
        if not files:
            return 0
        if self.file_format == "parquet" and column not in self.hive_columns:
            from_footers = self._footer_null_count(files, column)
            if from_footers is not None:
                return from_footers
        if self.file_format == "parquet":
            try:
                dataset = self._dataset(files, schema)
                return int(dataset.count_rows(filter=pc.field(column).is_null()))
            except (OSError, ValueError) as err:
                raise self._read_error(files, schema, err) from err
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
            return self._files_by_facts(transforms, keys, files)
        wanted = {tuple(k[i] for i in projection) for k in keys}
        return sorted((f for partial in wanted for f in groups.get(partial, [])), key=lambda f: f.relative)

    def _files_by_facts(
        self, transforms: Sequence[Transform], keys: Sequence[KeyTuple], files: list[SourceFile]
    ) -> list[SourceFile]:
        """The files whose kept facts say they can feed `keys`, plus every file without kept facts."""
        if self.facts_state is None or not transforms:
            return files
        known = self.facts_state.load(facts_context(self.schema(), transforms))
        facts: dict[str, FileFacts | None] = {
            f.fingerprint_line(): known.get(f.fingerprint_line()) for f in files
        }
        fields = [(f"k{i}", t.canonical) for i, t in enumerate(transforms)]
        by_key, _, _ = files_by_key([tuple(k) for k in keys], facts, fields, self.schema(), transforms)
        wanted = {line for lines in by_key.values() for line in lines}
        return [f for f in files if f.fingerprint_line() in wanted]

    def spark_frame(
        self,
        spark: Any,
        transforms: Sequence[Transform],
        keys: Sequence[KeyTuple] | None,
        *,
        work_dir: str,
        since: RowsSince | None = None,
    ) -> Any:
        """The source rows in Spark, under `schema()` exactly.

        `since` is left to the caller's filter on the frame, which Spark pushes into the Parquet scan
        (row groups whose statistics hold no row past the watermark are skipped).

        CSV and JSON are read with `mode=FAILFAST` (a value that does not parse fails the job instead of
        becoming NULL); JSON timestamps are parsed as instants (any offset, UTC when none) and naive
        columns then keep their UTC wall time, as Arrow reads them. Parquet files whose own types differ
        from the unified ones are read in groups under their own types and cast (checked per value).

        Hive directory columns never come from Spark's partition discovery (it decodes `%C3%A9` byte by
        byte instead of as UTF-8, and refuses an empty value `s=`): the files are read without it and
        each row gets its file's values as pyarrow decoded them (`_file_hive_values`), typed as
        `schema()` says, by a broadcast join on the file's path.
        """
        from functools import reduce

        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        from airflow_partitions.sources.spark import checked_cast, quote_column, spark_schema

        schema = self.schema()
        files = self.files_for_keys(transforms, keys)
        struct = spark_schema(schema)
        if not files:
            return spark.createDataFrame([], struct)
        spark_scheme = self.params.get("spark_scheme")
        if self.is_s3 and spark_scheme:
            paths = [f"{spark_scheme}://{f.path}" for f in files]
            # `bucket/key`: what Spark's `_metadata.file_path` decodes to once its scheme is removed.
            file_keys = [f.path for f in files]
        elif self.is_s3:
            # Spark has no S3 connector configured: copy the needed objects next to the staging data.
            paths = self._download(files, os.path.join(work_dir, "source"))
            file_keys = [os.path.abspath(path) for path in paths]
        else:
            paths = [f.path for f in files]
            file_keys = [os.path.abspath(path) for path in paths]
        hive = set(self.hive_columns)
        file_struct = T.StructType([f for f in struct.fields if f.name not in hive])
        # Each row's file, for the join that gives it its Hive values (nothing when there are none).
        file_key = [_spark_file_key().alias(_FILE_KEY)] if hive else []
        groups: Mapping[tuple[Any, ...], list[SourceFile]] = {(): files}
        if self.file_format == "parquet":
            groups = self._spark_type_groups(files, schema)
        elif self.file_format == "csv":
            groups = self._csv_header_groups(files)
        read_path = dict(zip((f.path for f in files), paths, strict=True))
        whole_source = (
            self._pattern is None
            # Hive values are joined on per listed file: Spark must read exactly the files listed.
            and not hive
            and len(files) == len(self.list_files())
            and not (self.is_s3 and not spark_scheme)
            and len(groups) == 1
            and (self.file_format != "parquet" or list(groups) == [()])
        )
        if whole_source:
            # The whole directory: let Spark list it (in parallel) instead of passing every file path.
            whole = self._root if not self.is_s3 else f"{spark_scheme}://{self._root}"
            if self.is_s3 or os.path.isdir(self._root):
                paths = [whole]
                read_path = {}
        # Listed paths name files, never patterns: `s=[x]` must not read `s=x`, nor `s={a,b}` fail.
        paths = [_glob_escaped(path) for path in paths]
        read_path = {name: _glob_escaped(path) for name, path in read_path.items()}

        def reader(read_struct: Any) -> Any:
            read = spark.read.format(self.file_format).schema(read_struct)
            if self.file_format == "csv":
                header = bool(self.params.get("header", True))
                read = read.option("header", str(header).lower())
                read = read.option("sep", self._csv_delimiter())
                # RFC 4180 quoting, as pyarrow and DuckDB read it: `""` inside quotes is one `"`, and a
                # backslash is an ordinary character (Spark's default escape is `\`, which kept the quotes).
                read = read.option("quote", '"').option("escape", '"')
                # Check each file's header against the columns it is read as (never map by position alone).
                read = read.option("enforceSchema", str(not header).lower())
            if self.file_format in ("csv", "json"):
                read = read.option("mode", "FAILFAST")
            if hive:
                # No partition discovery: the Hive values are joined on afterwards, as pyarrow decodes them.
                read = read.option("recursiveFileLookup", "true")
            return read

        if self.file_format == "json":
            # Parse every timestamp as an instant (offsets honoured), then naive ones back to UTC wall time.
            read_struct = T.StructType(
                [
                    T.StructField(f.name, T.TimestampType(), True)
                    if isinstance(f.dataType, T.TimestampNTZType)
                    else f
                    for f in file_struct.fields
                ]
            )
            frame = reader(read_struct).load(paths)
            frame = frame.select(
                *[
                    F.col(quote_column(f.name)).cast(T.TimestampNTZType()).alias(f.name)
                    if isinstance(f.dataType, T.TimestampNTZType)
                    else F.col(quote_column(f.name))
                    for f in file_struct.fields
                ],
                *file_key,
            )
            return self._with_hive_values(spark, frame, files, file_keys, struct)
        if self.file_format == "csv":
            # Spark maps CSV fields by position: read each header order as itself, then align by name.
            by_name = {f.name: f for f in file_struct.fields}
            csv_frames = []
            for order, group in groups.items():
                group_paths = [read_path[f.path] for f in group] if read_path else paths
                in_file = [by_name[name] for name in order if name in by_name]
                frame = reader(T.StructType(in_file)).load(group_paths)
                csv_frames.append(
                    frame.select(
                        *[
                            F.col(quote_column(f.name))
                            if f.name in frame.columns
                            else F.lit(None).cast(f.dataType).alias(f.name)
                            for f in file_struct.fields
                        ],
                        *file_key,
                    )
                )
            frame = reduce(lambda left, right: left.unionByName(right), csv_frames)
            return self._with_hive_values(spark, frame, files, file_keys, struct)
        file_names = [f.name for f in file_struct.fields]
        frames = []
        for differing, group in groups.items():
            group_paths = [read_path[f.path] for f in group] if read_path else paths
            if not differing:
                frames.append(
                    reader(file_struct)
                    .load(group_paths)
                    .select(*[quote_column(n) for n in file_names], *file_key)
                )
                continue
            own = dict(differing)
            own_struct = spark_schema(pa_schema_with(pa_schema_subset(schema, file_names), own))
            frame = reader(own_struct).load(group_paths)
            frames.append(
                frame.select(
                    *[
                        checked_cast(F.col(quote_column(n)), own[n], schema.field(n).type, n).alias(n)
                        if n in own
                        else F.col(quote_column(n))
                        for n in file_names
                    ],
                    *file_key,
                )
            )
        frame = reduce(lambda left, right: left.unionByName(right), frames)
        return self._with_hive_values(spark, frame, files, file_keys, struct)

    def _with_hive_values(
        self, spark: Any, frame: Any, files: Sequence[SourceFile], file_keys: Sequence[str], struct: Any
    ) -> Any:
        """`frame` (file columns and `_FILE_KEY`) with each row's Hive values, columns in `struct` order.

        A broadcast left join on one small (file -> values) frame keeps the plan one scan however many
        directories there are; each file key is unique, so every row matches at most one entry, and a row
        whose file matches none fails the job (naming the file) instead of taking NULL values.
        """
        import pyarrow as pa
        from pyspark.sql import functions as F

        from airflow_partitions.sources.spark import HIVE_CHECK_MARK, quote_column

        if not self.hive_columns:
            return frame
        schema = self.schema()
        values = self._file_hive_values()
        owners: dict[str, str] = {}
        for source_file, key in zip(files, file_keys, strict=True):
            if owners.setdefault(key, source_file.relative) != source_file.relative:
                raise SourceError(
                    f"files {owners[key]!r} and {source_file.relative!r} of {self.describe()} are one path "
                    "to Spark; rename one of them"
                )
        columns: dict[str, pa.Array] = {
            _FILE_KEY: pa.array(list(file_keys), pa.string()),
            _FILE_FOUND: pa.array([True] * len(files), pa.bool_()),
        }
        for name in self.hive_columns:
            columns[name] = pa.array(
                [values.get(f.path, {}).get(name) for f in files], type=schema.field(name).type
            )
        mapping = spark.createDataFrame(pa.table(columns))
        mapping = mapping.select(
            F.col(_FILE_KEY),
            F.col(_FILE_FOUND),
            *[
                F.col(quote_column(f.name)).cast(f.dataType).alias(f.name)
                for f in struct.fields
                if f.name in self.hive_columns
            ],
        )
        joined = frame.join(F.broadcast(mapping), _FILE_KEY, "left")
        unmatched = F.concat(
            F.lit(f"{HIVE_CHECK_MARK}a row of "),
            F.col(_FILE_KEY),
            F.lit(" belongs to no listed file of the source"),
        )
        first = self.hive_columns[0]
        return joined.select(
            *[
                F.when(F.col(_FILE_FOUND).isNull(), F.raise_error(unmatched))
                .otherwise(F.col(quote_column(f.name)))
                .alias(f.name)
                if f.name == first
                else F.col(quote_column(f.name))
                for f in struct.fields
            ]
        )

    def _csv_header_groups(self, files: Sequence[SourceFile]) -> dict[tuple[Any, ...], list[SourceFile]]:
        """CSV files grouped by their columns in header order."""
        groups: dict[tuple[Any, ...], list[SourceFile]] = {}
        schemas = self.file_schemas(files)
        for source_file in files:
            groups.setdefault(tuple(schemas[source_file.path].names), []).append(source_file)
        return groups

    def _spark_type_groups(
        self, files: Sequence[SourceFile], schema: pa.Schema
    ) -> dict[tuple[tuple[str, pa.DataType], ...], list[SourceFile]]:
        """Files grouped by the columns whose own type Spark would not read as the unified one."""
        from airflow_partitions.sources.spark import spark_schema

        hive = set(self.hive_columns)
        targets = {f.name: f.type for f in schema if f.name not in hive}
        spark_types: dict[pa.DataType, Any] = {}

        def spark_type(data_type: pa.DataType) -> Any:
            if data_type not in spark_types:
                spark_types[data_type] = spark_schema(pa_schema_of([("c", data_type)])).fields[0].dataType
            return spark_types[data_type]

        groups: dict[tuple[tuple[str, pa.DataType], ...], list[SourceFile]] = {}
        schemas = self.file_schemas(files)
        for source_file in files:
            own = schemas[source_file.path]
            differing = tuple(
                (f.name, f.type)
                for f in own
                if f.name in targets and spark_type(f.type) != spark_type(targets[f.name])
            )
            groups.setdefault(differing, []).append(source_file)
        return groups

    def _download(self, files: Sequence[SourceFile], target_root: str) -> list[str]:
        client = shared_s3_client(self.s3_settings)
        out: list[str] = []
        for f in files:
            location = _s3_path(f.path)
            target = os.path.join(target_root, *f.relative.split("/"))
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            client.download_file(location.bucket, location.prefix, target)
            out.append(target)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "scheme": "s3" if self.is_s3 else "file",
            "location": self.location,
            "params": masked_params(self.params),
            "base_dir": self.base_dir,
        }


# Columns the Spark read adds while joining on Hive values; the final select drops them.
_FILE_KEY = "__airflow_partitions_file__"
_FILE_FOUND = "__airflow_partitions_file_found__"


def _static_keys(transforms: Sequence[Transform]) -> list[KeyTuple] | None:
    """Every key of an all-bucket partitioning (each field's buckets and NULL), or None beyond
    `STATIC_MAPPING_LIMIT` keys or when a field is not a bucket."""
    import itertools

    from airflow_partitions.spec.model import bucket_count

    counts = [bucket_count(t) for t in transforms]
    total = 1
    for count in counts:
        if count is None:
            return None
        total *= count + 1
    if total > STATIC_MAPPING_LIMIT:
        return None
    choices = [[*range(count or 0), None] for count in counts]
    return [tuple(key) for key in itertools.product(*choices)]


def _glob_escaped(path: str) -> str:
    """`path` as Spark's `load` reads it literally: it expands any path holding one of `{}[]*?\\` as a
    Hadoop glob, where a backslash makes the next character literal."""
    return re.sub(r"([{}\[\]*?\\])", r"\\\1", path)


def _spark_file_key() -> Any:
    """The row's file as a plain path: `_metadata.file_path` (a URI) decoded, its scheme removed.

    Spark gives `file:/d/s=%25C3%25A9/f.parquet` for the directory `s=%C3%A9` (a literal `%` is always
    escaped, non-ASCII letters are kept as they are); decoding it gives the path back exactly: `/d/...`
    locally, `bucket/key` for an object store. `+` is protected because the SQL decoder reads it as a space.
    """
    from pyspark.sql import functions as F

    uri = F.replace(F.col("_metadata.file_path"), F.lit("+"), F.lit("%2B"))
    return F.regexp_replace(F.url_decode(uri), r"^[A-Za-z][A-Za-z0-9+.-]*:(//)?", "")


def pa_schema_of(columns: Sequence[tuple[str, pa.DataType]]) -> pa.Schema:
    import pyarrow as pa

    return pa.schema(columns)


def pa_schema_with(schema: pa.Schema, types: Mapping[str, pa.DataType]) -> pa.Schema:
    """`schema` with the given columns' types replaced."""
    import pyarrow as pa

    return pa.schema([pa.field(f.name, types.get(f.name, f.type)) for f in schema])


def pa_schema_subset(schema: pa.Schema, names: Sequence[str]) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([schema.field(name) for name in names])


def filter_to_key(table: pa.Table, transforms: Sequence[Transform], key: KeyTuple) -> pa.Table:
    """Keep the rows whose partition values equal `key` (NULL matches NULL)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return table
    mask: Any = None
    for transform, value in zip(transforms, key, strict=True):
        computed = transform.apply_table(table)
        if value is None:
            this = pc.is_null(computed)
        else:
            this = pc.fill_null(pc.equal(computed, pa.scalar(value, type=computed.type)), False)
        mask = this if mask is None else pc.and_(mask, this)
    return table.filter(mask)


__all__ = ["EMPTY_FINGERPRINT", "FileSource", "SourceFile", "filter_to_key", "glob_to_regex", "unify_types"]


def _s3_path(path: str) -> S3Location:
    """`s3://bucket/key`, `s3a://bucket/key` or `bucket/key` (as source files are recorded) split."""
    return parse_s3_location(path, what="S3 location", error=SourceError, strict=False)
