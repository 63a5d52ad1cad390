"""pyarrow reads of a file source: one file's schema, rows and footer NULL counts, datasets over many files
(Hive directory values included), typed reads, and errors that name the file and the value at fault."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import SourceError
from airflow_partitions.sources.base import Deadline, KeyTuple
from airflow_partitions.sources.files.formats import FileFormatRules
from airflow_partitions.sources.files.place import SourceFile

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as pads

    from airflow_partitions.transforms import Transform


@dataclass(frozen=True, slots=True)
class FileReader:
    """One file at a time: its schema, its rows, its footer; `describe` names the source in messages."""

    rules: FileFormatRules
    filesystem: Any
    describe: str

    def file_schema(self, source_file: SourceFile) -> pa.Schema:
        try:
            schema = self.rules.read_schema(source_file.path, self.filesystem)
        except (OSError, ValueError) as err:
            raise SourceError(
                f"cannot read the schema of {source_file.relative} ({self.describe}): {err}"
            ) from err
        return schema.remove_metadata()

    def file_rows(self, source_file: SourceFile) -> int | None:
        """The rows of one file (a Parquet footer; CSV and JSON parsed); None when it cannot be read here
        (the refresh's own read reports why)."""
        try:
            return self.rules.count_rows(source_file.path, self.filesystem)
        except (OSError, ValueError):
            return None

    def footer_null_count(self, files: Sequence[SourceFile], column: str) -> int | None:
        """NULLs of `column` over Parquet `files` from their footers; None if one cannot tell (no such
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

    def bad_file_message(self, source_file: SourceFile, schema: pa.Schema, err: BaseException) -> str:
        """Why `source_file` cannot be read under `schema`, naming the column where it can be found."""
        if self.rules.name == "parquet":
            try:
                found = self._parquet_cast_failure(source_file, schema)
            except (OSError, ValueError):
                found = None
            if found is not None:
                return found
        return (
            f"cannot read {source_file.path} ({self.describe}): {err}; declare the column's type under "
            "the dataset's schema: (values with a zone offset need e.g. `timestamp[us, UTC]`), or fix the "
            "value in the file. Nothing is read as NULL in its place"
        )

    def _parquet_cast_failure(self, source_file: SourceFile, schema: pa.Schema) -> str | None:
        """The dataset's cast error names neither the column nor the file: find the column."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        own = pq.read_schema(source_file.path, filesystem=self.filesystem)
        for target in schema:
            if target.name not in own.names or own.field(target.name).type == target.type:
                continue
            column = pq.read_table(source_file.path, columns=[target.name], filesystem=self.filesystem)
            try:
                column.column(target.name).cast(target.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as cast_err:
                return (
                    f"column {target.name!r} of {source_file.path} ({self.describe}) is "
                    f"{own.field(target.name).type} there, and a value cannot become "
                    f"{target.type} (the source schema) without loss: {cast_err}; declare the "
                    f"column's type under the dataset's schema: (e.g. `{target.name}: "
                    f"{own.field(target.name).type}`), or rewrite the files with one type"
                )
        return None


@dataclass(frozen=True, slots=True)
class ArrowFiles:
    """Many files as one pyarrow dataset: the Hive directory columns come from the paths under
    `hive_base`, every other column from the files, each read as the source schema says."""

    reader: FileReader
    hive_columns: tuple[str, ...]
    hive_base: str

    def physical_schema(self, schema: pa.Schema) -> pa.Schema:
        """`schema` without the Hive directory columns: the columns the files themselves hold."""
        import pyarrow as pa

        hive = set(self.hive_columns)
        return pa.schema([f for f in schema if f.name not in hive])

    def dataset(self, files: Sequence[SourceFile], schema: pa.Schema | None = None) -> pads.Dataset:
        import pyarrow.dataset as pads

        rules, filesystem = self.reader.rules, self.reader.filesystem
        paths = [f.path for f in files]
        file_format = rules.arrow_format(self.physical_schema(schema) if schema is not None else None)
        if schema is not None:
            schema = rules.parse_schema(schema)
        if not self.hive_columns:
            return pads.dataset(paths, schema=schema, format=file_format, filesystem=filesystem)
        if schema is not None:
            partitioning: Any = pads.partitioning(pa_schema_subset(schema, self.hive_columns), flavor="hive")
        else:
            partitioning = pads.HivePartitioning.discover(infer_dictionary=False)
        return pads.dataset(
            paths,
            schema=schema,
            format=file_format,
            filesystem=filesystem,
            partitioning=partitioning,
            partition_base_dir=self.hive_base,
        )

    def read(
        self,
        files: Sequence[SourceFile],
        schema: pa.Schema,
        *,
        columns: Sequence[str] | None = None,
        condition: Any = None,
    ) -> pa.Table:
        """The rows of `files` (only `columns`, only those matching `condition`), typed as `schema`."""
        try:
            table = self.dataset(files, schema).to_table(columns=columns, filter=condition)
            return typed(table, schema)
        except (OSError, ValueError) as err:
            raise self.read_error(files, schema, err) from err

    def batches(
        self,
        files: Sequence[SourceFile],
        schema: pa.Schema,
        *,
        parquet: bool,
        batch_rows: int,
        readahead: int,
    ) -> Iterator[pa.Table]:
        """The rows of `files` typed as `schema`, as tables of at most `batch_rows` rows read as they are
        consumed. A Parquet file is scanned one row group at a time (pyarrow's dataset scanner otherwise
        decodes a whole file ahead of a slow consumer); a CSV or JSON file as one scan `readahead` batches
        ahead."""
        import pyarrow as pa

        try:
            dataset = self.dataset(files, schema)
            for fragment in dataset.get_fragments():
                pieces = fragment.split_by_row_group() if parquet else [fragment]
                for piece in pieces:
                    for batch in piece.to_batches(
                        schema=dataset.schema, batch_size=batch_rows, batch_readahead=readahead
                    ):
                        yield typed(pa.Table.from_batches([batch]), schema)
        except (OSError, ValueError) as err:
            raise self.read_error(files, schema, err) from err

    def file_batches(
        self,
        source_file: SourceFile,
        schema: pa.Schema,
        *,
        row_groups: Sequence[int] | None,
        batch_rows: int,
    ) -> Iterator[pa.Table]:
        """The rows of one Parquet file (only `row_groups`, when given) typed as `schema`, as tables of at
        most `batch_rows` rows; a file that cannot be read raises `SourceError` naming it."""
        import pyarrow as pa

        try:
            dataset = self.dataset([source_file], schema)
            for fragment in dataset.get_fragments():
                piece = fragment if row_groups is None else fragment.subset(row_group_ids=list(row_groups))
                for batch in piece.to_batches(schema=dataset.schema, batch_size=batch_rows):
                    yield typed(pa.Table.from_batches([batch]), schema)
        except (OSError, ValueError) as err:
            raise self.read_error([source_file], schema, err) from err

    def read_error(self, files: Sequence[SourceFile], schema: pa.Schema, err: BaseException) -> SourceError:
        """The error of a failed read, naming the file (found by reading them one by one) and the value."""
        for source_file in files:
            try:
                typed(self.dataset([source_file], schema).to_table(), schema)
            except (OSError, ValueError) as file_err:
                return SourceError(self.reader.bad_file_message(source_file, schema, file_err))
        return SourceError(f"cannot read {len(files)} file(s) of {self.reader.describe}: {err}")

    def hive_values(self, files: Sequence[SourceFile], schema: pa.Schema) -> dict[str, dict[str, Any]]:
        """Per file path, its typed Hive values (as pyarrow parsed them from the directories)."""
        import pyarrow.dataset as pads

        dataset = self.dataset(files, schema)
        return {
            fragment.path: pads.get_partition_keys(fragment.partition_expression)
            for fragment in dataset.get_fragments()
        }

    def hive_fields(self, files: Sequence[SourceFile]) -> list[pa.Field]:
        """The Hive directory columns with the types pyarrow infers from every file's directories."""
        if not self.hive_columns:
            return []
        try:
            schema = self.dataset(files).schema
        except (OSError, ValueError) as err:
            raise SourceError(
                f"cannot read the Hive directory values of {self.reader.describe}: {err}"
            ) from err
        return [schema.field(name) for name in self.hive_columns]

    def distinct_keys(
        self,
        files: Sequence[SourceFile],
        schema: pa.Schema,
        transforms: Sequence[Transform],
        deadline: Deadline,
        location: str,
    ) -> list[KeyTuple]:
        """Every distinct partition key of the rows of `files` (one scan of the partition columns)."""
        import pyarrow as pa

        columns = sorted({c for t in transforms for c in t.source_columns})
        names = [f"k{i}" for i in range(len(transforms))]
        partials: list[pa.Table] = []
        pending_rows = 0
        for batch in self._typed_batches(files, schema, columns, deadline, location):
            arrays = [t.apply_table(batch) for t in transforms]
            distinct = pa.table(dict(zip(names, arrays, strict=True))).group_by(names).aggregate([])
            partials.append(distinct)
            pending_rows += distinct.num_rows
            if pending_rows > 1 << 16 and len(partials) > 1:
                partials = [pa.concat_tables(partials).group_by(names).aggregate([])]
                pending_rows = partials[0].num_rows
        deadline.check(f"scanning {location} for distinct partition values")
        if not partials:
            return []
        table = pa.concat_tables(partials).group_by(names).aggregate([])
        columns_py = [table.column(name).to_pylist() for name in names]
        return list(zip(*columns_py, strict=True))

    def _typed_batches(
        self,
        files: Sequence[SourceFile],
        schema: pa.Schema,
        columns: list[str],
        deadline: Deadline,
        location: str,
    ) -> Any:
        """The non-empty batches of `columns`, typed, checking `deadline` between them."""
        batches = self.dataset(files, schema).to_batches(columns=columns, batch_size=1 << 18)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except (OSError, ValueError) as err:
                raise self.read_error(files, schema, err) from err
            deadline.check(f"scanning {location} for distinct partition values")
            if batch.num_rows == 0:
                continue
            try:
                yield typed(batch, schema)
            except (OSError, ValueError) as err:
                raise self.read_error(files, schema, err) from err


def typed(data: Any, schema: pa.Schema) -> Any:
    """A table or batch read under the format's parse schema, with `schema`'s types (ArrowInvalid, a
    ValueError, for a value that is not one: `2027-01-01T05:00` is not a date)."""
    import pyarrow as pa

    for index, name in enumerate(data.schema.names):
        if name in schema.names and data.schema.field(name).type != schema.field(name).type:
            column = data.column(index).cast(schema.field(name).type)
            data = data.set_column(index, pa.field(name, column.type), column)
    return data


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
