"""The ``Idempotency-Key`` request header (draft-ietf-httpapi-idempotency-key-header)
as a way to send ``POST /v1/effects``'s operation key.

The draft defines the field as a Structured Field Item (RFC 9651) whose value is a
String; a bare Token is accepted too, since clients written against other APIs send
``Idempotency-Key: 8e03978e-...`` unquoted. Everything else is a 400 that names the
rule: no value, an empty key, a key over ``MAX_HEADER_KEY_LENGTH`` characters, or more
than one value (two header lines reach Django joined by a comma, which neither form
allows outside quotes; a comma inside a quoted String is part of the one key).

The key it carries is an operation key like any other (``validate_operation_key``):
the header is only another way to send it, never a second key space.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpRequest, HttpResponse

from effect_broker.domain.errors import InvalidRequestError
from effect_broker.domain.keys import MAX_OPERATION_KEY_LENGTH, validate_operation_key

HEADER = "Idempotency-Key"
#: The answer header on every replay (the draft's examples name it; clients read it).
REPLAYED_HEADER = "Idempotent-Replayed"
#: The draft's bound; the same as the body's, so one key has one rule however sent.
MAX_HEADER_KEY_LENGTH = MAX_OPERATION_KEY_LENGTH

_TCHAR_EXTRA = set("!#$%&'*+-.^_`|~:/")


@dataclass(frozen=True)
class OperationKey:
    """The operation key of a submit, and whether it came in the header."""

    value: str
    from_header: bool


def _refuse(reason: str) -> InvalidRequestError:
    return InvalidRequestError(f"{HEADER}: {reason}", field=HEADER)


def _parse_string(raw: str) -> str:
    """An RFC 9651 sf-string (``raw`` starts with a quote): its unescaped value."""
    out: list[str] = []
    i = 1
    while i < len(raw):
        char = raw[i]
        if char == "\\":
            if i + 1 >= len(raw) or raw[i + 1] not in '"\\':
                raise _refuse('a backslash in a quoted key escapes only " or \\')
            out.append(raw[i + 1])
            i += 2
            continue
        if char == '"':
            if raw[i + 1 :].strip(" \t"):
                raise _refuse(
                    "send one key in one header; a second value or header was sent"
                )
            return "".join(out)
        if not " " <= char <= "~":
            raise _refuse("a quoted key holds printable ASCII characters only")
        out.append(char)
        i += 1
    raise _refuse("the quoted key has no closing quote")


def _parse_token(raw: str) -> str:
    """An RFC 9651 sf-token: ALPHA or ``*`` first, then tchar, ``:`` or ``/``."""
    if "," in raw:
        raise _refuse("send one key in one header; a second value or header was sent")
    first = raw[0]
    if not (first.isascii() and (first.isalpha() or first == "*")) or any(
        not (c.isascii() and (c.isalnum() or c in _TCHAR_EXTRA)) for c in raw
    ):
        raise _refuse(
            'send the key as a quoted string ("order:42"), or as a bare token that '
            "starts with a letter and has no spaces, quotes or commas"
        )
    return raw


def header_key(request: HttpRequest) -> str | None:
    """The key the ``Idempotency-Key`` header carries; None when there is none."""
    raw = request.headers.get(HEADER)
    if raw is None:
        return None
    raw = raw.strip(" \t")
    if not raw:
        raise _refuse("the header is empty; send the operation key in it")
    key = _parse_string(raw) if raw.startswith('"') else _parse_token(raw)
    if not key:
        raise _refuse("the key is empty")
    if len(key) > MAX_HEADER_KEY_LENGTH:
        raise _refuse(
            f"the key is {len(key)} characters; at most {MAX_HEADER_KEY_LENGTH}"
        )
    validate_operation_key(key)
    return key


def operation_key(request: HttpRequest, body_key: str | None) -> OperationKey:
    """The submit's operation key, from the header or the body (or both, if equal)."""
    from_header = header_key(request)
    if from_header is None and body_key is None:
        raise InvalidRequestError(
            "no operation key: send it in the Idempotency-Key header "
            '(Idempotency-Key: "order:42:charge") or as the body\'s operation_key',
            field="operation_key",
        )
    if from_header is not None and body_key is not None and from_header != body_key:
        raise InvalidRequestError(
            "the Idempotency-Key header and the body's operation_key name different "
            "operations; send one of them, or the same key in both",
            field=HEADER,
        )
    if from_header is not None:
        return OperationKey(from_header, from_header=True)
    assert body_key is not None
    return OperationKey(body_key, from_header=False)


#: Where the key policy is published (the draft: "publish expiration policy"); the
#: broker serves it itself, so the link resolves against any running broker.
POLICY_PATH = "/problems/#idempotency-key"


def with_policy_link(response: HttpResponse) -> HttpResponse:
    """``response`` with ``Link: <policy>; rel="describedby"``: how long a key is
    remembered (for as long as its effect exists) and what a reuse does."""
    response["Link"] = f'<{POLICY_PATH}>; rel="describedby"; type="text/html"'
    return response


# What the parser accepts, as a JSON Schema pattern (stricter only in leaving out
# optional whitespace around the value): a token, or a quoted String whose key does
# not start or end with a space (validate_operation_key refuses that).
_QCHAR = r'[!#-\[\]-~]|\\["\\]'
_HEADER_PATTERN = (
    r"^(?:[A-Za-z*][A-Za-z0-9!#$%&'*+.^_`|~:/-]*"
    rf'|"(?:{_QCHAR})(?:(?:{_QCHAR}| )*(?:{_QCHAR}))?")$'
)

#: The OpenAPI parameter object (django-ninja declares body and auth, not this).
IDEMPOTENCY_KEY_PARAMETER = {
    "in": "header",
    "name": HEADER,
    "required": False,
    "description": (
        "The operation key (draft-ietf-httpapi-idempotency-key-header): a quoted "
        "Structured Field String or a bare token, 1 to 255 printable ASCII "
        "characters, one header only. Instead of, or equal to, the body's "
        "operation_key. Sent this way, drift is 422 payload_conflict (the draft) "
        "instead of 409; every replay answers Idempotent-Replayed: true. A key is "
        "remembered for as long as its effect exists: the broker deletes no effect, "
        "so a key never expires and never names a second operation."
    ),
    "schema": {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_HEADER_KEY_LENGTH,
        "pattern": _HEADER_PATTERN,
    },
}


_LINK = {
    "description": "Where the key policy is published (rel=describedby).",
    "schema": {"type": "string"},
}
#: The submit's answer headers, for its OpenAPI responses.
SUBMIT_RESPONSE_HEADERS = {
    200: {
        "headers": {
            REPLAYED_HEADER: {
                "description": "On every replay.",
                "schema": {"type": "string", "enum": ["true"]},
            },
            "Link": _LINK,
        }
    },
    202: {"headers": {"Link": _LINK}},
}
