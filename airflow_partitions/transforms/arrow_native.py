"""Custom expressions evaluated with Arrow compute kernels, for the forms whose meaning is DuckDB's.

The Arrow path of an expression otherwise hands the column to an embedded DuckDB, which costs a copy of
strings in and out per batch. The same subset Spark runs natively (`transforms.spark`) has one meaning in
Arrow too: comparisons of the column with a literal (integers exactly, strings by code point, which is
byte order in UTF-8, as in DuckDB), three-valued AND / OR / NOT, IS [NOT] NULL, CASE over literals (a NULL
condition is not true), code point prefixes (`left(s, n)`, `substr(s, 1, n)` with n > 0), and `lower` /
`upper` (Arrow's case mapping, the few rows Arrow maps otherwise through DuckDB: `case_mapping`).
`native_kernel` gives a kernel for a tree made only of those, else None (DuckDB evaluates it).
`tests/test_expression_conformance.py` compares both paths row for row with DuckDB over the source.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from airflow_partitions.transforms.case_mapping import case_map

if TYPE_CHECKING:
    import pyarrow as pa

Kernel = Callable[["pa.Array"], Any]
_COMPARISONS: dict[type[exp.Expr], str] = {
    exp.EQ: "equal",
    exp.NEQ: "not_equal",
    exp.LT: "less",
    exp.LTE: "less_equal",
    exp.GT: "greater",
    exp.GTE: "greater_equal",
}
_INT32_MAX = (1 << 31) - 1


def native_kernel(tree: exp.Expr, source_type: pa.DataType) -> Kernel | None:
    """A function of the column's values giving the expression's values, or None outside the subset."""
    import pyarrow as pa

    if not (
        pa.types.is_signed_integer(source_type)
        or pa.types.is_string(source_type)
        or pa.types.is_large_string(source_type)
        or pa.types.is_boolean(source_type)
    ):
        return None
    return _convert(tree, source_type)


def encoded_kernel(tree: exp.Expr, source_type: pa.DataType) -> Kernel | None:
    """For a CASE whose results are all string literals, a kernel giving its values as a dictionary array
    (int8 indices into the distinct literals, NULL where no branch holds and there is no ELSE), so routing
    groups rows on the indices without building a string per row; None for every other tree."""
    import pyarrow as pa

    if isinstance(tree, exp.Paren):
        return encoded_kernel(tree.this, source_type)
    if native_kernel(tree, source_type) is None or not isinstance(tree, exp.Case) or tree.this is not None:
        return None
    parts = _case_parts(tree, source_type)
    if parts is None or not all(isinstance(value, str) for value in parts[1]):
        return None
    conditions, results, otherwise, has_default = parts
    distinct = list(dict.fromkeys([*results, *([otherwise] if has_default else [])]))
    if len(distinct) > 127:
        return None
    dictionary = pa.array(distinct, pa.string())
    codes = [distinct.index(value) for value in results]
    default_code = distinct.index(otherwise) if has_default else None
    return _encoded_case(conditions, codes, default_code, dictionary)


def _encoded_case(conditions: list[Kernel], codes: list[int], default: int | None, dictionary: Any) -> Kernel:
    import pyarrow as pa
    import pyarrow.compute as pc

    def evaluate(column: pa.Array) -> Any:
        masks = [pc.fill_null(_boolean(condition(column)), False) for condition in conditions]
        if len(masks) == 1 and default is not None and {codes[0], default} == {0, 1}:
            # The one-branch CASE with an ELSE: the mask itself, cast, is the index (a tenth of if_else).
            indices = (masks[0] if codes[0] == 1 else pc.invert(masks[0])).cast(pa.int8())
        else:
            out: Any = pa.scalar(default, type=pa.int8())
            # The first true condition wins: the branches last to first (as `_case`).
            for mask, code in reversed(list(zip(masks, codes, strict=True))):
                out = pc.if_else(mask, pa.scalar(code, type=pa.int8()), out)
            indices = out
        return pa.DictionaryArray.from_arrays(indices, dictionary)

    return evaluate


def _literal(node: exp.Expr) -> Any:
    """The Python value of a literal in the subset (str, bool, int < 2**31), or `_NOT_LITERAL`."""
    if isinstance(node, exp.Paren):
        return _literal(node.this)
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return str(node.this)
        text = str(node.this)
        if text.isdigit() and int(text) <= _INT32_MAX:
            return int(text)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        text = str(node.this.this)
        if text.isdigit() and int(text) <= _INT32_MAX:
            return -int(text)
    return _NOT_LITERAL


_NOT_LITERAL = object()


def _convert(node: exp.Expr, source_type: pa.DataType) -> Kernel | None:
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(node, exp.Paren):
        return _convert(node.this, source_type)
    if isinstance(node, exp.Column):
        return lambda values: values
    if type(node) in _COMPARISONS:
        left, right = node.this, node.expression
        literal_left, literal_right = _literal(left), _literal(right)
        # A comparison of a value with a literal of its own kind (two literals: each engine types them).
        if (literal_left is _NOT_LITERAL) == (literal_right is _NOT_LITERAL):
            return None
        function = getattr(pc, _COMPARISONS[type(node)])
        if literal_right is not _NOT_LITERAL:
            value_kernel, literal, swapped = _convert(left, source_type), literal_right, False
        else:
            value_kernel, literal, swapped = _convert(right, source_type), literal_left, True
        if value_kernel is None:
            return None
        kernel = value_kernel

        def compare(values: pa.Array) -> Any:
            computed = kernel(values)
            if not _kind_matches(computed.type, literal):
                raise _OutOfSubset
            scalar = pa.scalar(literal, type=computed.type) if not isinstance(literal, str) else literal
            return function(scalar, computed) if swapped else function(computed, scalar)

        return compare
    if isinstance(node, exp.And | exp.Or):
        first, second = _convert(node.this, source_type), _convert(node.expression, source_type)
        if first is None or second is None:
            return None
        combine = pc.and_kleene if isinstance(node, exp.And) else pc.or_kleene
        return lambda values: combine(_boolean(first(values)), _boolean(second(values)))
    if isinstance(node, exp.Not):
        negated = _convert(node.this, source_type)
        return None if negated is None else (lambda values: pc.invert(_boolean(negated(values))))
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        tested = _convert(node.this, source_type)
        return None if tested is None else (lambda values: pc.is_null(tested(values)))
    if isinstance(node, exp.Case) and node.this is None:
        return _case(node, source_type)
    if isinstance(node, exp.Left | exp.Substring):
        return _prefix(node, source_type)
    if isinstance(node, exp.Lower | exp.Upper):
        return _case_mapping(node, source_type)
    return None


class _OutOfSubset(Exception):
    """Raised at evaluation when a value's type is not the literal's kind (the caller falls back)."""


def _kind_matches(data_type: pa.DataType, literal: Any) -> bool:
    import pyarrow as pa

    if isinstance(literal, bool):
        return bool(pa.types.is_boolean(data_type))
    if isinstance(literal, int):
        return bool(pa.types.is_signed_integer(data_type))
    return bool(pa.types.is_string(data_type) or pa.types.is_large_string(data_type))


def _boolean(values: Any) -> Any:
    import pyarrow as pa

    if not pa.types.is_boolean(values.type):
        raise _OutOfSubset
    return values


def _case_parts(node: exp.Case, source_type: pa.DataType) -> tuple[list[Kernel], list[Any], Any, bool] | None:
    """A CASE over literals of one kind (not boolean): its condition kernels, result literals, the ELSE
    literal (None without one) and whether it has an ELSE; None outside the subset."""
    branches = node.args.get("ifs") or []
    default = node.args.get("default")
    results = [_literal(branch.args.get("true")) for branch in branches]
    otherwise = _literal(default) if default is not None else None
    values = [*results, *([otherwise] if default is not None else [])]
    if any(value is _NOT_LITERAL for value in values):
        return None
    kinds = {type(value) for value in values}
    if len(kinds) != 1 or kinds & {bool}:
        return None  # mixed result kinds: each engine coerces them its own way
    conditions = [_convert(branch.this, source_type) for branch in branches]
    if any(condition is None for condition in conditions):
        return None
    return [c for c in conditions if c is not None], results, otherwise, default is not None


def _case(node: exp.Case, source_type: pa.DataType) -> Kernel | None:
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = _case_parts(node, source_type)
    if parts is None:
        return None
    conditions, results, otherwise, _ = parts
    # Integer literals here fit 32 bits, so DuckDB types the CASE INTEGER: built in that type, the values
    # need no cast afterwards (`apply` casts to DuckDB's type whenever they differ).
    result_type = pa.string() if isinstance(results[0], str) else pa.int32()

    def evaluate(column: pa.Array) -> Any:
        out: Any = pa.scalar(otherwise, type=result_type)
        # The first true condition wins: apply the branches last to first (the first has an array
        # condition, so the result is an array even when every branch is a scalar).
        for condition, value in reversed(list(zip(conditions, results, strict=True))):
            chosen = pc.fill_null(_boolean(condition(column)), False)
            out = pc.if_else(chosen, pa.scalar(value, type=result_type), out)
        return out

    return evaluate


def prefix_count(node: exp.Left | exp.Substring) -> int | None:
    """n of `left(s, n)` / `substr(s, 1, n)` when both are literals and 0 < n < 2**31 (the first n code
    points in every engine), else None: the one reading of a prefix form for Arrow and Spark."""
    start: exp.Expr | None
    length: exp.Expr | None
    if isinstance(node, exp.Left):
        start, length = exp.Literal.number(1), node.expression
    else:
        start, length = node.args.get("start"), node.args.get("length")
    if not isinstance(start, exp.Literal) or start.this != "1":
        return None
    if not isinstance(length, exp.Literal) or length.is_string or not str(length.this).isdigit():
        return None
    count = int(length.this)
    return count if 0 < count <= _INT32_MAX else None


def _prefix(node: exp.Left | exp.Substring, source_type: pa.DataType) -> Kernel | None:
    import pyarrow.compute as pc

    inner = _convert(node.this, source_type)
    count = prefix_count(node)
    if inner is None or count is None:
        return None

    def evaluate(values: Any) -> Any:
        computed = inner(values)
        if not _kind_matches(computed.type, ""):
            raise _OutOfSubset
        return pc.utf8_slice_codeunits(computed, 0, count)

    return evaluate


def _case_mapping(node: exp.Lower | exp.Upper, source_type: pa.DataType) -> Kernel | None:
    inner = _convert(node.this, source_type)
    if inner is None:
        return None
    function = "lower" if isinstance(node, exp.Lower) else "upper"

    def evaluate(values: Any) -> Any:
        computed = inner(values)
        if not _kind_matches(computed.type, ""):
            raise _OutOfSubset
        if hasattr(computed, "combine_chunks"):
            computed = computed.combine_chunks()
        return case_map(function, computed)

    return evaluate


def evaluate(kernel: Kernel, values: pa.Array) -> pa.Array | None:
    """The kernel's values over `values`, or None when a value falls outside the subset at run time."""
    import pyarrow as pa

    try:
        result = kernel(values)
    except (_OutOfSubset, pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if isinstance(result, pa.ChunkedArray):
        result = result.combine_chunks()
    return result
