"""Caps on a submit's arguments (issue 12): keys over all objects, nesting depth, and
string length (keys included), each refused with the cap named."""

from __future__ import annotations

import pytest

from effect_broker.domain.argument_limits import ArgumentLimits, check_arguments
from effect_broker.domain.errors import ArgumentsTooLargeError

LIMITS = ArgumentLimits(max_keys=5, max_depth=3, max_string_length=10)


def nested(depth: int) -> dict[str, object]:
    value: dict[str, object] = {"v": 1}
    for _ in range(depth - 1):
        value = {"n": value}
    return value


@pytest.mark.parametrize(
    ("arguments", "cap", "limit"),
    [
        ({str(i): i for i in range(6)}, "keys", 5),
        ({"a": {"b": 1, "c": 2}, "d": {"e": 3, "f": 4}}, "keys", 5),  # 6 over all
        (nested(4), "depth", 3),
        ({"a": [[["deep"]]]}, "depth", 3),
        ({"a": "x" * 11}, "string_length", 10),
        ({"k" * 11: 1}, "string_length", 10),
        ({"a": ["ok", "y" * 11]}, "string_length", 10),
    ],
    ids=[
        "top-keys",
        "keys-over-all-objects",
        "object-depth",
        "array-depth",
        "value",
        "key",
        "string-in-list",
    ],
)
def test_given_arguments_over_a_cap_then_refused_naming_it(
    arguments: dict[str, object], cap: str, limit: int
) -> None:
    with pytest.raises(ArgumentsTooLargeError) as caught:
        check_arguments(arguments, LIMITS)
    assert caught.value.details == {"cap": cap, "limit": limit}
    assert caught.value.http_status == 422


def test_given_arguments_at_every_cap_then_accepted() -> None:
    check_arguments({"a": {"b": ["x" * 10]}, "c": 1, "d": 2, "e": 3}, LIMITS)
    check_arguments(nested(3), LIMITS)


def test_the_defaults_leave_room_for_real_tool_calls() -> None:
    real = {"order": "42", "amount_minor": 1999, "currency": "EUR", "lines": [{}] * 50}
    check_arguments(real, ArgumentLimits())
