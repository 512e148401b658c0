"""A limit on request body size, enforced before the body is read (ASGI middleware).

Issue 12: a 300 MiB chunked upload with no Authorization header was read in full, to
disk, before the 401 - Django's ASGI handler reads the whole body before any
middleware or view runs - and a body over Django's own limit was a 500. Here, in
front of everything:

- a declared ``Content-Length`` over the limit is refused at once, and not a byte of
  the body is read;
- a body without one (chunked) is counted as it arrives, and refused as soon as the
  count passes the limit: at most the limit plus one receive of the server's is read.

Either way the answer is 413 ``payload_too_large`` (problem+json), authenticated or
not, with ``Connection: close`` so the server drops the rest of the upload instead of
reading it to keep the connection alive. ``config/asgi.py`` puts this outside the
in-flight limit, so an oversized upload never holds a request slot.
"""

from __future__ import annotations

import logging

from effect_broker.api.admission import ASGIApp, Message, Receive, Scope, Send
from effect_broker.api.problems import PROBLEM_JSON, problem_body
from effect_broker.domain.errors import PayloadTooLargeError

logger = logging.getLogger(__name__)


class _BodyTooLarge(Exception):
    """Raised out of ``receive`` into the application when the count passes the limit."""


class BodySizeLimit:
    """ASGI middleware: 413 for a request body over ``max_body_bytes``, before it is
    read past the limit."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        if max_body_bytes < 1:
            raise ValueError("max_body_bytes must be at least 1")
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await self._refuse(scope, send)
            return
        received = 0
        response_started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise _BodyTooLarge
            return message

        async def watched_send(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except _BodyTooLarge:
            # Django reads the whole body before it starts a response, so none has
            # started; an application that answered first has nothing left to say.
            if not response_started:
                await self._refuse(scope, send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        logger.warning(
            "refused: request body too large",
            extra={
                "action": "payload_too_large",
                "path": scope.get("path"),
                "limit": self.max_body_bytes,
            },
        )
        body = problem_body(
            PayloadTooLargeError.http_status,
            PayloadTooLargeError.code,
            f"request body exceeds {self.max_body_bytes} bytes",
            limit=self.max_body_bytes,
        )
        await send(
            {
                "type": "http.response.start",
                "status": PayloadTooLargeError.http_status,
                "headers": [
                    (b"content-type", PROBLEM_JSON.encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


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
