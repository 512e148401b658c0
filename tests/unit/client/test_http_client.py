"""BrokerClient and AsyncBrokerClient against a scripted broker: the API's paths and
JSON, typed errors, and the resend rules (transport errors and 5xx resent with
backoff, 429 only with Retry-After, no other 4xx ever)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from effect_broker.client import (
    NO_RETRY,
    AsyncBrokerClient,
    BrokerClient,
    BrokerError,
    BrokerUnavailable,
    DatabaseUnavailable,
    EffectNotFound,
    InternalServerError,
    InvalidJson,
    InvalidRequest,
    NumberOutOfRange,
    PayloadConflict,
    RetryPolicy,
)
from tests.unit.client.conftest import (
    EFFECT_ID,
    FakeClock,
    ScriptedBroker,
    effect_json,
    problem,
    receipt_json,
)

ARGS = {"order": "42", "amount_minor": 1999, "currency": "EUR"}
POLICY = RetryPolicy(attempts=3, initial_delay=0.1, max_delay=1.0)


def client_for(
    broker: ScriptedBroker, clock: FakeClock, retry: RetryPolicy = POLICY
) -> BrokerClient:
    http = httpx.Client(
        base_url="http://broker.test", transport=httpx.MockTransport(broker)
    )
    return BrokerClient(
        "http://broker.test",
        "eb_test",
        http_client=http,
        retry=retry,
        sleep=clock.sleep,
        rand=lambda: 0.0,
    )


def submit(client: BrokerClient, **arguments: object):
    return client.submit("order:42:charge:v1", "charge_card", arguments or ARGS)


def test_submit_posts_the_api_body_and_reads_a_202_as_created(broker, clock) -> None:
    broker.script = [httpx.Response(202, json=effect_json(created=True, replayed=False))]
    effect = submit(client_for(broker, clock))
    (request,) = broker.requests
    assert (request.method, request.url.path) == ("POST", "/v1/effects")
    assert request.headers["Authorization"] == "Bearer eb_test"
    assert request.headers["Content-Type"] == "application/json"
    assert json.loads(request.content) == {
        "operation_key": "order:42:charge:v1",
        "tool": "charge_card",
        "arguments": ARGS,
        "trace_id": None,
        "requested_by": "",
    }
    assert (effect.effect_id, effect.status, effect.created) == (
        EFFECT_ID,
        "prepared",
        True,
    )
    assert clock.sleeps == []


def test_a_submit_whose_answer_was_lost_is_resent_and_replays(broker, clock) -> None:
    # Given the first answer never arrives (the broker may have committed)
    broker.script = [
        httpx.ReadTimeout("lost"),
        httpx.Response(200, json=effect_json(created=False, replayed=True)),
    ]
    effect = submit(client_for(broker, clock))
    # Then the same bytes went out again and the broker answered with a replay
    assert len(broker.requests) == 2
    assert broker.requests[0].content == broker.requests[1].content
    assert (effect.effect_id, effect.replayed) == (EFFECT_ID, True)
    assert clock.sleeps == [pytest.approx(0.05)]


def test_transport_errors_back_off_exponentially_with_jitter(broker, clock) -> None:
    broker.script = [
        httpx.ConnectError("refused"),
        httpx.RemoteProtocolError("reset"),
        httpx.Response(202, json=effect_json()),
    ]
    policy = RetryPolicy(attempts=3, initial_delay=0.1, max_delay=1.0)
    http = httpx.Client(base_url="http://b.test", transport=httpx.MockTransport(broker))
    client = BrokerClient(
        "http://b.test",
        "k",
        http_client=http,
        retry=policy,
        sleep=clock.sleep,
        rand=lambda: 1.0,
    )
    submit(client)
    # Equal jitter: half the capped backoff plus up to the other half (here all of it).
    assert clock.sleeps == [pytest.approx(0.1), pytest.approx(0.2)]


def test_a_503_with_retry_after_waits_at_least_that_long(broker, clock) -> None:
    broker.script = [
        httpx.Response(503, text="upstream busy", headers={"Retry-After": "2"}),
        httpx.Response(202, json=effect_json()),
    ]
    submit(client_for(broker, clock))
    assert len(broker.requests) == 2
    assert clock.sleeps == [2.0]


def test_database_unavailable_is_resent_after_its_retry_after_then_typed(
    broker, clock
) -> None:
    # Issue 11: while the broker's database restarts, a submit is 503
    # database_unavailable; resending it with the same key is what the caller wants.
    unavailable = problem(
        503, "database_unavailable", "database did not answer", reason="server_starting"
    )
    unavailable.headers["Retry-After"] = "2"
    broker.script = [unavailable, httpx.Response(202, json=effect_json())]
    submit(client_for(broker, clock))
    assert (len(broker.requests), clock.sleeps) == (2, [2.0])
    broker.script = [unavailable] * 3
    with pytest.raises(DatabaseUnavailable) as error:
        submit(client_for(broker, clock))
    assert (error.value.status, error.value.code) == (503, "database_unavailable")


def test_5xx_is_resent_until_the_attempts_are_spent_then_typed(broker, clock) -> None:
    broker.script = [problem(500, "internal_error", "internal error")] * 3
    with pytest.raises(InternalServerError) as error:
        submit(client_for(broker, clock))
    assert (error.value.status, len(broker.requests)) == (500, 3)
    assert len(clock.sleeps) == 2


def test_a_proxy_5xx_that_is_not_a_problem_ends_as_broker_unavailable(
    broker, clock
) -> None:
    broker.script = [httpx.Response(502, text="<html>bad gateway</html>")] * 3
    with pytest.raises(BrokerUnavailable) as error:
        submit(client_for(broker, clock))
    assert error.value.status == 502
    assert error.value.code == "broker_unavailable"


def test_transport_errors_past_the_last_attempt_are_broker_unavailable(
    broker, clock
) -> None:
    broker.script = [httpx.ConnectError("refused")]
    with pytest.raises(BrokerUnavailable) as error:
        submit(client_for(broker, clock, retry=NO_RETRY))
    assert isinstance(error.value.__cause__, httpx.ConnectError)
    assert error.value.status is None
    assert clock.sleeps == []


def test_a_payload_conflict_is_never_resent(broker, clock) -> None:
    broker.script = [
        problem(409, "payload_conflict", "Inspect the existing effect e1", effect_id="e1")
    ]
    with pytest.raises(PayloadConflict) as error:
        submit(client_for(broker, clock))
    assert (error.value.effect_id, len(broker.requests)) == ("e1", 1)
    assert clock.sleeps == []


@pytest.mark.parametrize(
    ("headers", "requests"),
    [({}, 1), ({"Retry-After": "1"}, 2)],
    ids=["without-retry-after", "with-retry-after"],
)
def test_a_429_is_resent_only_when_it_says_when(broker, clock, headers, requests) -> None:
    busy = problem(429, "rate_limited")
    busy.headers.update(headers)
    broker.script = [busy, httpx.Response(202, json=effect_json())]
    if requests == 1:
        with pytest.raises(BrokerError) as error:
            submit(client_for(broker, clock))
        assert error.value.code == "rate_limited"
    else:
        submit(client_for(broker, clock))
    assert len(broker.requests) == requests


def test_an_unsupported_scheme_is_not_resent(clock) -> None:
    client = BrokerClient("ftp://broker.test", "k", retry=POLICY, sleep=clock.sleep)
    with pytest.raises(BrokerUnavailable):
        submit(client)
    assert clock.sleeps == []


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"amount": float("nan")}, InvalidJson),
        ({"amount_minor": 2**60}, NumberOutOfRange),
    ],
    ids=["nan", "beyond-2**53"],
)
def test_arguments_the_broker_would_refuse_are_refused_before_sending(
    broker, clock, arguments, error
) -> None:
    with pytest.raises(error):
        submit(client_for(broker, clock), **arguments)
    assert broker.requests == []


@pytest.mark.parametrize("key", ["", " order:42", "order:\x0042"])
def test_an_unusable_operation_key_is_refused_before_sending(broker, clock, key) -> None:
    with pytest.raises(InvalidRequest):
        client_for(broker, clock).submit(key, "charge_card", ARGS)
    assert broker.requests == []


def test_reads_use_the_api_paths_with_the_id_escaped(broker, clock) -> None:
    broker.script = [
        httpx.Response(200, json=effect_json("succeeded")),
        httpx.Response(200, json=receipt_json({"charge_id": "ch_1"})),
        httpx.Response(
            200,
            json={
                "effect_id": EFFECT_ID,
                "at_sequence": 1,
                "latest_sequence": 3,
                "status": "prepared",
                "version": 1,
                "chain_verified": True,
                "events": [
                    {
                        "sequence": 1,
                        "event_type": "reserved",
                        "old_status": None,
                        "new_status": "prepared",
                        "version": 1,
                        "actor": "caller",
                        "occurred_at": "2026-12-03T21:00:00Z",
                        "metadata": {},
                        "digest": "ab",
                    }
                ],
            },
        ),
        problem(404, "effect_not_found", "no effect"),
    ]
    client = client_for(broker, clock)
    assert client.get(EFFECT_ID).status == "succeeded"
    assert client.receipt(EFFECT_ID).result == {"charge_id": "ch_1"}
    history = client.history(EFFECT_ID, at_sequence=1)
    assert (history.at_sequence, history.events[0].event_type) == (1, "reserved")
    with pytest.raises(EffectNotFound):
        client.get("../../admin")
    paths = [r.url.raw_path.decode() for r in broker.requests]
    assert paths == [
        f"/v1/effects/{EFFECT_ID}",
        f"/v1/effects/{EFFECT_ID}/receipt",
        f"/v1/effects/{EFFECT_ID}/history?at_sequence=1",
        "/v1/effects/..%2F..%2Fadmin",
    ]


def test_the_async_client_resends_the_same_way(broker, clock) -> None:
    broker.script = [
        httpx.ConnectError("refused"),
        httpx.Response(503, text="busy", headers={"Retry-After": "1"}),
        httpx.Response(202, json=effect_json(created=True)),
    ]

    async def scenario():
        http = httpx.AsyncClient(
            base_url="http://broker.test", transport=httpx.MockTransport(broker)
        )
        async with AsyncBrokerClient(
            "http://broker.test",
            "eb_test",
            http_client=http,
            retry=POLICY,
            sleep=clock.asleep,
            rand=lambda: 0.0,
        ) as client:
            return await client.submit("order:42:charge:v1", "charge_card", ARGS)

    effect = asyncio.run(scenario())
    assert effect.created is True
    assert len(broker.requests) == 3
    assert clock.sleeps == [pytest.approx(0.05), 1.0]
    assert {r.headers["Authorization"] for r in broker.requests} == {"Bearer eb_test"}


def test_arguments_that_are_not_an_object_are_refused_before_sending(
    broker, clock
) -> None:
    with pytest.raises(InvalidRequest, match="JSON object"):
        client_for(broker, clock).submit("k:1", "charge_card", [1, 2])  # type: ignore[arg-type]
    assert broker.requests == []


@pytest.mark.parametrize(
    ("key", "header"),
    [
        ("order:42:charge:v1", '"order:42:charge:v1"'),
        ('say "hi" \\ there', '"say \\"hi\\" \\\\ there"'),
        # Outside printable ASCII a key cannot be a Structured Field String: the body
        # alone carries it.
        ("bestellung:Zoë:1", None),
    ],
    ids=["plain", "escaped", "non-ascii"],
)
def test_submit_sends_the_key_as_the_drafts_idempotency_key_header(
    broker, clock, key: str, header: str | None
) -> None:
    # Issue 21: the SDK speaks the draft too, and keeps the key in the body (the
    # same key both ways), so an older broker that ignores the header still works.
    broker.script = [httpx.Response(202, json=effect_json(created=True)) for _ in "ab"]
    client_for(broker, clock).submit(key, "charge_card", ARGS)

    async def scenario() -> None:
        http = httpx.AsyncClient(
            base_url="http://broker.test", transport=httpx.MockTransport(broker)
        )
        async with AsyncBrokerClient(
            "http://broker.test", "eb_test", http_client=http, retry=POLICY
        ) as client:
            await client.submit(key, "charge_card", ARGS)

    asyncio.run(scenario())
    assert len(broker.requests) == 2  # the sync client's, then the async one's
    for request in broker.requests:
        assert request.headers.get("Idempotency-Key") == header
        assert json.loads(request.content)["operation_key"] == key
