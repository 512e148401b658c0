"""Round trips of a submit. Issue 25, item 3: a replay is ONE indexed read (a prepared
SELECT by tenant and key, nothing sealed, nothing inserted) plus the answer; a new key
is that read, a miss, then ONE reservation statement (intent + event + job). Issue 13:
the reservation answers a key that exists too, so only the concurrent-insert race - ON
CONFLICT waited for another transaction's insert, which this statement's snapshot
cannot see - reads the winner in a second statement."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from effect_broker import store
from effect_broker.domain.errors import PayloadConflictError
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus
from effect_broker.models import EffectEvent, EffectIntent
from effect_broker.scheduling import ProcrastinateScheduler
from effect_broker.services.submission import submit


def _request(key: str) -> EffectRequest:
    return EffectRequest(
        operation_key=key,
        tool="charge_card",
        arguments={"order": "42", "amount_minor": 1999, "currency": "EUR"},
    )


def _intent(tenant: Any, key: str) -> store.NewIntent:
    return store.NewIntent(
        tenant_id=str(tenant.id),
        operation_key=key,
        tool="charge_card",
        request_hash=b"\x01" * 32,
        arguments_ciphertext=b"x",
        arguments_key_id="k1",
        arguments_preview={},
        contract_name="charge_card",
        contract_version="1",
        safety_class="idempotent",
        downstream_key="dk",
    )


def _jobs_for(effect_id: str) -> int:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE args->>'effect_id' = %s",
            [effect_id],
        )
        return int(cur.fetchone()[0])


def _statements(queries: CaptureQueriesContext) -> list[str]:
    """The first word of each statement sent."""
    return [q["sql"].split(None, 1)[0].upper() for q in queries.captured_queries]


@pytest.mark.django_db
def test_a_replay_is_one_indexed_read_and_a_new_key_reads_then_reserves(tenant) -> None:
    # Given a tenant and a key never seen
    # When it is submitted, then submitted again with the same payload
    with CaptureQueriesContext(connection) as new:
        first = submit(tenant, _request("order:rt:1"))
    with CaptureQueriesContext(connection) as replay:
        again = submit(tenant, _request("order:rt:1"))
    # Then the new key was read (a miss), then reserved in one statement
    assert _statements(new) == ["SELECT", "WITH"]
    # And the replay sent exactly one statement: the read by key, nothing inserted
    assert _statements(replay) == ["SELECT"]
    read = replay.captured_queries[0]["sql"]
    assert "INSERT" not in read.upper()
    assert "WHERE tenant_id = " in read
    assert "AND operation_key = " in read
    # And it answered the same effect, field for field (head digest included)
    assert (first.created, again.created, again.replayed) == (True, False, True)
    assert again.effect == first.effect
    # And wrote no event and queued no job
    assert EffectEvent.objects.filter(effect_id=first.effect.effect_id).count() == 1
    assert _jobs_for(first.effect.effect_id) == 1


@pytest.mark.django_db
def test_a_drifted_payload_is_refused_after_the_one_read(tenant) -> None:
    # Given an effect reserved for a key
    first = submit(tenant, _request("order:rt:drift"))
    drifted = EffectRequest(
        operation_key="order:rt:drift",
        tool="charge_card",
        arguments={"order": "42", "amount_minor": 2999, "currency": "EUR"},
    )
    # When the key comes again with another payload
    with (
        CaptureQueriesContext(connection) as queries,
        pytest.raises(PayloadConflictError) as err,
    ):
        submit(tenant, drifted)
    # Then it is the stable conflict, decided by the one read, and nothing changed
    assert err.value.code == "payload_conflict"
    assert _statements(queries) == ["SELECT"]
    assert store.get_effect(str(tenant.id), first.effect.effect_id) == first.effect


@pytest.mark.django_db
def test_a_replay_answers_the_effects_current_state(tenant) -> None:
    # Given an effect a worker has claimed since it was reserved (version 2)
    first = submit(tenant, _request("order:rt:claimed"))
    claimed, _ = store.start_attempt(
        store.load_effect_for_worker(first.effect.effect_id),
        worker="w1",
        now=tenant.created_at,
        changes={},
    )
    # When the caller retries the submit
    with CaptureQueriesContext(connection) as replay:
        again = submit(tenant, _request("order:rt:claimed"))
    # Then the one read answers the row as it is now, not as it was reserved
    assert _statements(replay) == ["SELECT"]
    assert again.replayed is True
    assert again.effect == claimed
    assert (again.effect.status, again.effect.version) == (
        EffectStatus.DISPATCHING,
        2,
    )


@pytest.mark.django_db
def test_a_key_inserted_between_the_read_and_the_reservation_is_a_replay(
    tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an effect whose key the submit's read does not see (as when a concurrent
    # submit commits it just after that read)
    first = submit(tenant, _request("order:rt:race"))
    monkeypatch.setattr(store, "find_effect_by_key", lambda tenant_id, key: None)
    # When the key comes again: the reservation statement finds it
    with CaptureQueriesContext(connection) as queries:
        again = submit(tenant, _request("order:rt:race"))
    # Then it is answered as a replay of that effect, and nothing was written
    assert _statements(queries) == ["WITH"]
    assert (again.created, again.replayed) == (False, True)
    assert again.effect == first.effect
    assert EffectEvent.objects.filter(effect_id=first.effect.effect_id).count() == 1
    assert _jobs_for(first.effect.effect_id) == 1
    # And another payload in that window is still the conflict
    drifted = EffectRequest(
        operation_key="order:rt:race",
        tool="charge_card",
        arguments={"order": "42", "amount_minor": 1, "currency": "EUR"},
    )
    with pytest.raises(PayloadConflictError):
        submit(tenant, drifted)


@pytest.mark.django_db
def test_a_replay_inside_the_callers_transaction_sees_its_own_insert(tenant) -> None:
    # Given a caller's transaction that reserved a key and has not committed
    with transaction.atomic():
        created, was_created = store.reserve(
            _intent(tenant, "order:rt:2"), now=tenant.created_at, actor="caller"
        )
        # When the same transaction reserves the key again
        with CaptureQueriesContext(connection) as again:
            replayed, was_created_again = store.reserve(
                _intent(tenant, "order:rt:2"), now=tenant.created_at, actor="caller"
            )
    # Then one statement returned the row it inserted, with its head digest
    assert len(again.captured_queries) == 1
    assert (was_created, was_created_again) == (True, False)
    assert replayed == created
    assert replayed.head_digest is not None
    assert EffectEvent.objects.filter(effect_id=created.effect_id).count() == 1


def _wait_until_blocked_on_a_lock(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    with connection.cursor() as cur:
        while time.monotonic() < deadline:
            cur.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
            )
            row = cur.fetchone()
            if row is not None and row[0] == "Lock":
                return
            time.sleep(0.01)
    raise AssertionError(f"backend {pid} never waited on a lock")


@pytest.mark.django_db(transaction=True)
def test_the_concurrent_insert_race_reads_twice_and_returns_the_winner(tenant) -> None:
    # Given a winner whose insert of the key is in flight (not committed), with its job
    scheduler = ProcrastinateScheduler()
    inserted, commit = threading.Event(), threading.Event()
    winner: dict[str, Any] = {}
    loser: dict[str, Any] = {}

    def win() -> None:
        try:
            with transaction.atomic():
                intent = _intent(tenant, "order:rt:3")
                winner["out"] = store.reserve(
                    intent,
                    now=tenant.created_at,
                    actor="winner",
                    job=scheduler.reservation_job(intent.effect_id),
                )
                inserted.set()
                commit.wait(10)
        finally:
            connection.close()

    def lose() -> None:
        try:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                loser["pid"] = cur.fetchone()[0]
            started.set()
            intent = _intent(tenant, "order:rt:3")
            with CaptureQueriesContext(connection) as queries:
                loser["out"] = store.reserve(
                    intent,
                    now=tenant.created_at,
                    actor="loser",
                    job=scheduler.reservation_job(intent.effect_id),
                )
            loser["statements"] = len(queries.captured_queries)
        finally:
            connection.close()

    started = threading.Event()
    a = threading.Thread(target=win)
    a.start()
    assert inserted.wait(10)
    # When a second caller reserves the same key: ON CONFLICT waits for the winner
    b = threading.Thread(target=lose)
    b.start()
    assert started.wait(10)
    _wait_until_blocked_on_a_lock(loser["pid"])
    # and the winner commits after the loser's statement took its snapshot
    commit.set()
    a.join(10)
    b.join(10)
    assert not a.is_alive()
    assert not b.is_alive()
    # Then the loser got the winner's row, not created, after exactly two statements
    won: EffectRecord = winner["out"][0]
    lost: EffectRecord = loser["out"][0]
    assert (winner["out"][1], loser["out"][1]) == (True, False)
    assert lost == won
    assert loser["statements"] == 2
    # And only the winner's intent, event and job exist
    assert EffectIntent.objects.filter(operation_key="order:rt:3").count() == 1
    assert EffectEvent.objects.filter(effect_id=won.effect_id).count() == 1
    assert _jobs_for(won.effect_id) == 1
