"""A worker's own metrics port: this process's registry, once, never fatal."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from effect_broker.observability import worker_metrics
from effect_broker.observability.metrics import STALE_WRITES


@pytest.fixture(autouse=True)
def closed() -> Iterator[None]:
    worker_metrics.stop_worker_metrics()
    yield
    worker_metrics.stop_worker_metrics()


def test_the_port_serves_this_process_counters_and_starts_once() -> None:
    port = worker_metrics.start_worker_metrics(0, "127.0.0.1")
    assert port
    assert worker_metrics.start_worker_metrics(0, "127.0.0.1") == port
    STALE_WRITES.inc(0)
    body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert "effect_broker_stale_writes_total" in body
    # The ledger is the API's to report, once: never on a worker's port
    assert "effect_broker_unknown_effects" not in body


def test_a_port_in_use_is_logged_and_the_worker_goes_on(caplog) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert worker_metrics.start_worker_metrics(port, "127.0.0.1") is None
    assert "worker metrics port unavailable" in caplog.text
