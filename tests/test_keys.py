"""Partition key encodings: JSON, path components and canonical key strings round-trip exactly."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_partitions.exceptions import PartitionValueError
from airflow_partitions.keys import (
    MAX_COMPONENT_BYTES,
    NULL_MARKER,
    PartitionKey,
    decode_value,
    encode_value,
    escape_component,
    parse_path,
    unescape_component,
    value_from_json,
    value_kind,
    value_to_json,
)

HOSTILE = [
    "",
    "/",
    "a/b",
    "../../etc",
    "..",
    ".",
    "k=v",
    "%",
    "%25",
    "%NULL",
    "null",
    "none",
    "NULL",
    "__HIVE_DEFAULT_PARTITION__",
    'it\'s "quoted"',
    "line\nbreak\r\t",
    "\x00\x01\x7f",
    "Zürich 東京 🚕",
    "a:b",
    " leading and trailing ",
    "back\\slash",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_strings_escape_to_safe_components_and_back(text: str) -> None:
    escaped = escape_component(text)
    assert all(c.isascii() and (c.isalnum() or c in "_.-%") for c in escaped), escaped
    assert "/" not in escaped
    assert "=" not in escaped
    assert not escaped.startswith((".", "_")), "hidden-file prefixes must be escaped"
    assert unescape_component(escaped) == text


def escaped_byte_by_byte(text: str) -> str:
    """The escaping rule spelt out: every UTF-8 byte outside [A-Za-z0-9_.-], and a leading '.' or '_'."""
    safe = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
    out = []
    for i, ch in enumerate(text):
        encoded = ch.encode("utf-8")
        plain = len(encoded) == 1 and encoded[0] in safe and not (i == 0 and ch in "._")
        out.append(ch if plain else "".join(f"%{b:02X}" for b in encoded))
    return "".join(out)


@pytest.mark.parametrize(
    "text",
    [
        *HOSTILE,
        "12345",
        "-7",
        "abc\n",  # a `$`-anchored shortcut would let the trailing newline through
        "abc\r",
        "a.b_c-d",
        "_hidden",
        ".hidden",
        "٣",  # an Arabic-Indic digit: a digit to `str.isdigit` and to `\\d`, not in [0-9]
        "Ⅻ",
        "ａ",  # fullwidth letter
        "x" * 400,
    ],
)
def test_plain_components_take_the_shortcut_and_every_other_one_is_escaped_byte_by_byte(text: str) -> None:
    assert escape_component(text) == escaped_byte_by_byte(text)


@given(st.text(alphabet=st.characters(max_codepoint=0x3000)))
def test_escaping_equals_the_byte_by_byte_rule(text: str) -> None:
    assert escape_component(text) == escaped_byte_by_byte(text)


@given(st.text())
def test_any_string_round_trips_through_a_component(text: str) -> None:
    component = encode_value(text)
    assert len(component) <= MAX_COMPONENT_BYTES
    if "%H" in component:
        assert len(escape_component(text)) > MAX_COMPONENT_BYTES
    else:
        assert decode_value(component, "string") == text


def test_null_marker_is_distinct_from_every_real_string() -> None:
    assert encode_value(None) == NULL_MARKER
    for text in ["%NULL", "NULL", "null", "None", "", "%"]:
        assert encode_value(text) != NULL_MARKER, f"{text!r} must not collide with NULL"
    assert decode_value(NULL_MARKER, "string") is None


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (0, "int"),
        (-(2**63), "int"),
        (2**64 - 1, "int"),
        (True, "bool"),
        (False, "bool"),
        (dt.date(2024, 2, 29), "date"),
        (dt.datetime(2026, 3, 29, 1, 30, 0, 123456), "timestamp"),
        (dt.datetime(2026, 3, 29, 1, 30, tzinfo=dt.UTC), "timestamp"),
        (Decimal("-14.20"), "decimal"),
        (b"\x00\x01/=%", "binary"),
        ("Zürich/=%", "string"),
    ],
)
def test_typed_values_round_trip_through_path_and_json(value: object, kind: str) -> None:
    assert value_kind(value) == kind  # type: ignore[arg-type]
    assert decode_value(encode_value(value), kind) == value  # type: ignore[arg-type]
    assert value_from_json(value_to_json(value)) == value  # type: ignore[arg-type]


def test_bool_is_not_mistaken_for_int() -> None:
    assert value_kind(True) == "bool"
    assert value_to_json(True) is True


def test_composite_key_path_and_parse_back() -> None:
    names = ["region", "day", "bucket"]
    key = PartitionKey(("EU/West=1", dt.date(2026, 1, 31), None))
    path = key.path(names)
    assert path == "region=EU%2FWest%3D1/day=2026-01-31/bucket=%NULL"
    assert parse_path(path, names, ["string", "date", "int"]) == key
    assert PartitionKey.loads(key.dumps()) == key


def test_field_names_are_escaped_too() -> None:
    assert PartitionKey((1,)).path(["a/b"]) == "a%2Fb=1"


def test_long_values_are_shortened_deterministically_and_refuse_decoding() -> None:
    long_value = "x" * 10_000
    component = encode_value(long_value)
    assert len(component) <= MAX_COMPONENT_BYTES
    assert component == encode_value(long_value)
    assert component != encode_value("x" * 9_999)
    with pytest.raises(PartitionValueError, match="shortened"):
        decode_value(component, "string")


def test_shortening_never_splits_an_escape_sequence() -> None:
    for pad in range(8):
        component = encode_value("a" * pad + "é" * 200)
        prefix = component.split("%H")[0]
        unescape_component(prefix)  # must decode: no dangling '%X'


@pytest.mark.parametrize("bad", ["%", "%4", "%zz", "a/b", "é"])
def test_unescape_refuses_what_escape_cannot_produce(bad: str) -> None:
    with pytest.raises(PartitionValueError):
        unescape_component(bad)


def test_path_with_wrong_field_is_rejected() -> None:
    with pytest.raises(PartitionValueError, match="region"):
        parse_path("zone=1", ["region"], ["string"])


# --- readable labels and Airflow composite keys ---------------------------------------------------

LABEL_FIELDS = ("region", "day")


def _select(keys: list[tuple[object, ...]], requested: str) -> list[tuple[object, ...]]:
    from airflow_partitions.refresh.discovery import select_keys

    selected, unknown = select_keys(LABEL_FIELDS, keys, [requested])  # type: ignore[arg-type]
    assert not unknown, f"{requested!r} names no partition"
    return selected  # type: ignore[return-value]


def test_labels_and_composite_keys_are_readable() -> None:
    from airflow_partitions.keys import composite_key, partition_label

    key = PartitionKey(("Zürich", dt.datetime(2026, 1, 1)))
    assert partition_label(LABEL_FIELDS, key) == "region=Zürich/day=2026-01-01T00:00:00"
    assert composite_key(key) == "Zürich|2026-01-01T00:00:00"
    assert composite_key(PartitionKey((2025,))) == "2025"
    aware = PartitionKey(("EU", dt.datetime(2026, 1, 1, tzinfo=dt.UTC)))
    assert composite_key(aware) == "EU|2026-01-01T00:00:00+00:00", "the UTC offset is kept, never guessed"


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_values_map_back_to_exactly_their_partition(text: str) -> None:
    """Every value, however hostile, gives a label and a composite key that select its partition alone."""
    from airflow_partitions.keys import composite_key, partition_label

    day = dt.datetime(2026, 1, 1)
    keys: list[tuple[object, ...]] = [(value, day) for value in HOSTILE if value != text]
    keys += [(None, day), (text, day)]
    key = PartitionKey((text, day))
    label, composite = partition_label(LABEL_FIELDS, key), composite_key(key)
    assert label.count("/") == 1, f"a value's '/' never reads as a field separator: {label!r}"
    assert composite.count("|") == 1, f"a value's '|' never reads as a segment delimiter: {composite!r}"
    assert composite.strip(), "Airflow refuses an empty or blank partition key"
    assert composite == composite.strip(), "run options strip edge whitespace"
    assert label == label.strip(), "run options strip edge whitespace"
    assert _select(keys, label) == [(text, day)]
    assert _select(keys, composite) == [(text, day)]
    assert _select(keys, key.path(LABEL_FIELDS)) == [(text, day)], "canonical keys still select"


def test_null_and_empty_string_have_distinct_readable_forms() -> None:
    from airflow_partitions.keys import composite_key, partition_label

    day = dt.datetime(2026, 1, 1)
    null, empty = PartitionKey((None, day)), PartitionKey(("", day))
    assert partition_label(LABEL_FIELDS, null) == "region=%NULL/day=2026-01-01T00:00:00"
    assert partition_label(LABEL_FIELDS, empty) == "region=/day=2026-01-01T00:00:00"
    assert composite_key(PartitionKey((None,))) == "%NULL"
    assert composite_key(PartitionKey(("",))) == "%EMPTY", "an empty key would be refused by Airflow"
    assert composite_key(PartitionKey(("%NULL",))) == "%25NULL"
    assert composite_key(PartitionKey(("%EMPTY",))) == "%25EMPTY"
    keys: list[tuple[object, ...]] = [(None, day), ("", day), ("NULL", day), ("%NULL", day)]
    for key in keys:
        pk = PartitionKey(key)
        assert _select(keys, partition_label(LABEL_FIELDS, pk)) == [key]
        assert _select(keys, composite_key(pk)) == [key]


@pytest.mark.parametrize(
    ("text", "escaped"),
    [("a|b", "a%7Cb"), ("50%", "50%25"), (" x ", "%20x%20"), ("a\nb", "a%0Ab"), ("a=b/c", "a=b/c")],
)
def test_composite_segments_escape_only_what_they_must(text: str, escaped: str) -> None:
    from airflow_partitions.keys import composite_key, unescape_readable

    assert composite_key(PartitionKey((text,))) == escaped
    assert unescape_readable(escaped) == text


def test_long_readable_keys_fit_airflow_and_stay_distinct() -> None:
    from airflow_partitions.keys import AIRFLOW_KEY_LIMIT, composite_key, partition_label

    long_a, long_b = PartitionKey(("ü/" * 200 + "a",)), PartitionKey(("ü/" * 200 + "b",))
    for render in (composite_key, lambda k: partition_label(["region"], k)):
        a, b = render(long_a), render(long_b)
        assert len(a) <= AIRFLOW_KEY_LIMIT
        assert a != b, "different keys never collapse into one"
        assert "%H" in a
        assert not a.split("%H")[0].endswith(("%", "%2")), "the prefix never ends inside an escape"


@pytest.mark.parametrize("bad", ["%", "%2", "%zz", "a%G1"])
def test_readable_decoding_refuses_a_bare_percent(bad: str) -> None:
    from airflow_partitions.keys import unescape_readable

    with pytest.raises(PartitionValueError, match="%25"):
        unescape_readable(bad)


def test_every_spelling_of_a_key_selects_it() -> None:
    """The label (`region=Zürich/year=2025`), the comma form of logs (`region=Zürich, year=2025`) and
    Airflow's composite key (`Zürich|2025`) all name the same partition, and pass the shape check."""
    from airflow_partitions.keys import key_text_problem

    keys: list[tuple[object, ...]] = [("Zürich", 2025), ("Zürich", 2026), ("a, day=b", 2025)]
    for spelling in (
        "region=Zürich/day=2025",
        "region=Zürich, day=2025",
        "region=Zürich,day=2025",
        "Zürich|2025",
    ):
        assert key_text_problem(spelling, LABEL_FIELDS) is None, spelling
        assert _select(keys, spelling) == [("Zürich", 2025)], spelling
    # A value holding `, day=` is named by its label; the comma form is ambiguous there, not wrong.
    assert _select(keys, "region=a, day=b/day=2025") == [("a, day=b", 2025)]
    problem = key_text_problem("region=Zürich, year=2025", LABEL_FIELDS)
    assert problem is not None
    assert "missing day" in problem


def test_the_form_pattern_accepts_the_comma_form() -> None:
    import re

    from airflow_partitions.operators.run_conf import _key_pattern

    pattern = re.compile(_key_pattern(LABEL_FIELDS))
    for spelling in ("region=Zürich/day=2025", "region=Zürich, day=2025", "Zürich|2025"):
        assert pattern.match(spelling), spelling
    assert not pattern.match("day=2025")
