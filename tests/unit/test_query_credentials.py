"""Credentials in a query string (effect_broker.api.query_credentials): refused with
400 before the application runs, and scrubbed from the scope the access log reads."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from effect_broker.api.query_credentials import QueryCredentialGuard


def call(query: bytes) -> tuple[int, bytes, dict[str, Any], bool]:
    reached: list[bool] = []
    sent: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        reached.append(True)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "path": "/v1/effects", "query_string": query}
    asyncio.run(QueryCredentialGuard(app)(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return sent[0]["status"], body, scope, bool(reached)


@pytest.mark.parametrize(
    ("query", "left"),
    [
        (b"api_key=abc&tool=x", b"tool=x"),
        (b"API_KEY=abc", b""),
        (b"tool=x&access_token=abc", b"tool=x"),
        (b"k=eb_" + b"s" * 43, b""),
        (b"k=eb%5F" + b"s" * 43 + b"&limit=5", b"limit=5"),  # percent-encoded
        (b"t=ebop_" + b"x-_Z9" * 8, b""),
    ],
)
def test_a_credential_is_refused_and_scrubbed(query: bytes, left: bytes) -> None:
    status, body, scope, reached = call(query)
    assert status == 400
    assert json.loads(body)["code"] == "credential_in_query"
    assert scope["query_string"] == left
    assert reached is False


@pytest.mark.parametrize(
    "query",
    [
        b"",
        b"tool=charge_card&limit=5",
        b"operation_prefix=eb_order:",
        b"operation_prefix=" + b"eb_" + b"s" * 20,
        b"q=token",
    ],
)
def test_other_query_strings_pass_untouched(query: bytes) -> None:
    status, _, scope, reached = call(query)
    assert (status, reached) == (200, True)
    assert scope["query_string"] == query
