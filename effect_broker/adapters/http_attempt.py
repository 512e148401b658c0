"""One HTTP attempt's guards at the wire: the send gate, and the total time limit.

The base class checks ``request.gate`` before ``_send``; between that check and the
first byte a connection still has to be taken or opened, which can take the whole
connect timeout. A paused worker must not send after its lease could have passed
(issue 9, "send gate at the socket"), so ``GatedTransport`` checks the gate again on
its way into the transport and ``AttemptGuard.trace`` once more from httpcore's
``send_request_headers.started`` event, immediately before the request is written.
A ``SendRefusedError`` from either means no byte of the request left this process.

The attempt's total time (``gate.remaining()``, the lease the sweeper trusts) bounds
its I/O: every httpx timeout is capped by it, the body is read chunk by chunk against
it, and a watchdog shuts the socket down when it is spent - a trickling answer (one
byte just inside every read timeout, in the headers or the body) cannot keep an
attempt open. A connection reused from the pool (``keep_alive = true``) opens no
socket this attempt sees, so it has the caps and the chunk check but no watchdog.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import httpx

from effect_broker.adapters.base import SendGate
from effect_broker.domain.errors import SendRefusedError

#: The request extension that carries the attempt's guard to ``GatedTransport``.
EXTENSION = "effect_broker.attempt"

_BEFORE_WRITE = frozenset(
    {"http11.send_request_headers.started", "http2.send_request_headers.started"}
)

Trace = Callable[[str, dict[str, Any]], None]


class AttemptTimeLimitError(Exception):
    """The attempt's total time limit was spent while its answer was still coming."""


class AttemptGuard:
    """The gate and deadline of one attempt, consulted on the way to the wire."""

    def __init__(self, gate: SendGate, *, clock: Callable[[], float] = time.monotonic):
        self.gate = gate
        self._clock = clock
        limit = gate.remaining()
        self.deadline = None if math.isinf(limit) else clock() + max(limit, 0.0)
        #: True once the watchdog shut the socket down: the failure that follows is
        #: the time limit, not the target.
        self.expired = False
        self._lock = threading.Lock()
        self._done = False
        self._timer: threading.Timer | None = None

    def left(self) -> float:
        """Seconds until the deadline (inf without one, never negative)."""
        if self.deadline is None:
            return math.inf
        return max(0.0, self.deadline - self._clock())

    def spent(self) -> bool:
        """True when the deadline has passed."""
        return self.left() <= 0.0

    def check_before_write(self) -> None:
        """Raise ``SendRefusedError`` unless sending now is within lease and limit."""
        self.gate.check()
        if self.spent():
            raise SendRefusedError(
                "the attempt's time limit was spent before the request was written"
            )

    def cap(self, timeout: httpx.Timeout) -> httpx.Timeout:
        """``timeout`` with every phase capped by the time left."""
        left = self.left()
        if math.isinf(left):
            return timeout

        def capped(value: float | None) -> float:
            return left if value is None else min(value, left)

        return httpx.Timeout(
            connect=capped(timeout.connect),
            read=capped(timeout.read),
            write=capped(timeout.write),
            pool=capped(timeout.pool),
        )

    def tracer(self, inner: Trace | None) -> Trace:
        """An httpcore ``trace`` callback: arm the watchdog, check before writing."""

        def trace(event: str, info: dict[str, Any]) -> None:
            if inner is not None:
                inner(event, info)
            if event == "connection.connect_tcp.complete":
                self._arm(info.get("return_value"))
            elif event in _BEFORE_WRITE:
                self.check_before_write()

        return trace

    def read(self, response: httpx.Response) -> bytes:
        """The whole body, or ``AttemptTimeLimitError`` once the limit is spent."""
        chunks: list[bytes] = []
        for chunk in response.iter_bytes():
            chunks.append(chunk)
            if self.spent():
                raise AttemptTimeLimitError
        return b"".join(chunks)

    def _arm(self, stream: object) -> None:
        if self.deadline is None or stream is None:
            return
        get_info = getattr(stream, "get_extra_info", None)
        sock = get_info("socket") if get_info is not None else None
        if not isinstance(sock, socket.socket):
            return
        with self._lock:
            if self._done:
                return
            self._timer = threading.Timer(self.left(), self._expire, [sock])
            self._timer.daemon = True
            self._timer.start()

    def _expire(self, sock: socket.socket) -> None:
        with self._lock:
            if self._done:
                return
            self.expired = True
            # shutdown, not close: it wakes a recv/send blocked in another thread. A
            # socket httpcore already closed raises OSError here, which is harmless.
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def finish(self) -> None:
        """Disarm the watchdog; after this it never touches the socket."""
        with self._lock:
            self._done = True
            if self._timer is not None:
                self._timer.cancel()


class GatedTransport(httpx.BaseTransport):
    """Checks the attempt's gate before delegating, and installs its trace hook."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self._inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Refuse before a connection is taken; then check again before the write."""
        guard = request.extensions.pop(EXTENSION, None)
        if isinstance(guard, AttemptGuard):
            guard.check_before_write()
            request.extensions["trace"] = guard.tracer(request.extensions.get("trace"))
        return self._inner.handle_request(request)

    def close(self) -> None:
        """Close the wrapped transport."""
        self._inner.close()


__all__ = ["EXTENSION", "AttemptGuard", "AttemptTimeLimitError", "GatedTransport"]
