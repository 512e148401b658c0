"""The dispatch job of a new effect rides in its reservation statement (scheduling.py).

The job is inserted by procrastinate's own ``procrastinate_defer_jobs_v1``; these tests
pin that the row is the one procrastinate's ``defer()`` would write, that a replay
queues nothing, and that the intent, its event and its job commit together or not at
all.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import DatabaseError, connection
from procrastinate import jobs

from effect_broker import store
from effect_broker.domain.records import EffectRequest
from effect_broker.models import EffectEvent, EffectIntent
from effect_broker.scheduling import ProcrastinateScheduler, _manager
from effect_broker.services.submission import submit
from effect_broker.tasks import dispatch_effect

JOB_COLUMNS = (
    "queue_name, task_name, priority, lock, queueing_lock, args, status, scheduled_at"
)


def _jobs(where: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT {JOB_COLUMNS} FROM procrastinate_jobs WHERE {where} ORDER BY id",
            params,
        )
        return list(cur.fetchall())


def _request(key: str) -> EffectRequest:
    return EffectRequest(
        operation_key=key,
        tool="charge_card",
        arguments={"order": "42", "amount_minor": 1999, "currency": "EUR"},
    )


@pytest.mark.django_db
def test_the_reservation_job_is_the_row_procrastinate_defer_writes(tenant) -> None:
    # Given a new effect, reserved with its job in one statement
    effect_id = submit(tenant, _request("order:1")).effect.effect_id
    ours = _jobs("args->>'effect_id' = %s", [effect_id])
    # When procrastinate's own defer() queues the same task for a made-up effect
    twin = "00000000-0000-7000-8000-000000000001"
    configured = dispatch_effect.configure(
        lock=f"effect:{twin}", queueing_lock=f"dispatch:{twin}"
    )
    jobs.JobDeferrer(job_manager=_manager, job=configured.job).defer(effect_id=twin)
    theirs = _jobs("args->>'effect_id' = %s", [twin])
    # Then both rows agree on every column (jsonb arrives as text) but the effect id
    assert len(ours) == len(theirs) == 1
    assert ours[0] == tuple(
        v.replace(twin, effect_id) if isinstance(v, str) else v for v in theirs[0]
    )
    queue, task, _, lock, queueing_lock, args, status, scheduled = ours[0]
    assert (queue, task, status, scheduled) == (
        "dispatch",
        dispatch_effect.name,
        "todo",
        None,
    )
    assert (lock, queueing_lock) == (f"effect:{effect_id}", f"dispatch:{effect_id}")
    assert json.loads(args) == {"effect_id": effect_id}


@pytest.mark.django_db
def test_a_replay_queues_no_second_job(tenant) -> None:
    first = submit(tenant, _request("order:2"))
    again = submit(tenant, _request("order:2"))
    assert again.replayed
    assert len(_jobs("args->>'effect_id' = %s", [first.effect.effect_id])) == 1


@pytest.mark.django_db(transaction=True)
def test_a_failing_job_insert_leaves_no_intent_and_no_event(tenant) -> None:
    # Given a job already holding the queueing lock the new effect's job will need
    scheduler = ProcrastinateScheduler()
    intent = store.NewIntent(
        tenant_id=str(tenant.id),
        operation_key="order:3",
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
    scheduler.dispatch(intent.effect_id)
    job = scheduler.reservation_job(intent.effect_id)
    # When the reservation statement's job insert violates that lock
    with pytest.raises(DatabaseError):
        store.reserve(intent, now=tenant.created_at, actor="caller", job=job)
    # Then the intent and its event were not written either: one statement, one commit
    assert not EffectIntent.objects.filter(operation_key="order:3").exists()
    assert not EffectEvent.objects.filter(effect_id=intent.effect_id).exists()
    assert len(_jobs("args->>'effect_id' = %s", [intent.effect_id])) == 1
