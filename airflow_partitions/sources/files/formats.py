"""File formats of a file source (parquet, CSV, JSON lines): how each is named, parsed by pyarrow, asked
for one file's schema and row count, and which of its inferred types give way to text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_partitions.exceptions import SourceError

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.dataset as pads

FORMAT_ALIASES = {
    "parquet": "parquet",
    "pq": "parquet",
    "csv": "csv",
    "tsv": "csv",
    "json": "json",
    "jsonl": "json",
    "ndjson": "json",
}
_COMPRESSION_SUFFIXES = (".gz", ".bz2", ".zst", ".lz4")


def format_from_name(name: str) -> str | None:
    """The format a file or location name says (`.csv.gz` is CSV), or None."""
    lowered = name.lower()
    for suffix in _COMPRESSION_SUFFIXES:
        lowered = lowered.removesuffix(suffix)
    ext = lowered.rsplit(".", 1)[-1] if "." in lowered else ""
    return FORMAT_ALIASES.get(ext)


def declared_format(params: Mapping[str, Any], location: str) -> str | None:
    """The format the params declare (`file_format` or `format`), or None when they declare none."""
    declared = params.get("file_format") or params.get("format")
    if not declared:
        return None
    fmt = FORMAT_ALIASES.get(str(declared).lower())
    if fmt is None:
        raise SourceError(
            f"unknown file_format {declared!r} for {location}; use parquet, csv or json (lines)"
        )
    return fmt


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


class FileFormatRules:
    """One format's reading rules; `physical` schemas hold the columns the files themselves hold."""

    name: ClassVar[str]

    def arrow_format(self, physical: pa.Schema | None = None) -> pads.FileFormat:
        """The pyarrow format; with `physical`, text values are parsed as its types, not inferred."""
        raise NotImplementedError

    def parse_schema(self, schema: pa.Schema) -> pa.Schema:
        """`schema` as the files are parsed (before the reader casts to `schema` itself)."""
        return schema

    def read_schema(self, path: str, filesystem: Any) -> pa.Schema:
        """One file's own schema (the first block of a text file)."""
        import pyarrow.dataset as pads

        return pads.dataset([path], format=self.arrow_format(), filesystem=filesystem).schema

    def count_rows(self, path: str, filesystem: Any) -> int:
        import pyarrow.dataset as pads

        return int(pads.dataset([path], format=self.arrow_format(), filesystem=filesystem).count_rows())

    def inferred_type(self, data_type: pa.DataType) -> pa.DataType:
        """The source type of a column whose files say `data_type` and whose type is not declared."""
        import pyarrow as pa

        if pa.types.is_timestamp(data_type):
            # Text inference picks seconds when no sample had a fraction (later values may have one),
            # and nanoseconds for long fractions, which Spark cannot hold: microseconds either way.
            return pa.timestamp("us", data_type.tz)
        return data_type

    def text_fallback(self, left: pa.DataType, right: pa.DataType) -> pa.DataType | None:
        """The type of a column some files infer as string and others as another type, or None."""
        return None

    def needs_declared_columns(self) -> bool:
        """Whether a declared column no file holds is an error (a JSON key no sampled line had is not)."""
        return True


class ParquetRules(FileFormatRules):
    name = "parquet"

    def arrow_format(self, physical: pa.Schema | None = None) -> pads.FileFormat:
        import pyarrow.dataset as pads

        return pads.ParquetFileFormat()

    def read_schema(self, path: str, filesystem: Any) -> pa.Schema:
        import pyarrow.parquet as pq

        return pq.read_schema(path, filesystem=filesystem)

    def count_rows(self, path: str, filesystem: Any) -> int:
        import pyarrow.parquet as pq

        return int(pq.read_metadata(path, filesystem=filesystem).num_rows)

    def inferred_type(self, data_type: pa.DataType) -> pa.DataType:
        return data_type


class CsvRules(FileFormatRules):
    """CSV (and TSV): `delimiter`, and whether the first line is a `header`."""

    name = "csv"

    def __init__(self, delimiter: str, header: bool) -> None:
        self.delimiter = delimiter
        self.header = header

    def arrow_format(self, physical: pa.Schema | None = None) -> pads.FileFormat:
        import pyarrow.csv as pacsv
        import pyarrow.dataset as pads

        return pads.CsvFileFormat(
            parse_options=pacsv.ParseOptions(delimiter=self.delimiter),
            read_options=pacsv.ReadOptions(autogenerate_column_names=not self.header),
            convert_options=csv_convert_options(physical),
        )

    def text_fallback(self, left: pa.DataType, right: pa.DataType) -> pa.DataType | None:
        """A column some files infer as string is read as string everywhere: the text itself is kept."""
        import pyarrow as pa

        return pa.string() if pa.string() in (left, right) else None


class JsonRules(FileFormatRules):
    """JSON lines."""

    name = "json"

    def arrow_format(self, physical: pa.Schema | None = None) -> pads.FileFormat:
        import pyarrow.dataset as pads
        import pyarrow.json as pajson

        if physical is None:
            return pads.JsonFileFormat()
        return pads.JsonFileFormat(
            parse_options=pajson.ParseOptions(
                explicit_schema=self.parse_schema(physical), unexpected_field_behavior="ignore"
            )
        )

    def parse_schema(self, schema: pa.Schema) -> pa.Schema:
        """Dates as text (pyarrow's JSON parser takes a date only as a number of days), which the reader
        then casts to the date type, strictly."""
        import pyarrow as pa

        return pa.schema([pa.field(f.name, pa.string()) if pa.types.is_date(f.type) else f for f in schema])

    def text_fallback(self, left: pa.DataType, right: pa.DataType) -> pa.DataType | None:
        """Text is kept only where the other files hold text too (e.g. timestamps)."""
        import pyarrow as pa

        if pa.string() not in (left, right):
            return None
        other = right if left == pa.string() else left
        return pa.string() if pa.types.is_temporal(other) else None

    def needs_declared_columns(self) -> bool:
        return False


def format_rules(file_format: str, params: Mapping[str, Any], location: str) -> FileFormatRules:
    """The rules of `file_format` (a `FORMAT_ALIASES` value), with the source's CSV params."""
    if file_format == "parquet":
        return ParquetRules()
    if file_format == "csv":
        delimiter = params.get("delimiter") or params.get("csv_delimiter")
        if delimiter is None:
            delimiter = "\t" if location.lower().endswith(".tsv") else ","
        return CsvRules(str(delimiter), bool(params.get("header", True)))
    return JsonRules()
