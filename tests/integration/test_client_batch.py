"""``InProcessClient.submit_many`` on the services, and parity with ``BrokerClient``
over the real API: the same results, the same typed conflicts."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest

from effect_broker.client import (
    NO_RETRY,
    BatchItem,
    BrokerClient,
    InProcessClient,
    PayloadConflict,
    UnknownContract,
)
from effect_broker.domain.states import SafetyClass
from effect_broker.models import EffectIntent
from effect_broker.services.tenants import create_tenant
from tests.integration.engine.harness import TOOLS, Bench
from tests.integration.test_client_in_process import DjangoTestTransport

pytestmark = pytest.mark.django_db

IDEMPOTENT = TOOLS[SafetyClass.IDEMPOTENT]


def test_in_process_submit_many_reserves_and_dispatches_each_new_item(
    bench: Bench,
) -> None:
    client = InProcessClient(bench.tenant)
    results = client.submit_many(
        [
            BatchItem("batch:1", IDEMPOTENT, {"amount_minor": 1}),
            BatchItem("batch:2", IDEMPOTENT, {"amount_minor": 2}),
            BatchItem("batch:1", IDEMPOTENT, {"amount_minor": 9}),
        ]
    )
    assert [r.outcome for r in results] == ["created", "created", "conflict"]
    assert results[0].unwrap().created is True
    assert isinstance(results[2].error, PayloadConflict)
    assert results[2].error.extras["item"] == 2
    # The scheduler without job rows was asked to dispatch each created effect once
    assert [r[:2] for r in bench.scheduler.requests] == [
        ("dispatch", results[0].unwrap().effect_id),
        ("dispatch", results[1].unwrap().effect_id),
    ]


def test_in_process_refuses_a_batch_with_an_unknown_tool_and_writes_nothing(
    bench: Bench,
) -> None:
    client = InProcessClient(bench.tenant)
    with pytest.raises(UnknownContract) as caught:
        client.submit_many(
            [
                BatchItem("batch:ok", IDEMPOTENT, {"amount_minor": 1}),
                BatchItem("batch:bad", "no_such_tool", {}),
            ]
        )
    assert caught.value.extras["item"] == 1
    assert EffectIntent.objects.count() == 0


def test_the_http_and_in_process_clients_give_the_same_batch_results(
    bench: Bench,
) -> None:
    tenant, api_key = create_tenant("batch-parity")
    http = BrokerClient(
        "http://testserver",
        api_key,
        retry=NO_RETRY,
        http_client=httpx.Client(
            base_url="http://testserver", transport=DjangoTestTransport()
        ),
    )
    local = InProcessClient(tenant)
    items = [
        BatchItem("parity:1", IDEMPOTENT, {"amount_minor": 1}),
        BatchItem("parity:2", IDEMPOTENT, {"amount_minor": 2}),
    ]
    over_http = http.submit_many(items)
    assert [r.outcome for r in over_http] == ["created", "created"]
    drifted = [items[0], replace(items[1], arguments={"amount_minor": 3})]
    again_http = http.submit_many(drifted)
    again_local = local.submit_many(drifted)
    assert [r.outcome for r in again_local] == ["replayed", "conflict"]
    assert again_http[0].effect == again_local[0].effect
    assert again_local[0].effect == replace(
        over_http[0].unwrap(), created=False, replayed=True
    )
    http_error, local_error = again_http[1].error, again_local[1].error
    assert isinstance(http_error, PayloadConflict)
    assert isinstance(local_error, PayloadConflict)
    assert str(http_error) == str(local_error)
    assert http_error.extras == local_error.extras
