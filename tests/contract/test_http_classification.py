"""The HTTP adapter's classification table, proved with real loopback sockets.

Spec "State machine" rules 2-3: only proof of non-commit is RETRYABLE; anything after
the request may have left is OUTCOME_UNKNOWN. Every case also counts connections and
requests at the server: one dispatch is exactly one request (no hidden retries)."""

from __future__ import annotations

import logging
import math
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import replace
from datetime import timedelta
from typing import Any

import httpx
import pytest

from effect_broker.adapters.base import DispatchRequest, DispatchResult, ProbeRequest
from effect_broker.adapters.conformance import make_effect_record
from effect_broker.adapters.http_adapter import HttpAdapter
from effect_broker.domain.canonical import canonical_json
from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.errors import (
    ConfigurationError,
    OutcomeUnknownError,
    RetryableAdapterError,
    SendRefusedError,
    TerminalAdapterError,
)
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import ProbeStatus, SafetyClass
from effect_broker.services.runtime import EngineTiming

ARGUMENTS = {"order": "42", "amount_minor": 1999, "currency": "EUR"}
KEY = "dk_" + "A" * 40

Then = Callable[[socket.socket, threading.Event], None]


def read_request(conn: socket.socket) -> bytes:
    """Read one HTTP request: headers, then a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class ScriptedServer:
    """A loopback TCP server: per connection, read the request, then run ``then``."""

    def __init__(self, then: Then, *, read: bool = True) -> None:
        self.then, self.read = then, read
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.requests: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            with conn:
                conn.settimeout(5)
                if self.read:
                    self.requests.append(read_request(conn))
                self.then(conn, self.stop)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def respond(
    status: int, body: bytes = b"{}", content_type: str = "application/json"
) -> Then:
    def then(conn: socket.socket, _: threading.Event) -> None:
        conn.sendall(
            b"HTTP/1.1 %d Scripted\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s"
            % (status, content_type.encode(), len(body), body)
        )

    return then


def close_quietly(conn: socket.socket, _: threading.Event) -> None:
    conn.shutdown(socket.SHUT_RDWR)  # FIN after the request was read: no status line


def reset(conn: socket.socket, _: threading.Event) -> None:
    # SO_LINGER 0 makes close() send RST instead of FIN: a connection reset.
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def hang(_: socket.socket, stop: threading.Event) -> None:
    stop.wait(10)


def reset_mid_body(conn: socket.socket, stop: threading.Event) -> None:
    # Take the headers and part of the body, then reset: the client is mid-write.
    conn.recv(65536)
    reset(conn, stop)


@pytest.fixture
def serve() -> Iterator[Callable[..., ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def start(then: Then, **kwargs: Any) -> ScriptedServer:
        servers.append(ScriptedServer(then, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def adapter_for(url: str, safety: str = "unsafe", **options: object) -> HttpAdapter:
    if safety == "idempotent":
        options.setdefault("idempotency_header", "Idempotency-Key")
    contract = EffectContract(
        name="http.test",
        version="1",
        tool="charge",
        safety=SafetyClass(safety),
        key_retention=timedelta(hours=1) if safety == "idempotent" else None,
        settlement_bound=timedelta(seconds=1) if safety == "reconcilable" else None,
        adapter="http",
        adapter_options={"url": url, "timeout": "2s", "connect_timeout": "1s", **options},
    )
    return HttpAdapter(contract)


def record(adapter: HttpAdapter) -> EffectRecord:
    return make_effect_record(adapter.contract, "order:42:charge:v1", ARGUMENTS, KEY)


def dispatch(
    adapter: HttpAdapter, arguments: dict[str, object] = ARGUMENTS
) -> DispatchResult:
    request = DispatchRequest(record(adapter), arguments, "attempt-1", adapter.contract)
    return adapter.dispatch(request)


def probe_status(adapter: HttpAdapter) -> tuple[ProbeStatus, str | None]:
    result = adapter.probe(ProbeRequest(record(adapter), ARGUMENTS, adapter.contract))
    return result.status, result.external_id


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])


# --- transport failures -----------------------------------------------------------------


def test_refused_connection_is_retryable_because_nothing_was_written() -> None:
    with (
        adapter_for(f"http://127.0.0.1:{free_port()}/charges") as adapter,
        pytest.raises(RetryableAdapterError) as caught,
    ):
        dispatch(adapter)
    assert isinstance(caught.value.__cause__, httpx.ConnectError)


def test_connect_timeout_is_retryable() -> None:
    # Given a listener whose accept queue is full: the kernel drops further SYNs, so
    # the connection is never established (a real connect timeout, no byte written)
    with socket.create_server(("127.0.0.1", 0), backlog=0) as full:
        address = full.getsockname()
        fillers = [socket.socket() for _ in range(4)]
        try:
            for filler in fillers:
                filler.setblocking(False)
                filler.connect_ex(address)
            url = f"http://127.0.0.1:{address[1]}/charges"
            with (
                adapter_for(url, connect_timeout="200ms") as adapter,
                pytest.raises(RetryableAdapterError) as caught,
            ):
                dispatch(adapter)
        finally:
            for filler in fillers:
                filler.close()
    assert isinstance(caught.value.__cause__, httpx.ConnectTimeout)


@pytest.mark.parametrize(
    ("then", "cause"),
    [
        (close_quietly, httpx.RemoteProtocolError),
        (reset, httpx.ReadError),
        (hang, httpx.ReadTimeout),
    ],
    ids=["closed-after-read", "reset-after-read", "never-answers"],
)
def test_no_answer_after_the_request_was_read_is_unknown(
    serve: Callable[..., ScriptedServer], then: Then, cause: type[Exception]
) -> None:
    server = serve(then)
    with (
        adapter_for(f"{server.url}/charges", timeout="300ms") as adapter,
        pytest.raises(OutcomeUnknownError) as caught,
    ):
        dispatch(adapter)
    assert isinstance(caught.value.__cause__, cause)
    # The whole request reached the server, exactly once.
    assert server.connections == 1
    assert len(server.requests) == 1
    assert server.requests[0].endswith(canonical_json(ARGUMENTS))


@pytest.mark.parametrize(
    ("read", "then", "cause"),
    [
        (False, hang, httpx.WriteTimeout),
        # httpcore swallows the WriteError and reads for a response (a server may
        # answer early), so the reset surfaces on that read.
        (
            False,
            reset_mid_body,
            (httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError),
        ),
    ],
    ids=["peer-never-reads", "peer-resets-mid-body"],
)
def test_failure_while_writing_the_body_is_unknown(
    serve: Callable[..., ScriptedServer], read: bool, then: Then, cause: Any
) -> None:
    # Given a body far larger than the socket buffers, so the write is in progress
    server = serve(then, read=read)
    big = {**ARGUMENTS, "memo": "x" * (16 << 20)}
    with (
        adapter_for(f"{server.url}/charges", timeout="300ms") as adapter,
        pytest.raises(OutcomeUnknownError) as caught,
    ):
        dispatch(adapter, big)
    # Part of the request left: never retryable
    assert isinstance(caught.value.__cause__, cause)
    assert server.connections == 1


# --- answers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error"),
    [
        # Issue 9, defect 4: a proxy's 503 can arrive after the backend committed, so
        # only 429 proves non-commit by default (503 was retryable before).
        (503, OutcomeUnknownError),
        (429, RetryableAdapterError),
        (422, TerminalAdapterError),
        (400, TerminalAdapterError),
        (404, TerminalAdapterError),
        (500, OutcomeUnknownError),
        (502, OutcomeUnknownError),
        (301, OutcomeUnknownError),
    ],
)
def test_status_codes_are_classified(
    serve: Callable[..., ScriptedServer], status: int, error: type[Exception]
) -> None:
    server = serve(respond(status, b'{"error": "x"}'))
    with adapter_for(f"{server.url}/charges") as adapter, pytest.raises(error):
        dispatch(adapter)
    assert (server.connections, len(server.requests)) == (1, 1)  # no retry, no redirect


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_5xx_is_retryable_only_when_the_contract_declares_it(
    serve: Callable[..., ScriptedServer], status: int
) -> None:
    # Given a target whose contract documents this 5xx as "not committed"
    server = serve(respond(status, b'{"error": "x"}'))
    url = f"{server.url}/charges"
    with (
        adapter_for(url, retryable_statuses=[429, status]) as adapter,
        pytest.raises(RetryableAdapterError) as caught,
    ):
        dispatch(adapter)
    assert caught.value.details["http_status"] == status
    # And without the declaration the same answer is unknown
    with adapter_for(url) as adapter, pytest.raises(OutcomeUnknownError):
        dispatch(adapter)
    assert (server.connections, len(server.requests)) == (2, 2)


@pytest.mark.parametrize("status", [409, 423])
def test_key_in_use_answer_to_an_idempotent_contract_is_retry_later(
    serve: Callable[..., ScriptedServer], status: int
) -> None:
    # Issue 9, defect 3: "request with this key in progress" answered to a same-key
    # resend means this request was not applied; the earlier one may still commit,
    # so it is never a final failure.
    server = serve(respond(status, b'{"error": "idempotency_key_in_use"}'))
    with (
        adapter_for(f"{server.url}/charges", "idempotent") as adapter,
        pytest.raises(RetryableAdapterError) as caught,
    ):
        dispatch(adapter)
    assert type(caught.value) is RetryableAdapterError
    assert caught.value.details["reason"] == "key_in_use"
    assert caught.value.details["http_status"] == status
    assert (server.connections, len(server.requests)) == (1, 1)


def test_in_progress_statuses_can_be_declared_and_other_4xx_stay_terminal(
    serve: Callable[..., ScriptedServer],
) -> None:
    server = serve(respond(425, b'{"error": "in_progress"}'))
    url = f"{server.url}/charges"
    with (
        adapter_for(url, "idempotent", in_progress_statuses=[425]) as adapter,
        pytest.raises(RetryableAdapterError) as caught,
    ):
        dispatch(adapter)
    assert caught.value.details["reason"] == "key_in_use"
    # 409 is no longer declared "in progress": the default 4xx rule applies again
    server.then = respond(409, b'{"error": "conflict"}')
    with (
        adapter_for(url, "idempotent", in_progress_statuses=[425]) as adapter,
        pytest.raises(TerminalAdapterError),
    ):
        dispatch(adapter)


def test_without_an_idempotency_key_409_is_no_key_in_use_answer(
    serve: Callable[..., ScriptedServer],
) -> None:
    # Retrying after "in progress" is only safe when the key dedups the resend.
    server = serve(respond(409, b'{"error": "idempotency_key_in_use"}'))
    with (
        adapter_for(f"{server.url}/charges") as adapter,
        pytest.raises(TerminalAdapterError),
    ):
        dispatch(adapter)


def test_explicit_terminal_statuses_leave_other_4xx_unknown(
    serve: Callable[..., ScriptedServer],
) -> None:
    server = serve(respond(409))
    url = f"{server.url}/charges"
    with (
        adapter_for(url, terminal_statuses=[422]) as adapter,
        pytest.raises(OutcomeUnknownError),
    ):
        dispatch(adapter)


@pytest.mark.parametrize(
    ("body", "content_type"),
    [(b"ok", "text/plain"), (b"[1, 2]", "application/json"), (b"", "application/json")],
    ids=["text", "array", "empty"],
)
def test_2xx_without_a_json_object_is_unknown(
    serve: Callable[..., ScriptedServer], body: bytes, content_type: str
) -> None:
    server = serve(respond(200, body, content_type))
    with (
        adapter_for(f"{server.url}/charges") as adapter,
        pytest.raises(OutcomeUnknownError),
    ):
        dispatch(adapter)


def test_2xx_object_is_the_receipt_and_the_request_carries_key_and_canonical_body(
    serve: Callable[..., ScriptedServer],
) -> None:
    server = serve(respond(201, b'{"data": {"id": "ch_1"}, "status": "succeeded"}'))
    url = f"{server.url}/orders/{{order}}/charges?effect={{effect_id}}"
    with adapter_for(
        url,
        "idempotent",
        external_id_field="data.id",
        correlation_header="X-Correlation-Key",
        status_field="status",
    ) as adapter:
        result = dispatch(adapter)
    assert result.external_id == "ch_1"
    assert result.output == {"data": {"id": "ch_1"}, "status": "succeeded"}
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0].startswith("POST /orders/42/charges?effect=")
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    assert headers["idempotency-key"] == KEY
    assert headers["x-correlation-key"] == KEY
    assert headers["content-type"] == "application/json"
    assert body == canonical_json(ARGUMENTS)


def test_a_fencing_header_carries_the_claim_version_and_the_attempt_id(
    serve: Callable[..., ScriptedServer],
) -> None:
    server = serve(respond(200, b'{"id": "ch_1"}'))
    with adapter_for(
        f"{server.url}/charges", "idempotent", fencing_header="X-Fencing-Token"
    ) as adapter:
        effect = replace(record(adapter), version=7)
        adapter.dispatch(
            DispatchRequest(effect, ARGUMENTS, "attempt-9", adapter.contract)
        )
    head = server.requests[0].partition(b"\r\n\r\n")[0].decode()
    headers = {
        k.lower(): v.strip() for k, _, v in (x.partition(":") for x in head.split("\r\n"))
    }
    assert headers["x-fencing-token"] == "7"
    assert headers["x-attempt-id"] == "attempt-9"


def test_without_a_fencing_header_no_token_is_sent(
    serve: Callable[..., ScriptedServer],
) -> None:
    server = serve(respond(200, b'{"id": "ch_1"}'))
    with adapter_for(f"{server.url}/charges", "idempotent") as adapter:
        dispatch(adapter)
    head = server.requests[0].partition(b"\r\n\r\n")[0].lower()
    assert b"x-fencing-token" not in head
    assert b"x-attempt-id" not in head


@pytest.mark.parametrize("safety", ["idempotent", "reconcilable"])
def test_a_stale_fencing_token_refusal_is_terminal(
    serve: Callable[..., ScriptedServer], safety: str
) -> None:
    # A 409 that would otherwise be "key in use" (retry later): the target says a
    # newer claim of this effect exists, so this worker's attempt is over.
    server = serve(respond(409, b'{"error": "stale_fencing_token"}'))
    options: dict[str, object] = {"fencing_header": "X-Fencing-Token"}
    if safety == "reconcilable":
        options |= {
            "correlation_header": "X-Correlation-Key",
            "probe_url": f"{server.url}/charges?k={{downstream_key}}",
        }
    with (
        adapter_for(f"{server.url}/charges", safety, **options) as adapter,
        pytest.raises(TerminalAdapterError) as caught,
    ):
        dispatch(adapter)
    assert caught.value.details["reason"] == "stale_fencing_token"
    assert caught.value.details["http_status"] == 409


def test_failed_status_value_is_terminal(serve: Callable[..., ScriptedServer]) -> None:
    server = serve(respond(200, b'{"id": "ch_1", "status": "failed"}'))
    url = f"{server.url}/charges"
    with (
        adapter_for(
            url, status_field="status", failed_status_values=["failed"]
        ) as adapter,
        pytest.raises(TerminalAdapterError) as caught,
    ):
        dispatch(adapter)
    assert caught.value.details["external_id"] == "ch_1"


def test_missing_url_field_is_terminal_and_sends_nothing(
    serve: Callable[..., ScriptedServer],
) -> None:
    server = serve(respond(200))
    with (
        adapter_for(f"{server.url}/charges/{{customer}}") as adapter,
        pytest.raises(TerminalAdapterError),
    ):
        dispatch(adapter)
    assert server.connections == 0


def test_environment_proxy_is_ignored(
    serve: Callable[..., ScriptedServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A proxy would answer for the target and change every classification.
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("ALL_PROXY", f"http://127.0.0.1:{free_port()}")
    server = serve(respond(200, b'{"id": "ch_1"}'))
    with adapter_for(f"{server.url}/charges") as adapter:
        assert dispatch(adapter).external_id == "ch_1"


def test_logs_carry_no_arguments_url_or_key(
    serve: Callable[..., ScriptedServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = serve(respond(200, b'{"id": "ch_1"}'))
    caplog.set_level(logging.DEBUG, logger="effect_broker.adapters.http_adapter")
    with adapter_for(f"{server.url}/c/{{order}}", "idempotent") as adapter:
        dispatch(adapter, {**ARGUMENTS, "order": "secret-order-771"})
    assert caplog.records
    for entry in caplog.records:
        text = repr(entry.__dict__)
        assert KEY not in text
        assert "secret-order-771" not in text
        assert server.url not in text


# --- probes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("then", "expected"),
    [
        (respond(200, b'{"id": "ch_9"}'), (ProbeStatus.COMMITTED, "ch_9")),
        (respond(404, b'{"error": "not_found"}'), (ProbeStatus.NOT_COMMITTED, None)),
        (respond(500), (ProbeStatus.UNKNOWN, None)),
        (respond(503), (ProbeStatus.UNKNOWN, None)),
        (respond(200, b"<html>", "text/html"), (ProbeStatus.UNKNOWN, None)),
        (close_quietly, (ProbeStatus.UNKNOWN, None)),
        (hang, (ProbeStatus.UNKNOWN, None)),
    ],
    ids=["200", "404", "500", "503", "200-html", "closed", "timeout"],
)
def test_probe_is_committed_not_committed_or_unknown(
    serve: Callable[..., ScriptedServer],
    then: Then,
    expected: tuple[ProbeStatus, str | None],
) -> None:
    server = serve(then)
    probe_url = f"{server.url}/charges?key={{downstream_key}}"
    with adapter_for(
        f"{server.url}/charges",
        "reconcilable",
        probe_url=probe_url,
        correlation_header="X-Correlation-Key",
        timeout="300ms",
    ) as adapter:
        assert probe_status(adapter) == expected
    assert server.requests[0].startswith(f"GET /charges?key={KEY} ".encode())


def test_probe_of_unreachable_target_is_unknown() -> None:
    port = free_port()
    with adapter_for(
        f"http://127.0.0.1:{port}/c",
        "reconcilable",
        probe_url=f"http://127.0.0.1:{port}/c?k={{downstream_key}}",
        correlation_header="X-Correlation-Key",
    ) as adapter:
        assert probe_status(adapter) == (ProbeStatus.UNKNOWN, None)


def test_adapter_without_probe_url_answers_unknown() -> None:
    with adapter_for(f"http://127.0.0.1:{free_port()}/c", "idempotent") as adapter:
        assert probe_status(adapter) == (ProbeStatus.UNKNOWN, None)


# --- configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("safety", "options", "message"),
    [
        ("idempotent", {"idempotency_header": None}, "idempotency_header"),
        ("reconcilable", {}, "probe_url"),
        ("transactional", {}, "cannot share"),
        ("unsafe", {"url": "http://h/{arguments[order]}"}, "bare name"),
        ("unsafe", {"url": "http://h/{order.id}"}, "bare name"),
        ("unsafe", {"retries": 3}, "unknown http adapter options"),
        ("unsafe", {"timeout": "10"}, "timeout"),
        ("unsafe", {"retryable_statuses": [200]}, "not 4xx/5xx"),
        ("unsafe", {"in_progress_statuses": [409]}, "needs an idempotency_header"),
        ("idempotent", {"in_progress_statuses": [302]}, "not 4xx/5xx"),
        ("unsafe", {"fencing_header": "X-Fencing-Token"}, "fences per key"),
        ("idempotent", {"fencing_header": ""}, "fencing_header"),
    ],
)
def test_contracts_that_claim_more_than_the_configuration_delivers_are_refused(
    safety: str, options: dict[str, object], message: str
) -> None:
    url = str(options.pop("url", "http://127.0.0.1:1/c"))
    with pytest.raises(ConfigurationError, match=message):
        adapter_for(url, safety, **options)


# --- the send gate and the attempt's total time limit -----------------------------------


class ScriptedGate:
    """A send gate that refuses from its ``refuse_from``-th check on, and whose
    attempt time limit is ``limit`` seconds from its creation."""

    def __init__(self, refuse_from: int | None = None, limit: float = math.inf) -> None:
        self.refuse_from = refuse_from
        self.checks = 0
        self.deadline = time.monotonic() + limit

    def check(self) -> None:
        self.checks += 1
        if self.refuse_from is not None and self.checks >= self.refuse_from:
            raise SendRefusedError("scripted: the lease cannot be proved")

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


def gated_dispatch(adapter: HttpAdapter, gate: ScriptedGate) -> DispatchResult:
    request = DispatchRequest(
        record(adapter), ARGUMENTS, "attempt-1", adapter.contract, gate=gate
    )
    return adapter.dispatch(request)


def answer_if_asked(conn: socket.socket, stop: threading.Event) -> None:
    # A client that connected and sent nothing has already gone: nothing to answer.
    with suppress(OSError):
        respond(200, b'{"id": "ch_1"}')(conn, stop)


def settle(server: ScriptedServer) -> None:
    """Wait until the server has taken every connection the client opened."""
    time.sleep(0.2)
    deadline = time.monotonic() + 5
    while len(server.requests) < server.connections:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_refusing_gate_is_checked_at_the_socket_and_sends_zero_bytes(
    serve: Callable[..., ScriptedServer],
) -> None:
    # Given gates that refuse from the 1st, 2nd, ... check on, until one lets the
    # request through
    outcomes: list[tuple[bool, int, list[bytes]]] = []
    for refuse_from in range(1, 10):
        server = serve(answer_if_asked)
        with adapter_for(f"{server.url}/charges") as adapter:
            try:
                gated_dispatch(adapter, ScriptedGate(refuse_from))
            except SendRefusedError:
                refused = True
            else:
                refused = False
        settle(server)
        outcomes.append((refused, server.connections, list(server.requests)))
        if not refused:
            break
    # Then every refusal reached the server with zero bytes ...
    assert outcomes[-1][0] is False, "no gate ever let the request through"
    assert outcomes[-1][2][0].endswith(canonical_json(ARGUMENTS))
    refusals = outcomes[:-1]
    assert refusals
    for _, connections, requests in refusals:
        assert requests == [b""] * connections
    # ... the first before any connection (the base class) ...
    assert refusals[0][1] == 0
    # ... and the last with the connection open: checked after connect, right
    # before the first byte is written
    assert refusals[-1][1] == 1


def test_a_spent_attempt_time_limit_sends_nothing(
    serve: Callable[..., ScriptedServer],
) -> None:
    server = serve(answer_if_asked)
    with (
        adapter_for(f"{server.url}/charges") as adapter,
        pytest.raises(SendRefusedError),
    ):
        gated_dispatch(adapter, ScriptedGate(limit=0.0))
    settle(server)
    assert server.requests == [b""] * server.connections


def trickle(payload: bytes, interval: float = 0.05) -> Then:
    """Answer ``payload`` one byte at a time: never idle long enough to time out."""

    def then(conn: socket.socket, stop: threading.Event) -> None:
        for byte in payload:
            if stop.wait(interval):
                return
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                return  # the client gave up

    return then


BODY = b'{"id": "ch_1", "pad": "' + b"x" * 60 + b'"}'
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"


def trickled_body(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(HEAD % len(BODY) + b"\r\n")
    trickle(BODY)(conn, stop)


def never_reads(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait(10)


SEND_MARGIN = EngineTiming().send_margin.total_seconds()


@pytest.mark.parametrize(
    ("then", "read", "arguments", "limit"),
    [
        (trickled_body, True, ARGUMENTS, 0.6),
        (
            trickle(HEAD % len(BODY) + b"X-Pad: " + b"p" * 40 + b"\r\n\r\n" + BODY),
            True,
            ARGUMENTS,
            0.6,
        ),
        (hang, True, ARGUMENTS, 0.6),
        # The limit runs from the claim, and encoding a 16 MiB body on a loaded
        # machine can take most of a second before the first byte is written.
        (never_reads, False, {**ARGUMENTS, "memo": "x" * (16 << 20)}, 3.0),
    ],
    ids=["trickled-body", "trickled-headers", "never-answers", "never-reads"],
)
def test_an_attempt_ends_unknown_when_its_total_time_limit_is_spent(
    serve: Callable[..., ScriptedServer],
    then: Then,
    read: bool,
    arguments: dict[str, object],
    limit: float,
) -> None:
    # Given a target that keeps the attempt busy for 4s or more (each byte in time
    # for the 10s read/write timeouts) and an attempt allowed less in total
    server = serve(then, read=read)
    with adapter_for(f"{server.url}/charges", timeout="10s") as adapter:
        gate = ScriptedGate(limit=limit)
        request = DispatchRequest(
            record(adapter), arguments, "attempt-1", adapter.contract, gate=gate
        )
        with pytest.raises(OutcomeUnknownError) as caught:
            adapter.dispatch(request)
        elapsed = time.monotonic() - (gate.deadline - limit)
    # Then it gives up as unknown (bytes left) once the limit is spent, not later
    assert caught.value.details["reason"] == "attempt_time_limit"
    # "Not later" is the send margin: the worker's heartbeat vouches for an attempt
    # until its limit plus that margin (services/lease.py, beat_due), so an overrun
    # within it is what the design allows and one beyond it is the defect. Without
    # the limit the attempt would last as long as the target keeps it busy (4 s to
    # 10 s). Measured overrun here: 1-21 ms, at a load average of 5 on two CPUs; the
    # former bound of 0.8 s was a guess, not the guarantee (issue 19).
    assert limit <= elapsed < limit + SEND_MARGIN
    assert server.connections == 1
