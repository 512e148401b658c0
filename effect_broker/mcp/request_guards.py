"""Two checks streamable-HTTP MCP requests pass that the REST API gets elsewhere
(issue 19, item 12); both answer problem+json, as the other ``/mcp`` guards do.

- ``OriginGuard``: the MCP specification asks servers to validate ``Origin`` against
  DNS rebinding: a page on ``http://evil.example`` whose name is rebound to the
  broker's address makes the browser send its requests there. A request with no
  ``Origin`` (every non-browser client) passes; one with an ``Origin`` passes only if
  it is listed (``EFFECT_BROKER_MCP_ALLOWED_ORIGINS``), else 403 ``origin_not_allowed``.
- ``StrictJsonBody``: the SDK parses JSON-RPC itself, leniently: ``1e-400`` became 0
  and of two equal keys the last won, where REST refuses both. The body of a POST is
  parsed first with REST's own parser (``domain.canonical.parse_json_strict``); a
  refusal is REST's 400 (``invalid_json`` or ``number_out_of_range``), and nothing
  reaches a tool. Duplicate keys are gone once parsed, so only the raw body can tell.
"""

from __future__ import annotations

from collections.abc import Iterable

from effect_broker.api.admission import ASGIApp, Message, Receive, Scope, Send
from effect_broker.api.problems import PROBLEM_JSON, problem_body
from effect_broker.domain.canonical import parse_json_strict
from effect_broker.domain.errors import (
    EffectBrokerError,
    InvalidJsonError,
    NumberOutOfRangeError,
    OriginNotAllowedError,
)

#: Origins of pages on this machine, as the SDK allows them for a loopback bind.
LOOPBACK_ORIGINS = ("http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*")


async def send_problem(send: Send, error: EffectBrokerError) -> None:
    """``error`` as its problem+json response."""
    body = problem_body(error.http_status, error.code, str(error), **_scalars(error))
    await send(
        {
            "type": "http.response.start",
            "status": error.http_status,
            "headers": [
                (b"content-type", PROBLEM_JSON.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _scalars(error: EffectBrokerError) -> dict[str, object]:
    return {
        key: value
        for key, value in error.details.items()
        if isinstance(value, str | int | bool)
    }


def origin_allowed(origin: str, allowed: Iterable[str]) -> bool:
    """True when ``origin`` is listed exactly, or matches ``scheme://host:*``."""
    origin = origin.strip().lower()
    for pattern in allowed:
        pattern = pattern.strip().lower().rstrip("/")
        if origin == pattern:
            return True
        if pattern.endswith(":*"):
            base, _, port = origin.rpartition(":")
            if base == pattern[:-2] and port.isdigit():
                return True
    return False


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


class OriginGuard:
    """ASGI: 403 ``origin_not_allowed`` for a request whose ``Origin`` is not listed."""

    def __init__(self, app: ASGIApp, *, allowed_origins: Iterable[str]) -> None:
        self.app = app
        self.allowed_origins = tuple(allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") != "/healthz":
            origin = _header(scope, b"origin")
            if origin is not None and not origin_allowed(origin, self.allowed_origins):
                # The origin is not echoed: it is the caller's text.
                await send_problem(send, OriginNotAllowedError())
                return
        await self.app(scope, receive, send)


class StrictJsonBody:
    """ASGI: a POST body must pass the REST API's strict JSON parser (module doc).

    Sits behind ``BodySizeLimit``, which bounds what is read here."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # The client left before its body was complete: nothing to answer.
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            parse_json_strict(body)
        except (InvalidJsonError, NumberOutOfRangeError) as exc:
            await send_problem(send, exc)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
