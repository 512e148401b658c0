"""Strict canonical JSON (RFC 8785, JCS) for request hashes, receipts and event digests.

Spec "Operation identity and payload binding": canonical JSON rejects NaN, infinity,
duplicate keys, non-string object keys, and values without a declared serialisation.
The byte form is what ``request_hash`` and the event chain hash, so two payloads that
mean the same JSON must give the same bytes (key order, ``1`` vs ``1.0``, ``-0.0``),
and anything whose meaning could shift between a Python caller, the JSON wire and a
target API is refused rather than guessed at.

The number rule (docs/reference/http-api.md; issue 19) is stricter than RFC 8785:
every number, integer or not, must lie within ±(2**53-1). RFC 8785 accepts any finite
double, but writes doubles between 2**53 and 1e21 as integer digits (2**68 becomes
``295147905179352830000``) that an exact-integer reader takes for another number.

``rfc8785`` already refuses NaN/±Infinity, integers beyond ±(2**53-1), non-string keys
and unknown types, but accepts such floats and only accepts ``dict``/``list``/``tuple``
containers. ``validate_json_value`` therefore
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


#: Where the walker is: None at the root, else (parent trail, key or index). The JSON
#: path string is built only for an error message, not for every value walked.
_Trail = tuple[Any, str | int] | None


def _path(trail: _Trail) -> str:
    keys: list[str | int] = []
    while trail is not None:
        trail, key = trail
        keys.append(key)
    path = "$"
    for key in reversed(keys):
        path = _child(path, key)
    return path


class _Walk:
    """State of one walk: containers on the current branch (cycle detection), and
    whether ``json.dumps`` would give exactly the RFC 8785 bytes (no float anywhere,
    every object key ASCII - see ``canonical_json``)."""

    __slots__ = ("active", "plain")

    def __init__(self) -> None:
        self.active: set[int] = set()
        self.plain = True


def _string(value: str, trail: _Trail) -> str:
    if type(value) is not str:
        # A str subclass (a StrEnum, or one overriding comparison or isascii) becomes
        # its plain text, so sorting and escaping cannot depend on its methods.
        value = str.__str__(value)
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            where = _path(trail)
            raise InvalidJsonError(
                f"string at {where} is not valid Unicode (lone surrogate)", path=where
            ) from exc
    return value


def _normalise(value: object, trail: _Trail, walk: _Walk) -> Any:
    """Validate ``value`` and return it as plain dict/list/scalars for rfc8785."""
    # bool before int: bool is an int subclass but serialises as true/false.
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _string(value, trail)
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise _out_of_range(_path(trail))
        return int(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            where = _path(trail)
            raise InvalidJsonError(f"{value} at {where} is not a JSON number", path=where)
        # The same range rule as for ints (module docstring): rfc8785 would print
        # 1.2345678901234567e20 as 123456789012345670000, which an exact reader
        # takes for an integer the double is not.
        if abs(value) > MAX_SAFE_INTEGER:
            raise _out_of_range(_path(trail))
        walk.plain = False  # ECMAScript number formatting: rfc8785's job
        return float(value)
    if isinstance(value, dict | list | tuple | Mapping):
        # A container that contains itself has no JSON form; say so instead of
        # recursing until RecursionError.
        if id(value) in walk.active:
            where = _path(trail)
            raise InvalidJsonError(f"circular reference at {where}", path=where)
        walk.active.add(id(value))
        try:
            if isinstance(value, dict | Mapping):
                result: dict[str, Any] = {}
                for key, item in value.items():
                    if not isinstance(key, str):
                        where = _path(trail)
                        raise InvalidJsonError(
                            f"object key of type {type(key).__name__} at {where} is "
                            "not a string",
                            path=where,
                        )
                    text = _string(key, trail)
                    if not text.isascii():
                        walk.plain = False  # RFC 8785 sorts keys by UTF-16 units
                    result[text] = _normalise(item, (trail, text), walk)
                return result
            return [_normalise(item, (trail, i), walk) for i, item in enumerate(value)]
        finally:
            walk.active.discard(id(value))
    where = _path(trail)
    raise InvalidJsonError(
        f"value of type {type(value).__name__} at {where} has no declared JSON "
        "serialisation",
        path=where,
    )


def _plain(value: object) -> tuple[Any, bool]:
    walk = _Walk()
    try:
        return _normalise(value, None, walk), walk.plain
    except RecursionError as exc:
        raise InvalidJsonError("value is nested too deeply", path="$") from exc


def validate_json_value(value: object) -> None:
    """Raise InvalidJsonError unless ``value`` is JSON the broker can canonicalise."""
    _plain(value)


def canonical_json(value: object) -> bytes:
    """Return the RFC 8785 canonical UTF-8 bytes of ``value``; refuse ambiguous input.

    Without floats and with ASCII object keys, RFC 8785 is what ``json.dumps`` with
    sorted keys, no whitespace and unescaped non-ASCII produces (same string escapes,
    integers within ±(2**53-1) print alike, ASCII keys sort alike by code point and by
    UTF-16 unit), and the C encoder does it several times faster than rfc8785's pure
    Python; everything else goes through rfc8785. A property test holds the two equal.
    """
    plain, simple = _plain(value)
    if simple:
        try:
            return json.dumps(
                plain, ensure_ascii=False, separators=(",", ":"), sort_keys=True
            ).encode("utf-8")
        except RecursionError as exc:
            raise InvalidJsonError("value is nested too deeply", path="$") from exc
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
    mantissa = text.lower().partition("e")[0]
    if number == 0.0 and any(d in "123456789" for d in mantissa):
        # "1e-400" parses to 0.0: a non-zero amount silently became zero (issue 12).
        raise NumberOutOfRangeError(
            "a non-zero number is too small to represent and would become 0"
        )
    return number


def _decode_error(exc: json.JSONDecodeError) -> tuple[str, int, int]:
    """The decoder's message and position, worded the same on every Python version.

    Python 3.13 names a trailing comma ("Illegal trailing comma before end of object",
    at the comma); 3.11 and 3.12 report the token after it. A client's error must not
    change with the server's interpreter, so the older wording is rewritten to 3.13's.
    """
    doc, pos = exc.doc, exc.pos
    closer = doc[pos : pos + 1]
    before = doc[:pos].rstrip()
    if closer in ("}", "]") and before.endswith(","):
        comma = len(before) - 1
        kind = "object" if closer == "}" else "array"
        line = doc.count("\n", 0, comma) + 1
        column = comma - doc.rfind("\n", 0, comma)
        return f"Illegal trailing comma before end of {kind}", line, column
    return exc.msg, exc.lineno, exc.colno


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
        message, line, column = _decode_error(exc)
        raise InvalidJsonError(
            f"malformed JSON: {message} at line {line} column {column}",
            line=line,
            column=column,
        ) from exc
    except RecursionError as exc:
        raise InvalidJsonError("JSON is nested too deeply") from exc
    validate_json_value(value)
    return value
