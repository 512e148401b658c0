"""The HTTP clients' ``wait`` on the broker's long-poll (``GET /v1/effects/{id}/wait``):
what they ask for, how long they let a read take, that they loop over polls instead of
reading every second, and that an older broker without the route is read instead."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from effect_broker.client import (
    AsyncBrokerClient,
    BrokerClient,
    EffectNotFound,
    OutcomeUnknown,
)
from effect_broker.client.waiting import POLL_OPERATOR
from effect_broker.domain.waits import MAX_WAIT_SECONDS
from tests.unit.client.conftest import (
    EFFECT_ID,
    FakeClock,
    ScriptedBroker,
    effect_json,
    problem,
)

WAIT_PATH = f"/v1/effects/{EFFECT_ID}/wait"
READ_PATH = f"/v1/effects/{EFFECT_ID}"


def polled(clock: FakeClock, status: str, safety: str = "unsafe"):
    """An answer of the long-poll that, like the broker, takes the time asked for
    unless the effect is already where the wait ends (``final``)."""

    def answer(request: httpx.Request) -> httpx.Response:
        if status not in {"succeeded", "failed_final", "compensated"}:
            clock.now += float(request.url.params["timeout"])
        return httpx.Response(200, json=effect_json(status, safety))

    return answer


def client_for(broker: ScriptedBroker, clock: FakeClock, **options) -> BrokerClient:
    http = httpx.Client(
        base_url="http://broker.test",
        transport=httpx.MockTransport(broker),
        timeout=options.pop("timeout", 10.0),
    )
    client = BrokerClient(
        "http://broker.test", "eb_test", http_client=http, sleep=clock.sleep, **options
    )
    client._monotonic = clock.monotonic
    return client


def test_a_settled_wait_loops_over_long_polls_without_reading_every_second(
    broker, clock
) -> None:
    # Given an effect an operator settles during the third poll
    broker.script = [
        polled(clock, "outcome_unknown"),
        polled(clock, "outcome_unknown"),
        polled(clock, "succeeded"),
    ]
    # When the caller waits up to an hour for the operator
    effect = client_for(broker, clock).wait(EFFECT_ID, timeout=3600, until="settled")
    # Then three requests sufficed, none of them a plain read, and no pause between
    assert effect.status == "succeeded"
    assert [r.url.path for r in broker.requests] == [WAIT_PATH] * 3
    assert [dict(r.url.params) for r in broker.requests] == [
        {"timeout": f"{MAX_WAIT_SECONDS:.3f}", "until": "settled"}
    ] * 3
    assert clock.sleeps == []


def test_a_long_poll_may_take_its_wait_on_top_of_the_read_timeout(broker, clock) -> None:
    broker.script = [polled(clock, "succeeded")]
    client_for(broker, clock, timeout=10.0).wait(EFFECT_ID, timeout=4)
    (request,) = broker.requests
    assert request.url.params["until"] == "answer"  # the default wait
    assert request.url.params["timeout"] == "4.000"  # never past the caller's deadline
    assert request.extensions["timeout"]["read"] == pytest.approx(14.0)
    assert request.extensions["timeout"]["connect"] == pytest.approx(10.0)


def test_the_last_poll_asks_only_for_the_time_left(broker, clock) -> None:
    broker.script = [polled(clock, "manual_review"), polled(clock, "manual_review")]
    with pytest.raises(OutcomeUnknown) as error:
        client_for(broker, clock).wait(EFFECT_ID, timeout=40, until="settled")
    assert [r.url.params["timeout"] for r in broker.requests] == ["25.000", "15.000"]
    assert error.value.needs_operator is True
    assert clock.now == pytest.approx(40)


def test_an_older_broker_without_the_long_poll_is_read_on_the_schedule(
    broker, clock
) -> None:
    # Given a broker that predates the route: 404 route_not_found
    broker.script = [
        problem(404, "route_not_found", "no route"),
        httpx.Response(200, json=effect_json("outcome_unknown", "unsafe")),
        httpx.Response(200, json=effect_json("succeeded", "unsafe")),
        httpx.Response(200, json=effect_json("succeeded", "unsafe")),
    ]
    client = client_for(broker, clock)
    assert client.wait(EFFECT_ID, timeout=60, until="settled").status == "succeeded"
    # Then it fell back to plain reads, paced for an operator, and stays with them
    paths = [r.url.path for r in broker.requests]
    assert paths == [WAIT_PATH, READ_PATH, READ_PATH]
    assert clock.sleeps == pytest.approx([POLL_OPERATOR])
    client.wait(EFFECT_ID, timeout=60)
    assert broker.requests[-1].url.path == READ_PATH


def test_a_missing_effect_is_not_taken_for_an_older_broker(broker, clock) -> None:
    broker.script = [problem(404, "effect_not_found", "no such effect")]
    with pytest.raises(EffectNotFound):
        client_for(broker, clock).wait(EFFECT_ID, timeout=5)
    assert len(broker.requests) == 1


def test_the_async_client_long_polls_too(broker, clock) -> None:
    broker.script = [polled(clock, "outcome_unknown"), polled(clock, "failed_final")]

    async def scenario() -> str:
        http = httpx.AsyncClient(
            base_url="http://broker.test", transport=httpx.MockTransport(broker)
        )
        async with AsyncBrokerClient(
            "http://broker.test", "eb_test", http_client=http, sleep=clock.asleep
        ) as client:
            client._monotonic = clock.monotonic
            effect = await client.wait(EFFECT_ID, timeout=600, until="settled")
            return effect.status

    assert asyncio.run(scenario()) == "failed_final"
    assert [r.url.path for r in broker.requests] == [WAIT_PATH] * 2
    assert clock.sleeps == []
