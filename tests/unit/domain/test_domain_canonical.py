"""Strict canonical JSON (spec "Operation identity and payload binding")."""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Mapping
from decimal import Decimal
from types import MappingProxyType
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from effect_broker.domain.canonical import (
    MAX_SAFE_INTEGER,
    canonical_json,
    parse_json_strict,
    validate_json_value,
)
from effect_broker.domain.errors import InvalidJsonError, NumberOutOfRangeError
from effect_broker.domain.states import SafetyClass

safe_ints = st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
safe_floats = st.floats(
    min_value=-MAX_SAFE_INTEGER,
    max_value=MAX_SAFE_INTEGER,
    allow_nan=False,
    allow_infinity=False,
)
json_scalars = st.none() | st.booleans() | safe_ints | safe_floats | st.text()
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5)
    ),
    max_leaves=30,
)
json_objects = st.dictionaries(st.text(), json_values, max_size=8)
# No floats: the values canonical_json serialises with json.dumps instead of rfc8785
# (when every key is ASCII too); keys are ASCII or any text, so both paths are hit.
float_free_values = st.recursive(
    st.none() | st.booleans() | safe_ints | st.text(),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(
            st.text(st.characters(codec="ascii")) | st.text(), children, max_size=5
        )
    ),
    max_leaves=30,
)
big_ints = st.integers(min_value=MAX_SAFE_INTEGER + 1) | st.integers(
    max_value=-MAX_SAFE_INTEGER - 1
)


def _shuffled(value: Any, rng: random.Random) -> Any:
    """Return ``value`` with every object's key insertion order shuffled."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: _shuffled(item, rng) for key, item in items}
    if isinstance(value, list):
        return [_shuffled(item, rng) for item in value]
    return value


# --- canonical bytes --------------------------------------------------------------------


def test_given_object_then_keys_are_sorted_and_whitespace_removed() -> None:
    value = {"b": [1.5, "é", None], "a": True}
    assert canonical_json(value) == '{"a":true,"b":[1.5,"é",null]}'.encode()


def test_given_rfc8785_key_sorting_example_then_keys_sort_by_utf16_code_units() -> None:
    # RFC 8785 section 3.2.3: the emoji (surrogates D83D DE00) sorts before U+FB33.
    value = {k: 0 for k in ["\u20ac", "\r", "\ufb33", "1", "\U0001f600", "\u0080", "ö"]}
    reparsed = parse_json_strict(canonical_json(value))
    assert isinstance(reparsed, dict)
    assert list(reparsed) == ["\r", "1", "\u0080", "ö", "\u20ac", "\U0001f600", "\ufb33"]


@settings(max_examples=500)
@given(value=float_free_values | json_values)
def test_given_any_json_value_then_bytes_equal_the_rfc8785_reference(value: Any) -> None:
    # canonical_json takes a json.dumps fast path for float-free, ASCII-keyed values;
    # the bytes must be exactly what the reference implementation produces.
    assert canonical_json(value) == rfc8785.dumps(value)


def test_given_str_subclass_keys_with_own_ordering_then_bytes_follow_the_text() -> None:
    class Backwards(str):
        def __lt__(self, other: object) -> bool:
            return str.__gt__(self, str(other))

    value = {Backwards("a"): 1, Backwards("b"): 2}
    assert canonical_json(value) == b'{"a":1,"b":2}' == rfc8785.dumps({"a": 1, "b": 2})


def test_given_control_characters_then_escapes_match_the_rfc8785_reference() -> None:
    value = {"s": "".join(map(chr, range(0x20))) + '"\\/\x7f\u2028é\U0001f600'}
    assert canonical_json(value) == rfc8785.dumps(value)


@given(value=json_values, rng=st.randoms(use_true_random=False))
def test_given_any_key_order_then_canonical_bytes_are_identical(
    value: Any, rng: random.Random
) -> None:
    assert canonical_json(_shuffled(value, rng)) == canonical_json(value)


@given(value=json_values)
def test_given_canonical_bytes_then_parsing_gives_an_equal_value(value: Any) -> None:
    assert parse_json_strict(canonical_json(value)) == value


@given(value=json_values)
def test_given_canonical_bytes_then_canonicalising_the_parse_is_identity(
    value: Any,
) -> None:
    once = canonical_json(value)
    assert canonical_json(parse_json_strict(once)) == once


@given(text=st.text())
def test_given_unicode_string_then_it_round_trips_as_utf8(text: str) -> None:
    encoded = canonical_json({"s": text})
    assert encoded.decode("utf-8")  # valid UTF-8, no surrogate escapes needed
    assert parse_json_strict(encoded) == {"s": text}


@given(number=safe_ints)
def test_given_integral_float_then_bytes_equal_the_int(number: int) -> None:
    assert canonical_json(float(number)) == canonical_json(number)


def test_given_one_point_zero_and_one_then_bytes_are_identical() -> None:
    assert (
        canonical_json({"amount": 1.0})
        == canonical_json({"amount": 1})
        == b'{"amount":1}'
    )


def test_given_negative_zero_then_it_canonicalises_to_zero() -> None:
    assert canonical_json(-0.0) == b"0"
    assert canonical_json([-0.0, 0.0, 0]) == b"[0,0,0]"


def test_given_bool_then_it_stays_a_bool_not_an_int() -> None:
    assert canonical_json([True, False]) == b"[true,false]"
    assert canonical_json(True) != canonical_json(1)


def test_given_safe_integer_bounds_then_they_are_accepted() -> None:
    assert canonical_json([MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER]) == (
        b"[9007199254740991,-9007199254740991]"
    )


def test_given_str_enum_then_it_serialises_as_its_value() -> None:
    assert (
        canonical_json({"safety": SafetyClass.IDEMPOTENT}) == b'{"safety":"idempotent"}'
    )


def test_given_mapping_proxy_and_tuple_then_they_serialise_like_dict_and_list() -> None:
    proxy = MappingProxyType({"b": (1, 2), "a": "x"})
    assert canonical_json(proxy) == canonical_json({"a": "x", "b": [1, 2]})


# --- refusals ---------------------------------------------------------------------------


@given(number=big_ints)
def test_given_int_beyond_2_pow_53_then_number_out_of_range(number: int) -> None:
    with pytest.raises(NumberOutOfRangeError) as caught:
        canonical_json({"amount": number})
    assert str(caught.value) == (
        "number at $.amount is outside ±(2**53-1); money and big numbers travel as "
        "strings or minor-unit integers"
    )
    assert str(number) not in str(caught.value)  # never echo a possible card number


@given(number=st.floats(min_value=2.0**53, allow_infinity=False))
def test_given_float_beyond_2_pow_53_then_number_out_of_range(number: float) -> None:
    with pytest.raises(NumberOutOfRangeError):
        canonical_json([number])
    with pytest.raises(NumberOutOfRangeError):
        canonical_json([-number])


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_given_non_finite_float_then_invalid_json(number: float) -> None:
    with pytest.raises(InvalidJsonError) as caught:
        canonical_json({"x": [number]})
    assert type(caught.value) is InvalidJsonError
    assert str(caught.value) == f"{number} at $.x[0] is not a JSON number"


@given(key=st.integers() | st.none() | st.booleans() | st.tuples(st.text()) | st.binary())
def test_given_non_string_key_then_invalid_json(key: object) -> None:
    with pytest.raises(InvalidJsonError) as caught:
        canonical_json({"outer": {key: 1}})
    assert str(caught.value) == (
        f"object key of type {type(key).__name__} at $.outer is not a string"
    )


@pytest.mark.parametrize(
    "value",
    [
        {1, 2},
        frozenset({1}),
        b"bytes",
        bytearray(b"x"),
        Decimal("10.00"),
        dt.datetime(2026, 12, 3, tzinfo=dt.UTC),
        dt.date(2026, 12, 3),
        1j,
        object(),
    ],
    ids=lambda value: type(value).__name__,
)
def test_given_value_without_declared_serialisation_then_invalid_json(
    value: object,
) -> None:
    with pytest.raises(InvalidJsonError) as caught:
        canonical_json({"v": value})
    assert str(caught.value) == (
        f"value of type {type(value).__name__} at $.v has no declared JSON serialisation"
    )


def test_given_lone_surrogate_then_invalid_json() -> None:
    with pytest.raises(InvalidJsonError) as caught:
        canonical_json(["ok", "\ud800"])
    assert str(caught.value) == "string at $[1] is not valid Unicode (lone surrogate)"


def test_given_circular_structure_then_invalid_json_not_recursion_error() -> None:
    value: dict[str, Any] = {"a": []}
    value["a"].append(value)
    with pytest.raises(InvalidJsonError) as caught:
        canonical_json(value)
    assert str(caught.value) == "circular reference at $.a[0]"


def test_given_shared_non_circular_substructure_then_it_is_accepted() -> None:
    shared = [1]
    assert canonical_json({"a": shared, "b": shared}) == b'{"a":[1],"b":[1]}'


def test_given_key_that_is_not_an_identifier_then_path_quotes_it() -> None:
    with pytest.raises(NumberOutOfRangeError) as caught:
        validate_json_value({"line items": [{"unit.price": 2**60}]})
    assert caught.value.details == {"path": '$["line items"][0]["unit.price"]'}


def test_given_valid_value_then_validate_returns_none() -> None:
    validate_json_value({"a": [1, 2.5, "x", None, True]})  # does not raise


# --- strict parsing ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('{"amount": 1, "amount": 2}', "amount"),
        ('{"a": {"b": 1, "b": 1}}', "b"),
        ('[{"ok": 1}, {"k": [], "k": {}}]', "k"),
    ],
)
def test_given_duplicate_keys_then_parse_refuses(text: str, key: str) -> None:
    with pytest.raises(InvalidJsonError) as caught:
        parse_json_strict(text)
    assert str(caught.value) == f"duplicate object key {key!r}"


@given(key=st.text(), first=json_values, second=json_values)
def test_given_any_duplicated_key_then_parse_refuses(
    key: str, first: Any, second: Any
) -> None:
    encoded_key = json.dumps(key)
    first_text, second_text = json.dumps(first), json.dumps(second)
    text = f'{{"wrap": {{{encoded_key}: {first_text}, {encoded_key}: {second_text}}}}}'
    with pytest.raises(InvalidJsonError) as caught:
        parse_json_strict(text)
    assert str(caught.value) == f"duplicate object key {key!r}"


@pytest.mark.parametrize(
    ("text", "constant"),
    [("NaN", "NaN"), ("[Infinity]", "Infinity"), ('{"a": -Infinity}', "-Infinity")],
)
def test_given_nan_or_infinity_literal_then_parse_refuses(
    text: str, constant: str
) -> None:
    with pytest.raises(InvalidJsonError) as caught:
        parse_json_strict(text)
    assert str(caught.value) == f"{constant} is not a JSON number"


@pytest.mark.parametrize(
    "text",
    [
        "9007199254740992",
        "-9007199254740992",
        '{"amount": 12345678901234567890}',
        "1e16",
        "[1e400]",
        "-1e400",
        "1" * 5000,  # past Python's int() digit limit: still a clean refusal
    ],
)
def test_given_big_number_then_parse_refuses_with_number_out_of_range(text: str) -> None:
    with pytest.raises(NumberOutOfRangeError):
        parse_json_strict(text)


@pytest.mark.parametrize("text", ["1e-400", "[-2.5E-999]", '{"a": 0.000001e-330}'])
def test_given_a_nonzero_number_that_underflows_then_parse_refuses(text: str) -> None:
    # Issue 12: 1e-400 silently became 0.
    with pytest.raises(NumberOutOfRangeError, match="would become 0"):
        parse_json_strict(text)


def test_given_zero_spelt_as_a_float_then_parse_accepts() -> None:
    assert parse_json_strict("[0.0, -0e-400, 0E5, 5e-324]") == [0.0, 0.0, 0.0, 5e-324]


def test_given_safe_bounds_then_parse_accepts() -> None:
    assert parse_json_strict("[9007199254740991, -9007199254740991, 1e15]") == [
        MAX_SAFE_INTEGER,
        -MAX_SAFE_INTEGER,
        1e15,
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "malformed JSON: Expecting value at line 1 column 1"),
        (
            '{"a": 1,}',
            "malformed JSON: Illegal trailing comma before end of object at line 1 "
            "column 8",
        ),
        ("[1,\n]", "malformed JSON: Illegal trailing comma before end of array"),
        ("{'a': 1}", "malformed JSON: Expecting property name enclosed in double quotes"),
        ("[1] [2]", "malformed JSON: Extra data at line 1 column 5"),
    ],
)
def test_given_malformed_json_then_invalid_json_with_position(
    text: str, message: str
) -> None:
    with pytest.raises(InvalidJsonError) as caught:
        parse_json_strict(text)
    assert str(caught.value).startswith(message)


def test_given_bytes_that_are_not_utf8_then_invalid_json() -> None:
    with pytest.raises(InvalidJsonError) as caught:
        parse_json_strict(b'"\xff"')
    assert str(caught.value) == "JSON is not valid UTF-8: invalid start byte"


def test_given_escaped_lone_surrogate_then_parse_refuses() -> None:
    with pytest.raises(InvalidJsonError) as caught:
        parse_json_strict('["\\ud800"]')
    assert str(caught.value) == "string at $[0] is not valid Unicode (lone surrogate)"


def test_given_very_deep_nesting_then_invalid_json_not_recursion_error() -> None:
    with pytest.raises(InvalidJsonError) as caught:
        parse_json_strict("[" * 100_000 + "]" * 100_000)
    assert str(caught.value) == "JSON is nested too deeply"


def test_given_utf8_bytes_then_parse_matches_str_parse() -> None:
    text = '{"name": "Zoë", "n": -0.0}'
    parsed = parse_json_strict(text.encode())
    assert parsed == parse_json_strict(text) == {"name": "Zoë", "n": 0}
    assert isinstance(parsed, Mapping)
