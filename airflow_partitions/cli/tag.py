"""`airflow-partitions tag SPEC DATASET NAME` and `tags SPEC DATASET`: name catalog versions, list names."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tag",
        help="name a catalog version (a release) so reads can pin it and vacuum keeps it",
        description=(
            "Point the tag NAME at a catalog version of DATASET (default: the newest), creating or moving "
            "it in one atomic catalog write; --delete removes it. Reads pin a tag with `--tag NAME` "
            "(query, plan), read(tag=...) and the hook's tag=; vacuum keeps every tagged version and its "
            "files."
        ),
    )
    parser.add_argument("spec", metavar="SPEC", help="path of the spec YAML file")
    parser.add_argument("dataset", metavar="DATASET", help="name of a dataset in the spec")
    parser.add_argument("name", metavar="NAME", help="the tag, e.g. release-2026-01 (letters, digits, . _ -)")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--version", type=int, default=None, help="the version to tag (default: newest)")
    action.add_argument("--delete", action="store_true", help="remove the tag")
    parser.add_argument("--json", action="store_true", help="print a JSON document")
    parser.set_defaults(func=run_tag)

    listing = subparsers.add_parser(
        "tags",
        help="list the tags of a dataset's catalog versions",
        description=(
            "List the tags of DATASET: each tag's version, that version's commit id, and when it was set."
        ),
    )
    listing.add_argument("spec", metavar="SPEC", help="path of the spec YAML file")
    listing.add_argument("dataset", metavar="DATASET", help="name of a dataset in the spec")
    listing.add_argument("--json", action="store_true", help="print a JSON document")
    listing.set_defaults(func=run_tags)


def _catalog(args: argparse.Namespace) -> Any:
    from airflow_partitions.spec import load_spec  # lazy: loads sqlglot
    from airflow_partitions.table import open_handle  # lazy: loads sqlglot

    project = load_spec(args.spec)
    return open_handle(project, args.dataset).catalog


def run_tag(args: argparse.Namespace) -> int:
    catalog = _catalog(args)
    if args.delete:
        catalog.delete_tag(args.name)
        document: dict[str, Any] = {"dataset": args.dataset, "tag": args.name, "deleted": True}
        text = f"{args.dataset}: tag {args.name} deleted"
    else:
        info = catalog.tag(args.name, args.version)
        document = {"dataset": args.dataset, **info.to_json(), "deleted": False}
        commit = info.commit_id or "unknown"
        text = f"{args.dataset}: tag {info.name} -> version {info.version} (commit {commit})"
    print(json.dumps(document, indent=2, ensure_ascii=False) if args.json else text)
    return 0


def run_tags(args: argparse.Namespace) -> int:
    tags = _catalog(args).tags()
    if args.json:
        document = {"dataset": args.dataset, "tags": [info.to_json() for info in tags.values()]}
        print(json.dumps(document, indent=2, ensure_ascii=False))
        return 0
    if not tags:
        print(f"{args.dataset}: no tags")
        return 0
    width = max(len(name) for name in tags)
    print(f"{'tag'.ljust(width)}  version  written_at                        commit_id")
    for info in tags.values():
        print(
            f"{info.name.ljust(width)}  {str(info.version).rjust(7)}  {info.to_json()['written_at']}  "
            f"{info.commit_id or ''}"
        )
    return 0
