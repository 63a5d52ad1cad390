"""A file source's rows as a Spark frame, under the source schema exactly.

CSV and JSON are read with `mode=FAILFAST` (a value that does not parse fails the job instead of becoming
NULL); JSON timestamps are parsed as instants (any offset, UTC when none) and naive columns then keep their
UTC wall time, as Arrow reads them. Parquet files whose own types differ from the unified ones are read in
groups under their own types and cast (checked per value).

Hive directory columns never come from Spark's partition discovery (it decodes `%C3%A9` byte by byte
instead of as UTF-8, and refuses an empty value `s=`): the files are read without it and each row gets its
file's values as pyarrow decoded them, typed as the source schema says, by a broadcast join on the file's
path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import SourceError
from airflow_partitions.sources.files.arrow_reads import pa_schema_of, pa_schema_subset, pa_schema_with
from airflow_partitions.sources.files.formats import CsvRules, FileFormatRules
from airflow_partitions.sources.files.place import FilePlace, SourceFile
from airflow_partitions.sources.spark import HIVE_CHECK_MARK, checked_cast, quote_column, spark_schema

if TYPE_CHECKING:
    import pyarrow as pa

# Columns the Spark read adds while joining on Hive values; the final select drops them.
_FILE_KEY = "__airflow_partitions_file__"
_FILE_FOUND = "__airflow_partitions_file_found__"


@dataclass(frozen=True)
class SparkFileRead:
    """What a Spark read of a file source needs to know of it; `frame` reads some of its files."""

    rules: FileFormatRules
    place: FilePlace
    schema: pa.Schema
    hive_columns: tuple[str, ...]
    file_schemas: Callable[[Sequence[SourceFile]], Mapping[str, pa.Schema]]
    hive_values: Callable[[], Mapping[str, Mapping[str, Any]]]
    describe: str
    spark_scheme: str | None

    def frame(self, spark: Any, files: Sequence[SourceFile], *, whole_listing: bool, work_dir: str) -> Any:
        """The rows of `files` (`whole_listing`: every listed file of the source), in `schema` order."""
        from pyspark.sql import types as T

        struct = spark_schema(self.schema)
        if not files:
            return spark.createDataFrame([], struct)
        paths, file_keys = self.place.spark_paths(files, work_dir, self.spark_scheme)
        file_struct = T.StructType([f for f in struct.fields if f.name not in set(self.hive_columns)])
        groups: Mapping[tuple[Any, ...], list[SourceFile]] = {(): list(files)}
        if self.rules.name == "parquet":
            groups = self._spark_type_groups(files)
        elif self.rules.name == "csv":
            groups = self._csv_header_groups(files)
        read_path: dict[str, str] = dict(zip((f.path for f in files), paths, strict=True))
        whole = self._whole_source_path(whole_listing, groups)
        if whole is not None:
            # The whole directory: let Spark list it (in parallel) instead of passing every file path.
            paths, read_path = [whole], {}
        # Listed paths name files, never patterns: `s=[x]` must not read `s=x`, nor `s={a,b}` fail.
        paths = [_glob_escaped(path) for path in paths]
        read_path = {name: _glob_escaped(path) for name, path in read_path.items()}
        if self.rules.name == "json":
            frame = self._json_frame(spark, file_struct, paths)
        else:
            frames = [
                self._group_frame(
                    spark, file_struct, differing, [read_path[f.path] for f in group] if read_path else paths
                )
                for differing, group in groups.items()
            ]
            frame = reduce(lambda left, right: left.unionByName(right), frames)
        return self._with_hive_values(spark, frame, files, file_keys, struct)

    def _whole_source_path(self, whole_listing: bool, groups: Mapping[tuple[Any, ...], Any]) -> str | None:
        """The root for Spark to list itself when it holds exactly the files to read, each read alike."""
        if (
            self.place.pattern is None
            # Hive values are joined on per listed file: Spark must read exactly the files listed.
            and not self.hive_columns
            and whole_listing
            and len(groups) == 1
            and (self.rules.name != "parquet" or list(groups) == [()])
        ):
            return self.place.spark_whole_path(self.spark_scheme)
        return None

    def _reader(self, spark: Any, read_struct: Any) -> Any:
        read = spark.read.format(self.rules.name).schema(read_struct)
        if isinstance(self.rules, CsvRules):
            read = read.option("header", str(self.rules.header).lower())
            read = read.option("sep", self.rules.delimiter)
            # RFC 4180 quoting, as pyarrow and DuckDB read it: `""` inside quotes is one `"`, and a
            # backslash is an ordinary character (Spark's default escape is `\`, which kept the quotes).
            read = read.option("quote", '"').option("escape", '"')
            # Check each file's header against the columns it is read as (never map by position alone).
            read = read.option("enforceSchema", str(not self.rules.header).lower())
        if self.rules.name in ("csv", "json"):
            read = read.option("mode", "FAILFAST")
        if self.hive_columns:
            # No partition discovery: the Hive values are joined on afterwards, as pyarrow decodes them.
            read = read.option("recursiveFileLookup", "true")
        return read

    def _file_key(self) -> list[Any]:
        """Each row's file, for the join that gives it its Hive values (nothing when there are none)."""
        return [_spark_file_key().alias(_FILE_KEY)] if self.hive_columns else []

    def _json_frame(self, spark: Any, file_struct: Any, paths: list[str]) -> Any:
        """Every timestamp parsed as an instant (offsets honoured), then naive ones back to UTC wall time."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        naive = [f.name for f in file_struct.fields if isinstance(f.dataType, T.TimestampNTZType)]
        read_struct = T.StructType(
            [
                T.StructField(f.name, T.TimestampType(), True) if f.name in naive else f
                for f in file_struct.fields
            ]
        )
        frame = self._reader(spark, read_struct).load(paths)
        return frame.select(
            *[
                F.col(quote_column(f.name)).cast(T.TimestampNTZType()).alias(f.name)
                if f.name in naive
                else F.col(quote_column(f.name))
                for f in file_struct.fields
            ],
            *self._file_key(),
        )

    def _group_frame(self, spark: Any, file_struct: Any, differing: tuple[Any, ...], paths: list[str]) -> Any:
        """One group's rows: CSV files of one header order, or Parquet files of one set of own types."""
        if isinstance(self.rules, CsvRules):
            return self._csv_frame(spark, file_struct, differing, paths)
        return self._parquet_frame(spark, file_struct, dict(differing), paths)

    def _csv_frame(self, spark: Any, file_struct: Any, order: tuple[str, ...], paths: list[str]) -> Any:
        """Spark maps CSV fields by position: each header order is read as itself, then aligned by name."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        by_name = {f.name: f for f in file_struct.fields}
        in_file = [by_name[name] for name in order if name in by_name]
        frame = self._reader(spark, T.StructType(in_file)).load(paths)
        return frame.select(
            *[
                F.col(quote_column(f.name))
                if f.name in frame.columns
                else F.lit(None).cast(f.dataType).alias(f.name)
                for f in file_struct.fields
            ],
            *self._file_key(),
        )

    def _parquet_frame(
        self, spark: Any, file_struct: Any, own: dict[str, pa.DataType], paths: list[str]
    ) -> Any:
        """Files read under their own types where those differ, then cast (checked per value)."""
        from pyspark.sql import functions as F

        file_names = [f.name for f in file_struct.fields]
        if not own:
            return (
                self._reader(spark, file_struct)
                .load(paths)
                .select(*[quote_column(n) for n in file_names], *self._file_key())
            )
        own_struct = spark_schema(pa_schema_with(pa_schema_subset(self.schema, file_names), own))
        frame = self._reader(spark, own_struct).load(paths)
        return frame.select(
            *[
                checked_cast(F.col(quote_column(n)), own[n], self.schema.field(n).type, n).alias(n)
                if n in own
                else F.col(quote_column(n))
                for n in file_names
            ],
            *self._file_key(),
        )

    def _with_hive_values(
        self, spark: Any, frame: Any, files: Sequence[SourceFile], file_keys: Sequence[str], struct: Any
    ) -> Any:
        """`frame` (file columns and `_FILE_KEY`) with each row's Hive values, columns in `struct` order.

        A broadcast left join on one small (file -> values) frame keeps the plan one scan however many
        directories there are; each file key is unique, so every row matches at most one entry, and a row
        whose file matches none fails the job (naming the file) instead of taking NULL values.
        """
        from pyspark.sql import functions as F

        if not self.hive_columns:
            return frame
        mapping = spark.createDataFrame(self._hive_value_table(files, file_keys))
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

    def _hive_value_table(self, files: Sequence[SourceFile], file_keys: Sequence[str]) -> pa.Table:
        """(file key, found mark, Hive values) per file; two files Spark names alike are refused."""
        import pyarrow as pa

        values = self.hive_values()
        owners: dict[str, str] = {}
        for source_file, key in zip(files, file_keys, strict=True):
            if owners.setdefault(key, source_file.relative) != source_file.relative:
                raise SourceError(
                    f"files {owners[key]!r} and {source_file.relative!r} of {self.describe} are one path "
                    "to Spark; rename one of them"
                )
        columns: dict[str, pa.Array] = {
            _FILE_KEY: pa.array(list(file_keys), pa.string()),
            _FILE_FOUND: pa.array([True] * len(files), pa.bool_()),
        }
        for name in self.hive_columns:
            columns[name] = pa.array(
                [values.get(f.path, {}).get(name) for f in files], type=self.schema.field(name).type
            )
        return pa.table(columns)

    def _csv_header_groups(self, files: Sequence[SourceFile]) -> dict[tuple[Any, ...], list[SourceFile]]:
        """CSV files grouped by their columns in header order."""
        groups: dict[tuple[Any, ...], list[SourceFile]] = {}
        schemas = self.file_schemas(files)
        for source_file in files:
            groups.setdefault(tuple(schemas[source_file.path].names), []).append(source_file)
        return groups

    def _spark_type_groups(self, files: Sequence[SourceFile]) -> dict[tuple[Any, ...], list[SourceFile]]:
        """Files grouped by the columns whose own type Spark would not read as the unified one."""
        hive = set(self.hive_columns)
        targets = {f.name: f.type for f in self.schema if f.name not in hive}
        spark_types: dict[pa.DataType, Any] = {}

        def spark_type(data_type: pa.DataType) -> Any:
            if data_type not in spark_types:
                spark_types[data_type] = spark_schema(pa_schema_of([("c", data_type)])).fields[0].dataType
            return spark_types[data_type]

        groups: dict[tuple[Any, ...], list[SourceFile]] = {}
        schemas = self.file_schemas(files)
        for source_file in files:
            differing = tuple(
                (f.name, f.type)
                for f in schemas[source_file.path]
                if f.name in targets and spark_type(f.type) != spark_type(targets[f.name])
            )
            groups.setdefault(differing, []).append(source_file)
        return groups


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
