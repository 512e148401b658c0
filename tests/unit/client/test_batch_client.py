"""``submit_many`` on BrokerClient and AsyncBrokerClient against a scripted broker:
the batch path and body, a typed result per item, local refusal of an invalid item,
and a resend that repeats the same bytes."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from effect_broker.client import (
    AsyncBrokerClient,
    BatchItem,
    BrokerClient,
    InvalidRequest,
    PayloadConflict,
    RetryPolicy,
)
from tests.unit.client.conftest import EFFECT_ID, FakeClock, ScriptedBroker, effect_json

ARGS = {"order": "42", "amount_minor": 1999, "currency": "EUR"}
POLICY = RetryPolicy(attempts=3, initial_delay=0.1, max_delay=1.0)
ITEMS = [
    BatchItem("order:42:charge:v1", "charge_card", ARGS),
    BatchItem("order:43:charge:v1", "charge_card", ARGS, requested_by="agent"),
]
CONFLICT = {
    "type": "x/payload_conflict",
    "title": "payload conflict",
    "status": 409,
    "code": "payload_conflict",
    "detail": "operation key 'order:43:charge:v1' is effect e2, reserved with a "
    "different payload",
    "item": 1,
    "effect_id": "e2",
}
ANSWER = {
    "items": [
        {"index": 0, "outcome": "created", "effect": effect_json(created=True)},
        {"index": 1, "outcome": "conflict", "effect": None, "problem": CONFLICT},
    ]
}


def client_for(broker: ScriptedBroker, clock: FakeClock) -> BrokerClient:
    http = httpx.Client(
        base_url="http://broker.test", transport=httpx.MockTransport(broker)
    )
    return BrokerClient(
        "http://broker.test",
        "eb_test",
        http_client=http,
        retry=POLICY,
        sleep=clock.sleep,
        rand=lambda: 0.0,
    )


def test_submit_many_posts_the_items_and_types_each_result(broker, clock) -> None:
    broker.script = [httpx.Response(200, json=ANSWER)]
    created, conflict = client_for(broker, clock).submit_many(ITEMS)
    (request,) = broker.requests
    assert (request.method, request.url.path) == ("POST", "/v1/effects/batch")
    assert json.loads(request.content) == {
        "items": [
            {
                "operation_key": "order:42:charge:v1",
                "tool": "charge_card",
                "arguments": ARGS,
                "trace_id": None,
                "requested_by": "",
            },
            {
                "operation_key": "order:43:charge:v1",
                "tool": "charge_card",
                "arguments": ARGS,
                "trace_id": None,
                "requested_by": "agent",
            },
        ]
    }
    assert (created.index, created.outcome, created.error) == (0, "created", None)
    assert created.unwrap().effect_id == EFFECT_ID
    assert created.unwrap().created is True
    assert (conflict.index, conflict.outcome, conflict.effect) == (1, "conflict", None)
    assert isinstance(conflict.error, PayloadConflict)
    assert conflict.error.extras == {"item": 1, "effect_id": "e2"}
    with pytest.raises(PayloadConflict):
        conflict.unwrap()


def test_an_invalid_item_is_refused_before_sending(broker, clock) -> None:
    bad = BatchItem(" padded", "charge_card", ARGS)
    with pytest.raises(InvalidRequest) as caught:
        client_for(broker, clock).submit_many([ITEMS[0], bad])
    assert caught.value.extras["item"] == 1
    assert broker.requests == []


def test_a_lost_batch_answer_is_resent_with_the_same_bytes(broker, clock) -> None:
    broker.script = [httpx.ReadTimeout("lost"), httpx.Response(200, json=ANSWER)]
    results = client_for(broker, clock).submit_many(ITEMS)
    assert [r.outcome for r in results] == ["created", "conflict"]
    assert broker.requests[0].content == broker.requests[1].content


def test_the_async_client_submits_a_batch_the_same_way(broker, clock) -> None:
    broker.script = [httpx.Response(200, json=ANSWER)]

    async def scenario():
        http = httpx.AsyncClient(
            base_url="http://broker.test", transport=httpx.MockTransport(broker)
        )
        async with AsyncBrokerClient(
            "http://broker.test", "eb_test", http_client=http, retry=POLICY
        ) as client:
            return await client.submit_many(ITEMS)

    results = asyncio.run(scenario())
    assert [(r.index, r.outcome) for r in results] == [(0, "created"), (1, "conflict")]
    assert broker.requests[0].url.path == "/v1/effects/batch"
    assert isinstance(results[1].error, PayloadConflict)
