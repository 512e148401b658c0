"""The killer demo's payment target, as a real process on loopback with a real Postgres.

Its table is the ground truth the crash matrix counts, so its own promises are tested
here first: idempotent dedup under concurrency, drift refusal, bounded-eventual lookup,
and faults that lose the answer but never the charge."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress

import httpx
import pytest

from examples.crash_matrix.target_client import TargetProcess, start_target

pytestmark = pytest.mark.django_db

CHARGE = {"order": "42", "amount_minor": 1999, "currency": "EUR"}


@pytest.fixture
def client(target: TargetProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=target.url, trust_env=False, timeout=5.0) as http:
        yield http


def charge(
    http: httpx.Client, mode: str, key: str | None = None, body: object = CHARGE
) -> httpx.Response:
    header = {"idempotent": "Idempotency-Key", "reconcilable": "X-Correlation-Key"}
    headers = {header[mode]: key} if key and mode in header else {}
    return http.post(f"/{mode}/charges", json=body, headers=headers)


def test_20_concurrent_same_key_requests_make_one_charge(
    target: TargetProcess, client: httpx.Client
) -> None:
    # Given 20 threads released together with one key and one body
    barrier = threading.Barrier(20)

    def send(_: int) -> tuple[int, str]:
        with httpx.Client(base_url=target.url, trust_env=False, timeout=10.0) as http:
            barrier.wait()
            response = charge(http, "idempotent", "order:42")
            return response.status_code, response.json()["id"]

    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(send, range(20)))
    # Then every answer is the same charge and the table holds exactly one row
    assert {status for status, _ in results} == {200}
    assert len({charge_id for _, charge_id in results}) == 1
    assert target.count_charges(mode="idempotent", key="order:42") == 1
    assert target.stats()["requests"] == 20


def test_same_key_with_a_different_body_is_refused_and_creates_nothing(
    target: TargetProcess, client: httpx.Client
) -> None:
    first = charge(client, "idempotent", "k1")
    drift = charge(client, "idempotent", "k1", {**CHARGE, "amount_minor": 1})
    assert (first.status_code, drift.status_code) == (200, 422)
    assert drift.json() == {"error": "idempotency_key_reused"}
    assert target.count_charges(key="k1") == 1


def test_idempotent_mode_requires_the_key(
    target: TargetProcess, client: httpx.Client
) -> None:
    response = charge(client, "idempotent")
    assert response.status_code == 400
    assert target.count_charges() == 0


def test_reconcilable_lookup_sees_a_charge_only_after_the_settlement_delay(
    target: TargetProcess, client: httpx.Client
) -> None:
    created = charge(client, "reconcilable", "corr-1").json()
    lookup = {"correlation_key": "corr-1"}
    # Inside the 300ms settlement delay the committed charge is invisible
    early = client.get("/reconcilable/charges", params=lookup)
    assert (early.status_code, early.json()) == (404, {"error": "not_found"})
    assert target.count_charges(key="corr-1") == 1  # ... although it exists
    time.sleep(target.settlement_delay.total_seconds() + 0.05)
    settled = client.get("/reconcilable/charges", params=lookup)
    assert settled.status_code == 200
    assert settled.json()["id"] == created["id"]
    assert settled.json()["matches"] == 1


def test_reconcilable_and_unsafe_modes_never_dedup(
    target: TargetProcess, client: httpx.Client
) -> None:
    for _ in range(2):
        assert charge(client, "reconcilable", "corr-2").status_code == 200
        assert charge(client, "unsafe").status_code == 200
    assert target.count_charges(mode="reconcilable", key="corr-2") == 2
    assert target.count_charges(mode="unsafe") == 2
    assert target.stats()["by_mode"] == {"idempotent": 0, "reconcilable": 2, "unsafe": 2}


def test_reject_next_answers_429_before_touching_the_database(
    target: TargetProcess, client: httpx.Client
) -> None:
    # 429 is the one answer the HTTP adapter treats as "not committed" by default
    target.inject("reject_next")
    response = charge(client, "unsafe")
    assert (response.status_code, response.json()) == (429, {"error": "rejected"})
    assert target.count_charges() == 0  # documented "not committed": and it is not
    assert charge(client, "unsafe").status_code == 200  # one fault, one request


@pytest.mark.parametrize(
    ("fault", "status", "error"),
    [
        ("in_progress_next", 409, "idempotency_key_in_use"),
        ("terminal_next", 400, "rejected"),
    ],
)
def test_refusal_faults_answer_without_committing(
    target: TargetProcess, client: httpx.Client, fault: str, status: int, error: str
) -> None:
    target.inject(fault)
    response = charge(client, "idempotent", f"k-{fault}")
    assert (response.status_code, response.json()) == (status, {"error": error})
    assert target.count_charges() == 0
    assert target.stats()["requests"] == 1
    # One fault, one request: the resend with the same key commits once
    assert charge(client, "idempotent", f"k-{fault}").status_code == 200
    assert target.count_charges(key=f"k-{fault}") == 1


def test_slow_commit_holds_the_transaction_open_then_commits_and_answers(
    target: TargetProcess,
) -> None:
    # Given a charge whose transaction stays open for 1.5s before it commits
    target.inject("slow_commit", seconds=1.5)
    started = time.monotonic()
    # When the caller's read timeout is shorter: a slow commit with a lost response
    with (
        httpx.Client(base_url=target.url, trust_env=False, timeout=0.3) as http,
        pytest.raises(httpx.ReadTimeout),
    ):
        charge(http, "idempotent", "k-slow")
    # Then nothing is committed yet while the transaction is open ...
    assert target.count_charges(key="k-slow") == 0
    # ... and the charge commits once the hold ends
    while target.count_charges(key="k-slow") == 0:
        # A liveness deadline, not a speed test (issue 19): 1.5 s hold, 10 s to see it.
        assert time.monotonic() - started < 10, "slow_commit never committed"
        time.sleep(0.05)
    assert time.monotonic() - started >= 1.4
    # A caller that waits gets the normal answer
    target.inject("slow_commit", seconds=0.3)
    with httpx.Client(base_url=target.url, trust_env=False, timeout=5.0) as http:
        slow = charge(http, "unsafe")
    assert slow.status_code == 200
    assert target.count_charges(mode="unsafe") == 1


def raw_post(target: TargetProcess, head: bytes, body: bytes) -> bytes:
    """Send ``head`` + ``body`` on a raw socket, half-close, read what comes back."""
    host, port = target.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(head + body)
        sock.shutdown(socket.SHUT_WR)  # the client is done: fewer bytes than promised
        answer = b""
        with suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
    return answer


@pytest.mark.parametrize(
    "body", [b"", b"{}", b'{"order": "42"}'], ids=["nothing", "empty-object", "prefix"]
)
def test_a_truncated_request_is_refused_and_commits_nothing(
    target: TargetProcess, body: bytes
) -> None:
    # Given a request that promises 200 body bytes and sends fewer, then closes
    head = (
        b"POST /unsafe/charges HTTP/1.1\r\nHost: target\r\n"
        b"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n"
    )
    answer = raw_post(target, head, body)
    # Then the target refuses it (or just closes), and commits nothing
    assert answer == b"" or answer.split(b"\r\n", 1)[0].split(b" ")[1] == b"400"
    assert target.stats()["requests"] == 1  # it did reach the handler
    assert target.count_charges() == 0


def test_a_complete_raw_request_commits(target: TargetProcess) -> None:
    # The control for the truncation test: the same raw request, all bytes sent
    body = b'{"order": "42"}'
    head = (
        b"POST /unsafe/charges HTTP/1.1\r\nHost: target\r\nContent-Type: "
        b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    answer = raw_post(target, head, body)
    assert answer.split(b"\r\n", 1)[0].split(b" ")[1] == b"200"
    assert target.count_charges() == 1


def fenced(
    http: httpx.Client, mode: str, key: str, token: object, body: object = CHARGE
) -> httpx.Response:
    header = {"idempotent": "Idempotency-Key", "reconcilable": "X-Correlation-Key"}
    headers = {header[mode]: key, "X-Fencing-Token": str(token), "X-Attempt-Id": "a-1"}
    return http.post(f"/{mode}/charges", json=body, headers=headers)


@pytest.mark.parametrize("mode", ["idempotent", "reconcilable"])
def test_a_stale_fencing_token_is_refused_and_commits_nothing(
    target: TargetProcess, client: httpx.Client, mode: str
) -> None:
    # Given a charge committed under token 3 (an attempt claimed at version 3)
    assert fenced(client, mode, f"f-{mode}", 3).status_code == 200
    assert fenced(client, mode, f"f-{mode}", 3).status_code == 200  # same claim
    rows = target.count_charges(key=f"f-{mode}")
    # When a worker from the older claim 2 sends afterwards
    stale = fenced(client, mode, f"f-{mode}", 2)
    # Then it is refused and nothing is committed
    assert (stale.status_code, stale.json()) == (409, {"error": "stale_fencing_token"})
    assert target.count_charges(key=f"f-{mode}") == rows
    assert target.stats()["stale_fencing_refusals"] == 1  # counted, for the matrix
    # And a newer claim still goes through
    assert fenced(client, mode, f"f-{mode}", 4).status_code == 200
    # Fencing is per key: another key starts from nothing
    assert fenced(client, mode, f"g-{mode}", 1).status_code == 200


@pytest.mark.parametrize("token", ["", "x", "-1", "1.5"])
def test_a_malformed_fencing_token_is_refused(
    target: TargetProcess, client: httpx.Client, token: str
) -> None:
    response = fenced(client, "idempotent", "f-bad", token)
    assert (response.status_code, response.json()) == (
        400,
        {"error": "invalid_fencing_token"},
    )
    assert target.count_charges() == 0


def test_the_highest_fencing_token_survives_a_restart(target_database_url: str) -> None:
    # Given a service that saw token 7 for a key, stopped and started again
    for attempt in range(2):
        with start_target(target_database_url, schema="contract_fencing") as service:
            if attempt == 0:
                service.reset()
            with httpx.Client(base_url=service.url, trust_env=False, timeout=5) as http:
                if attempt == 0:
                    assert fenced(http, "reconcilable", "f-durable", 7).status_code == 200
                else:
                    # Then the new process still refuses an older token
                    stale = fenced(http, "reconcilable", "f-durable", 6)
                    assert stale.status_code == 409
                    assert service.count_charges(key="f-durable") == 1


def test_dropped_connection_after_commit_loses_the_answer_not_the_charge(
    target: TargetProcess, client: httpx.Client
) -> None:
    target.inject("drop_connection_after_commit")
    with pytest.raises(httpx.RemoteProtocolError):
        charge(client, "idempotent", "k-drop")
    assert target.count_charges(key="k-drop") == 1
    # The retry with the same key returns the charge that committed
    again = charge(client, "idempotent", "k-drop")
    assert again.status_code == 200
    assert target.count_charges(key="k-drop") == 1


def test_hang_after_commit_times_the_client_out_with_the_charge_committed(
    target: TargetProcess,
) -> None:
    target.inject("hang_after_commit", seconds=1.0)
    with (
        httpx.Client(base_url=target.url, trust_env=False, timeout=0.3) as http,
        pytest.raises(httpx.ReadTimeout),
    ):
        charge(http, "unsafe")
    assert target.count_charges(mode="unsafe") == 1


def test_fail_next_lookup_answers_503(
    target: TargetProcess, client: httpx.Client
) -> None:
    target.inject("fail_next_lookup")
    params = {"correlation_key": "nobody"}
    assert client.get("/reconcilable/charges", params=params).status_code == 503
    assert client.get("/reconcilable/charges", params=params).status_code == 404


def test_stats_and_reset(target: TargetProcess, client: httpx.Client) -> None:
    charge(client, "unsafe")
    target.inject("reject_next", times=3)
    assert target.stats() == {
        "charges": 1,
        "by_mode": {"idempotent": 0, "reconcilable": 0, "unsafe": 1},
        "requests": 1,
        "stale_fencing_refusals": 0,
    }
    target.reset()
    assert target.stats()["charges"] == target.stats()["requests"] == 0
    assert charge(client, "unsafe").status_code == 200  # the queued faults are gone


def test_expired_key_retention_and_clean_sigterm(target_database_url: str) -> None:
    # Given a second service with a 300ms key retention, in its own schema
    with start_target(
        target_database_url, key_retention="300ms", schema="contract_retention"
    ) as short:
        short.reset()
        with httpx.Client(base_url=short.url, trust_env=False, timeout=5.0) as http:
            first = charge(http, "idempotent", "k-old").json()["id"]
            assert charge(http, "idempotent", "k-old").json()["id"] == first
            time.sleep(0.4)
            # When the horizon has passed, the key is forgotten: a second charge
            assert charge(http, "idempotent", "k-old").json()["id"] != first
        assert short.count_charges(key="k-old") == 2
        # Then SIGTERM stops it cleanly
        assert short.stop() == 0
