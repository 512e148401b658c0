"""The killer demo's payment target, as a real process on loopback with a real Postgres.

Its table is the ground truth the crash matrix counts, so its own promises are tested
here first: idempotent dedup under concurrency, drift refusal, bounded-eventual lookup,
and faults that lose the answer but never the charge."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

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


def test_reject_next_answers_503_before_touching_the_database(
    target: TargetProcess, client: httpx.Client
) -> None:
    target.inject("reject_next")
    assert charge(client, "unsafe").status_code == 503
    assert target.count_charges() == 0  # documented "not committed": and it is not
    assert charge(client, "unsafe").status_code == 200  # one fault, one request


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
