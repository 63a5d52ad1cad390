"""Skip files whose side index proves a filter value absent (`=`, `IN`, `IS NULL` on index columns).

A file's side index (`storage/side_index.py`) answers "might this file hold value v?" with no false
negative. A leaf is ruled out for a file when every value it asks for is absent (`col = v`, `col IN (...)`)
or the file has no NULL (`col IS NULL`); `AND` is ruled out when any child is, `OR` when every child is;
anything else (`NOT`, ranges, expressions on partition transforms) rules nothing out. `col = NULL` never
reaches here: binding makes it a predicate no row satisfies, which the evaluator already skips. A file
without an index for the column, or whose index was built for another kind of type (a column whose type
changed), is always kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from airflow_partitions.pruning.expressions import (
    And,
    ColumnRef,
    Comparison,
    InList,
    IsNull,
    Op,
    Or,
    Predicate,
)
from airflow_partitions.spec.index_settings import index_kind
from airflow_partitions.storage.side_index import ProbeSet, literal_hashes

if TYPE_CHECKING:
    from airflow_partitions.storage.datafile import DataFile

Mask = npt.NDArray[np.bool_]


def index_excluded(predicate: Predicate, files: Sequence[DataFile]) -> Mask | None:
    """Per file: True where its side indexes prove no row makes `predicate` TRUE (None: none proved)."""
    if not any(f.index for f in files):
        return None
    return _excluded(predicate, files)


def index_columns_used(predicate: Predicate) -> list[str]:
    """The columns of the `=` / `IN` / `IS NULL` leaves a side index can judge, in first-seen order."""
    found: list[str] = []
    stack = [predicate]
    while stack:
        node = stack.pop()
        if isinstance(node, And | Or):
            stack.extend(reversed(node.items))
        elif _leaf_column(node) is not None and node.term.name not in found:  # type: ignore[attr-defined]
            found.append(node.term.name)  # type: ignore[attr-defined]
    return found


def _leaf_column(node: Predicate) -> str | None:
    if isinstance(node, Comparison) and node.op is Op.EQ and isinstance(node.term, ColumnRef):
        return node.term.name
    if isinstance(node, InList | IsNull) and isinstance(node.term, ColumnRef):
        return node.term.name
    return None


def _excluded(node: Predicate, files: Sequence[DataFile]) -> Mask | None:
    if isinstance(node, And):
        result: Mask | None = None
        for child in node.items:
            mask = _excluded(child, files)
            if mask is not None:
                result = mask if result is None else result | mask
        return result
    if isinstance(node, Or):
        result = None
        for child in node.items:
            mask = _excluded(child, files)
            if mask is None:
                return None
            result = mask if result is None else result & mask
        return result
    if isinstance(node, Comparison) and node.op is Op.EQ and isinstance(node.term, ColumnRef):
        return _values_absent(node.term, [node.value], files)
    if isinstance(node, InList) and isinstance(node.term, ColumnRef):
        return _values_absent(node.term, list(node.values), files)
    if isinstance(node, IsNull) and isinstance(node.term, ColumnRef):
        name = node.term.name
        out = np.zeros(len(files), dtype=bool)
        for position, file in enumerate(files):
            column_index = file.index.get(name)
            out[position] = column_index is not None and not column_index.has_null
        return out
    return None


def _values_absent(term: ColumnRef, values: list[Any], files: Sequence[DataFile]) -> Mask | None:
    kind = index_kind(term.type)
    if kind is None:
        return None
    hashes = literal_hashes(values, term.type)
    if hashes is None:
        return None
    probes = ProbeSet(hashes)
    name = term.name
    out = np.zeros(len(files), dtype=bool)
    for position, file in enumerate(files):
        column_index = file.index.get(name)
        if column_index is None or column_index.kind != kind:
            continue
        out[position] = not column_index.might_contain_any(probes)
    return out


__all__ = ["index_columns_used", "index_excluded"]
