"""Read YAML into plain dicts and lists that remember the line of every key and item, and flag duplicate keys.

Validation messages point at the line the user has to edit, so the loader needs positions that PyYAML's
default constructors throw away. PyYAML also silently keeps the last of two equal keys in one mapping (a
typo'd copy-paste of `engine:` would win without notice); here every duplicate is reported instead.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

# libyaml's parser is several times faster; the pure-Python one gives the same marks.
_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_MERGE_TAG = "tag:yaml.org,2002:merge"

# Aliases let a few lines stand for an exponential number of values ("billion laughs"); every consumer of the
# parsed spec (validation, plain copies, JSON for XCom) walks the expanded tree. A real spec expands to a few
# thousand nodes and a few KB per dataset (validating 2 MiB of datasets takes seconds); these bounds refuse
# a bomb before anything walks it, and a huge file before it is parsed.
MAX_SPEC_BYTES = 2 * 1024 * 1024
MAX_EXPANDED_NODES = 1_000_000


class YamlTooLargeError(yaml.YAMLError):
    """The document is over a size bound (bytes, or nodes once aliases are expanded); nothing was built."""


class LineDict(dict[Any, Any]):
    """A YAML mapping: a plain dict plus `line` (of its first key) and `key_lines` (key -> 1-based line)."""

    line: int | None = None

    def __init__(self) -> None:
        super().__init__()
        self.key_lines: dict[Any, int] = {}

    def line_of(self, key: Any) -> int | None:
        """Line of `key` in the file, else the line of the mapping itself."""
        return self.key_lines.get(key, self.line)


class LineList(list[Any]):
    """A YAML sequence: a plain list plus `line` and `item_lines` (index -> 1-based line)."""

    line: int | None = None

    def __init__(self) -> None:
        super().__init__()
        self.item_lines: list[int] = []

    def line_of(self, index: int) -> int | None:
        return self.item_lines[index] if 0 <= index < len(self.item_lines) else self.line


@dataclass
class YamlDocument:
    """The parsed document and the duplicate-key findings (`(line, message)`) met while reading it."""

    data: Any
    duplicates: list[tuple[int, str]] = field(default_factory=list)


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


class _LineLoader(_BaseLoader):  # type: ignore[valid-type,misc]
    """SafeLoader whose mappings and sequences record source lines; duplicates are collected, not raised."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[tuple[int, str]] = []

    def construct_line_dict(self, node: MappingNode) -> Iterator[LineDict]:
        data = LineDict()
        data.line = _line(node)
        yield data
        # Duplicates are judged on the mapping's own keys: a key overriding one pulled in through a `<<`
        # merge is the documented way to customise an anchor, not a mistake.
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable):
                if key in seen:
                    self.duplicates.append(
                        (
                            _line(key_node),
                            f"duplicate key {key!r} (first defined on line {seen[key]}); "
                            "remove one of them, YAML would silently keep only the last",
                        )
                    )
                else:
                    seen[key] = _line(key_node)
        self.flatten_mapping(node)
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    "found unhashable key",
                    key_node.start_mark,
                )
            data[key] = self.construct_object(value_node, deep=True)
            data.key_lines[key] = _line(key_node)

    def construct_line_list(self, node: SequenceNode) -> Iterator[LineList]:
        data = LineList()
        data.line = _line(node)
        yield data
        for child in node.value:
            data.append(self.construct_object(child, deep=True))
            data.item_lines.append(_line(child))


_LineLoader.add_constructor("tag:yaml.org,2002:map", _LineLoader.construct_line_dict)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _LineLoader.construct_line_list)


def format_yaml_error(err: yaml.YAMLError) -> str:
    """One line for a YAML syntax error: `line L, column C: problem (context)`."""
    if isinstance(err, YamlTooLargeError):
        return str(err)
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    context = getattr(err, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    detail = f" ({context})" if context else ""
    return f"{where}YAML syntax error: {problem}{detail}{_hint(str(problem), str(context or ''))}"


def _hint(problem: str, context: str) -> str:
    # The two YAML traps of this format: presets start with `@` and cron expressions with `*`.
    if "that cannot start any token" in problem:
        return '; quote the value, e.g. schedule: "@hourly"'
    if "scanning an alias" in context:
        return '; a value starting with * must be quoted, e.g. schedule: "*/15 * * * *"'
    return ""


def expanded_size(root: Node, limit: int) -> int:
    """How many nodes `root` stands for once every alias is expanded, counting up to just past `limit`.

    Each distinct node is sized once (aliases share node objects), so a bomb is measured in time linear in
    its text, not in its expansion.
    """
    sizes: dict[int, int] = {}
    # Iterative post-order walk: a deeply nested document must not exhaust Python's recursion limit.
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children: list[Node] = []
        if isinstance(node, MappingNode):
            for key_node, value_node in node.value:
                children += (key_node, value_node)
        elif isinstance(node, SequenceNode):
            children = list(node.value)
        if children_done or not children:
            sizes[id(node)] = min(limit + 1, 1 + sum(sizes[id(child)] for child in children))
            continue
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)]


def read_yaml(text: str) -> YamlDocument:
    """Parse one YAML document; raises `yaml.YAMLError` on a syntax error (see `format_yaml_error`) and
    `YamlTooLargeError` past `MAX_SPEC_BYTES` or `MAX_EXPANDED_NODES`."""
    size = len(text.encode("utf-8"))
    if size > MAX_SPEC_BYTES:
        raise YamlTooLargeError(
            f"the spec is {size:,} bytes, over the {MAX_SPEC_BYTES:,}-byte limit; split its datasets "
            "into several spec files (each with its own DAG file), and keep data (key lists, values) out"
        )
    loader = _LineLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return YamlDocument(data=None, duplicates=loader.duplicates)
        if expanded_size(node, MAX_EXPANDED_NODES) > MAX_EXPANDED_NODES:
            raise YamlTooLargeError(
                f"the spec expands to more than {MAX_EXPANDED_NODES:,} values once its YAML aliases (*name) "
                "are resolved; an alias repeated inside aliases multiplies the document. "
                "Write the values out, or reuse anchors without nesting them"
            )
        data = loader.construct_document(node)
    finally:
        loader.dispose()
    return YamlDocument(data=data, duplicates=loader.duplicates)
