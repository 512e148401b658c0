"""Per-tenant submit rate limit (issue 12, item 2): 429 ``rate_limited`` with
``Retry-After``, charged before the body is read, nothing written, other tenants
untouched."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client, override_settings

from effect_broker.models import EffectIntent
from effect_broker.services.tenants import create_tenant

pytestmark = pytest.mark.django_db


def limit(rate: float, burst: float) -> override_settings:
    return override_settings(
        EFFECT_BROKER_TENANT_SUBMIT_RATE=rate, EFFECT_BROKER_TENANT_SUBMIT_BURST=burst
    )


def submit(client: Client, key: str, n: int, body: str | None = None) -> Any:
    payload = body or json.dumps(
        {
            "operation_key": f"order:{n}:charge:v1",
            "tool": "charge_card",
            "arguments": {"order": str(n), "amount_minor": 100, "currency": "EUR"},
        }
    )
    return client.post(
        "/v1/effects",
        data=payload,
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


@override_settings(
    EFFECT_BROKER_TENANT_SUBMIT_RATE=0.5, EFFECT_BROKER_TENANT_SUBMIT_BURST=3
)
def test_past_its_burst_a_tenant_gets_429_and_nothing_is_written() -> None:
    client = Client()
    key = create_tenant("noisy")[1]
    assert [submit(client, key, n).status_code for n in range(3)] == [202, 202, 202]

    refused = submit(client, key, 3)
    assert refused.status_code == 429
    assert refused["Content-Type"] == "application/problem+json"
    assert refused.json()["code"] == "rate_limited"
    assert int(refused["Retry-After"]) >= 1
    assert EffectIntent.objects.count() == 3


@override_settings(
    EFFECT_BROKER_TENANT_SUBMIT_RATE=0.5, EFFECT_BROKER_TENANT_SUBMIT_BURST=1
)
def test_the_limit_is_charged_before_the_body_is_parsed() -> None:
    client = Client()
    key = create_tenant("noisy")[1]
    assert submit(client, key, 0).status_code == 202
    # A body that would be a 400 if parsed: the refusal comes first, so a flood of
    # large or malformed bodies is turned away at the cost of a key check.
    assert submit(client, key, 1, body="{not json").status_code == 429


@override_settings(
    EFFECT_BROKER_TENANT_SUBMIT_RATE=0.5, EFFECT_BROKER_TENANT_SUBMIT_BURST=1
)
def test_one_tenants_flood_leaves_another_tenant_untouched() -> None:
    client = Client()
    noisy = create_tenant("noisy")[1]
    quiet = create_tenant("quiet")[1]
    submit(client, noisy, 0)
    assert submit(client, noisy, 1).status_code == 429
    assert submit(client, quiet, 1).status_code == 202


@override_settings(
    EFFECT_BROKER_TENANT_SUBMIT_RATE=0.5, EFFECT_BROKER_TENANT_SUBMIT_BURST=1
)
def test_reads_are_not_charged_to_the_submit_limit() -> None:
    client = Client()
    key = create_tenant("noisy")[1]
    submit(client, key, 0)
    listed = client.get("/v1/effects", headers={"Authorization": f"Bearer {key}"})
    assert listed.status_code == 200


@override_settings(
    EFFECT_BROKER_TENANT_SUBMIT_RATE=0, EFFECT_BROKER_TENANT_SUBMIT_BURST=1
)
def test_a_rate_of_zero_turns_the_limit_off() -> None:
    client = Client()
    key = create_tenant("bulk")[1]
    assert {submit(client, key, n).status_code for n in range(5)} == {202}


@limit(rate=1, burst=20)
def test_a_large_body_spends_the_budget_of_many_small_ones() -> None:
    client = Client()
    key = create_tenant("bulky")[1]
    arguments = {"order": "1", "amount_minor": 100, "currency": "EUR"}
    arguments |= {f"note_{i}": "x" * 200 for i in range(500)}  # ~110 KB: 7 tokens
    bodies = [
        json.dumps(
            {"operation_key": f"bulk:{n}", "tool": "charge_card", "arguments": arguments}
        )
        for n in range(3)
    ]
    statuses = [
        submit(client, key, n, body=body).status_code for n, body in enumerate(bodies)
    ]
    assert statuses == [202, 202, 429]  # 20 tokens: two large submits, not twenty


def test_a_list_page_is_bounded_and_a_larger_limit_is_refused() -> None:
    client = Client()
    key = create_tenant("reader")[1]
    auth = {"Authorization": f"Bearer {key}"}
    assert client.get("/v1/effects?limit=500", headers=auth).status_code == 200
    refused = client.get("/v1/effects?limit=501", headers=auth)
    assert refused.status_code == 422
    assert refused.json()["field"] == "query.limit"
