"""``POST /v1/effects`` speaks draft-ietf-httpapi-idempotency-key-header (issue 21).

The draft's scenarios, each stated and tested, or stated as not applying and why:

applies (scenario: test)
- missing key, neither header nor body: test_no_key_either_way_is_400_naming_both
- empty header, empty quoted key: test_malformed_headers_are_400_and_write_nothing
- key too long (over 255 characters): the same
- two headers, or a list in one: the same
- a valid key, sf-string or bare token: test_a_quoted_string_and_a_bare_token_...
- first request, replay, drift (422): test_first_request_replay_and_drift_by_the_draft
- replay header (Idempotent-Replayed): the same, and test_a_body_key_replay_says_so_too
- problem+json members (type, title, status, detail; the type resolves): problem_of,
  used by every refusal here
- expiry policy published (Link rel=describedby): test_first_request_replay_and_...

does not apply
- "different key, same payload" is never a conflict: two identical refunds may both be
  meant, so a second key is a second operation (test_a_new_key_with_the_same_body_...).
- "request still being processed: 409 + Retry-After": the broker never runs the effect
  inside the request; the request that reserved the key finished when the intent was
  committed, and a concurrent duplicate waits on the key's unique index and then
  replays. A replay of an effect still being dispatched is answered at once with its
  current state (test_a_replay_while_in_flight_is_200_with_the_current_state).
- key expiry: a key is remembered for as long as its effect exists and the broker
  deletes no effect, so "after expiry the key is new again" never happens.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from effect_broker.models import EffectIntent
from effect_broker.services.tenants import create_tenant

pytestmark = pytest.mark.django_db

# A client from the draft knows the tool and its arguments, nothing else of the body.
BODY = {
    "tool": "charge_card",
    "arguments": {"order": "42", "amount_minor": 1999, "currency": "EUR"},
}


@pytest.fixture
def api_key(db: None) -> str:
    return create_tenant("draft-tenant")[1]


def post(client: Client, api_key: str, body: object, key: str | None = None) -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {api_key}"}
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return client.post(
        "/v1/effects", data=json.dumps(body), content_type="application/json", **headers
    )


def problem_of(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert (body["status"], body["code"]) == (status, code)
    assert body["type"] == f"/problems/{code}"
    assert body["title"] == code.replace("_", " ")
    assert body["detail"]
    return body


def test_first_request_replay_and_drift_by_the_draft(client: Client, api_key) -> None:
    # Given a key sent only in the header
    first = post(client, api_key, BODY, '"order:42:charge:v1"')
    # Then the first request reserves it, and says where the key policy is published
    assert first.status_code == 202
    assert first.json()["operation_key"] == "order:42:charge:v1"
    policy = '</problems/#idempotency-key>; rel="describedby"; type="text/html"'
    assert first["Link"] == policy
    assert "Idempotent-Replayed" not in first
    # When it is resent with the same payload: the same effect, marked a replay
    again = post(client, api_key, BODY, '"order:42:charge:v1"')
    assert again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["effect_id"] == first.json()["effect_id"]
    # When the payload drifts: the draft's 422, the broker's code, nothing written
    drift = {**BODY, "arguments": {**BODY["arguments"], "amount_minor": 1}}
    problem = problem_of(
        post(client, api_key, drift, '"order:42:charge:v1"'), 422, "payload_conflict"
    )
    assert problem["effect_id"] == first.json()["effect_id"]
    assert EffectIntent.objects.count() == 1
    # And the problem's type resolves against this broker, with what to do
    page = client.get(problem["type"])
    assert page.status_code == 200
    assert b"What to do:" in page.content


def test_the_body_key_keeps_the_product_specs_409(client: Client, api_key) -> None:
    post(client, api_key, {**BODY, "operation_key": "order:43"})
    drift = {**BODY, "operation_key": "order:43", "arguments": {"order": "43"}}
    problem_of(post(client, api_key, drift), 409, "payload_conflict")
    # The same key in both places is the header's way (the SDK sends both).
    problem_of(post(client, api_key, drift, "order:43"), 422, "payload_conflict")
    assert EffectIntent.objects.count() == 1


def test_a_body_key_replay_says_so_too(client: Client, api_key) -> None:
    body = {**BODY, "operation_key": "order:44"}
    assert post(client, api_key, body).status_code == 202
    again = post(client, api_key, body)
    assert (again.status_code, again["Idempotent-Replayed"]) == (200, "true")


@pytest.mark.parametrize(
    ("header", "stored"),
    [
        ('"order:45:charge"', "order:45:charge"),
        ("order:45:charge", "order:45:charge"),
        ('"a \\"quoted\\" key, with a comma"', 'a "quoted" key, with a comma'),
        ('  "padded by OWS"  ', "padded by OWS"),
        ('"' + "k" * 255 + '"', "k" * 255),
    ],
    ids=["sf-string", "token", "escapes-and-comma", "ows", "at-the-limit"],
)
def test_a_quoted_string_and_a_bare_token_are_the_key(
    client: Client, api_key, header: str, stored: str
) -> None:
    response = post(client, api_key, BODY, header)
    assert response.status_code == 202, response.content
    assert response.json()["operation_key"] == stored


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        ("", "the header is empty"),
        ('""', "the key is empty"),
        ('"' + "k" * 256 + '"', "the key is 256 characters; at most 255"),
        ("k" * 256, "the key is 256 characters; at most 255"),
        # Two header lines reach Django joined by a comma (ASGI and WSGI alike).
        ('"order:1", "order:2"', "send one key in one header"),
        ("order:1,order:2", "send one key in one header"),
        ('"order:1", order:2', "send one key in one header"),
        ('"unterminated', "no closing quote"),
        ('"bad \\n escape"', "escapes only"),
        ("has space", "bare token"),
        ("1starts-with-a-digit", "bare token"),
        ('"caf\u00e9"', "printable ASCII"),
        ('"tab\there"', "printable ASCII"),
    ],
    ids=[
        "empty-header",
        "empty-string",
        "too-long-string",
        "too-long-token",
        "two-strings",
        "two-tokens",
        "string-and-token",
        "unterminated",
        "bad-escape",
        "space-in-token",
        "digit-first-token",
        "non-ascii",
        "control-char",
    ],
)
def test_malformed_headers_are_400_and_write_nothing(
    client: Client, api_key, header: str, reason: str
) -> None:
    problem = problem_of(post(client, api_key, BODY, header), 400, "invalid_request")
    assert problem["field"] == "Idempotency-Key"
    assert reason in problem["detail"]
    assert EffectIntent.objects.count() == 0


def test_no_key_either_way_is_400_naming_both(client: Client, api_key) -> None:
    problem = problem_of(post(client, api_key, BODY), 400, "invalid_request")
    assert "Idempotency-Key header" in problem["detail"]
    assert "operation_key" in problem["detail"]
    assert client.get(problem["type"]).status_code == 200
    assert EffectIntent.objects.count() == 0


def test_header_and_body_naming_different_keys_is_400(client: Client, api_key) -> None:
    body = {**BODY, "operation_key": "order:46"}
    response = post(client, api_key, body, '"order:47"')
    problem = problem_of(response, 400, "invalid_request")
    assert "different operations" in problem["detail"]
    assert EffectIntent.objects.count() == 0


def test_a_new_key_with_the_same_body_is_a_second_operation(
    client: Client, api_key
) -> None:
    # Not a draft conflict: two equal refunds may both be meant.
    first = post(client, api_key, BODY, "refund:1")
    second = post(client, api_key, BODY, "refund:2")
    assert (first.status_code, second.status_code) == (202, 202)
    assert first.json()["effect_id"] != second.json()["effect_id"]
    assert EffectIntent.objects.count() == 2


def test_a_replay_while_in_flight_is_200_with_the_current_state(
    client: Client, api_key
) -> None:
    # Given an effect reserved and not yet dispatched (no worker runs here)
    first = post(client, api_key, BODY, "order:48")
    assert first.json()["status"] == "prepared"
    # Then its replay is no 409 "still processing": the intent is recorded
    again = post(client, api_key, BODY, "order:48")
    assert (again.status_code, again["Idempotent-Replayed"]) == (200, "true")
    assert again.json()["status"] == "prepared"
    assert "Retry-After" not in again


def test_the_batch_refuses_the_header_and_writes_nothing(client: Client, api_key) -> None:
    response = client.post(
        "/v1/effects/batch",
        data=json.dumps({"items": [{**BODY, "operation_key": "order:49"}]}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api_key}",
        HTTP_IDEMPOTENCY_KEY='"order:49"',
    )
    problem = problem_of(response, 400, "invalid_request")
    assert "each item's operation_key" in problem["detail"]
    assert EffectIntent.objects.count() == 0


def test_the_openapi_document_declares_the_header(client: Client) -> None:
    operation = client.get("/openapi.json").json()["paths"]["/v1/effects"]["post"]
    (header,) = [p for p in operation["parameters"] if p["in"] == "header"]
    assert header["name"] == "Idempotency-Key"
    assert header["required"] is False
    assert header["schema"]["maxLength"] == 255
    answers = operation["responses"]
    assert answers["200"]["headers"]["Idempotent-Replayed"]["schema"]["enum"] == ["true"]
    assert set(answers["202"]["headers"]) == {"Link"}
