"""A limit on requests in flight in one API process (ASGI middleware).

Without it, every request the server accepted ran at once in its own thread with its
own database connection: open connections followed load with no bound (53 at
concurrency 64) and, past PostgreSQL's ``max_connections``, became 500s (issue 13).

Here at most ``max_in_flight`` HTTP requests run; the next ones wait in a FIFO queue
of at most ``max_queued`` for at most ``queue_timeout`` seconds, and are then refused
with 503 ``overloaded`` (problem+json, ``Retry-After``). A refused request never
reached Django: nothing was done, so a caller may retry it as it is. By default the
limit equals the database pool's size (``config.capacity.admission``), so an admitted
request does not wait for a connection.

``/healthz`` is not limited: it touches no database and answers "is the process
alive"; failing it because the process is busy would get a healthy, loaded process
restarted. ``/readyz`` is limited, since it needs a connection like any request.
Static files (``/static/``, the admin's CSS and the docs' assets served by WhiteNoise)
touch no database either: a page's dozen asset requests must not take the request
slots its API calls need. Nor is the effect long-poll (``GET /v1/effects/{id}/wait``,
``effect_broker.api.effect_wait``), for the reason ``/mcp`` is not (``config/asgi.py``):
it spends up to 25 s waiting while holding no connection, and a slot held that long
per waiting agent would starve every other route; its few short reads are bounded by
the same pool.

The middleware also answers the ASGI lifespan protocol, which Django does not speak,
and closes the database pool at shutdown so PostgreSQL sees clean disconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async

from effect_broker.api.problems import (
    PROBLEM_JSON,
    RETRY_AFTER_SECONDS,
    overloaded_body,
)

logger = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
#: Any ASGI 3 application (Django's handler annotates its arguments more narrowly).
ASGIApp = Callable[..., Awaitable[None]]

#: Paths outside the limit (see the module docstring).
UNLIMITED_PATHS = frozenset({"/healthz"})
UNLIMITED_PREFIXES = ("/static/",)
#: The effect long-poll: ``/v1/effects/<one segment>/wait``.
LONG_POLL = re.compile(r"/v1/effects/[^/]+/wait")


class InFlightLimit:
    """ASGI middleware: at most ``max_in_flight`` requests at once, a bounded wait
    for the rest, then 503 ``overloaded``."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_in_flight: int,
        max_queued: int,
        queue_timeout: float,
        on_shutdown: Callable[[], None] | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.app = app
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued
        self.queue_timeout = queue_timeout
        self._on_shutdown = on_shutdown
        self._in_flight = 0
        # Each waiter is a future that is resolved when a finishing request hands
        # its slot over; the slot count does not change on a hand-over.
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def in_flight(self) -> int:
        """Requests running now."""
        return self._in_flight

    @property
    def queued(self) -> int:
        """Requests waiting for a slot now."""
        return sum(1 for w in self._waiters if not w.done())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        path = scope.get("path") or ""
        if (
            scope["type"] != "http"
            or path in UNLIMITED_PATHS
            or path.startswith(UNLIMITED_PREFIXES)
            or LONG_POLL.fullmatch(path)
        ):
            await self.app(scope, receive, send)
            return
        if not await self._acquire():
            logger.warning(
                "refused: too many requests in flight",
                extra={
                    "action": "overloaded",
                    "reason": "in_flight_limit",
                    "path": scope.get("path"),
                },
            )
            await _send_overloaded(send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self._release()

    async def _acquire(self) -> bool:
        """Take a slot, waiting in line for one; False when refused."""
        # A free slot implies nobody is waiting: _release hands a slot to a waiter
        # rather than freeing it, so waiters exist only while every slot is taken.
        if self._in_flight < self.max_in_flight:
            self._in_flight += 1
            return True
        # Waiters that just gave up leave the deque in their own ``finally``; until
        # then they count against the bound, which errs on the side of refusing.
        if len(self._waiters) >= self.max_queued:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self.queue_timeout):
                await waiter
            return True
        except TimeoutError:
            # The slot may have been handed over just as the timeout fired: then it
            # is ours, and refusing now would lose it.
            return waiter.done() and not waiter.cancelled()
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # handed a slot, but gone: pass it on
            raise
        finally:
            if not waiter.done():
                waiter.cancel()
            with contextlib.suppress(ValueError):  # already taken off by _release
                self._waiters.remove(waiter)

    def _release(self) -> None:
        """Hand this request's slot to the next waiter, or free it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._in_flight -= 1

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._on_shutdown is not None:
                    try:
                        await sync_to_async(self._on_shutdown, thread_sensitive=False)()
                    except Exception:  # a failed close must not hang the shutdown
                        logger.exception("shutdown hook failed", extra={"action": "api"})
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _send_overloaded(send: Send) -> None:
    body = overloaded_body("in_flight_limit")
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", PROBLEM_JSON.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(RETRY_AFTER_SECONDS).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
