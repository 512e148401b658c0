"""Limits on a request body: its framing, its size and how long it may take to arrive,
enforced before the application sees the request (ASGI middleware).

Issue 12: a 300 MiB chunked upload with no Authorization header was read in full, to
disk, before the 401 - Django's ASGI handler reads the whole body before any
middleware or view runs - and a body over Django's own limit was a 500. Issue 19: 8
connections trickling one byte every 3 s made every other request a 503 for as long
as they trickled, because each held a request slot (``admission.InFlightLimit``)
while Django waited for its body, and nothing bounded that wait. Here, in front of
everything:

- a request carrying both ``Content-Length`` and ``Transfer-Encoding`` is refused
  with 400 ``invalid_request`` (RFC 9112 section 6.1: such a message may be an
  attempt at request smuggling; a server that processes it must close the
  connection after responding, and the server here - uvicorn with h11 - processed it
  and kept the connection open);
- a declared ``Content-Length`` over the limit is refused at once, and not a byte of
  the body is read;
- the body is then read here, whole, before the application is called, so a request
  takes a slot only once its body has arrived: a slow body holds a connection and a
  coroutine, never capacity other requests need. A body without a length (chunked)
  is counted as it arrives and refused as soon as the count passes the limit: at
  most the limit plus one receive of the server's is read;
- the body must arrive within ``read_timeout`` seconds of the request head, and at
  ``min_rate`` bytes per second on average after a head start of
  ``GRACE_SECONDS`` (at time *t* after the head, at least ``min_rate * (t -
  GRACE_SECONDS)`` bytes must have arrived); a body too slow for either is refused
  with 408 ``request_timeout`` as soon as it falls behind.

A refusal is problem+json with ``Connection: close``, so the server drops the rest of
the upload instead of reading it to keep the connection alive. Holding the body in
memory costs at most the size limit per request, which Django would hold anyway.
``config/asgi.py`` puts this outside the in-flight limit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from django.conf import settings

from effect_broker.api.admission import ASGIApp, Message, Receive, Scope, Send
from effect_broker.api.problems import PROBLEM_JSON, problem_body
from effect_broker.domain.errors import (
    InvalidRequestError,
    PayloadTooLargeError,
    RequestTimeoutError,
)

logger = logging.getLogger(__name__)

#: Seconds a body may take before the minimum rate applies: covers a client's first
#: round trips and a short pause, far less than a trickle can hold a connection.
GRACE_SECONDS = 5.0
#: Defaults of ``EFFECT_BROKER_BODY_TIMEOUT`` and ``EFFECT_BROKER_BODY_MIN_RATE``
#: (config/settings.py): a 256 KiB body must then arrive at ~9 KB/s or better.
DEFAULT_READ_TIMEOUT = 30.0
DEFAULT_MIN_RATE = 1024.0


class _TooSlow(Exception):
    """The body fell behind its deadline or the minimum rate."""


class BodySizeLimit:
    """ASGI middleware: refuse ambiguous framing (400), a body over
    ``max_body_bytes`` (413, before it is read past the limit) and a body slower than
    the time limits (408); hand the application the body only once it has arrived."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        min_rate: float = DEFAULT_MIN_RATE,
        grace: float = GRACE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_body_bytes < 1:
            raise ValueError("max_body_bytes must be at least 1")
        if not (read_timeout > 0 and min_rate > 0):
            raise ValueError("read_timeout and min_rate must be positive")
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.read_timeout = read_timeout
        self.min_rate = min_rate
        self.grace = grace
        self._clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _has_header(scope, b"transfer-encoding") and _has_header(
            scope, b"content-length"
        ):
            await self._refuse(
                scope,
                send,
                InvalidRequestError.http_status,
                InvalidRequestError.code,
                "a request must not carry both Content-Length and Transfer-Encoding",
                reason="ambiguous_framing",
            )
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await self._refuse_too_large(scope, send)
            return
        try:
            messages = await self._read_body(receive)
        except _TooSlow:
            await self._refuse(
                scope,
                send,
                RequestTimeoutError.http_status,
                RequestTimeoutError.code,
                f"request body too slow: it must arrive within {self.read_timeout:g} s, "
                f"at {self.min_rate:g} bytes per second or faster after the first "
                f"{self.grace:g} s",
                reason="slow_body",
            )
            return
        if messages is None:
            await self._refuse_too_large(scope, send)
            return

        async def replayed_receive() -> Message:
            # The body as it arrived, then the client's own messages (a disconnect).
            if messages:
                return messages.pop(0)
            return await receive()

        await self.app(scope, replayed_receive, send)

    async def _read_body(self, receive: Receive) -> list[Message] | None:
        """The body's messages, read within the limits; None when it is too large.
        Raise ``_TooSlow`` when it falls behind (module docstring)."""
        started = self._clock()
        received = 0
        messages: list[Message] = []
        while True:
            allowed = min(self.read_timeout, self.grace + received / self.min_rate)
            remaining = started + allowed - self._clock()
            if remaining <= 0:
                raise _TooSlow
            try:
                async with asyncio.timeout(remaining):
                    message = await receive()
            except TimeoutError:
                raise _TooSlow from None
            messages.append(message)
            if message["type"] != "http.request":
                return messages  # a disconnect: the application hears it as it is
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:
                return None
            if not message.get("more_body"):
                return messages

    async def _refuse_too_large(self, scope: Scope, send: Send) -> None:
        await self._refuse(
            scope,
            send,
            PayloadTooLargeError.http_status,
            PayloadTooLargeError.code,
            f"request body exceeds {self.max_body_bytes} bytes",
            reason="payload_too_large",
            limit=self.max_body_bytes,
        )

    async def _refuse(
        self,
        scope: Scope,
        send: Send,
        status: int,
        code: str,
        detail: str,
        *,
        reason: str,
        **extra: object,
    ) -> None:
        logger.warning(
            "refused: %s",
            reason.replace("_", " "),
            extra={"action": reason, "path": scope.get("path"), **extra},
        )
        body = problem_body(status, code, detail, **extra)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", PROBLEM_JSON.encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def body_limits(app: ASGIApp) -> BodySizeLimit:
    """``app`` behind the limits the settings configure (``EFFECT_BROKER_MAX_BODY_BYTES``,
    ``EFFECT_BROKER_BODY_TIMEOUT``, ``EFFECT_BROKER_BODY_MIN_RATE``): one place, so
    the REST API and every MCP transport apply the same ones."""
    return BodySizeLimit(
        app,
        max_body_bytes=settings.EFFECT_BROKER_MAX_BODY_BYTES,
        read_timeout=settings.EFFECT_BROKER_BODY_TIMEOUT,
        min_rate=settings.EFFECT_BROKER_BODY_MIN_RATE,
    )


def _has_header(scope: Scope, wanted: bytes) -> bool:
    return any(name.lower() == wanted for name, _ in scope.get("headers", ()))


def _content_length(scope: Scope) -> int | None:
    """The declared body length, or None when there is none (chunked) or it is not a
    number (the server refuses that before the application sees it)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
