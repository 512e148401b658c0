"""The send window ends at the last byte (issue 19, item 4), on real loopback sockets.

httpcore writes a request's headers and its body in two socket writes. A worker that
stalled between them (12 s, reconcilable, the default gate) woke up after its lease
was handed on and sent the body: the target committed a second charge. The HTTP
adapter now hands the whole request to the socket in one write and checks the send
gate immediately before it; these tests pin both, and the failpoints the crash matrix
freezes workers at.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpcore
import pytest
from httpcore._backends.sync import SyncStream
from httpcore._sync.http11 import HTTP11Connection

from effect_broker import failpoints
from effect_broker.adapters.base import DispatchRequest, SendGate
from effect_broker.adapters.http_adapter import HttpAdapter
from effect_broker.adapters.http_attempt import (
    HOLD_BYTES,
    AttemptGuard,
    WireStream,
    writing,
)
from effect_broker.domain.canonical import canonical_json
from effect_broker.domain.errors import SendRefusedError
from tests.contract.test_http_classification import (
    ARGUMENTS,
    ScriptedServer,
    adapter_for,
    record,
    respond,
)

#: Longer than the lease the gate below can prove: the worker wakes without it.
STALL = 0.6


class LeaseGate:
    """A send gate whose lease is provable for ``seconds`` from its creation."""

    def __init__(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds
        self.checks = 0

    def check(self) -> None:
        self.checks += 1
        if time.monotonic() >= self.until:
            raise SendRefusedError("the lease cannot be proved", reason="lease_unproven")

    def remaining(self) -> float:
        return math.inf


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    scripted = ScriptedServer(respond(200, b'{"id": "ch_1"}'))
    yield scripted
    scripted.close()


def reconcilable(server: ScriptedServer) -> HttpAdapter:
    """The issue's case: a reconcilable charge, the default gate, no fencing header."""
    return adapter_for(
        f"{server.url}/charges",
        "reconcilable",
        correlation_header="X-Correlation-Key",
        probe_url=f"{server.url}/charges?correlation_key={{downstream_key}}",
    )


def dispatch_with(adapter: HttpAdapter, gate: SendGate) -> None:
    request = DispatchRequest(
        record(adapter), ARGUMENTS, "attempt-1", adapter.contract, gate=gate
    )
    adapter.dispatch(request)


def received(server: ScriptedServer, connections: int) -> list[bytes]:
    """What the server read on each connection, once it has read them all."""
    deadline = time.monotonic() + 5
    while len(server.requests) < connections:
        assert time.monotonic() < deadline, "the server never saw the connection end"
        time.sleep(0.02)
    return list(server.requests)


def test_a_worker_stalled_between_headers_and_body_sends_nothing_without_its_lease(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker that stalls after httpcore handed over the request's headers and
    # before the body (a GC pause, a VM stall), longer than its lease can be proved
    original = HTTP11Connection._send_request_body

    def stalled(self: HTTP11Connection, request: httpcore.Request) -> None:
        time.sleep(STALL)
        original(self, request)

    monkeypatch.setattr(HTTP11Connection, "_send_request_body", stalled)
    gate = LeaseGate(STALL / 2)

    # When it wakes up and carries on with the body
    with (
        reconcilable(server) as adapter,
        pytest.raises(SendRefusedError) as caught,
    ):
        dispatch_with(adapter, gate)

    # Then the gate refused immediately before the write, and not one byte of the
    # request - headers included - reached the target
    assert caught.value.details["reason"] == "lease_unproven"
    assert received(server, server.connections) == [b""] * server.connections
    assert server.connections == 1


def test_headers_and_body_leave_in_one_write(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a spy on the socket writes httpcore's sync backend makes
    writes: list[bytes] = []
    original = SyncStream.write

    def spy(self: SyncStream, buffer: bytes, timeout: float | None = None) -> None:
        writes.append(bytes(buffer))
        original(self, buffer, timeout)

    monkeypatch.setattr(SyncStream, "write", spy)
    gate = LeaseGate(60)

    # When the adapter sends one charge
    with reconcilable(server) as adapter:
        dispatch_with(adapter, gate)

    # Then the request line, the headers and the body went in one write, and the
    # gate was checked right before it (the base class, the transport, the headers,
    # the write)
    assert len(writes) == 1
    assert writes[0].startswith(b"POST /charges HTTP/1.1\r\n")
    assert writes[0].endswith(b"\r\n\r\n" + canonical_json(ARGUMENTS))
    assert received(server, 1) == writes
    assert gate.checks == 4


def test_the_wire_failpoints_fire_for_the_attempts_subject(
    server: ScriptedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given both wire failpoints armed (pause 0) for this effect's subject
    monkeypatch.setenv("EFFECT_BROKER_FAILPOINT_DIR", str(tmp_path))
    with reconcilable(server) as adapter:
        effect = record(adapter)
        subject = f"{effect.tenant_id}/{effect.operation_key}"
        for name in failpoints.WIRE_FAILPOINTS:
            failpoints.arm(tmp_path, subject, name, pause=0)
            assert not failpoints.fired(tmp_path, subject, name)
            # When the adapter sends the charge
            dispatch_with(adapter, LeaseGate(60))
            # Then the failpoint fired in this process, where the crash matrix
            # freezes a worker
            assert failpoints.fired_by(tmp_path, subject, name) == os.getpid()


# --- the stream itself: what it holds, when it checks -----------------------------------


class FakeStream(httpcore.NetworkStream):
    """An inner stream that records writes and answers reads with nothing."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return b""

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.writes.append(buffer)

    def close(self) -> None:
        self.closed = True


class CountingGate:
    """Lets ``allow`` checks through, then refuses."""

    def __init__(self, allow: int) -> None:
        self.allow, self.checks = allow, 0

    def check(self) -> None:
        self.checks += 1
        if self.checks > self.allow:
            raise SendRefusedError("refused", reason="lease_unproven")

    def remaining(self) -> float:
        return math.inf


def test_each_request_on_a_kept_alive_connection_is_one_write_checked_before_it() -> None:
    inner = FakeStream()
    stream = WireStream(inner)
    gate = CountingGate(allow=10)
    with writing(AttemptGuard(gate)):
        for n in (1, 2):
            stream.write(b"POST /%d HTTP/1.1\r\n\r\n" % n)
            stream.write(b"body%d" % n)
            stream.write(b"")  # h11's end of message for a Content-Length body
            assert gate.checks == n - 1  # nothing is checked or sent while held
            stream.read(65536)
    assert inner.writes == [
        b"POST /1 HTTP/1.1\r\n\r\nbody1",
        b"POST /2 HTTP/1.1\r\n\r\nbody2",
    ]
    assert gate.checks == 2


def test_a_request_still_held_when_the_connection_closes_is_never_sent() -> None:
    inner = FakeStream()
    stream = WireStream(inner)
    stream.write(b"POST / HTTP/1.1\r\n\r\n")
    stream.close()
    assert (inner.writes, inner.closed) == ([], True)


def test_a_gate_refusal_after_part_of_a_streamed_body_left_cuts_the_request() -> None:
    # Given a streamed body bigger than what the stream holds, and a gate that lets
    # the first part through and then refuses
    inner = FakeStream()
    stream = WireStream(inner)
    part = b"x" * HOLD_BYTES
    with writing(AttemptGuard(CountingGate(allow=1))):
        stream.write(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        stream.write(part)  # over the limit: checked, written
        # When the next part is due, the gate refuses: bytes already left, so this
        # is no "not sent" - the request is cut and the outcome is unknown
        with pytest.raises(httpcore.WriteError):
            stream.write(part)
    # Then the rest never left and the connection is closed
    assert len(inner.writes) == 1
    assert inner.closed is True


def test_no_gate_no_check_but_still_one_write() -> None:
    # A probe (GET) carries no attempt: nothing to check, the request still goes whole
    inner = FakeStream()
    stream = WireStream(inner)
    stream.write(b"GET / HTTP/1.1\r\n\r\n")
    stream.read(1)
    assert inner.writes == [b"GET / HTTP/1.1\r\n\r\n"]


def test_the_gate_check_runs_on_the_writing_thread_only() -> None:
    # The guard is per thread (a contextvar): another thread's writes on another
    # connection are not checked against this attempt's gate
    inner = FakeStream()
    stream = WireStream(inner)
    gate = CountingGate(allow=0)
    done = threading.Event()

    def other_thread() -> None:
        stream.write(b"GET / HTTP/1.1\r\n\r\n")
        stream.read(1)
        done.set()

    with writing(AttemptGuard(gate)):
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join(5)
    assert done.is_set()
    assert gate.checks == 0
