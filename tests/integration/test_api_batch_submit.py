"""``POST /v1/effects/batch`` over HTTP: a result per item, problem+json for a refused
batch (nothing written), the per-item rate-limit charge."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client, override_settings

from effect_broker.models import EffectIntent
from effect_broker.services.tenants import create_tenant
from tests import docs_pages

pytestmark = pytest.mark.django_db

BATCH = "/v1/effects/batch"


def _item(key: str, amount: int = 100) -> dict[str, Any]:
    return {
        "operation_key": key,
        "tool": "charge_card",
        "arguments": {"order": key, "amount_minor": amount, "currency": "EUR"},
    }


def post(client: Client, key: str, body: object) -> Any:
    return client.post(
        BATCH,
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


def _problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert (body["status"], body["code"]) == (status, code)
    return body


def test_a_batch_answers_200_with_a_result_per_item() -> None:
    client, key = Client(), create_tenant("batcher")[1]
    single = client.post(
        "/v1/effects",
        data=json.dumps(_item("api:old")),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    ).json()
    response = post(
        client,
        key,
        {
            "items": [
                _item("api:new"),
                _item("api:old"),
                _item("api:old", amount=1),
                _item("api:new"),
            ]
        },
    )
    assert response.status_code == 200, response.content
    items = response.json()["items"]
    assert [(i["index"], i["outcome"]) for i in items] == [
        (0, "created"),
        (1, "replayed"),
        (2, "conflict"),
        (3, "replayed"),
    ]
    assert items[0]["effect"]["created"] is True
    assert items[1]["effect"]["effect_id"] == single["effect_id"]
    assert items[1]["effect"]["replayed"] is True
    assert items[3]["effect"]["effect_id"] == items[0]["effect"]["effect_id"]
    problem = items[2]["problem"]
    assert (problem["status"], problem["code"], problem["item"]) == (
        409,
        "payload_conflict",
        2,
    )
    assert problem["effect_id"] == single["effect_id"]
    assert items[2]["effect"] is None
    assert EffectIntent.objects.count() == 2


def test_an_invalid_item_refuses_the_batch_as_problem_json() -> None:
    client, key = Client(), create_tenant("batcher")[1]
    bad = {**_item("api:bad"), "tool": "no_such_tool"}
    problem = _problem(
        post(client, key, {"items": [_item("api:ok"), bad]}), 422, "unknown_contract"
    )
    assert problem["item"] == 1
    assert EffectIntent.objects.count() == 0


def test_an_unknown_field_in_an_item_is_refused() -> None:
    client, key = Client(), create_tenant("batcher")[1]
    item = {**_item("api:x"), "tenant_id": "someone-else"}
    _problem(post(client, key, {"items": [item]}), 422, "unknown_field")
    assert EffectIntent.objects.count() == 0


def test_an_empty_batch_is_refused() -> None:
    client, key = Client(), create_tenant("batcher")[1]
    _problem(post(client, key, {"items": []}), 422, "invalid_request")


@override_settings(EFFECT_BROKER_MAX_BATCH_ITEMS=2)
def test_a_batch_over_the_cap_is_400_with_its_limit() -> None:
    client, key = Client(), create_tenant("batcher")[1]
    items = [_item(f"api:cap:{n}") for n in range(3)]
    problem = _problem(post(client, key, {"items": items}), 400, "invalid_request")
    assert (problem["field"], problem["limit"]) == ("items", 2)
    assert EffectIntent.objects.count() == 0


def test_a_batch_needs_the_tenant_key() -> None:
    response = Client().post(
        BATCH, data=json.dumps({"items": [_item("k")]}), content_type="application/json"
    )
    _problem(response, 401, "unauthenticated")
    assert EffectIntent.objects.count() == 0


@override_settings(
    EFFECT_BROKER_TENANT_SUBMIT_RATE=0.5, EFFECT_BROKER_TENANT_SUBMIT_BURST=5
)
def test_a_batch_is_charged_one_token_per_item() -> None:
    client, key = Client(), create_tenant("batcher")[1]
    # Given a burst of 5: a batch of 4 takes 4 tokens
    items = [_item(f"api:rate:{n}") for n in range(4)]
    assert post(client, key, {"items": items}).status_code == 200
    # Then a batch of 2 no longer fits (1 token left), and writes nothing
    more = [_item(f"api:rate:more:{n}") for n in range(2)]
    _problem(post(client, key, {"items": more}), 429, "rate_limited")
    assert EffectIntent.objects.count() == 4


@override_settings(
    EFFECT_BROKER_TENANT_SUBMIT_RATE=0.5, EFFECT_BROKER_TENANT_SUBMIT_BURST=3
)
def test_a_batch_larger_than_the_burst_is_refused_not_undercharged() -> None:
    client, key = Client(), create_tenant("batcher")[1]
    items = [_item(f"api:burst:{n}") for n in range(4)]
    problem = _problem(post(client, key, {"items": items}), 400, "invalid_request")
    assert (problem["field"], problem["limit"]) == ("items", 3)
    assert EffectIntent.objects.count() == 0


def test_get_on_the_batch_path_is_not_an_effect_lookup() -> None:
    key = create_tenant("batcher")[1]
    response = Client().get(BATCH, headers={"Authorization": f"Bearer {key}"})
    _problem(response, 405, "method_not_allowed")


def test_the_readme_batch_example_is_accepted_as_written() -> None:
    # The body of the HTTP API reference's curl example, sent as it is written there
    readme = docs_pages.page("docs/reference/http-api.md")
    found = re.search(r"/v1/effects/batch \\\n.*?-d '(.*?)'\n", readme, re.S)
    assert found is not None
    client, key = Client(), create_tenant("readme")[1]
    response = post(client, key, json.loads(found.group(1)))
    assert response.status_code == 200, response.content
    assert [i["outcome"] for i in response.json()["items"]] == ["created", "created"]
