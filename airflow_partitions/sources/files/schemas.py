"""The schema of a file source: every file's own schema (read once per file version, in parallel),
unified losslessly into one, with the types the spec declares on top."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from airflow_partitions.exceptions import SchemaDriftError, SourceError
from airflow_partitions.sources.files.formats import FileFormatRules
from airflow_partitions.sources.files.place import SourceFile
from airflow_partitions.sources.schema import unify_types

if TYPE_CHECKING:
    import pyarrow as pa


class FileSchemas:
    """Each file's own schema, remembered per path, size and version for the life of the source."""

    def __init__(self, read: Callable[[SourceFile], pa.Schema], parallelism: int) -> None:
        self._read = read
        self._parallelism = parallelism
        self._known: dict[str, pa.Schema] = {}

    def of(self, files: Sequence[SourceFile]) -> dict[str, pa.Schema]:
        """Path -> schema of `files`, reading the ones not known yet in parallel."""
        missing = [f for f in files if _cache_key(f) not in self._known]
        if missing:
            with ThreadPoolExecutor(max_workers=min(self._parallelism, len(missing))) as pool:
                for source_file, schema in zip(missing, pool.map(self._read, missing), strict=True):
                    self._known[_cache_key(source_file)] = schema
        return {f.path: self._known[_cache_key(f)] for f in files}


def _cache_key(source_file: SourceFile) -> str:
    return f"{source_file.path}\t{source_file.size}\t{source_file.version}"


def source_schema(
    files: Sequence[SourceFile],
    schemas: Mapping[str, pa.Schema],
    hive_fields: Sequence[pa.Field],
    declared_schema: pa.Schema | None,
    rules: FileFormatRules,
    describe: str,
) -> pa.Schema:
    """The one schema of every row of `files`: their own schemas unified losslessly, the declared types on
    top, the Hive directory columns last."""
    import pyarrow as pa

    declared = {f.name: f.type for f in declared_schema} if declared_schema is not None else {}
    hive_names = {f.name for f in hive_fields}
    merged = unified_file_types(
        files, schemas, skip=hive_names, declared=set(declared), rules=rules, describe=describe
    )
    fields = [
        pa.field(name, declared[name] if name in declared else rules.inferred_type(data_type))
        for name, data_type in merged.items()
    ]
    fields += [pa.field(f.name, declared.get(f.name, f.type)) for f in hive_fields]
    absent = [name for name in declared if name not in merged and name not in hive_names]
    if absent and rules.needs_declared_columns():
        raise SourceError(
            f"the spec's schema: declares column(s) {absent} that no file of {describe} has "
            f"(files have {list(merged) + sorted(hive_names)}); fix the names under schema:"
        )
    # A JSON key no sampled line had is still a column the spec says exists (NULL where absent).
    fields += [pa.field(name, declared[name]) for name in absent]
    return pa.schema(fields)


def unified_file_types(
    files: Sequence[SourceFile],
    schemas: Mapping[str, pa.Schema],
    *,
    skip: set[str],
    declared: set[str],
    rules: FileFormatRules,
    describe: str,
) -> dict[str, pa.DataType]:
    """Column -> one type for every file (first-seen order); `SchemaDriftError` when none is lossless."""
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
            unified = unify_types(seen[0], field.type) or rules.text_fallback(seen[0], field.type)
            if unified is None:
                raise SchemaDriftError(
                    f"column {field.name!r} of {describe} is {seen[0]} in {seen[1].relative} "
                    f"but {field.type} in {source_file.relative}, and no lossless type holds both; "
                    f"declare its type under the dataset's schema: (e.g. `{field.name}: "
                    f"{seen[0]}`) so every file is read as that type, or rewrite the files with "
                    "one type"
                )
            merged[field.name] = (unified, seen[1])
    return {name: data_type for name, (data_type, _) in merged.items()}
