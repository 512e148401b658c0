"""Batch submit (issue 13): N effects in one statement and one commit, a result per
item, each item keeping a single submit's replay and conflict semantics."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext, override_settings

from effect_broker.domain.errors import (
    InvalidRequestError,
    TenantDisabledError,
    UnknownContractError,
)
from effect_broker.domain.records import EffectRequest
from effect_broker.models import EffectEvent, EffectIntent
from effect_broker.services.batch_submission import submit_many
from effect_broker.services.submission import submit
from effect_broker.store import verify_event_chain

pytestmark = pytest.mark.django_db


def _request(key: str, amount: int = 1999, **extra: Any) -> EffectRequest:
    return EffectRequest(
        operation_key=key,
        tool="charge_card",
        arguments={"order": key, "amount_minor": amount, "currency": "EUR"},
        **extra,
    )


def _jobs_for(effect_ids: list[str]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT args->>'effect_id', task_name, lock, queueing_lock, status"
            " FROM procrastinate_jobs WHERE args->>'effect_id' = ANY(%s) ORDER BY id",
            [effect_ids],
        )
        return list(cur.fetchall())


def _outcomes(results: Any) -> list[str]:
    return [r.outcome for r in results]


def test_new_keys_are_reserved_with_their_events_and_jobs_in_one_statement(
    tenant,
) -> None:
    # Given three new keys
    requests = [_request(f"batch:{n}", requested_by="agent-7") for n in range(3)]
    # When they are submitted as one batch
    with CaptureQueriesContext(connection) as queries:
        results = submit_many(tenant, requests)
    # Then one statement wrote them, each created, in the order sent
    writes = [q for q in queries.captured_queries if "INSERT" in q["sql"]]
    assert len(queries.captured_queries) == 1
    assert len(writes) == 1
    assert _outcomes(results) == ["created"] * 3
    assert [r.index for r in results] == [0, 1, 2]
    assert [r.effect.operation_key for r in results] == [
        r.operation_key for r in requests
    ]
    ids = [r.effect.effect_id for r in results]
    # And each intent has its verified reserved event, with the item's actor
    for effect_id in ids:
        verify_event_chain(effect_id)
        event = EffectEvent.objects.get(effect_id=effect_id)
        assert (event.sequence, event.event_type, event.actor) == (
            1,
            "reserved",
            "agent-7",
        )
    # And each its own dispatch job, queued with the intent
    assert _jobs_for(ids) == [
        (i, "effect_broker.dispatch_effect", f"effect:{i}", f"dispatch:{i}", "todo")
        for i in ids
    ]


def test_a_batch_mixes_created_replayed_and_conflict_per_item(tenant) -> None:
    # Given two effects already reserved one by one
    kept = submit(tenant, _request("mixed:kept")).effect
    submit(tenant, _request("mixed:drift"))
    # When a batch replays one, changes the other's payload and adds a new key
    with CaptureQueriesContext(connection) as queries:
        results = submit_many(
            tenant,
            [
                _request("mixed:kept"),
                _request("mixed:drift", amount=1),
                _request("mixed:new"),
            ],
        )
    # Then each item answers as a single submit would, in one statement
    assert len(queries.captured_queries) == 1
    assert _outcomes(results) == ["replayed", "conflict", "created"]
    assert results[0].effect.effect_id == kept.effect_id
    conflict = results[1].error
    assert conflict is not None
    assert conflict.code == "payload_conflict"
    assert conflict.details["item"] == 1
    assert results[1].effect is None
    # And the conflict wrote nothing: two old rows, one new, one job for the new one
    assert EffectIntent.objects.filter(tenant=tenant).count() == 3
    assert EffectEvent.objects.filter(effect__operation_key="mixed:drift").count() == 1
    assert len(_jobs_for([results[2].effect.effect_id])) == 1
    # (the replayed key still has only the job its own submit queued)
    assert len(_jobs_for([kept.effect_id])) == 1


def test_a_key_repeated_in_a_batch_replays_or_conflicts_with_its_first_item(
    tenant,
) -> None:
    # When one batch carries a key three times: same payload, then another payload
    results = submit_many(
        tenant,
        [_request("dup:1"), _request("dup:1"), _request("dup:1", amount=5)],
    )
    # Then the first creates, the second replays it, the third conflicts with it
    assert _outcomes(results) == ["created", "replayed", "conflict"]
    assert results[1].effect.effect_id == results[0].effect.effect_id
    assert results[2].error is not None
    assert results[2].error.code == "payload_conflict"
    assert results[2].error.details["effect_id"] == results[0].effect.effect_id
    # And one intent, one event, one job exist for the key
    assert EffectIntent.objects.filter(operation_key="dup:1").count() == 1
    assert EffectEvent.objects.filter(effect__operation_key="dup:1").count() == 1
    assert len(_jobs_for([results[0].effect.effect_id])) == 1


def test_an_invalid_item_refuses_the_whole_batch_and_writes_nothing(tenant) -> None:
    # Given a batch whose third item names no contract
    requests = [_request("refused:0"), _request("refused:1")]
    bad = EffectRequest(operation_key="refused:2", tool="no_such_tool", arguments={})
    # When it is submitted, Then the item's own error names it by index
    with pytest.raises(UnknownContractError) as caught:
        submit_many(tenant, [*requests, bad])
    assert caught.value.details["item"] == 2
    # And nothing was written: no intent, no event, no job
    assert EffectIntent.objects.filter(tenant=tenant).count() == 0
    assert EffectEvent.objects.count() == 0
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM procrastinate_jobs")
        assert cur.fetchone() == (0,)


def test_an_invalid_key_refuses_the_batch_with_the_single_submit_error(tenant) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        submit_many(tenant, [_request("ok"), _request(" padded")])
    assert caught.value.details["item"] == 1
    assert caught.value.details["field"] == "operation_key"
    assert EffectIntent.objects.count() == 0


@override_settings(EFFECT_BROKER_MAX_BATCH_ITEMS=3)
def test_a_batch_over_the_cap_is_refused_whole(tenant) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        submit_many(tenant, [_request(f"cap:{n}") for n in range(4)])
    assert (caught.value.details["field"], caught.value.details["limit"]) == ("items", 3)
    assert EffectIntent.objects.count() == 0
    # And a batch at the cap goes through
    assert (
        _outcomes(submit_many(tenant, [_request(f"cap:{n}") for n in range(3)]))
        == ["created"] * 3
    )


def test_an_empty_batch_is_refused(tenant) -> None:
    with pytest.raises(InvalidRequestError):
        submit_many(tenant, [])


def test_a_disabled_tenant_writes_nothing(tenant) -> None:
    tenant.disabled = True
    tenant.save()
    with pytest.raises(TenantDisabledError):
        submit_many(tenant, [_request("off:1")])
    assert EffectIntent.objects.count() == 0


def test_keys_are_scoped_to_the_tenant(tenant, other_tenant) -> None:
    # Given another tenant holding the same key with another payload
    theirs = submit(other_tenant, _request("shared", amount=7)).effect
    # When this tenant batches that key
    results = submit_many(tenant, [_request("shared")])
    # Then it is this tenant's new effect, not a conflict with theirs
    assert _outcomes(results) == ["created"]
    assert results[0].effect.effect_id != theirs.effect_id
    assert results[0].effect.tenant_id == str(tenant.id)


def test_a_batch_replays_what_single_submits_made_and_vice_versa(tenant) -> None:
    # Given a batch-made effect
    made = submit_many(tenant, [_request("both:1")])[0].effect
    # Then a single submit of the same call replays it, and a batch replays it too
    single = submit(tenant, _request("both:1"))
    assert (single.replayed, single.effect.effect_id) == (True, made.effect_id)
    again = submit_many(tenant, [_request("both:1")])
    assert _outcomes(again) == ["replayed"]
    assert again[0].effect == single.effect


@pytest.mark.django_db(transaction=True)
def test_a_key_a_concurrent_submit_commits_during_the_batch_is_read_back(
    tenant,
) -> None:
    # Given another caller's submit of "race:1", reserved but not yet committed
    reserved, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                submit(tenant, _request("race:1"))
                reserved.set()
                release.wait(10)
        finally:
            connection.close()

    found: dict[str, Any] = {}

    def batch() -> None:
        try:
            with CaptureQueriesContext(connection) as queries:
                found["results"] = submit_many(
                    tenant, [_request("race:1"), _request("race:2")]
                )
            found["statements"] = len(queries.captured_queries)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert reserved.wait(10)
    # When a batch carrying that key waits on it (ON CONFLICT), and then it commits
    batcher = threading.Thread(target=batch)
    batcher.start()
    _wait_for_a_lock_waiter()
    release.set()
    holder.join(10)
    batcher.join(10)
    # Then the batch reads the winner in one more statement: a replay, not an error
    assert [r.outcome for r in found["results"]] == ["replayed", "created"]
    assert found["statements"] == 2
    winner = EffectIntent.objects.get(operation_key="race:1")
    assert found["results"][0].effect.effect_id == str(winner.id)


def _wait_for_a_lock_waiter() -> None:
    deadline = time.monotonic() + 10
    with connection.cursor() as cur:
        while time.monotonic() < deadline:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname ="
                " current_database() AND wait_event_type = 'Lock'"
            )
            if cur.fetchone()[0]:
                return
            time.sleep(0.02)
    raise AssertionError("the batch never waited on the uncommitted key")
