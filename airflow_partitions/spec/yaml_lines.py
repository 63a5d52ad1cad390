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


def read_yaml(text: str) -> YamlDocument:
    """Parse one YAML document; raises `yaml.YAMLError` on a syntax error (see `format_yaml_error`)."""
    loader = _LineLoader(text)
    try:
        data = loader.get_single_data()
    finally:
        loader.dispose()
    return YamlDocument(data=data, duplicates=loader.duplicates)
