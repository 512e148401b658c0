"""The API while its database is down (issue 11): a real uvicorn process, a real
PostgreSQL killed with SIGKILL, real HTTP.

During outages the API answered 500 ``internal_error`` with a traceback per request.
A caller needs a retryable answer that says what happened: 503
``database_unavailable`` (problem+json) with ``Retry-After``, and the log one
warning line per interval, not one per request.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from effect_broker.api.database_unavailable import LOG_EVERY_SECONDS
from tests.acceptance.outage_stack import (
    ApiServer,
    PrivatePostgres,
    clean_env,
    migrated_with_tenant,
    submit,
)

pytestmark = pytest.mark.slow

TOOL = "charge_card"  # examples/contracts.toml, the default contract file
BODY = {"order": "42", "amount_minor": 1999, "currency": "EUR"}
WARNING_LINE = "database unavailable ("


@dataclass
class Stack:
    postgres: PrivatePostgres
    env: dict[str, str]
    api_key: str


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    postgres = PrivatePostgres(Path(tmp_path_factory.mktemp("api-outage")))
    try:
        # DEBUG on, as a developer runs it: Django's request log would then print a
        # line for every error response, which the test must not see either.
        env = clean_env(postgres.url("eb_api_outage"), DEBUG="1")
        yield Stack(postgres, env, migrated_with_tenant(env))
    finally:
        postgres.remove()


#: The API with its connection pool (a refusal is the pool's timeout: it could not
#: connect) and without one (a refusal is the connect error itself).
POOLS = {
    # A refusal waits for the pool this long; short keeps the test short.
    "pooled": {"EFFECT_BROKER_API_DB_POOL_TIMEOUT": "1"},
    "unpooled": {"EFFECT_BROKER_API_DB_POOL_MAX_SIZE": "0"},
}


@pytest.fixture(params=sorted(POOLS))
def api(request: pytest.FixtureRequest, stack: Stack) -> Iterator[ApiServer]:
    stack.postgres.start()  # up, whatever an earlier test left it
    server = ApiServer({**stack.env, **POOLS[request.param]})
    try:
        yield server
    finally:
        server.stop()


def test_while_the_database_is_down_every_request_is_503_database_unavailable(
    stack: Stack, api: ApiServer
) -> None:
    with httpx.Client(base_url=api.url, trust_env=False) as client:
        # Given an API that records effects
        first = submit(client, stack.api_key, TOOL, f"before:{uuid.uuid4()}", BODY)
        assert first.status_code == 202, first.text
        effect_url = f"/v1/effects/{first.json()['effect_id']}"
        headers = {"Authorization": f"Bearer {stack.api_key}"}
        # When its database is SIGKILLed and requests keep coming
        stack.postgres.kill()
        down_at = time.monotonic()
        answers = [
            submit(client, stack.api_key, TOOL, f"during:{i}:{uuid.uuid4()}", BODY)
            for i in range(4)
        ] + [client.get(effect_url, headers=headers, timeout=30) for _ in range(2)]
        # Then each is a 503 database_unavailable problem with Retry-After
        for answer in answers:
            assert answer.status_code == 503, answer.text
            assert answer.headers["content-type"] == "application/problem+json"
            assert answer.headers["retry-after"] == "2"
            problem = answer.json()
            assert problem["code"] == "database_unavailable"
            assert problem["status"] == 503
            assert problem["detail"] == (
                "The broker's database did not answer; nothing was recorded. Retry later."
            )
        # And once the database is back, the same API records effects again
        stack.postgres.start()
        deadline = time.monotonic() + 60
        while True:
            again = submit(client, stack.api_key, TOOL, f"after:{uuid.uuid4()}", BODY)
            if again.status_code == 202 or time.monotonic() > deadline:
                break
            assert again.status_code == 503, again.text
            time.sleep(0.5)
        assert again.status_code == 202, again.text
        refusing_for = time.monotonic() - down_at
        assert client.get(effect_url, headers=headers).status_code == 200
    log = api.log()
    # No traceback, no 500, and the warning rate-limited, not one per request
    assert "Traceback" not in log, log[-3000:]
    assert "internal_error" not in log
    assert "Internal Server Error" not in log
    assert "Service Unavailable" not in log  # Django's per-request line
    warnings = log.count(WARNING_LINE)
    assert 1 <= warnings <= int(refusing_for // LOG_EVERY_SECONDS) + 1, log
    assert warnings < len(answers)
