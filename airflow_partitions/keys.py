"""Partition keys: typed values, their JSON form, and the one Hive-path escaping used everywhere.

A partition key is a tuple of Python scalars, one per `partition_by` field, in field order. Scalars are
`None`, `bool`, `int`, `str`, `bytes`, `decimal.Decimal`, `datetime.date` and `datetime.datetime`.

Three encodings, each reversible:

* JSON (`value_to_json` / `value_from_json`): for the catalog manifest and XCom. Plain JSON for
  NULL/bool/int/str; a one-key tagged object for the rest (`{"$date": "2026-01-01"}`).
* Path component (`escape_component` / `unescape_component`): every byte outside `[A-Za-z0-9_.-]`,
  and a leading `.` or `_` (readers treat those as hidden), is percent-encoded (UTF-8), so `/`, `=`, `%`,
  `:`, quotes, control characters and unicode cannot break a path or an object-store key, and `.`/`..`
  cannot appear as a whole component (each one starts with `name=`). NULL is `%NULL`: the escaper only
  ever emits `%` followed by two hex digits, so no real value can produce it. Components longer than
  `MAX_COMPONENT_BYTES` keep a readable prefix and end in `%H<digest>`; the catalog, not the path, is
  then the source of the exact value.
* Canonical key string (`PartitionKey.path(names)`): `name=value/name2=value2`, the Hive-style directory
  of the partition and its stable identity in the catalog, in XCom and in the UI.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeAlias

from airflow_partitions.exceptions import PartitionValueError

Scalar: TypeAlias = bool | int | str | bytes | Decimal | dt.date | dt.datetime | None

NULL_MARKER = "%NULL"
HASHED_MARKER = "%H"
MAX_COMPONENT_BYTES = 160
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_HEX = "0123456789ABCDEF"
# A component with nothing to escape (numbers, plain names: most partition values). Matching it whole is
# one C call instead of one Python call per character, which was a tenth of a 100,000-partition discovery
# and of its commit. ASCII ranges only, and `fullmatch` (a `$` would accept a trailing newline).
_NOTHING_TO_ESCAPE = re.compile(r"[A-Za-z0-9-][A-Za-z0-9_.-]*")


# --- path components ------------------------------------------------------------------------------


def _escape_char(ch: str, leading: bool) -> str:
    encoded = ch.encode("utf-8")
    # A leading '.' or '_' is escaped too: Spark, Hive and DuckDB skip such files and folders as hidden.
    if len(encoded) == 1 and encoded[0] in _SAFE and not (leading and ch in "._"):
        return ch
    return "".join(f"%{_HEX[b >> 4]}{_HEX[b & 15]}" for b in encoded)


def escape_component(text: str) -> str:
    """Percent-encode every byte of `text` outside `[A-Za-z0-9_.-]` (and a leading `.`/`_`)."""
    if _NOTHING_TO_ESCAPE.fullmatch(text):
        return text
    return "".join(_escape_char(ch, i == 0) for i, ch in enumerate(text))


def unescape_component(text: str) -> str:
    """Decode a component produced by `escape_component`; refuses anything it could not have produced."""
    raw = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "%":
            pair = text[i + 1 : i + 3]
            if len(pair) != 2 or any(c not in _HEX for c in pair):
                raise PartitionValueError(f"invalid escape {text[i : i + 3]!r} in path component {text!r}")
            raw.append(int(pair, 16))
            i += 3
        else:
            if ord(ch) > 127 or ord(ch) not in _SAFE:
                raise PartitionValueError(f"unescaped character {ch!r} in path component {text!r}")
            raw.append(ord(ch))
            i += 1
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise PartitionValueError(f"path component {text!r} is not valid UTF-8 once decoded") from err


def _escape_bounded(text: str) -> str:
    escaped = escape_component(text)
    if len(escaped) <= MAX_COMPONENT_BYTES:
        return escaped
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]
    budget = MAX_COMPONENT_BYTES - len(digest) - len(HASHED_MARKER)
    # Cut on whole characters so the readable prefix still decodes.
    parts: list[str] = []
    used = 0
    for i, ch in enumerate(text):
        piece = _escape_char(ch, i == 0)
        if used + len(piece) > budget:
            break
        parts.append(piece)
        used += len(piece)
    return f"{''.join(parts)}{HASHED_MARKER}{digest}"


# --- scalar <-> text ------------------------------------------------------------------------------


def value_to_text(value: Scalar) -> str:
    """The unescaped text form of a non-NULL partition value (ISO dates, `true`/`false`, base 10)."""
    if value is None:
        raise PartitionValueError("NULL has no text form; use encode_value, which writes the NULL marker")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | str):
        return str(value)
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.urlsafe_b64encode(value).decode("ascii")
    raise PartitionValueError(f"unsupported partition value type {type(value).__name__}: {value!r}")


def text_to_value(text: str, kind: str) -> Scalar:
    """Inverse of `value_to_text` for a value of `kind` (see `value_kind`)."""
    try:
        match kind:
            case "string":
                return text
            case "int":
                return int(text)
            case "bool":
                if text not in ("true", "false"):
                    raise ValueError(text)
                return text == "true"
            case "date":
                return dt.date.fromisoformat(text)
            case "timestamp":
                return dt.datetime.fromisoformat(text)
            case "decimal":
                return Decimal(text)
            case "binary":
                return base64.urlsafe_b64decode(text.encode("ascii"))
    except (ValueError, TypeError) as err:
        raise PartitionValueError(f"{text!r} is not a valid {kind} partition value") from err
    raise PartitionValueError(f"unknown partition value kind {kind!r}")


def value_kind(value: Scalar) -> str:
    """The kind name of a scalar: string, int, bool, date, timestamp, decimal, binary or null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dt.datetime):
        return "timestamp"
    if isinstance(value, dt.date):
        return "date"
    if isinstance(value, Decimal):
        return "decimal"
    if isinstance(value, bytes):
        return "binary"
    raise PartitionValueError(f"unsupported partition value type {type(value).__name__}: {value!r}")


def encode_value(value: Scalar) -> str:
    """The path-safe component for one value; NULL becomes the `%NULL` marker."""
    if value is None:
        return NULL_MARKER
    return _escape_bounded(value_to_text(value))


def decode_value(component: str, kind: str) -> Scalar:
    """Inverse of `encode_value`; raises if the component was shortened (the catalog holds the value)."""
    if component == NULL_MARKER:
        return None
    if HASHED_MARKER in component:
        raise PartitionValueError(
            f"path component {component[:40]!r}... was shortened; read the exact value from the catalog"
        )
    return text_to_value(unescape_component(component), kind)


# --- JSON -----------------------------------------------------------------------------------------

_JSON_TAGS = {"date": "$date", "timestamp": "$ts", "decimal": "$dec", "binary": "$b64"}
_TAG_KINDS = {tag: kind for kind, tag in _JSON_TAGS.items()}


def value_to_json(value: Scalar) -> Any:
    """JSON-safe form of a scalar: plain for NULL/bool/int/str, `{"$tag": text}` for the rest."""
    kind = value_kind(value)
    if kind in ("null", "bool", "int", "string"):
        return value
    return {_JSON_TAGS[kind]: value_to_text(value)}


def value_from_json(data: Any) -> Scalar:
    """Inverse of `value_to_json`."""
    if data is None or isinstance(data, bool | int | str):
        return data
    if isinstance(data, Mapping) and len(data) == 1:
        ((tag, text),) = data.items()
        if tag in _TAG_KINDS and isinstance(text, str):
            return text_to_value(text, _TAG_KINDS[tag])
    raise PartitionValueError(f"not an encoded partition value: {data!r}")


# --- keys -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionKey:
    """The values of one partition, one per partition field, in field order."""

    values: tuple[Scalar, ...]

    def path(self, names: Sequence[str]) -> str:
        """Canonical key string and relative Hive directory: `name=value/name2=value2`."""
        if len(names) != len(self.values):
            raise PartitionValueError(f"key {self.values!r} has {len(self.values)} values for fields {names}")
        return "/".join(
            f"{escape_component(name)}={encode_value(value)}"
            for name, value in zip(names, self.values, strict=True)
        )

    def describe(self, names: Sequence[str]) -> str:
        """Human-readable form for logs and the Airflow UI: `region=EU, day=2026-01-01`."""
        return ", ".join(
            f"{name}={'NULL' if value is None else value_to_text(value)}"
            for name, value in zip(names, self.values, strict=True)
        )

    def to_json(self) -> list[Any]:
        return [value_to_json(v) for v in self.values]

    @classmethod
    def from_json(cls, data: Sequence[Any]) -> PartitionKey:
        return cls(tuple(value_from_json(v) for v in data))

    def dumps(self) -> str:
        """Compact JSON string of the key, stable across processes (for dict keys and XCom)."""
        return json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def loads(cls, text: str) -> PartitionKey:
        return cls.from_json(json.loads(text))


def parse_path(path: str, names: Sequence[str], kinds: Sequence[str]) -> PartitionKey:
    """Inverse of `PartitionKey.path` for fields `names` whose values are of `kinds`."""
    parts = path.strip("/").split("/") if path.strip("/") else []
    if len(parts) != len(names):
        raise PartitionValueError(f"path {path!r} has {len(parts)} components, expected {len(names)}")
    values: list[Scalar] = []
    for part, name, kind in zip(parts, names, kinds, strict=True):
        field, sep, component = part.partition("=")
        if not sep or unescape_component(field) != name:
            raise PartitionValueError(f"path component {part!r} is not `{name}=<value>`")
        values.append(decode_value(component, kind))
    return PartitionKey(tuple(values))


def key_text_problem(text: str, names: Sequence[str]) -> str | None:
    """Why `text` cannot name a partition of fields `names`, or None when its shape fits.

    Accepts the comma-separated form of logs (`region=EU, day=2026-01-01`, `PartitionKey.describe`), the
    canonical key string (`region=EU/day=2026-01-01T00%3A00%3A00`), the readable form
    people type (`region=EU/day=2026-01-01T00:00:00`), whose values may hold `/`: a component that does
    not start with the next field's `name=` continues the previous value, and Airflow's composite key
    (`EU|2026-01-01T00:00:00`: as many `|`-separated values as fields, `composite_key`). Only the field
    names, their order and their number are checked here; whether such a partition exists is discovery's
    answer.
    """
    shape = "/".join(f"{name}=<value>" for name in names)
    if not names:
        return f"the dataset has no partition fields, so {text!r} names no partition"
    stripped = comma_form_as_label(text, names).strip().strip("/")
    first = stripped.split("/", 1)[0].partition("=")[0]
    if first not in (names[0], escape_component(names[0])) and (
        text.count(COMPOSITE_DELIMITER) == len(names) - 1
    ):
        return None  # Airflow's composite key (`EU|2026-01-01T00:00:00`): one value per field
    found: list[str] = []
    strangers: list[str] = []
    for part in stripped.split("/") if stripped else []:
        field, sep, _ = part.partition("=")
        expected = names[len(found)] if len(found) < len(names) else None
        if sep and expected is not None and field in (expected, escape_component(expected)):
            found.append(expected)
        elif not found:
            return (
                f"partition key {text!r} must start with `{names[0]}=` or be Airflow's partition key "
                f"({len(names)} value(s) joined by `{COMPOSITE_DELIMITER}`); this dataset's keys look like "
                f"{shape}"
            )
        elif sep and field and field not in names and field.isidentifier():
            strangers.append(field)
    if len(found) == len(names):
        return None
    missing = ", ".join(names[len(found) :])
    unknown = f"; {', '.join(repr(s) for s in strangers)} is not a partition field" if strangers else ""
    return (
        f"partition key {text!r} gives {len(found)} of the {len(names)} partition fields "
        f"({', '.join(names)}), missing {missing}{unknown}; this dataset's keys look like {shape}"
    )


def comma_form_as_label(text: str, names: Sequence[str]) -> str:
    """`text` with `, name=` before each later field written `/name=`: the form `PartitionKey.describe`
    prints (`region=EU, day=2026-01-01`) read as the label form (`region=EU/day=2026-01-01`)."""
    for name in names[1:]:
        text = re.sub(rf",\s*(?={re.escape(name)}=)", "/", text)
    return text


# --- readable keys: map index labels and Airflow partition keys --------------------------------------

# Airflow keeps a partition key (asset events, runs) and a mapped task's label in 250-character columns.
AIRFLOW_KEY_LIMIT = 250
# Airflow's composite-key delimiter (`ProductMapper(..., delimiter="|")`'s default).
COMPOSITE_DELIMITER = "|"
# A composite key is never empty: Airflow refuses an empty partition key, so an empty string value is this.
EMPTY_MARKER = "%EMPTY"
_LABEL_NAME_RESERVED = "/="
_LABEL_VALUE_RESERVED = "/"
_DIGEST_CHARS = 24


def escape_readable(text: str, reserved: str) -> str:
    """Percent-encode only what a readable key must: `%`, the delimiters in `reserved`, characters that do
    not print, and whitespace at either end (run options strip it); unicode, `=`, quotes stay as they are.

    The escapes are those of `escape_component` (UTF-8 bytes as `%XX`), so `unescape_readable` decodes both.
    """
    last = len(text) - 1
    out: list[str] = []
    for i, ch in enumerate(text):
        edge_space = ch.isspace() and (i == 0 or i == last)
        if ch == "%" or ch in reserved or not ch.isprintable() or edge_space:
            out.append("".join(f"%{_HEX[b >> 4]}{_HEX[b & 15]}" for b in ch.encode("utf-8")))
        else:
            out.append(ch)
    return "".join(out)


def unescape_readable(text: str) -> str:
    """Inverse of `escape_readable` (and of `escape_component`): decode every `%XX`, keep the rest."""
    raw = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "%":
            pair = text[i + 1 : i + 3]
            if len(pair) != 2 or any(c not in "0123456789abcdefABCDEF" for c in pair):
                raise PartitionValueError(
                    f"invalid escape {text[i : i + 3]!r} in {text!r}: a literal % is written %25"
                )
            raw.append(int(pair, 16))
            i += 3
        else:
            raw.extend(text[i].encode("utf-8"))
            i += 1
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise PartitionValueError(f"{text!r} is not valid UTF-8 once decoded") from err


def bounded_key(text: str, limit: int = AIRFLOW_KEY_LIMIT) -> str:
    """`text` if it fits in `limit` characters, else a readable prefix + `%H` + a digest of all of it.

    The prefix never ends inside a `%XX` escape. A shortened key names no partition by itself (the
    catalog entry and the asset event's extra hold the exact key).
    """
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:_DIGEST_CHARS]
    prefix = text[: limit - len(HASHED_MARKER) - _DIGEST_CHARS]
    cut = prefix.rfind("%")
    if cut != -1 and cut >= len(prefix) - 2:
        prefix = prefix[:cut]
    return f"{prefix}{HASHED_MARKER}{digest}"


def _readable_value(value: Scalar, reserved: str) -> str:
    if value is None:
        return NULL_MARKER
    return escape_readable(value_to_text(value), reserved)


def partition_label(names: Sequence[str], key: PartitionKey) -> str:
    """The key as people read it, for mapped task labels and logs: `region=Zürich/day=2026-01-01`.

    Same shape as the canonical key string (`PartitionKey.path`), but only `%`, `/` (and `=` in names),
    unprintable characters and edge whitespace are escaped; NULL is `%NULL`. The `partitions` run option
    accepts it as typed (`refresh.discovery.select_keys`). Longer than Airflow's 250 characters: shortened
    by `bounded_key`.
    """
    if len(names) != len(key.values):
        raise PartitionValueError(f"key {key.values!r} has {len(key.values)} values for fields {names}")
    return bounded_key(
        "/".join(
            f"{escape_readable(name, _LABEL_NAME_RESERVED)}={_readable_value(value, _LABEL_VALUE_RESERVED)}"
            for name, value in zip(names, key.values, strict=True)
        )
    )


def composite_key(key: PartitionKey) -> str:
    """The key in Airflow's composite-key convention: the values joined by `|`, in field order.

    `ProductMapper(IdentityMapper(), StartOfDayMapper())` reads `EU|2026-01-01T00:00:00` segment by
    segment; a one-field key is the value alone (`IdentityMapper`, `AllowedKeyMapper`). Values are written
    as `value_to_text` writes them (ISO timestamps, with their UTC offset when the column has a time
    zone); `%`, `|`, unprintable characters and edge whitespace are `%XX`, NULL is `%NULL`, an empty
    string `%EMPTY`, so every key maps back to exactly one partition (`refresh.discovery.select_keys`).
    Longer than 250 characters: shortened by `bounded_key`.
    """
    segments = [
        EMPTY_MARKER
        if value is not None and value_to_text(value) == ""
        else _readable_value(value, COMPOSITE_DELIMITER)
        for value in key.values
    ]
    return bounded_key(COMPOSITE_DELIMITER.join(segments))


def names_of_path(key_path: str) -> list[str]:
    """The field names of a canonical key string, in order (`region=EU/day=...` -> `[region, day]`)."""
    if not key_path:
        return []
    return [unescape_component(part.partition("=")[0]) for part in key_path.split("/")]
