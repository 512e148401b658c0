"""How long is the window the send gate cannot close? (issues 9 and 19)

The send gate proves the lease right before a request is written; a stall between that
check and the LAST byte of the request on the wire is the one pause no local check can
catch (a request whose body follows its headers late is a late request all the same).
This measures the window on this machine: a real ``HttpAdapter`` sends to a loopback
server in ANOTHER process (so the server never waits for the sender's GIL), the gate
records ``time.monotonic()`` each time it is checked, and the server records
``time.monotonic()`` when the first byte of the request arrives and when the last one
does (CLOCK_MONOTONIC is one clock for every process on a Linux host).
window = arrival - last gate check, an upper bound: it includes the loopback hop and
the server's wake-up. The figure to publish is the one to the last byte.

It runs twice, side by side: idle, and with CPU-bound threads competing for the GIL
(the case a busy worker process is in). Usage::

    python -m examples.bench.gate_window [--requests 2000]
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection

from effect_broker.adapters.base import DispatchRequest
from effect_broker.adapters.conformance import make_effect_record
from effect_broker.adapters.http_adapter import HttpAdapter
from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.states import SafetyClass

_ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n"
    b'Connection: close\r\n\r\n{"id":"c1"}'
)


class RecordingGate:
    """A gate that never refuses and remembers when it was last asked."""

    def __init__(self) -> None:
        self.checked_at = 0.0

    def check(self) -> None:
        """Record the moment of the check."""
        self.checked_at = time.monotonic()

    def remaining(self) -> float:
        """No total limit here: the adapter's own timeouts apply."""
        return float("inf")


def _serve(sock: socket.socket, requests: int, out: Connection) -> None:
    """Answer ``requests`` requests, then send back when each one's first and last
    byte arrived."""
    arrivals: list[tuple[float, float]] = []
    for _ in range(requests):
        conn, _ = sock.accept()
        with conn:
            first = conn.recv(1)
            first_at = time.monotonic()
            data = first
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            while len(body) < length:
                body += conn.recv(65536)
            arrivals.append((first_at, time.monotonic()))
            conn.sendall(_ANSWER)
    out.send(arrivals)


@contextmanager
def busy_threads(count: int) -> Iterator[None]:
    """CPU-bound threads that compete with the sender for the GIL."""
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x = (x * 31 + 7) % 1_000_003

    threads = [threading.Thread(target=spin, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def measure(requests: int) -> tuple[list[float], list[float]]:
    """Windows in microseconds, one per request: to the first byte, to the last."""
    sock = socket.create_server(("127.0.0.1", 0), backlog=128)
    port = sock.getsockname()[1]
    receiver, sender = multiprocessing.Pipe(duplex=False)
    server = multiprocessing.get_context("fork").Process(
        target=_serve, args=(sock, requests, sender), daemon=True
    )
    server.start()
    contract = EffectContract(
        name="bench.gate",
        version="1",
        tool="gate",
        safety=SafetyClass.UNSAFE,
        adapter="http",
        adapter_options={"url": f"http://127.0.0.1:{port}/charges"},
    )
    adapter = HttpAdapter(contract)
    gate = RecordingGate()
    checks: list[float] = []
    try:
        for i in range(requests):
            record = make_effect_record(contract, f"op:{i}", {"n": i}, "key")
            request = DispatchRequest(
                effect=record,
                arguments={"n": i},
                attempt_id=f"a{i}",
                contract=contract,
                gate=gate,
            )
            adapter.dispatch(request)
            checks.append(gate.checked_at)
        arrivals = receiver.recv()
    finally:
        adapter.close()
        server.join(timeout=10)
        sock.close()
    pairs = list(zip(arrivals, checks, strict=True))
    return (
        [(first - check) * 1e6 for (first, _), check in pairs],
        [(last - check) * 1e6 for (_, last), check in pairs],
    )


def _row(label: str, windows: list[float]) -> str:
    ordered = sorted(windows)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    return (
        f"{label:<40} {len(ordered):>6} {statistics.median(ordered):>9.0f} "
        f"{pct(0.99):>9.0f} {pct(0.999):>9.0f} {ordered[-1]:>9.0f}"
    )


def main(argv: list[str] | None = None) -> int:
    """Print the window, idle and under GIL contention, side by side."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--busy-threads", type=int, default=2)
    options = parser.parse_args(argv)
    print("send-gate window: last gate check -> request byte at the server (µs)")
    print(f"{'case':<40} {'n':>6} {'p50':>9} {'p99':>9} {'p99.9':>9} {'max':>9}")
    first, last = measure(options.requests)
    print(_row("idle, to the first byte", first))
    print(_row("idle, to the last byte", last), flush=True)
    with busy_threads(options.busy_threads):
        first, last = measure(options.requests)
    busy = f"{options.busy_threads} CPU-bound threads"
    print(_row(f"{busy}, to the first byte", first))
    print(_row(f"{busy}, to the last byte", last))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
