"""HTTP surface: reservation semantics over REST and problem+json on every error."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from effect_broker.models import EffectIntent
from effect_broker.services.tenants import create_tenant

BODY = {
    "operation_key": "order:42:charge:v1",
    "tool": "charge_card",
    "arguments": {"order": "42", "amount_minor": 1999, "currency": "EUR"},
}


@pytest.fixture
def api_key(db: None) -> str:
    return create_tenant("api-tenant")[1]


def post(client: Client, key: str | None, body: object, raw: str | None = None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    data = raw if raw is not None else json.dumps(body)
    return client.post(
        "/v1/effects", data=data, content_type="application/json", **headers
    )


def assert_problem(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert (body["status"], body["code"]) == (status, code)
    assert "Traceback" not in body["detail"]
    return body


@pytest.mark.django_db
def test_submit_is_202_then_200_replay_then_409_on_drift(client: Client, api_key) -> None:
    first = post(client, api_key, BODY)
    assert first.status_code == 202
    assert first.json()["created"] is True
    assert first.json()["status"] == "prepared"
    again = post(client, api_key, BODY)
    assert again.status_code == 200
    assert again.json()["replayed"] is True
    assert again.json()["effect_id"] == first.json()["effect_id"]
    drift = {**BODY, "arguments": {**BODY["arguments"], "amount_minor": 1}}
    assert_problem(post(client, api_key, drift), 409, "payload_conflict")
    assert EffectIntent.objects.count() == 1


@pytest.mark.django_db
def test_get_effect_is_tenant_scoped(client: Client, api_key) -> None:
    effect_id = post(client, api_key, BODY).json()["effect_id"]
    mine = client.get(f"/v1/effects/{effect_id}", HTTP_AUTHORIZATION=f"Bearer {api_key}")
    assert mine.status_code == 200
    assert mine.json()["arguments_preview"] == BODY["arguments"]
    other_key = create_tenant("someone-else")[1]
    theirs = client.get(
        f"/v1/effects/{effect_id}", HTTP_AUTHORIZATION=f"Bearer {other_key}"
    )
    assert_problem(theirs, 404, "effect_not_found")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ('{"operation_key": "a", "operation_key": "b"}', "invalid_json"),
        ('{"operation_key": NaN}', "invalid_json"),
        ("{not json", "invalid_json"),
        ("[1, 2]", "invalid_json"),
    ],
    ids=["duplicate-key", "nan", "malformed", "not-an-object"],
)
def test_bad_json_is_a_400_problem(client: Client, api_key, raw: str, code: str) -> None:
    assert_problem(post(client, api_key, None, raw=raw), 400, code)
    assert EffectIntent.objects.count() == 0


@pytest.mark.django_db
def test_big_integers_are_refused_with_advice(client: Client, api_key) -> None:
    body = {**BODY, "arguments": {"amount_minor": 2**60}}
    problem = assert_problem(post(client, api_key, body), 400, "number_out_of_range")
    assert "string" in problem["detail"]


@pytest.mark.django_db
def test_missing_fields_are_a_422_problem(client: Client, api_key) -> None:
    problem = assert_problem(post(client, api_key, {"tool": "x"}), 422, "invalid_request")
    # operation_key may come in the Idempotency-Key header instead (issue 21), so its
    # absence is the 400 that names both ways: test_idempotency_key_header.py.
    assert "arguments" in problem["detail"]


@pytest.mark.django_db
def test_unknown_tool_is_a_422_problem(client: Client, api_key) -> None:
    assert_problem(
        post(client, api_key, {**BODY, "tool": "nope"}), 422, "unknown_contract"
    )


@pytest.mark.django_db
@pytest.mark.parametrize("key", [None, "eb_wrong", "not-even-prefixed"])
def test_requests_without_a_valid_key_are_401(client: Client, key) -> None:
    assert_problem(post(client, key, BODY), 401, "unauthenticated")
    assert EffectIntent.objects.count() == 0


@pytest.mark.django_db
def test_health_and_readiness(client: Client) -> None:
    from tests.integration.test_readiness import live_worker

    assert client.get("/healthz").json() == {"status": "ok"}
    with live_worker():  # readiness also needs a worker (tests/.../test_readiness.py)
        assert client.get("/readyz").json() == {"status": "ready"}
