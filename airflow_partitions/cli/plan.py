"""`airflow-partitions plan SPEC DATASET --where ...`: which partitions a filtered read opens, and why."""

from __future__ import annotations

import argparse
import json
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import FilterError

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.spec.model import DatasetSpec


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="explain which partitions a filtered read of a dataset would open",
        description=(
            "Prune a dataset's partitions with a SQL WHERE condition and print the plan: how many of the "
            "partitions are read, and for every partition whether it is read or skipped, why, and whether "
            "it is exact (every row matches, so the filter is not re-applied to it)."
        ),
    )
    parser.add_argument("spec", metavar="SPEC", help="path of the spec YAML file, e.g. dags/datasets.yaml")
    parser.add_argument(
        "dataset", metavar="DATASET", nargs="?", default=None, help="name of a dataset in the spec"
    )
    parser.add_argument(
        "--query",
        default=None,
        metavar="SQL",
        help=(
            "plan a query instead: each dataset it names (version, pruning) and each join of two datasets "
            "(split partition pair by partition pair or not, and why)"
        ),
    )
    parser.add_argument(
        "--where",
        default=None,
        help="SQL condition on the dataset's columns, e.g. \"region = 'EU' AND ts >= '2026-01-01'\"",
    )
    parser.add_argument("--version", type=int, default=None, help="catalog version to plan (default: newest)")
    parser.add_argument(
        "--tag",
        default=None,
        metavar="NAME",
        help="read the version this tag names (see `airflow-partitions tag`)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as a JSON document")
    parser.add_argument(
        "--max-skipped",
        type=int,
        default=None,
        metavar="N",
        help="list at most N skipped partitions in the text output (default: all)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from airflow_partitions.read import PartitionedDatasetReader  # lazy: loads numpy, pyarrow, sqlglot

    if args.query is not None:
        return _plan_query(args)
    if args.dataset is None:
        raise FilterError("name the DATASET to plan, or give --query SQL to plan a query")
    with PartitionedDatasetReader(args.spec, args.dataset) as reader:
        plan = reader.plan(args.where, args.version, tag=args.tag)
        if args.json:
            print(json.dumps(plan.to_json(), indent=2, ensure_ascii=False))
        else:
            print(plan.explain(max_skipped=args.max_skipped))
            schema = reader.index(reader.snapshot(args.version, tag=args.tag)).schema
            for line in describe_partition_widths(reader.dataset, schema):
                print(line)
    return 0


def _plan_query(args: argparse.Namespace) -> int:
    from airflow_partitions.read.multi import datasets_named_in  # lazy: loads numpy, pyarrow, sqlglot
    from airflow_partitions.read.reader import datasets_query  # lazy: loads numpy, pyarrow, sqlglot

    if args.where is not None:
        raise FilterError("--where plans one dataset; put the condition in the --query SQL instead")
    with datasets_query(args.spec) as query:
        versions = None
        if args.version is not None or args.tag is not None:
            # --version / --tag pin DATASET, or the one dataset the query reads.
            named = [args.dataset] if args.dataset else datasets_named_in(query.project, args.query)
            if len(named) > 1:
                option = "--version" if args.version is not None else "--tag"
                raise FilterError(
                    f"{option} is ambiguous: the query reads {', '.join(named)}; name the DATASET it pins"
                )
            versions = {named[0]: query.reader(named[0]).snapshot(args.version, tag=args.tag).version}
        plan = query.plan(args.query, versions=versions)
        if args.json:
            print(json.dumps(plan.to_json(), indent=2, ensure_ascii=False, default=str))
        else:
            print(plan.explain())
    return 0


def describe_partition_widths(dataset: DatasetSpec, schema: pa.Schema) -> list[str]:
    """One line per `truncate` field saying what its width means for the column's type.

    Iceberg's rule applies W to the stored (unscaled) value, so over `decimal(12, 2)` the ranges of
    `truncate(1000, amount)` are 10.00 wide, not 1000: this spells that out in the column's units.
    `dataset`'s fields and `schema` name the stored columns; a renamed column is printed as it is now.
    """
    import pyarrow as pa

    from airflow_partitions.spec.renames import renames_of  # lazy: loads yaml (--help loads neither)
    from airflow_partitions.transforms.truncate import TruncateTransform  # lazy: loads sqlglot

    renames = renames_of(dataset)  # fields name the stored columns; printed under the current names
    lines = []
    for field in dataset.acceleration.partition_by:
        transform = field.transform
        if not isinstance(transform, TruncateTransform):
            continue
        column = transform.source_column
        index = schema.get_field_index(column)
        if index < 0:
            continue
        column_type = schema.field(index).type
        width = transform.width
        if pa.types.is_decimal(column_type):
            scale = column_type.scale
            step = Decimal(width).scaleb(-scale)
            meaning = (
                f"ranges {step:.{max(scale, 0)}f} wide (W counts units of the last digit, "
                f"{Decimal(1).scaleb(-scale):.{max(scale, 0)}f}, as in Iceberg)"
            )
            type_text = f"decimal({column_type.precision},{scale})"
        elif pa.types.is_integer(column_type):
            meaning, type_text = f"ranges {width} wide", str(column_type)
        elif pa.types.is_string(column_type) or pa.types.is_large_string(column_type):
            meaning, type_text = f"the first {width} characters", "string"
        else:
            meaning, type_text = f"the first {width} bytes", str(column_type)
        shown = renames.current_transform(transform).canonical
        lines.append(f"partition field {field.name}: {shown} on {type_text}: {meaning}")
    return lines
