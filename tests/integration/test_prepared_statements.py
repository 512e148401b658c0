"""Issue 13: the reservation and the fenced compare-and-swap run as server-side prepared
statements (effect_broker.store.prepared), and write exactly what the client-bound
statements wrote; the off switch sends them as Django sends everything else; the
statements are still seen by Django's query log and django-prometheus; a pooled
connection keeps them across borrowings."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any, cast

import pytest
from django.db import connection, transaction
from django.db.backends.postgresql.base import DatabaseWrapper as PostgresWrapper
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django_prometheus.db import execute_total

from effect_broker import store
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import EffectAttempt, EffectEvent, EffectIntent, EffectReceipt
from effect_broker.services.dispatch import dispatch
from effect_broker.store import db_time
from tests.integration.engine.harness import Bench, engine_bench


def _prepared_on_this_connection() -> list[str]:
    """The statements psycopg prepared on this session (protocol-level, not SQL)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT statement FROM pg_prepared_statements WHERE NOT from_sql "
            "ORDER BY prepare_time"
        )
        return [" ".join(str(row[0]).split()) for row in cur.fetchall()]


def _reserving(statements: list[str]) -> list[str]:
    return [s for s in statements if s.startswith("WITH intent AS ( INSERT")]


def _fencing(statements: list[str]) -> list[str]:
    return [s for s in statements if s.startswith("WITH cas AS ( UPDATE")]


@pytest.fixture
def bench(db: None) -> Iterator[Bench]:
    with engine_bench() as b:
        yield b


#: Event metadata that names a row or a target id, different in each run.
_IDS = frozenset({"receipt_id", "external_id"})


def _lifecycle(bench: Bench, key: str) -> dict[str, Any]:
    """Submit, replay, claim, heartbeat (a touch with database times) and dispatch to
    success: every statement shape this module prepares; returns what was stored,
    without ids and times."""
    record = bench.submit(SafetyClass.IDEMPOTENT, key=key)
    replayed = bench.submit(SafetyClass.IDEMPOTENT, key=key)
    assert replayed.effect_id == record.effect_id
    touched = store.touch(
        record,
        event_type="schedule_changed",
        actor="tester",
        now=record.updated_at + timedelta(seconds=1),
        metadata={"why": "ünïcode ✓", "n": 3},
        changes={"next_action_at": db_time.after_now(timedelta(0), timedelta(0))},
    )
    done = dispatch(touched.effect_id, worker="w1")
    assert done.status is EffectStatus.SUCCEEDED
    intent = EffectIntent.objects.get(pk=done.effect_id)
    attempt = EffectAttempt.objects.get(effect_id=done.effect_id)
    receipt = EffectReceipt.objects.get(effect_id=done.effect_id)
    return {
        "record": (
            done.status,
            done.version,
            done.attempt_count,
            done.arguments_preview,
            done.outcome_in_doubt,
            done.safety,
            done.lease_owner,
        ),
        "times_set": (
            intent.first_dispatch_at is not None,
            intent.retention_deadline is not None,
            intent.created_at.tzinfo is not None,
        ),
        "events": [
            (
                e.sequence,
                e.event_type,
                e.old_status,
                e.new_status,
                e.actor,
                {k: "<id>" if k in _IDS else v for k, v in e.metadata.items()},
            )
            for e in EffectEvent.objects.filter(effect_id=done.effect_id).order_by(
                "sequence"
            )
        ],
        "chain": store.verify_event_chain(done.effect_id),
        "attempt": (
            attempt.ordinal,
            attempt.fencing_version,
            attempt.outcome,
            attempt.transport_meta,
            attempt.bytes_may_have_left,
            attempt.ended_at is not None,
        ),
        "receipt": (receipt.result_preview, receipt.result_key_id != ""),
        "hash_matches": bytes(intent.request_hash) == record.request_hash,
    }


@pytest.mark.django_db
def test_prepared_and_client_bound_statements_store_the_same_rows(bench: Bench) -> None:
    # Given the same lifecycle run once client-bound and once prepared
    with override_settings(EFFECT_BROKER_DB_PREPARED_STATEMENTS=False):
        plain = _lifecycle(bench, "order:prep:plain")
        assert _prepared_on_this_connection() == []
    prepared = _lifecycle(bench, "order:prep:prepared")
    # Then the prepared run did prepare the reservation and the fenced writes
    statements = _prepared_on_this_connection()
    assert len(_reserving(statements)) == 1
    assert len(_fencing(statements)) >= 3  # touch, claim, outcome: three shapes
    # And every value stored (types: uuid, jsonb, bytea, timestamptz, int, bool) is
    # the same as the client-bound statements stored
    assert prepared == plain
    assert prepared["chain"] == 4  # reserved, touched, dispatch_started, succeeded


@pytest.mark.django_db
def test_the_off_switch_prepares_nothing(tenant: Any, bench: Bench) -> None:
    # Given prepared statements switched off (a transaction-mode pooler)
    with override_settings(EFFECT_BROKER_DB_PREPARED_STATEMENTS=False):
        # When an effect is submitted, replayed and dispatched
        record = bench.submit(SafetyClass.IDEMPOTENT, key="order:prep:off")
        bench.submit(SafetyClass.IDEMPOTENT, key="order:prep:off")
        dispatch(record.effect_id, worker="w1")
    # Then nothing was prepared on the server
    assert _prepared_on_this_connection() == []


def _executions() -> float:
    return cast(float, execute_total.labels("default", "postgresql")._value.get())


@pytest.mark.django_db
def test_a_prepared_statement_is_logged_and_counted_once(bench: Bench) -> None:
    # Given the configured engine: django-prometheus's for DATABASE_URL (metered); the
    # embedded server's engine has no query metrics, only Django's query log
    metered = connection.settings_dict["ENGINE"].startswith("django_prometheus")
    before = _executions()
    # When a new key is reserved through the prepared statement
    with CaptureQueriesContext(connection) as queries:
        record = bench.submit(SafetyClass.IDEMPOTENT, key="order:prep:counted")
    # Then Django's query log holds the one statement, with its values bound in
    reserving = [q["sql"] for q in queries.captured_queries if "INSERT" in q["sql"]]
    assert len(reserving) == 1
    assert "order:prep:counted" in reserving[0]
    assert record.effect_id in reserving[0]
    # And django-prometheus counted every statement, the prepared one included
    if metered:
        assert _executions() - before == len(queries.captured_queries)
    assert len(_reserving(_prepared_on_this_connection())) == 1


@pytest.mark.django_db
def test_a_savepoint_rollback_deallocates_and_the_next_call_prepares_again(
    bench: Bench,
) -> None:
    # Given the reservation prepared on this connection
    bench.submit(SafetyClass.IDEMPOTENT, key="order:prep:rb:1")
    assert len(_reserving(_prepared_on_this_connection())) == 1

    # When a savepoint rolls back (psycopg then deallocates every statement)
    def submit_then_fail() -> None:
        with transaction.atomic():
            bench.submit(SafetyClass.IDEMPOTENT, key="order:prep:rb:2")
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        submit_then_fail()
    # Then the next reservation prepares it again and succeeds
    record = bench.submit(SafetyClass.IDEMPOTENT, key="order:prep:rb:3")
    assert record.version == 1
    assert len(_reserving(_prepared_on_this_connection())) == 1
    assert not EffectIntent.objects.filter(operation_key="order:prep:rb:2").exists()


@pytest.fixture
def pooled(transactional_db: None) -> Iterator[None]:
    """This thread's connection now comes from a pool of one, as the API's and the
    workers' connections do (config/capacity.py)."""
    wrapper = cast(PostgresWrapper, connection)
    options = wrapper.settings_dict["OPTIONS"]
    wrapper.close()
    options["pool"] = {"min_size": 1, "max_size": 1, "timeout": 5}
    try:
        wrapper.pool.open(wait=True)
        yield
    finally:
        wrapper.close()
        wrapper.close_pool()
        del options["pool"]


def test_a_pooled_connection_keeps_its_prepared_statements_across_borrowings(
    pooled: None,
) -> None:
    with engine_bench() as bench:
        # Given a reservation prepared while one request held the pooled connection
        first: EffectRecord = bench.submit(SafetyClass.IDEMPOTENT, key="order:pool:1")
        held = connection.connection
        connection.close()  # the request ends: the connection goes back to the pool
        # When the next request borrows it and reserves another key
        second = bench.submit(SafetyClass.IDEMPOTENT, key="order:pool:2")
        # Then it is the same session, and the statement prepared by the first request
        # was executed, not prepared again
        assert connection.connection is held
        with connection.cursor() as cur:
            cur.execute(
                "SELECT generic_plans + custom_plans FROM pg_prepared_statements "
                "WHERE NOT from_sql AND statement LIKE '%%INSERT INTO effect_intents%%'"
            )
            assert [row[0] for row in cur.fetchall()] == [2]
        assert (first.version, second.version) == (1, 1)


def _job_of(effect_id: str) -> tuple[Any, ...]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT queue_name, task_name, priority, lock, queueing_lock, args, "
            "scheduled_at, status FROM procrastinate_jobs "
            "WHERE args->>'effect_id' = %s",
            [effect_id],
        )
        rows = cur.fetchall()
    assert len(rows) == 1, rows
    queue, task, priority, lock, queueing_lock, args, scheduled_at, status = rows[0]
    # The locks name the effect; compare their shape, not the id in them
    return (
        queue,
        task,
        priority,
        (lock or "").replace(effect_id, "<id>"),
        (queueing_lock or "").replace(effect_id, "<id>"),
        store_json(args).keys(),
        scheduled_at,
        status,
    )


def store_json(raw: Any) -> dict[str, Any]:
    from effect_broker.store.rows import json_value

    return cast(dict[str, Any], json_value(raw))


@pytest.mark.django_db
def test_the_reservation_with_its_job_stores_the_same_job_prepared_or_not(
    tenant: Any,
) -> None:
    from effect_broker.scheduling import ProcrastinateScheduler

    scheduler = ProcrastinateScheduler()

    def reserve(key: str) -> EffectRecord:
        intent = store.NewIntent(
            tenant_id=str(tenant.id),
            operation_key=key,
            tool="charge_card",
            request_hash=b"\x00\x01\xff" * 11,
            arguments_ciphertext=b"\x00sealed\xff",
            arguments_key_id="k1",
            arguments_preview={"amount_minor": 1999, "note": "ünï ✓"},
            contract_name="charge_card",
            contract_version="1",
            safety_class="idempotent",
            downstream_key="dk",
        )
        record, created = store.reserve(
            intent,
            now=tenant.created_at,
            actor="tester",
            job=scheduler.reservation_job(intent.effect_id),
        )
        assert created
        return record

    # Given the reservation of a new key with its dispatch job, client-bound and
    # prepared
    before = store.database_now()
    with override_settings(EFFECT_BROKER_DB_PREPARED_STATEMENTS=False):
        plain = reserve("order:prep:job:plain")
    prepared = reserve("order:prep:job:prepared")
    after = store.database_now()
    assert len(_reserving(_prepared_on_this_connection())) == 1

    # Then the rows and the jobs are the same, value for value
    def comparable(r: EffectRecord) -> tuple[Any, ...]:
        return (
            r.request_hash,
            r.arguments_preview,
            r.created_at,
            r.status,
            r.version,
            r.head_digest is not None,
        )

    assert comparable(prepared) == comparable(plain)
    # The first due time is the database's clock at each write (issue 19), both ways
    for r in (plain, prepared):
        assert r.next_action_at is not None
        assert before <= r.next_action_at <= after
    assert _job_of(prepared.effect_id) == _job_of(plain.effect_id)
    stored = EffectIntent.objects.get(pk=prepared.effect_id)
    assert bytes(stored.arguments_ciphertext) == b"\x00sealed\xff"
    assert store.verify_event_chain(prepared.effect_id) == 1


@pytest.mark.django_db
def test_a_batch_reservation_stores_the_same_rows_prepared_or_not(tenant: Any) -> None:
    from effect_broker.domain.records import EffectRequest
    from effect_broker.services.batch_submission import submit_many

    def batch(prefix: str) -> list[tuple[Any, ...]]:
        requests = [
            EffectRequest(
                operation_key=f"{prefix}:{n}",
                tool="charge_card",
                arguments={"order": str(n), "amount_minor": 1999, "currency": "EUR"},
            )
            for n in range(3)
        ]
        first = submit_many(tenant, requests[:2])
        results = submit_many(tenant, requests)  # two replays and one new key
        assert [r.outcome for r in first] == ["created"] * 2
        return [
            (
                r.outcome,
                r.effect.status,
                r.effect.version,
                r.effect.arguments_preview,
                r.effect.head_digest is not None,
                store.verify_event_chain(r.effect.effect_id),
                _job_of(r.effect.effect_id),
            )
            for r in results
        ]

    # Given the same batches submitted client-bound, then prepared
    with override_settings(EFFECT_BROKER_DB_PREPARED_STATEMENTS=False):
        plain = batch("order:prep:batch:plain")
    prepared = batch("order:prep:batch:prepared")
    # Then the batch statement was prepared, and every answer and row is the same
    batch_statements = [
        s for s in _prepared_on_this_connection() if "jsonb_array_elements" in s
    ]
    assert len(batch_statements) == 1
    assert prepared == plain
