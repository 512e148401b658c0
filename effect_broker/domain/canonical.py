"""Strict canonical JSON (RFC 8785, JCS) for request hashes, receipts and event digests.

Spec "Operation identity and payload binding": canonical JSON rejects NaN, infinity,
duplicate keys, non-string object keys, and values without a declared serialisation.
The byte form is what ``request_hash`` and the event chain hash, so two payloads that
mean the same JSON must give the same bytes (key order, ``1`` vs ``1.0``, ``-0.0``),
and anything whose meaning could shift between a Python caller, the JSON wire and a
target API is refused rather than guessed at.

``rfc8785`` already refuses NaN/±Infinity, integers beyond ±(2**53-1), non-string keys
and unknown types, but it serialises huge integral floats (``1e20``) as exact digits and
only accepts ``dict``/``list``/``tuple`` containers. ``validate_json_value`` therefore
walks the value first with one rule set (shared with ``parse_json_strict``) and with
error messages that carry the JSON path; rfc8785's own errors are still wrapped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import rfc8785

from effect_broker.domain.errors import InvalidJsonError, NumberOutOfRangeError

MAX_SAFE_INTEGER = 2**53 - 1
"""Largest integer an IEEE-754 double (every JSON parser's number) holds exactly."""

_MAX_SAFE_DIGITS = len(str(MAX_SAFE_INTEGER))


def _out_of_range(path: str | None) -> NumberOutOfRangeError:
    # The value itself is never echoed: error messages reach logs, and a 16+ digit
    # number may well be a card number (STYLE rule 8).
    where = f"number at {path}" if path else "a number"
    return NumberOutOfRangeError(
        f"{where} is outside ±(2**53-1); money and big numbers travel as strings or "
        "minor-unit integers",
        path=path,
    )


def _child(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if key.isidentifier():
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key)}]"


def _normalise(value: object, path: str, active: set[int]) -> Any:
    """Validate ``value`` and return it as plain dict/list/scalars for rfc8785."""
    # bool before int: bool is an int subclass but serialises as true/false.
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise _out_of_range(path)
        return int(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise InvalidJsonError(f"{value} at {path} is not a JSON number", path=path)
        # Every float beyond 2**53 is integral; rfc8785 would print 1e20 as exact
        # digits a double cannot hold, so the same range rule as for ints applies.
        if abs(value) > MAX_SAFE_INTEGER:
            raise _out_of_range(path)
        return float(value)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidJsonError(
                f"string at {path} is not valid Unicode (lone surrogate)", path=path
            ) from exc
        return value
    if isinstance(value, Mapping | list | tuple):
        # A container that contains itself has no JSON form; say so instead of
        # recursing until RecursionError.
        if id(value) in active:
            raise InvalidJsonError(f"circular reference at {path}", path=path)
        active.add(id(value))
        try:
            if isinstance(value, Mapping):
                result: dict[str, Any] = {}
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise InvalidJsonError(
                            f"object key of type {type(key).__name__} at {path} is not "
                            "a string",
                            path=path,
                        )
                    result[_normalise(key, path, active)] = _normalise(
                        item, _child(path, key), active
                    )
                return result
            return [
                _normalise(item, _child(path, i), active) for i, item in enumerate(value)
            ]
        finally:
            active.discard(id(value))
    raise InvalidJsonError(
        f"value of type {type(value).__name__} at {path} has no declared JSON "
        "serialisation",
        path=path,
    )


def _plain(value: object) -> Any:
    try:
        return _normalise(value, "$", set())
    except RecursionError as exc:
        raise InvalidJsonError("value is nested too deeply", path="$") from exc


def validate_json_value(value: object) -> None:
    """Raise InvalidJsonError unless ``value`` is JSON the broker can canonicalise."""
    _plain(value)


def canonical_json(value: object) -> bytes:
    """Return the RFC 8785 canonical UTF-8 bytes of ``value``; refuse ambiguous input."""
    plain = _plain(value)
    try:
        return rfc8785.dumps(plain)
    except rfc8785.IntegerDomainError as exc:
        raise NumberOutOfRangeError(str(exc)) from exc
    except rfc8785.CanonicalizationError as exc:
        raise InvalidJsonError(str(exc)) from exc
    except RecursionError as exc:
        raise InvalidJsonError("value is nested too deeply", path="$") from exc


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last duplicate silently; two readers of one payload could
    # then disagree on "amount", so duplicates are refused (spec: payload binding).
    result: dict[str, Any] = {}
    for key, item in pairs:
        if key in result:
            raise InvalidJsonError(f"duplicate object key {key!r}", key=key)
        result[key] = item
    return result


def _reject_constant(name: str) -> Any:
    raise InvalidJsonError(f"{name} is not a JSON number", constant=name)


def _parse_int(text: str) -> int:
    # Refuse by digit count before int(): Python raises a bare ValueError past 4300
    # digits, and converting megabyte numbers is a cheap denial of service. Numbers of
    # up to 16 digits are range-checked by the walker, which knows the JSON path.
    if len(text.lstrip("-")) > _MAX_SAFE_DIGITS:
        raise _out_of_range(None)
    return int(text)


def _parse_float(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        # "1e400" parses to inf: it is out of range, not an Infinity literal.
        raise _out_of_range(None)
    return number


def parse_json_strict(data: str | bytes) -> object:
    """Parse JSON text, refusing duplicate keys, NaN/Infinity, big numbers, bad UTF-8."""
    if isinstance(data, bytes | bytearray | memoryview):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidJsonError(f"JSON is not valid UTF-8: {exc.reason}") from exc
    elif isinstance(data, str):
        text = data
    else:
        raise InvalidJsonError(f"cannot parse JSON from {type(data).__name__}")
    try:
        value = json.loads(
            text,
            object_pairs_hook=_reject_duplicates,
            parse_constant=_reject_constant,
            parse_int=_parse_int,
            parse_float=_parse_float,
        )
    except json.JSONDecodeError as exc:
        raise InvalidJsonError(
            f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            line=exc.lineno,
            column=exc.colno,
        ) from exc
    except RecursionError as exc:
        raise InvalidJsonError("JSON is nested too deeply") from exc
    validate_json_value(value)
    return value
