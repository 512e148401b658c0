"""Issue 19, item 5: Stripe's ``idempotency_error`` (400: this key was already used with
different parameters) is never "retry later", which could never succeed and only burns
the retry budget. The key is taken: the effect goes to ``manual_review`` with that
reason, on the real ledger, driven through the real Stripe SDK against a scripted
loopback Stripe.
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from effect_broker.domain.clock import ManualClock
from effect_broker.domain.contracts import parse_contracts
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus
from effect_broker.models import EffectAttempt, EffectEvent, Tenant
from effect_broker.scheduling import RecordingScheduler
from effect_broker.services import runtime
from effect_broker.services.dispatch import dispatch
from effect_broker.services.reconcile import reconcile
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant
from tests.contract.test_http_classification import (
    ScriptedServer,
    close_quietly,
    respond,
)
from tests.integration.engine.harness import TIMING

stripe = pytest.importorskip("stripe", reason="the stripe extra is not installed")
from effect_broker.adapters.stripe_adapter import StripeAdapter  # noqa: E402

IDEMPOTENCY_ERROR = json.dumps(
    {
        "error": {
            "type": "idempotency_error",
            "message": "Keys for idempotent requests can only be used with the same "
            "parameters they were first used with.",
        }
    }
).encode()


class Script:
    """Answers each connection with the next scripted action (the last repeats)."""

    def __init__(self, *actions: object) -> None:
        self.actions = list(actions)
        self.used = 0

    def __call__(self, conn: socket.socket, stop: threading.Event) -> None:
        action = self.actions[min(self.used, len(self.actions) - 1)]
        self.used += 1
        action(conn, stop)  # type: ignore[operator]


@dataclass
class Stripe:
    server: ScriptedServer
    script: Script
    tenant: Tenant
    scheduler: RecordingScheduler

    def submit(self) -> EffectRecord:
        key = f"order:{uuid.uuid4().hex}:charge"
        request = EffectRequest(
            operation_key=key,
            tool="stripe_charge",
            arguments={"amount_minor": 1999, "currency": "eur"},
        )
        return submit(self.tenant, request).effect


def contracts(api_base: str) -> str:
    return f"""
[[contract]]
name = "payments.stripe-charge"
version = "1"
tool = "stripe_charge"
safety = "idempotent"
key_retention = "24h"
retry_limit = 5
adapter = "stripe"
[contract.adapter_options]
timeout = "2s"
connect_timeout = "1s"
api_base = "{api_base}"
"""


@pytest.fixture
def scripted_stripe(
    request: pytest.FixtureRequest, db: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Stripe]:
    monkeypatch.setenv("STRIPE_TEST_KEY", "sk_test_offline")
    script = Script(*request.param)
    server = ScriptedServer(script)
    adapters: list[StripeAdapter] = []

    def adapter_for(contract):  # type: ignore[no-untyped-def]
        adapters.append(StripeAdapter(contract))
        return adapters[-1]

    scheduler = RecordingScheduler()
    runtime.reset()
    try:
        with runtime.override(
            registry=parse_contracts(contracts(server.url), source="<test>"),
            clock=ManualClock(datetime.now(UTC)),
            scheduler=scheduler,
            adapter_for=adapter_for,
            timing=TIMING,
        ):
            tenant = create_tenant(f"stripe-{uuid.uuid4().hex[:8]}")[0]
            yield Stripe(server, script, tenant, scheduler)
    finally:
        runtime.reset()
        for adapter in adapters:
            adapter.close()
        server.close()


def review_reason(record: EffectRecord) -> str:
    event = EffectEvent.objects.filter(
        effect_id=record.effect_id, event_type="manual_review_required"
    ).get()
    return str(event.metadata["reason"])


def dispatches_deferred(stripe_: Stripe, record: EffectRecord) -> int:
    return sum(
        1
        for kind, effect_id, _ in stripe_.scheduler.requests
        if kind == "dispatch" and effect_id == record.effect_id
    )


@pytest.mark.parametrize(
    "scripted_stripe",
    [(close_quietly, respond(400, IDEMPOTENCY_ERROR))],
    indirect=True,
)
def test_idempotency_error_after_an_attempt_in_doubt_is_manual_review(
    scripted_stripe: Stripe,
) -> None:
    # Given a first attempt whose answer was lost after the request left (in doubt)
    record = scripted_stripe.submit()
    first = dispatch(record.effect_id, worker="w1")
    assert first.status is EffectStatus.OUTCOME_UNKNOWN
    # When the same-key resend is answered "this key was used with other parameters"
    after = reconcile(record.effect_id, worker="w2")
    # Then the effect waits for an operator, with Stripe's reason and the doubt named
    assert after.status is EffectStatus.MANUAL_REVIEW
    assert after.outcome_in_doubt is True
    reason = review_reason(after)
    assert "idempotency_error" in reason
    assert "an earlier attempt may have reached the target unanswered" in reason
    # and nothing retries it: two requests in all, no dispatch deferred
    assert scripted_stripe.server.connections == 2
    assert dispatches_deferred(scripted_stripe, record) == 1  # the submit's only
    assert dispatch(record.effect_id, worker="w3").status is EffectStatus.MANUAL_REVIEW
    assert scripted_stripe.server.connections == 2
    attempts = EffectAttempt.objects.filter(effect_id=record.effect_id)
    assert sorted(a.outcome for a in attempts) == ["refused", "unknown"]


@pytest.mark.parametrize(
    "scripted_stripe", [(respond(400, IDEMPOTENCY_ERROR),)], indirect=True
)
def test_idempotency_error_on_a_first_attempt_is_manual_review_not_a_retry(
    scripted_stripe: Stripe,
) -> None:
    # Given a key Stripe already holds for another request (a restored ledger, a
    # second broker with the same tenant key)
    record = scripted_stripe.submit()
    # When the first attempt is answered idempotency_error
    after = dispatch(record.effect_id, worker="w1")
    # Then it is neither retried (it never could succeed) nor failed_final (the key
    # holds a request nobody can account for): an operator looks
    assert after.status is EffectStatus.MANUAL_REVIEW
    assert "idempotency_error" in review_reason(after)
    assert after.attempt_count == 1
    assert scripted_stripe.server.connections == 1
    assert dispatches_deferred(scripted_stripe, record) == 1  # the submit's only
