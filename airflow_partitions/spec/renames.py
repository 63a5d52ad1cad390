"""Column renames: a source column renamed after the acceleration was written keeps its identity.

A dataset's `renamed_columns: {old: new}` says that the source column now called `new` is the one the
acceleration stored as `old`. The stored name is the column's identity (what Iceberg and the Lance spec
keep as a field id): the catalog, the partition files, their statistics and the partition spec all keep
speaking of `old`, so a rename changes no spec id and rewrites no file. Only the edges translate: rows
read from the source are renamed to the stored names, and what a reader or a write hands in or gets back
speaks of the current names.

Every partition transform follows a rename, a custom expression (its tree's column references) and a
`multi_bucket` field (each of its columns) included; the function itself never changes, so the stored
spec's canonical text, and its id, stay what they were.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import SpecValidationError
from airflow_partitions.spec.model import NAME_PATTERN
from airflow_partitions.transforms.base import renamed_transform

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.transforms.base import Transform


class ColumnRenames:
    """The renames of one dataset, both ways: `stored` (old) names and `current` (source) names."""

    __slots__ = ("_to_current", "_to_stored")

    def __init__(self, pairs: Sequence[tuple[str, str]] = ()) -> None:
        self._to_current = dict(pairs)
        self._to_stored = {new: old for old, new in pairs}

    def __bool__(self) -> bool:
        return bool(self._to_current)

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        return tuple(self._to_current.items())

    def stored(self, name: str) -> str:
        """The stored name of the column the source now calls `name` (itself when not renamed)."""
        return self._to_stored.get(name, name)

    def current(self, name: str) -> str:
        """The current name of the column stored as `name` (itself when not renamed)."""
        return self._to_current.get(name, name)

    def stored_names(self, names: Sequence[str]) -> list[str]:
        return [self.stored(name) for name in names]

    def current_names(self, names: Sequence[str]) -> list[str]:
        return [self.current(name) for name in names]

    def to_stored(self, table: Any) -> Any:
        """An Arrow table, batch or schema with current names renamed to the stored ones."""
        return _renamed(table, self.stored) if self else table

    def to_current(self, table: Any) -> Any:
        """An Arrow table, batch or schema with stored names renamed to the current ones."""
        return _renamed(table, self.current) if self else table

    def current_transform(self, transform: Transform) -> Transform:
        """A copy of a stored-name transform that reads the current column (bound state kept)."""
        return renamed_transform(transform, self.current)

    def stored_transform(self, transform: Transform) -> Transform:
        """A copy of a current-name transform that reads the stored column (bound state kept)."""
        return renamed_transform(transform, self.stored)


def _renamed(value: Any, rename: Any) -> Any:
    import pyarrow as pa

    schema = value if isinstance(value, pa.Schema) else value.schema
    names = [rename(name) for name in schema.names]
    if names == list(schema.names):
        return value
    doubled = sorted({name for name in names if names.count(name) > 1})
    if doubled:
        raise SpecValidationError(
            [
                f"renamed_columns: after the renames, column(s) {doubled} would appear twice (columns "
                f"{list(schema.names)}): a renamed column's old name cannot be taken by another column"
            ]
        )
    if isinstance(value, pa.Schema):
        return pa.schema(
            [field.with_name(name) for field, name in zip(value, names, strict=True)], value.metadata
        )
    return value.rename_columns(names)


def renamed_columns_problems(raw: object) -> tuple[tuple[tuple[str, str], ...], list[str]]:
    """The `(old, new)` pairs of a `renamed_columns:` mapping, and what is wrong with it."""
    if raw is None:
        return (), []
    if not isinstance(raw, Mapping):
        return (), [
            f"renamed_columns must be a mapping of stored name to current name ({{ts: event_ts}}), got "
            f"{type(raw).__name__}"
        ]
    pairs: list[tuple[str, str]] = []
    problems: list[str] = []
    for old, new in raw.items():
        if not (isinstance(old, str) and isinstance(new, str)):
            problems.append(f"renamed_columns: {old!r}: {new!r} must map a column name to a column name")
            continue
        if not NAME_PATTERN.match(old) or not NAME_PATTERN.match(new):
            problems.append(
                f"renamed_columns: {old!r}: {new!r}: both names must be identifiers (letters, digits, _)"
            )
        elif old == new:
            problems.append(f"renamed_columns: {old!r} is renamed to itself")
        pairs.append((old, new))
    news = [new for _, new in pairs]
    olds = {old for old, _ in pairs}
    for new in sorted({n for n in news if news.count(n) > 1}):
        problems.append(f"renamed_columns: two columns are renamed to {new!r}")
    for new in sorted(olds.intersection(news)):
        problems.append(
            f"renamed_columns: {new!r} is both a stored and a current name; after a second rename map the "
            "stored (first) name straight to the newest one"
        )
    return tuple(pairs), problems


def stored_dataset(dataset: Any) -> Any:
    """A dataset spec whose partition fields, key, sort and refresh columns name stored columns.

    Everything below the edges (catalog, storage, pruning, refresh) works on the stored names; the
    partition spec id therefore stays the one the acceleration was written under.
    """
    from dataclasses import replace

    renames = ColumnRenames(dataset.renamed_columns)
    if not renames:
        return dataset
    acceleration = dataset.acceleration
    fields = tuple(
        replace(field, transform=renames.stored_transform(field.transform))
        for field in acceleration.partition_by
    )
    refresh = acceleration.refresh
    refresh = replace(
        refresh,
        check_column=renames.stored(refresh.check_column) if refresh.check_column else None,
        watermark_column=renames.stored(refresh.watermark_column) if refresh.watermark_column else None,
    )
    params = dict(acceleration.params)
    for key in ("sort_by", "index_columns"):
        value = params.get(key)
        if isinstance(value, list | tuple):
            params[key] = [renames.stored(v) if isinstance(v, str) else v for v in value]
        elif isinstance(value, str):
            params[key] = renames.stored(value)
    acceleration = replace(
        acceleration,
        partition_by=fields,
        refresh=refresh,
        params=params,
        primary_key=tuple(renames.stored_names(acceleration.primary_key)),
    )
    declared = tuple((renames.stored(name), text) for name, text in dataset.declared_columns)
    return replace(dataset, acceleration=acceleration, declared_columns=declared)


def renames_of(dataset: Any) -> ColumnRenames:
    """The dataset's renames (none for a spec object without the attribute)."""
    return ColumnRenames(getattr(dataset, "renamed_columns", ()) or ())


def stored_schema(schema: pa.Schema, dataset: Any) -> pa.Schema:
    return renames_of(dataset).to_stored(schema)
