"""InProcessClient against the test database: the SDK's interface on the services,
with the engine bench standing in for the worker (simulated targets, dispatch run by
hand). And parity: for one effect, BrokerClient over the real API and InProcessClient
hand back equal models, so "the same interface" is a fact, not a hope."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import httpx
import pytest
from django.test import Client

from effect_broker.adapters.simulated_adapter import Fault
from effect_broker.client import (
    NO_RETRY,
    BrokerClient,
    EffectFailed,
    EffectNotFound,
    InProcessClient,
    OutcomeUnknown,
    PayloadConflict,
    Unauthenticated,
)
from effect_broker.client.waiting import POLL_OPERATOR
from effect_broker.domain.states import SafetyClass
from effect_broker.models import EffectIntent
from effect_broker.services import resolution
from effect_broker.services.dispatch import dispatch
from effect_broker.services.tenants import create_tenant
from tests.integration.engine.harness import TOOLS, Bench

pytestmark = pytest.mark.django_db

IDEMPOTENT, UNSAFE = TOOLS[SafetyClass.IDEMPOTENT], TOOLS[SafetyClass.UNSAFE]
NEW_KEY_ADVICE = re.compile(
    r"(new|different|fresh|another)\s+(operation[ _])?key", re.IGNORECASE
)


def worker_between_polls(bench: Bench):
    """A ``sleep`` that runs the dispatch jobs the scheduler recorded, as a worker
    would while the caller waits."""

    def sleep(seconds: float) -> None:
        while bench.scheduler.requests:
            kind, effect_id, _ = bench.scheduler.requests.pop(0)
            if kind == "dispatch":
                dispatch(effect_id, worker="w-sdk")

    return sleep


def test_submit_wait_receipt_history_and_replay(bench: Bench) -> None:
    client = InProcessClient(bench.tenant, sleep=worker_between_polls(bench))
    args = {"amount_minor": 100, "ref": "order-42"}
    first = client.submit("order:42:charge:v1", IDEMPOTENT, args)
    assert (first.status, first.created, first.replayed) == ("prepared", True, False)
    done = client.wait(first.effect_id, timeout=5)
    assert done.status == "succeeded"
    receipt = client.receipt(first.effect_id)
    assert receipt.effect_id == first.effect_id
    assert receipt.result["status"] == "succeeded"
    history = client.history(first.effect_id)
    assert history.chain_verified is True
    assert [e.new_status for e in history.events][-1] == "succeeded"
    assert client.history(first.effect_id, at_sequence=1).status == "prepared"
    again = client.submit("order:42:charge:v1", IDEMPOTENT, args)
    assert (again.effect_id, again.created, again.replayed) == (
        first.effect_id,
        False,
        True,
    )
    assert (
        bench.target_rows(bench.submit.__self__ and client_record(first.effect_id)) == 1
    )


def client_record(effect_id: str):
    from effect_broker import store

    return store.load_effect_for_worker(effect_id)


def test_the_decorator_runs_in_process_and_replays(bench: Bench) -> None:
    client = InProcessClient(bench.tenant, sleep=worker_between_polls(bench))

    @client.effect(tool=IDEMPOTENT, key=lambda ref, **_: f"{ref}:charge:v1")
    def charge(ref: str, amount_minor: int) -> dict[str, Any]: ...

    first = charge("order-7", 250)
    second = charge("order-7", 250)
    assert first == second
    assert first["status"] == "succeeded"
    record = EffectIntent.objects.get(operation_key="order-7:charge:v1")
    assert bench.target_rows(client_record(str(record.id))) == 1


def test_a_payload_conflict_is_typed_and_says_inspect(bench: Bench) -> None:
    client = InProcessClient(bench.tenant)
    first = client.submit("order:9:charge:v1", IDEMPOTENT, {"amount_minor": 1})
    with pytest.raises(PayloadConflict) as error:
        client.submit("order:9:charge:v1", IDEMPOTENT, {"amount_minor": 2})
    assert error.value.effect_id == first.effect_id
    assert (error.value.status, error.value.code) == (409, "payload_conflict")
    assert "inspect the existing effect" in str(error.value).lower()
    assert not NEW_KEY_ADVICE.search(str(error.value))
    assert EffectIntent.objects.filter(operation_key="order:9:charge:v1").count() == 1


def test_an_unknown_outcome_reaches_the_caller_as_one(bench: Bench) -> None:
    # Given an unsafe target that commits and loses its answer
    client = InProcessClient(bench.tenant, sleep=worker_between_polls(bench))
    bench.targets[SafetyClass.UNSAFE].inject(Fault.LOSE_RESPONSE)

    @client.effect(tool=UNSAFE, key=lambda ref, **_: f"{ref}:refund:v1")
    def refund(ref: str, amount_minor: int) -> dict[str, Any]: ...

    # Then the call raises OutcomeUnknown: not a result, not a failure
    with pytest.raises(OutcomeUnknown) as error:
        refund("order-3", 100)
    assert error.value.needs_operator is True
    assert error.value.effect is not None
    assert error.value.effect.status == "outcome_unknown"
    assert not NEW_KEY_ADVICE.search(str(error.value))
    # and the target did apply it once: "unknown" was the honest answer
    assert bench.target_rows(client_record(error.value.effect.effect_id)) == 1


@pytest.mark.parametrize(
    ("verdict", "evidence"),
    [
        ("succeeded", {"source": "target dashboard", "reference": "row 1"}),
        ("failed", None),
    ],
)
def test_waiting_until_settled_waits_for_the_operators_resolution(
    bench: Bench, operator: Any, verdict: str, evidence: dict[str, str] | None
) -> None:
    # Given an unsafe target that commits and loses its answer, and an operator who
    # resolves the unknown outcome while the caller waits (on the third pause)
    bench.targets[SafetyClass.UNSAFE].inject(Fault.LOSE_RESPONSE)
    pauses: list[float] = []
    run_worker = worker_between_polls(bench)

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        run_worker(seconds)
        if len(pauses) == 3:
            (record,) = EffectIntent.objects.filter(operation_key="order-5:refund:v1")
            assert record.status == "outcome_unknown"
            resolution.resolve(
                bench.tenant,
                str(record.id),
                verdict,
                operator=operator,
                reason="checked the target",
                evidence=evidence,
            )

    client = InProcessClient(bench.tenant, sleep=sleep)

    def perform() -> dict[str, Any]:
        return client.perform(
            "order-5:refund:v1",
            tool=UNSAFE,
            arguments={"amount_minor": 100, "ref": "order-5"},
            on_unknown="wait",
            timeout=60,
        )

    # When the caller performs it, waiting for an operator rather than failing
    if verdict == "succeeded":
        # Then it returns the resolution's result
        assert perform() == evidence
    else:
        # Then it raises the final failure (an operator's decision, not a proof)
        with pytest.raises(EffectFailed, match="nothing proved"):
            perform()
    # having read the ledger every POLL_OPERATOR seconds while a person decided (less
    # the time each read took)
    assert pauses[1:] == pytest.approx([POLL_OPERATOR] * 2, abs=1.0)
    record = EffectIntent.objects.get(operation_key="order-5:refund:v1")
    assert bench.target_rows(client_record(str(record.id))) == 1


def test_reads_are_tenant_scoped_and_keys_authenticate(
    bench: Bench, other_tenant
) -> None:
    mine = InProcessClient(bench.tenant).submit("k:1", IDEMPOTENT, {"amount_minor": 1})
    with pytest.raises(EffectNotFound):
        InProcessClient(other_tenant).get(mine.effect_id)
    with pytest.raises(Unauthenticated):
        InProcessClient.for_api_key("eb_not-a-key")
    _, api_key = create_tenant("by-key")
    assert InProcessClient.for_api_key(api_key).tenant.name == "by-key"


class DjangoTestTransport(httpx.BaseTransport):
    """httpx over Django's test client: the real API stack, on the test's connection."""

    def __init__(self) -> None:
        self.django = Client()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path.decode()
        response = self.django.generic(
            request.method,
            path,
            data=request.read(),
            content_type=request.headers.get("content-type", ""),
            HTTP_AUTHORIZATION=request.headers["authorization"],
        )
        return httpx.Response(
            response.status_code,
            headers=dict(response.items()),
            content=response.content,
        )


def test_the_http_and_in_process_clients_see_the_same_effect(bench: Bench) -> None:
    tenant, api_key = create_tenant("parity")
    http = BrokerClient(
        "http://testserver",
        api_key,
        retry=NO_RETRY,
        http_client=httpx.Client(
            base_url="http://testserver", transport=DjangoTestTransport()
        ),
    )
    local = InProcessClient(tenant)
    submitted = http.submit("order:1:charge:v1", IDEMPOTENT, {"amount_minor": 5})
    replayed = local.submit("order:1:charge:v1", IDEMPOTENT, {"amount_minor": 5})
    assert replayed == replace(submitted, created=False, replayed=True)
    dispatch(submitted.effect_id, worker="w-parity")
    assert http.get(submitted.effect_id) == local.get(submitted.effect_id)
    assert http.receipt(submitted.effect_id) == local.receipt(submitted.effect_id)
    assert http.history(submitted.effect_id) == local.history(submitted.effect_id)
    with pytest.raises(PayloadConflict) as over_http:
        http.submit("order:1:charge:v1", IDEMPOTENT, {"amount_minor": 6})
    with pytest.raises(PayloadConflict) as in_process:
        local.submit("order:1:charge:v1", IDEMPOTENT, {"amount_minor": 6})
    assert str(over_http.value) == str(in_process.value)
    assert over_http.value.extras == in_process.value.extras
