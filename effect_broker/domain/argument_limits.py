"""Caps on the shape of a submit's arguments: how many keys, how deep, how long a
string (``EFFECT_BROKER_MAX_ARGUMENT_KEYS``, ``..._DEPTH``, ``..._STRING_LENGTH``).

Issue 12: four clients sending 240 KB submits with 15,500 argument keys each pushed
``/healthz`` from 6 ms to a p50 of 390 ms, and the preview kept every key name. The
body-size limit bounds the bytes; these bound the work each byte can cause (hashing,
canonicalising, previewing), and the submission service checks them for every
surface before anything else is done with the arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from effect_broker.domain.errors import ArgumentsTooLargeError


@dataclass(frozen=True, slots=True)
class ArgumentLimits:
    """The caps; the defaults leave room for any real tool call."""

    #: Object keys, counted over every object in the arguments.
    max_keys: int = 1000
    #: Nesting of objects and arrays; the arguments object itself is depth 1.
    max_depth: int = 20
    #: Characters in any one string, keys included.
    max_string_length: int = 65536


def check_arguments(arguments: Mapping[str, object], limits: ArgumentLimits) -> None:
    """Raise ``ArgumentsTooLargeError`` naming the cap ``arguments`` exceeds."""
    keys = 0
    # An explicit stack: depth is what is being limited, so no recursion here.
    stack: list[tuple[object, int]] = [(arguments, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _string(item, limits)
        elif isinstance(item, Mapping | list | tuple):
            if depth > limits.max_depth:
                raise ArgumentsTooLargeError(
                    f"arguments are nested more than {limits.max_depth} deep",
                    cap="depth",
                    limit=limits.max_depth,
                )
            if isinstance(item, Mapping):
                keys += len(item)
                if keys > limits.max_keys:
                    raise ArgumentsTooLargeError(
                        f"arguments have more than {limits.max_keys} keys",
                        cap="keys",
                        limit=limits.max_keys,
                    )
                for key in item:
                    _string(str(key), limits)
                stack.extend((child, depth + 1) for child in item.values())
            else:
                stack.extend((child, depth + 1) for child in item)


def _string(value: str, limits: ArgumentLimits) -> None:
    if len(value) > limits.max_string_length:
        raise ArgumentsTooLargeError(
            f"an argument string is longer than {limits.max_string_length} characters",
            cap="string_length",
            limit=limits.max_string_length,
        )
