"""The optional Stripe adapter: error classification offline (the real SDK against
scripted loopback sockets), and one opt-in live round trip in Stripe test mode."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest

from effect_broker.adapters.base import DispatchRequest, ProbeRequest
from effect_broker.adapters.conformance import make_effect_record
from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.errors import (
    ConfigurationError,
    KeyReusedError,
    OutcomeUnknownError,
    RetryableAdapterError,
    TerminalAdapterError,
)
from effect_broker.domain.states import ProbeStatus, SafetyClass
from tests.contract.test_http_classification import (
    ScriptedServer,
    close_quietly,
    free_port,
    respond,
)

stripe = pytest.importorskip("stripe", reason="the stripe extra is not installed")
from effect_broker.adapters.stripe_adapter import StripeAdapter  # noqa: E402

ARGUMENTS = {"amount_minor": 1999, "currency": "eur", "payment_method_types": ["card"]}


def contract(**options: object) -> EffectContract:
    return EffectContract(
        name="payments.stripe-charge",
        version="1",
        tool="stripe_charge",
        safety=SafetyClass.IDEMPOTENT,
        key_retention=timedelta(hours=24),
        adapter="stripe",
        adapter_options={"timeout": "2s", "connect_timeout": "1s", **options},
    )


def request(adapter: StripeAdapter) -> DispatchRequest:
    key = f"dk-{uuid.uuid4().hex}"
    effect = make_effect_record(adapter.contract, f"op:{uuid.uuid4()}", ARGUMENTS, key)
    return DispatchRequest(effect, ARGUMENTS, str(uuid.uuid4()), adapter.contract)


@pytest.fixture
def offline_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRIPE_TEST_KEY", "sk_test_offline")


@pytest.fixture
def stripe_at() -> Iterator[object]:
    servers: list[ScriptedServer] = []
    adapters: list[StripeAdapter] = []

    def start(then: object) -> tuple[StripeAdapter, ScriptedServer]:
        servers.append(ScriptedServer(then))  # type: ignore[arg-type]
        adapters.append(StripeAdapter(contract(api_base=servers[-1].url)))
        return adapters[-1], servers[-1]

    yield start
    for adapter in adapters:
        adapter.close()
    for server in servers:
        server.close()


def error(status: int, kind: str) -> bytes:
    return json.dumps({"error": {"type": kind, "message": "scripted"}}).encode()


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (402, error(402, "card_error"), TerminalAdapterError),
        (400, error(400, "invalid_request_error"), TerminalAdapterError),
        # Issue 19, item 5: 400 idempotency_error (the key was used with other
        # parameters) can never succeed on a resend: an operator decides.
        (400, error(400, "idempotency_error"), KeyReusedError),
        (429, error(429, "invalid_request_error"), RetryableAdapterError),
        (500, error(500, "api_error"), OutcomeUnknownError),
    ],
    ids=["card", "invalid", "idempotency", "rate-limit", "5xx"],
)
def test_stripe_answers_are_classified(
    offline_key: None, stripe_at: object, status: int, body: bytes, expected: type
) -> None:
    adapter, server = stripe_at(respond(status, body))  # type: ignore[operator]
    with pytest.raises(expected):
        adapter.dispatch(request(adapter))
    assert server.connections == 1  # max_network_retries=0: no SDK retry


def test_stripe_idempotency_error_is_key_reused_and_never_retried(
    offline_key: None, stripe_at: object
) -> None:
    # Given Stripe answering that this key was already used with other parameters
    adapter, server = stripe_at(respond(400, error(400, "idempotency_error")))  # type: ignore[operator]
    # Then the attempt is neither retry-later (it can never succeed) nor a plain
    # refusal: the key holds another request, and the reason names Stripe's answer
    with pytest.raises(KeyReusedError) as caught:
        adapter.dispatch(request(adapter))
    assert caught.value.details["reason"] == "idempotency_error"
    assert caught.value.details["http_status"] == 400
    assert "idempotency_error" in str(caught.value)
    assert not isinstance(caught.value, RetryableAdapterError)
    assert server.connections == 1


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (
            409,
            json.dumps(
                {
                    "error": {
                        "type": "idempotency_error",
                        "code": "idempotency_key_in_use",
                        "message": "There is currently another in-progress request",
                    }
                }
            ).encode(),
        ),
    ],
    ids=["key-in-use-409"],
)
def test_stripe_key_in_use_is_retry_later_not_terminal(
    offline_key: None, stripe_at: object, status: int, body: bytes
) -> None:
    # Given Stripe answering a same-key resend with an idempotency conflict
    adapter, server = stripe_at(respond(status, body))  # type: ignore[operator]
    # Then the attempt is retry-later with the same key, never a final failure
    with pytest.raises(RetryableAdapterError) as caught:
        adapter.dispatch(request(adapter))
    assert type(caught.value) is RetryableAdapterError
    assert caught.value.details["reason"] == "key_in_use"
    assert caught.value.details["http_status"] == status
    assert server.connections == 1


def test_stripe_connection_lost_after_send_is_unknown(
    offline_key: None, stripe_at: object
) -> None:
    adapter, server = stripe_at(close_quietly)  # type: ignore[operator]
    with pytest.raises(OutcomeUnknownError):
        adapter.dispatch(request(adapter))
    assert server.connections == 1
    # The downstream key travelled as Stripe's Idempotency-Key
    assert b"idempotency-key: dk-" in server.requests[0].lower()


def test_stripe_refused_connection_is_retryable(offline_key: None) -> None:
    adapter = StripeAdapter(contract(api_base=f"http://127.0.0.1:{free_port()}"))
    try:
        with pytest.raises(RetryableAdapterError):
            adapter.dispatch(request(adapter))
    finally:
        adapter.close()


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        ([], (ProbeStatus.UNKNOWN, None)),
        (
            [
                {
                    "id": "pi_1",
                    "object": "payment_intent",
                    "status": "succeeded",
                    "amount": 1,
                }
            ],
            (ProbeStatus.COMMITTED, "pi_1"),
        ),
    ],
    ids=["absent", "found"],
)
def test_stripe_search_finds_success_but_cannot_prove_absence(
    offline_key: None,
    stripe_at: object,
    found: list[object],
    expected: tuple[object, ...],
) -> None:
    # Stripe search is eventually consistent with no declared bound (spec: such a
    # lookup can discover success, never prove absence).
    page = {"object": "search_result", "data": found, "has_more": False, "url": "/v1/x"}
    adapter, server = stripe_at(respond(200, json.dumps(page).encode()))  # type: ignore[operator]
    attempt = request(adapter)
    result = adapter.probe(ProbeRequest(attempt.effect, ARGUMENTS, adapter.contract))
    assert (result.status, result.external_id) == expected
    assert attempt.downstream_key.encode() in server.requests[0]


@pytest.mark.parametrize("key", ["", "sk_live_123", "rk_test_123"])
def test_stripe_refuses_anything_but_a_test_key(
    monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    monkeypatch.setenv("STRIPE_TEST_KEY", key)
    with pytest.raises(ConfigurationError, match="sk_test_"):
        StripeAdapter(contract())


@pytest.mark.live
@pytest.mark.skipif(
    not os.environ.get("STRIPE_TEST_KEY"),
    reason="live Stripe test: set STRIPE_TEST_KEY=sk_test_... to run it",
)
def test_live_stripe_dedups_by_downstream_key() -> None:
    # Given a real test-mode PaymentIntent create under one downstream key
    adapter = StripeAdapter(contract(timeout="30s", connect_timeout="5s"))
    try:
        attempt = request(adapter)
        first = adapter.dispatch(attempt)
        # When the same effect is dispatched again (a redispatch after a lost answer)
        again = adapter.dispatch(
            DispatchRequest(attempt.effect, ARGUMENTS, "attempt-2", adapter.contract)
        )
        # Then Stripe returns the same intent: one observable effect
        assert first.external_id == again.external_id
        assert str(first.external_id).startswith("pi_")
    finally:
        adapter.close()
