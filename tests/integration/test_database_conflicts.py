"""Issue 19, item 3: batches that share keys do not deadlock, and a deadlock or
serialization failure is a retryable 503 on every surface, never a 500.

Two batches holding the same keys in opposite orders each took one key and waited for
the other's: PostgreSQL cancelled one, and the caller got ``500 internal_error``. The
batch statement now inserts in key order. Any deadlock (40P01) or serialization
failure (40001) left - real ones need other writers - answers ``503
database_conflict`` with ``Retry-After`` and leaves no row behind.

Two test triggers on ``effect_intents`` make the database do what a busy one does
now and then: one sleeps before each insert of a ``slow:`` key (so two concurrent
statements overlap deterministically, however the threads are scheduled), the other
raises the real SQLSTATE for a key ending in ``:deadlock`` or ``:serialization``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import OperationalError, connection
from django.test import Client

from effect_broker.api import effects as effects_api
from effect_broker.domain.errors import DatabaseConflictError
from effect_broker.domain.records import EffectRequest
from effect_broker.models import EffectEvent, EffectIntent, Tenant
from effect_broker.services.batch_submission import submit_many
from effect_broker.services.tenants import create_tenant
from tests.integration.mcp_support import World, call_in_memory, open_world

#: Seconds each ``slow:`` insert sleeps: wider than any thread's start-up skew.
SLOW_INSERT_SECONDS = 0.05

_TRIGGER = f"""
CREATE FUNCTION test_conflicting_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.operation_key LIKE '%:deadlock' THEN
        RAISE EXCEPTION 'deadlock detected (test)' USING ERRCODE = '40P01';
    END IF;
    IF NEW.operation_key LIKE '%:serialization' THEN
        RAISE EXCEPTION 'could not serialize access (test)' USING ERRCODE = '40001';
    END IF;
    IF NEW.operation_key LIKE 'slow:%' THEN
        PERFORM pg_sleep({SLOW_INSERT_SECONDS});
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_conflicting_insert BEFORE INSERT ON effect_intents
    FOR EACH ROW EXECUTE FUNCTION test_conflicting_insert();
"""
_DROP = """
DROP TRIGGER IF EXISTS test_conflicting_insert ON effect_intents;
DROP FUNCTION IF EXISTS test_conflicting_insert();
"""


@pytest.fixture
def conflicting_inserts() -> Iterator[None]:
    with connection.cursor() as cur:
        cur.execute(_TRIGGER)
    try:
        yield
    finally:
        with connection.cursor() as cur:
            cur.execute(_DROP)


def _request(key: str) -> EffectRequest:
    return EffectRequest(
        operation_key=key,
        tool="charge_card",
        arguments={"order": key, "amount_minor": 1999, "currency": "EUR"},
    )


def _item(key: str) -> dict[str, Any]:
    return {
        "operation_key": key,
        "tool": "charge_card",
        "arguments": {"order": key, "amount_minor": 1999, "currency": "EUR"},
    }


def _jobs() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM procrastinate_jobs")
        row = cur.fetchone()
    assert row is not None
    return int(row[0])


def _nothing_written(tenant: Tenant, keys: list[str], jobs_before: int) -> None:
    """No intent, event or dispatch job for any of ``keys``."""
    intents = EffectIntent.objects.filter(tenant_id=tenant.id, operation_key__in=keys)
    assert intents.count() == 0
    assert EffectEvent.objects.filter(effect__tenant_id=tenant.id).count() == 0
    assert _jobs() == jobs_before


def _retryable_503(response: Any, reason: str, sqlstate: str) -> None:
    assert response.status_code == 503, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response["Retry-After"] == "1"
    body = response.json()
    assert (body["status"], body["code"]) == (503, "database_conflict")
    assert (body["reason"], body["sqlstate"]) == (reason, sqlstate)
    assert "nothing was recorded" in body["detail"]


# --- the deadlock itself ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_batches_with_the_same_keys_in_opposite_orders_do_not_deadlock(
    conflicting_inserts: None,
) -> None:
    # Given one tenant, and per round four new keys whose inserts are slow
    tenant = create_tenant("deadlock")[0]
    rounds = 3
    failures: list[BaseException] = []
    answers: dict[tuple[int, str], list[tuple[str, str]]] = {}

    def batch(round_: int, name: str, keys: list[str], barrier: threading.Barrier):
        try:
            barrier.wait(10)
            results = submit_many(tenant, [_request(k) for k in keys])
            answers[(round_, name)] = [
                (r.effect.operation_key if r.effect else "", r.outcome) for r in results
            ]
        except BaseException as exc:  # the thread reports, the test asserts
            failures.append(exc)
        finally:
            connection.close()

    for round_ in range(rounds):
        keys = [f"slow:{round_}:{n}" for n in range(4)]
        barrier = threading.Barrier(2)
        # When two batches carry them at the same moment, in opposite orders
        threads = [
            threading.Thread(target=batch, args=(round_, "up", keys, barrier)),
            threading.Thread(target=batch, args=(round_, "down", keys[::-1], barrier)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        # Then neither fails: no deadlock, no error of any kind
        assert failures == []
        up, down = answers[(round_, "up")], answers[(round_, "down")]
        # And each answer lists the items in its caller's order
        assert [k for k, _ in up] == keys
        assert [k for k, _ in down] == keys[::-1]
        # And each key was created by exactly one batch and replayed by the other
        outcomes = dict(up)
        for key, outcome in down:
            assert {outcomes[key], outcome} == {"created", "replayed"}
        assert (
            EffectIntent.objects.filter(tenant_id=tenant.id, operation_key__in=keys)
        ).count() == 4


# --- 503 database_conflict on every surface --------------------------------------------


# Real autocommit, as served: in a test's wrapping transaction the cancelled
# statement would abort the test's own transaction.
@pytest.mark.django_db(transaction=True)
def test_a_deadlocked_submit_is_a_retryable_503_and_writes_nothing(
    conflicting_inserts: None, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a submit whose reservation the database cancels as a deadlock
    client, key = Client(), create_tenant("rest-single")[1]
    tenant = Tenant.objects.get(name="rest-single")
    jobs = _jobs()
    # When it is posted
    response = client.post(
        "/v1/effects",
        data=json.dumps(_item("order:1:deadlock")),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )
    # Then it is a 503 to retry, as problem+json with Retry-After, and nothing stayed
    _retryable_503(response, "deadlock", "40P01")
    _nothing_written(tenant, ["order:1:deadlock"], jobs)
    # And the log has one line for it, without the server's message
    lines = [r for r in caplog.records if getattr(r, "action", "") == "database_conflict"]
    assert [(r.levelname, getattr(r, "sqlstate", "")) for r in lines] == [
        ("WARNING", "40P01")
    ]
    assert "(test)" not in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_batch_cancelled_on_its_last_insert_is_a_retryable_503_and_writes_nothing(
    conflicting_inserts: None,
) -> None:
    # Given a batch whose last insert (in key order) the database cancels, after the
    # first two were inserted by the same statement
    client, key = Client(), create_tenant("rest-batch")[1]
    tenant = Tenant.objects.get(name="rest-batch")
    keys = ["b:2", "a:1", "c:serialization"]
    jobs = _jobs()
    # When it is posted
    response = client.post(
        "/v1/effects/batch",
        data=json.dumps({"items": [_item(k) for k in keys]}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )
    # Then it is a 503 to retry, and none of the three keys, events or jobs stayed
    _retryable_503(response, "serialization_failure", "40001")
    _nothing_written(tenant, keys, jobs)


@pytest.mark.django_db
def test_a_conflict_from_any_other_statement_is_a_503_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a read that meets a serialization failure outside the reservation
    client, key = Client(), create_tenant("rest-read")[1]

    def cancelled(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("could not serialize") from (
            psycopg.errors.SerializationFailure("could not serialize")
        )

    monkeypatch.setattr(effects_api.inspection, "get_effect", cancelled)
    # When it is asked for
    response = client.get(
        "/v1/effects/00000000-0000-0000-0000-000000000000",
        headers={"Authorization": f"Bearer {key}"},
    )
    # Then it is the same 503, not a 500
    _retryable_503(response, "serialization_failure", "40001")


@pytest.fixture
def mcp_world_with_conflicts(tmp_path: Path, transactional_db: None) -> Iterator[World]:
    with connection.cursor() as cur:
        cur.execute(_TRIGGER)
    try:
        with open_world(tmp_path) as world:
            yield world
    finally:
        with connection.cursor() as cur:
            cur.execute(_DROP)


def test_a_deadlocked_mcp_call_is_a_retryable_tool_error_and_stores_nothing(
    mcp_world_with_conflicts: World,
) -> None:
    world = mcp_world_with_conflicts
    # Given a proxy call whose reservation the database cancels as a deadlock
    arguments = {"operation_key": "order:7:deadlock", "order": "7", "amount_minor": 5}
    jobs = _jobs()
    # When the agent calls the tool
    result = call_in_memory(world.tenant, "charge_idempotent", arguments)
    # Then it is the same retryable error the HTTP API answers, not internal_error
    assert result.is_error
    content = result.structured_content
    assert content["code"] == "database_conflict"
    assert content["details"] == {
        "reason": "deadlock",
        "sqlstate": "40P01",
        "retry_after_seconds": 1,
    }
    assert "nothing was recorded" in content["message"]
    # And nothing was stored
    assert world.intents() == 0
    _nothing_written(world.tenant, ["order:7:deadlock"], jobs)


def test_the_conflict_sqlstates_and_only_they_are_recognised() -> None:
    deadlock = DatabaseConflictError.of(psycopg.errors.DeadlockDetected("x"))
    assert deadlock is not None
    assert deadlock.details == {
        "reason": "deadlock",
        "sqlstate": "40P01",
        "retry_after_seconds": 1,
    }
    wrapped = OperationalError("x")
    wrapped.__cause__ = psycopg.errors.SerializationFailure("x")
    conflict = DatabaseConflictError.of(wrapped)
    assert conflict is not None
    assert conflict.details["reason"] == "serialization_failure"
    assert conflict.http_status == 503
    # A lock timeout, a unique violation, a broken connection: not conflicts
    for other in (
        psycopg.errors.LockNotAvailable("x"),
        psycopg.errors.UniqueViolation("x"),
        psycopg.OperationalError("x"),
        RuntimeError("x"),
    ):
        assert DatabaseConflictError.of(other) is None
