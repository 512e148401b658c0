"""The one rule for text PostgreSQL refuses (issue 12): NUL and lone surrogates,
found anywhere in a value, keys included, and named by their path."""

from __future__ import annotations

import pytest

from effect_broker.domain.errors import UnstorableTextError
from effect_broker.domain.storable_text import find_unstorable, require_storable


@pytest.mark.parametrize(
    ("value", "found"),
    [
        ({"tool": "a\x00"}, ("tool", "value", "\x00")),
        ({"arguments": {"a\x00b": 1}}, ("arguments", "key", "\x00")),
        (
            {"arguments": {"note": ["ok", "x\x00"]}},
            ("arguments.note[1]", "value", "\x00"),
        ),
        ({"k": "\ud800"}, ("k", "value", "\ud800")),
        ("\x00", ("", "value", "\x00")),
    ],
)
def test_given_unstorable_text_then_its_path_is_found(
    value: object, found: tuple[str, str, str]
) -> None:
    assert find_unstorable(value) == found


def test_given_storable_text_then_nothing_is_found() -> None:
    value = {"tool": "é\u200b😀", "arguments": {"n": [1, 2.5, None, True, "\x01"]}}
    assert find_unstorable(value) is None
    require_storable(value)


def test_given_a_prefix_then_the_field_is_named_under_it() -> None:
    with pytest.raises(UnstorableTextError) as caught:
        require_storable({"tool": "x\x00"}, "query")
    assert caught.value.details == {"field": "query.tool"}
    assert str(caught.value) == "query.tool contains NUL (U+0000), which cannot be stored"
    assert caught.value.http_status == 422


def test_given_a_bad_key_then_the_message_names_the_object_not_the_key_text() -> None:
    with pytest.raises(UnstorableTextError) as caught:
        require_storable({"arguments": {"x" * 500 + "\x00": 1}})
    assert str(caught.value) == (
        "a key of arguments contains NUL (U+0000), which cannot be stored"
    )


def test_given_deep_nesting_then_the_walk_does_not_recurse() -> None:
    value: object = "\x00"
    for _ in range(10_000):
        value = [value]
    found = find_unstorable(value)
    assert found is not None
    assert found[1:] == ("value", "\x00")
