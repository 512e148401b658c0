"""A fault proxy of the conformance kit's own, between the real adapter and a target.

``effect-broker contracts conform`` (issue 22, item 1) must prove a target with the
faults that matter to the horizon, without the target's cooperation: a user's own
sandbox has no "lose the next answer" lever. This proxy listens on loopback, forwards
every request to the target's origin (http or https) and, for the next *effect
request* only (the adapter's create call, never a lookup), plays one armed fault:

* ``lose_answer`` - forward, read the target's answer (it committed), then close the
  connection without answering;
* ``reset`` - read the request, then reset the connection (RST) without forwarding
  it: a request that never arrived;
* ``slow`` - forward, read the answer, and hold it ``hold`` seconds (past the
  attempt's time limit) before writing it;
* ``twice`` - forward the request twice (as a retrying network layer would) and
  answer with the second answer.

Every effect request's exchange is recorded with the answers the target gave, so a
check can name the target's own evidence ("answer ch_1, lost; resend answered ch_2").
Stdlib server and httpx client only; no retry, no redirect, no environment proxy.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal
from urllib.parse import urlsplit

import httpx

Fault = Literal["lose_answer", "reset", "slow", "twice"]
FAULTS: tuple[Fault, ...] = ("lose_answer", "reset", "slow", "twice")
#: Decides whether a request is an effect request: (method, path, body).
EffectPredicate = Callable[[str, str, bytes], bool]

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
    }
)
_MAX_BODY = 8 << 20


@dataclass(frozen=True, slots=True)
class Answer:
    """One answer the target gave to a forwarded effect request."""

    status: int
    content_type: str
    body: bytes


@dataclass(slots=True)
class Exchange:
    """One effect request that reached the proxy, and what the proxy did with it."""

    fault: Fault | None
    #: How many times it was forwarded to the target (0 after a reset, 2 for twice).
    forwarded: int = 0
    answers: list[Answer] = field(default_factory=list)


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url``."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class FaultProxy:
    """A loopback reverse proxy to one origin that plays armed faults."""

    def __init__(
        self,
        origin: str,
        is_effect: EffectPredicate,
        *,
        is_lookup: EffectPredicate | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.origin = origin.rstrip("/")
        self.is_effect = is_effect
        self.is_lookup = is_lookup
        self.exchanges: list[Exchange] = []
        #: Lookups forwarded to the target (every request that is not an effect
        #: request, unless ``is_lookup`` says which are: an MCP session's handshake
        #: and listing are not lookups).
        self.other_requests = 0
        self._armed: list[tuple[Fault, float]] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout),
            follow_redirects=False,
            trust_env=False,
            transport=httpx.HTTPTransport(retries=0),
        )
        proxy = self

        class Handler(_ProxyHandler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fault-proxy",
            daemon=True,
        )
        self._thread.start()

    @property
    def url(self) -> str:
        """The proxy's own origin, to put in place of the target's."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def rewrite(self, url: str) -> str:
        """``url`` with the target's origin replaced by the proxy's."""
        if not url.startswith(self.origin):
            raise ValueError(f"{url!r} is not under {self.origin!r}")
        return self.url + url[len(self.origin) :]

    def arm(self, fault: Fault, *, hold: float = 0.0) -> None:
        """Play ``fault`` on the next effect request (faults queue in order)."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        with self._lock:
            self._armed.append((fault, hold))

    def disarm(self) -> None:
        """Drop every fault not yet played (its request never came)."""
        with self._lock:
            self._armed.clear()

    def effect_requests_forwarded(self) -> int:
        """Effect requests that reached the target (a twice-delivered one counts 2)."""
        with self._lock:
            return sum(exchange.forwarded for exchange in self.exchanges)

    def last(self) -> Exchange:
        """The most recent effect request's exchange."""
        with self._lock:
            return self.exchanges[-1]

    def close(self) -> None:
        """Stop serving (wakes a held answer) and close the client."""
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._client.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- used by the handler -------------------------------------------------------

    def _take(self) -> tuple[Fault | None, float]:
        with self._lock:
            return self._armed.pop(0) if self._armed else (None, 0.0)

    def _record(self, exchange: Exchange) -> None:
        with self._lock:
            self.exchanges.append(exchange)

    def _count_other(self) -> None:
        with self._lock:
            self.other_requests += 1


class _ProxyHandler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Silent: paths may carry keys."""

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _handle(self) -> None:
        owner = self.owner
        self.close_connection = True  # one request per connection: simple and honest
        if self.headers.get("Transfer-Encoding"):
            self._reply(Answer(501, "text/plain", b"chunked requests unsupported"))
            return
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 <= length <= _MAX_BODY:
            self._reply(Answer(413, "text/plain", b"body too large"))
            return
        body = self.rfile.read(length)
        headers = {
            name: value
            for name, value in self.headers.items()
            if name.lower() not in _HOP_BY_HOP
        }
        # Identity, so the bytes relayed are the bytes recorded as evidence.
        headers["Accept-Encoding"] = "identity"
        target = owner.origin + self.path
        if not owner.is_effect(self.command, self.path, body):
            if owner.is_lookup is None or owner.is_lookup(self.command, self.path, body):
                owner._count_other()
            self._stream(target, headers, body)
            return
        fault, hold = owner._take()
        exchange = Exchange(fault)
        # Recorded on arrival and filled in place: a held answer's exchange is read
        # while the proxy still holds it.
        owner._record(exchange)
        try:
            if fault == "reset":
                self._reset()
                return
            answer = self._forward(target, headers, body, exchange)
            if fault == "twice":
                answer = self._forward(target, headers, body, exchange)
            if fault == "lose_answer":
                self._drop()
                return
            if fault == "slow":
                owner._stopping.wait(hold)
            self._reply(answer)
        except httpx.HTTPError as exc:
            # The target itself did not answer: say so as a gateway would (the
            # adapter reads a 502 as "unknown").
            self._reply(Answer(502, "text/plain", f"{type(exc).__name__}".encode()))

    def _forward(
        self, target: str, headers: dict[str, str], body: bytes, exchange: Exchange
    ) -> Answer:
        exchange.forwarded += 1
        response = self.owner._client.request(
            self.command, target, headers=headers, content=body
        )
        answer = Answer(
            response.status_code,
            response.headers.get("content-type", ""),
            response.content,
        )
        exchange.answers.append(answer)
        return answer

    def _stream(self, target: str, headers: dict[str, str], body: bytes) -> None:
        # Relayed as it arrives (an MCP server's event stream stays open), then closed.
        try:
            request = self.owner._client.build_request(
                self.command, target, headers=headers, content=body
            )
            response = self.owner._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            self._reply(Answer(502, "text/plain", type(exc).__name__.encode()))
            return
        try:
            self.send_response_only(response.status_code)
            for name, value in response.headers.items():
                if name.lower() not in _HOP_BY_HOP:
                    self.send_header(name, value)
            self.send_header("Connection", "close")
            self.end_headers()
            for chunk in response.iter_raw():
                self.wfile.write(chunk)
                self.wfile.flush()
        except (OSError, httpx.HTTPError):
            pass
        finally:
            response.close()

    def _reply(self, answer: Answer) -> None:
        try:
            self.send_response_only(answer.status)
            if answer.content_type:
                self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(answer.body)
            self.wfile.flush()
        except OSError:
            pass  # the client gave up (a slow answer past its limit)

    def _drop(self) -> None:
        # No status line: the client sees the connection end after its request.
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _reset(self) -> None:
        # SO_LINGER 0 makes close() send RST: "connection reset by peer".
        try:
            self.connection.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
            self.connection.close()
        except OSError:
            pass


__all__ = ["FAULTS", "Answer", "Exchange", "Fault", "FaultProxy", "origin_of"]
