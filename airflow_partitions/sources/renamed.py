"""A source whose renamed columns read under the names the acceleration stored them as (`spec.renames`).

Below the source everything speaks of stored names: the transforms handed in read stored columns, the
rows handed out carry stored names. This wrapper turns transforms, watermark and check columns into the
source's current names on the way in, and the rows back into stored names on the way out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_partitions.sources.base import Deadline, KeyTuple, RowsSince, Source, SourceSurvey, schema_tag

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.spec.renames import ColumnRenames
    from airflow_partitions.transforms.base import Transform


class RenamedSource:
    """`inner` (a source that speaks current names) presented under stored names."""

    def __init__(self, inner: Source, renames: ColumnRenames) -> None:
        self.inner = inner
        self.renames = renames
        self.kind = inner.kind

    def __getattr__(self, name: str) -> Any:
        # `use_file_facts`, `list_files` and the like: facts of the source that name no column.
        return getattr(self.inner, name)

    def _transforms(self, transforms: Sequence[Transform]) -> list[Transform]:
        return [self.renames.current_transform(transform) for transform in transforms]

    def _since(self, since: RowsSince) -> RowsSince:
        return RowsSince(self.renames.current(since.column), since.after)

    def describe(self) -> str:
        return self.inner.describe()

    def schema(self) -> pa.Schema:
        return self.renames.to_stored(self.inner.schema())

    def survey(
        self,
        transforms: Sequence[Transform],
        *,
        need_keys: bool,
        check_column: str | None,
        deadline: Deadline,
    ) -> SourceSurvey:
        survey = self.inner.survey(
            self._transforms(transforms),
            need_keys=need_keys,
            check_column=self.renames.current(check_column) if check_column else None,
            deadline=deadline,
        )
        return stored_tags(survey, schema_tag(self.schema()))

    def can_read_partition(self, transforms: Sequence[Transform]) -> bool:
        return self.inner.can_read_partition(self._transforms(transforms))

    def partition_read_hint(self, transforms: Sequence[Transform], key: KeyTuple) -> Any:
        return self.inner.partition_read_hint(self._transforms(transforms), key)

    def read_partition(self, transforms: Sequence[Transform], key: KeyTuple, hint: Any) -> pa.Table:
        rows = self.inner.read_partition(self._transforms(transforms), key, hint)
        return self.renames.to_stored(rows)

    def read_partition_since(
        self, transforms: Sequence[Transform], key: KeyTuple, hint: Any, since: RowsSince
    ) -> pa.Table:
        rows = self.inner.read_partition_since(self._transforms(transforms), key, hint, self._since(since))
        return self.renames.to_stored(rows)

    def read_all(self, *, deadline: Deadline | None = None) -> pa.Table:
        return self.renames.to_stored(self.inner.read_all(deadline=deadline))

    def read_changed(self, columns: Sequence[str], column: str, after: Any, upper: Any = None) -> pa.Table:
        """`refresh_mode: changes`: the inner source's changed rows, asked and returned in stored names."""
        rows = self.inner.read_changed(  # type: ignore[attr-defined]
            self.renames.current_names(columns), self.renames.current(column), after, upper
        )
        return self.renames.to_stored(rows)

    def oldest_open_write(self) -> Any:
        return self.inner.oldest_open_write()  # type: ignore[attr-defined]

    def count_below_watermarks(
        self, transforms: Sequence[Transform], column: str, thresholds: Sequence[Any], bound: Any
    ) -> pa.Table | None:
        # The result names no source column (k0.., b, n, f): only the question is translated.
        counter = getattr(self.inner, "count_below_watermarks", None)
        if counter is None:
            return None
        result: pa.Table | None = counter(
            self._transforms(transforms), self.renames.current(column), thresholds, bound
        )
        return result

    def count_null_rows(self, column: str) -> int:
        return self.inner.count_null_rows(self.renames.current(column))

    def read_columns(self, columns: Sequence[str]) -> pa.Table:
        rows = self.inner.read_columns(self.renames.current_names(columns))
        return self.renames.to_stored(rows)

    def spark_frame(
        self,
        spark: Any,
        transforms: Sequence[Transform],
        keys: Sequence[KeyTuple] | None,
        *,
        work_dir: str,
        since: RowsSince | None = None,
    ) -> Any:
        frame = self.inner.spark_frame(
            spark,
            self._transforms(transforms),
            keys,
            work_dir=work_dir,
            since=self._since(since) if since is not None else None,
        )
        for old, new in self.renames.pairs:
            frame = frame.withColumnRenamed(new, old)
        return frame

    def to_json(self) -> dict[str, Any]:
        return {**self.inner.to_json(), "renamed_columns": dict(self.renames.pairs)}


def stored_tags(survey: SourceSurvey, stored: str) -> SourceSurvey:
    """`survey` with its fingerprints tagged by the stored schema (`stored`) instead of the source's
    current one. A declared rename is no schema change: fingerprints tagged by the current names would
    read as one (`changes_fallback` then rebuilds every partition at each refresh, a selection is refused
    as mixing schemas), while the changes plan and the committed partitions speak stored names."""
    current = survey.schema_tag
    if not current or current == stored:
        return survey

    def retag(fingerprint: str) -> str:
        head, slash, rest = fingerprint.partition("/")
        return f"{stored}/{rest}" if slash and head == current else fingerprint

    per_key = (
        {key: retag(value) for key, value in survey.per_key.items()} if survey.per_key else survey.per_key
    )
    return replace(
        survey,
        whole_fingerprint=retag(survey.whole_fingerprint),
        per_key=per_key,
        schema_tag=stored,
    )
