"""One HTTP attempt's guards at the wire: the send gate, one write, the time limit.

The base class checks ``request.gate`` before ``_send``; between that check and the
first byte a connection still has to be taken or opened, which can take the whole
connect timeout. A paused worker must not send after its lease could have passed
(issue 9, "send gate at the socket"), so ``GatedTransport`` checks the gate again on
its way into the transport and ``AttemptGuard.trace`` once more from httpcore's
``send_request_headers.started`` event. A ``SendRefusedError`` from either means no
byte of the request left this process.

The send window ends at the LAST byte, not the first (issue 19, item 4). httpcore
writes a request's headers and its body in two socket writes; a worker frozen between
them (a GC pause, a VM stall, SIGSTOP - the watchdog below is frozen with it) woke up
after its lease had been handed on, sent the body, and the target committed a second
charge. So every connection is opened through ``WireBackend``: its ``WireStream``
holds what httpcore writes and hands the whole request (headers and body up to
``HOLD_BYTES``) to the socket in ONE write when the request is complete, and checks
the gate immediately before that write. A stall anywhere before it is caught by that
check: nothing was sent. What is left is the stall between that check and the write
(docs/explanation/guarantees.md: measured, and closed by a ``fencing_header``).

The attempt's total time (``gate.remaining()``, the lease the sweeper trusts) bounds
its I/O: every httpx timeout is capped by it, the body is read chunk by chunk against
it, and a watchdog shuts the socket down when it is spent - a trickling answer (one
byte just inside every read timeout, in the headers or the body) cannot keep an
attempt open. A connection reused from the pool (``keep_alive = true``) opens no
socket this attempt sees, so it has the caps, the chunk check and the one write, but
no watchdog.
"""

from __future__ import annotations

import math
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from typing import Any

import httpcore
import httpx

from effect_broker import failpoints
from effect_broker.adapters.base import SendGate
from effect_broker.domain.clock import lease_seconds
from effect_broker.domain.errors import SendRefusedError

#: The request extension that carries the attempt's guard to ``GatedTransport``.
EXTENSION = "effect_broker.attempt"

_BEFORE_WRITE = frozenset(
    {"http11.send_request_headers.started", "http2.send_request_headers.started"}
)
#: httpcore has handed over the headers and is about to hand over the body.
_BETWEEN_HEADERS_AND_BODY = frozenset(
    {"http11.send_request_body.started", "http2.send_request_body.started"}
)
#: A request up to this size (headers and body) leaves in one write. The broker's
#: body is one chunk (canonical JSON), so a larger one also leaves in one write call
#: (the kernel may split it on the wire); only a streamed body is written in pieces.
HOLD_BYTES = 64 * 1024

Trace = Callable[[str, dict[str, Any]], None]


class AttemptTimeLimitError(Exception):
    """The attempt's total time limit was spent while its answer was still coming."""


class AttemptGuard:
    """The gate and deadline of one attempt, consulted on the way to the wire."""

    def __init__(
        self,
        gate: SendGate,
        *,
        subject: str | None = None,
        clock: Callable[[], float] = lease_seconds,
    ) -> None:
        self.gate = gate
        #: ``tenant_id/operation_key``: the failpoints at the wire fire for it.
        self.subject = subject
        # The gate's own clock (counts a suspend of the host): a host resumed after
        # the deadline finds it spent, whatever time.monotonic() says.
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
            elif event in _BETWEEN_HEADERS_AND_BODY and self.subject is not None:
                # Where a stall sent a late body before the one write (crash matrix
                # "frozen between headers and body"); the headers are still held.
                failpoints.hit("between_headers_and_body", subject=self.subject)

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


#: The guard of the attempt being written in this thread, for ``WireStream``.
_CURRENT: ContextVar[AttemptGuard | None] = ContextVar(
    "effect_broker_attempt", default=None
)


@contextmanager
def writing(guard: AttemptGuard) -> Iterator[None]:
    """While inside, this thread's ``WireStream`` writes check ``guard``'s gate."""
    token = _CURRENT.set(guard)
    try:
        yield
    finally:
        _CURRENT.reset(token)


class WireStream(httpcore.NetworkStream):
    """A connection that hands each request to the socket in one write, gate-checked.

    httpcore writes the request line and headers, then the body, then reads the
    answer. This stream holds the writes and sends them together when httpcore first
    reads (or when ``HOLD_BYTES`` are held), after checking the attempt's gate: a
    worker frozen anywhere before that check sends nothing once it wakes without its
    lease. Bytes held when the connection is closed are never sent.
    """

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner
        self._held: list[bytes] = []
        self._held_size = 0
        self._timeout: float | None = None
        #: Some byte of the current request has been written to the socket.
        self._sent = False
        #: The current request is written; the next write starts a new one.
        self._answering = False

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """Hold ``buffer`` until the request is complete (or too big to hold)."""
        if self._answering:  # a kept-alive connection starts its next request
            self._answering, self._sent = False, False
        if not buffer:
            return
        self._held.append(buffer)
        self._held_size += len(buffer)
        self._timeout = timeout
        if self._held_size >= HOLD_BYTES:
            self._flush()

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        """Send what is held (the whole request), then read the answer."""
        self._flush()
        self._answering = True
        return self._inner.read(max_bytes, timeout)

    def _flush(self) -> None:
        if not self._held:
            return
        data = b"".join(self._held)
        self._held.clear()
        self._held_size = 0
        guard = _CURRENT.get()
        if guard is not None:
            try:
                guard.check_before_write()
            except SendRefusedError:
                if not self._sent:
                    raise  # nothing of this request has left: "not sent" is true
                # Part of a streamed body already left: the rest would complete a
                # late request. Cut it instead (a truncated request commits nothing
                # at a target that honours Content-Length); the outcome is unknown.
                self._inner.close()
                raise httpcore.WriteError(
                    "the send gate closed while the request was being written"
                ) from None
            if not self._sent:
                # The one stall no local check can catch: after the gate, before the
                # write (crash matrix "frozen after the send gate").
                failpoints.hit("after_send_gate", subject=guard.subject)
        self._sent = True
        self._inner.write(data, timeout=self._timeout)

    def close(self) -> None:
        """Close the connection; a request still held is dropped, never sent."""
        self._held.clear()
        self._held_size = 0
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        """TLS over this connection; the TLS stream holds its writes the same way."""
        return WireStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        """The underlying stream's (the watchdog asks for ``"socket"``)."""
        return self._inner.get_extra_info(info)


class WireBackend(httpcore.NetworkBackend):
    """httpcore's network backend, every connection wrapped in a ``WireStream``."""

    def __init__(self, inner: httpcore.NetworkBackend | None = None) -> None:
        self._inner = inner or httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        """A TCP connection that writes each request once."""
        return WireStream(
            self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        )

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        """A Unix socket connection that writes each request once."""
        return WireStream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        """The wrapped backend's sleep."""
        self._inner.sleep(seconds)


class WireTransport(httpx.HTTPTransport):
    """httpx's HTTP/1.1 transport (no retries), its connections from ``WireBackend``.

    ``httpx.HTTPTransport`` builds its httpcore pool without a way to name the network
    backend, so this builds the pool it sends through (its ``_pool``, httpx 0.28 and
    0.29) the same way, with the backend. tests/contract/test_http_send_window.py
    counts the writes, so a change in httpx cannot silently split them again.
    """

    def __init__(self, *, limits: httpx.Limits) -> None:
        # Not super().__init__(): it would build a second pool (and SSL context).
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            retries=0,
            network_backend=WireBackend(),
        )


class GatedTransport(httpx.BaseTransport):
    """Checks the attempt's gate before delegating, and installs its trace hook."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self._inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Refuse before a connection is taken; then check again before the write."""
        guard = request.extensions.pop(EXTENSION, None)
        if not isinstance(guard, AttemptGuard):
            return self._inner.handle_request(request)
        guard.check_before_write()
        request.extensions["trace"] = guard.tracer(request.extensions.get("trace"))
        # The whole request is written inside handle_request (the answer's body is
        # read later, but nothing is written then), on this thread.
        with writing(guard):
            return self._inner.handle_request(request)

    def close(self) -> None:
        """Close the wrapped transport."""
        self._inner.close()


__all__ = [
    "EXTENSION",
    "HOLD_BYTES",
    "AttemptGuard",
    "AttemptTimeLimitError",
    "GatedTransport",
    "WireBackend",
    "WireStream",
    "WireTransport",
    "writing",
]
