"""STYLE rules 1-2 and issue "Fencing on every save": a ledger row is written only by
compare-and-swap on its version; receipts and events are append-only in the database."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, transaction

from effect_broker import store
from effect_broker.domain.errors import (
    EventChainBrokenError,
    IllegalTransitionError,
    StaleWriteError,
    UnfencedWriteError,
)
from effect_broker.domain.ids import new_row_id
from effect_broker.domain.records import EffectRequest
from effect_broker.domain.states import EffectStatus
from effect_broker.models import EffectEvent, EffectIntent, EffectReceipt, StaleWrite
from effect_broker.services.submission import submit
from effect_broker.store.ledger import touch, transition


def reserve(tenant, key: str = "order:1:charge:v1"):
    return submit(
        tenant,
        EffectRequest(
            operation_key=key,
            tool="charge_card",
            arguments={"order": "1", "amount_minor": 100, "currency": "EUR"},
        ),
    ).effect


def now(record):
    return record.updated_at + timedelta(seconds=1)


@pytest.mark.django_db
def test_a_transition_bumps_the_version_and_appends_one_event(tenant) -> None:
    record = reserve(tenant)
    moved = transition(
        record, EffectStatus.DISPATCHING, event_type="t", actor="w1", now=now(record)
    )
    assert (moved.status, moved.version) == (EffectStatus.DISPATCHING, 2)
    events = list(EffectEvent.objects.filter(effect_id=record.effect_id))
    assert [(e.sequence, e.old_status, e.new_status) for e in events] == [
        (1, None, "prepared"),
        (2, "prepared", "dispatching"),
    ]
    assert store.verify_event_chain(record.effect_id) == 2


@pytest.mark.django_db
def test_a_stale_writer_is_refused_and_changes_nothing(tenant) -> None:
    # Given two writers that loaded version 1, and the first one wins
    record = reserve(tenant)
    transition(
        record, EffectStatus.DISPATCHING, event_type="t", actor="w1", now=now(record)
    )
    # When the second writes with the version it loaded
    with pytest.raises(StaleWriteError) as err:
        transition(
            record,
            EffectStatus.FAILED_FINAL,
            event_type="late",
            actor="zombie",
            now=now(record),
        )
    # Then it is refused with the versions it raced on, and nothing changed
    assert err.value.details["expected_version"] == 1
    assert err.value.details["actual_version"] == 2
    row = EffectIntent.objects.get(pk=record.effect_id)
    assert (row.status, row.version) == ("dispatching", 2)
    assert EffectEvent.objects.filter(effect_id=record.effect_id).count() == 2


@pytest.mark.django_db
def test_a_stale_write_can_be_recorded_for_operators(tenant) -> None:
    record = reserve(tenant)
    touch(record, event_type="heartbeat", actor="w1", now=now(record))
    with pytest.raises(StaleWriteError) as err:
        touch(record, event_type="heartbeat", actor="zombie", now=now(record))
    store.record_stale_write(err.value, actor="zombie", now=now(record))
    stale = StaleWrite.objects.get()
    assert (stale.actor, stale.expected_version, stale.actual_version) == ("zombie", 1, 2)


@pytest.mark.django_db
def test_an_illegal_transition_is_refused_before_any_write(tenant) -> None:
    record = reserve(tenant)
    with pytest.raises(IllegalTransitionError):
        transition(
            record, EffectStatus.SUCCEEDED, event_type="t", actor="w1", now=now(record)
        )
    assert EffectIntent.objects.get(pk=record.effect_id).version == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "write",
    [
        lambda row: row.save(),
        lambda row: row.delete(),
        lambda row: EffectIntent.objects.filter(pk=row.pk).update(status="succeeded"),
        lambda row: EffectIntent.objects.bulk_update([row], ["status"]),
        lambda row: EffectIntent.objects.filter(pk=row.pk).delete(),
        lambda row: EffectIntent.objects.create(operation_key="x"),
        lambda row: EffectEvent.objects.filter(effect=row).update(actor="me"),
    ],
    ids=[
        "save",
        "delete",
        "update",
        "bulk_update",
        "qs-delete",
        "create",
        "event-update",
    ],
)
def test_orm_writes_that_bypass_the_fence_are_refused(tenant, write) -> None:
    row = EffectIntent.objects.get(pk=reserve(tenant).effect_id)
    with pytest.raises(UnfencedWriteError):
        write(row)
    assert EffectIntent.objects.get(pk=row.pk).version == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE effect_events SET actor = 'mallory'",
        "DELETE FROM effect_events",
        "UPDATE effect_receipts SET external_id = 'forged'",
        "DELETE FROM effect_receipts",
        "UPDATE effect_intents SET status = 'succeeded'",
        "UPDATE effect_intents SET version = version + 1, operation_key = 'other'",
        "DELETE FROM effect_intents",
    ],
)
def test_raw_sql_that_rewrites_history_fails_at_the_database(tenant, statement) -> None:
    record = reserve(tenant)
    # A receipt row to attack (the store only writes one together with SUCCEEDED, and
    # migration 0006 refuses any other at commit: so it is planted as a DBA would).
    _as_privileged_dba(
        "INSERT INTO effect_receipts (id, effect_id, external_id, result_ciphertext,"
        " result_key_id, result_preview, evidence_digest, contract_version,"
        " downstream_key_digest, created_at)"
        " VALUES (%s, %s, 'ch_1', 'x', 'k1', '{}', '', '1', 'd', %s)",
        [new_row_id(), record.effect_id, now(record)],
        then_origin=True,
    )
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cur:
        cur.execute(statement)
    assert EffectReceipt.objects.get().external_id == "ch_1"
    assert EffectEvent.objects.get().actor == "caller"
    assert EffectIntent.objects.get().status == "prepared"


def _as_privileged_dba(
    sql: str, params: list[object], *, then_origin: bool = False
) -> None:
    # session_replication_role=replica skips triggers: what a superuser could do.
    with connection.cursor() as cur:
        # The test's earlier writes stand for committed ones: run their deferred
        # checks (migration 0006) now, as their COMMIT would have, before the DBA acts.
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cur.execute("SET CONSTRAINTS ALL DEFERRED")
        cur.execute("SET LOCAL session_replication_role = replica")
        cur.execute(sql, params)
        if then_origin:
            cur.execute("SET LOCAL session_replication_role = origin")


@pytest.mark.django_db
def test_chain_verification_detects_an_edited_event(tenant) -> None:
    record = reserve(tenant)
    transition(
        record, EffectStatus.DISPATCHING, event_type="t", actor="w1", now=now(record)
    )
    _as_privileged_dba(
        "UPDATE effect_events SET actor = 'mallory' "
        "WHERE effect_id = %s AND sequence = 2",
        [record.effect_id],
    )
    with pytest.raises(EventChainBrokenError) as err:
        store.verify_event_chain(record.effect_id)
    assert err.value.details["sequence"] == 2


@pytest.mark.django_db
def test_chain_verification_detects_a_deleted_newest_event(tenant) -> None:
    record = reserve(tenant)
    transition(
        record, EffectStatus.DISPATCHING, event_type="t", actor="w1", now=now(record)
    )
    _as_privileged_dba(
        "DELETE FROM effect_events WHERE effect_id = %s AND sequence = 2",
        [record.effect_id],
    )
    with pytest.raises(EventChainBrokenError):
        store.verify_event_chain(record.effect_id)


@pytest.mark.django_db
def test_chain_verification_detects_a_deleted_event(tenant) -> None:
    record = reserve(tenant)
    moved = transition(
        record, EffectStatus.DISPATCHING, event_type="t", actor="w1", now=now(record)
    )
    transition(
        moved, EffectStatus.OUTCOME_UNKNOWN, event_type="t", actor="w1", now=now(moved)
    )
    _as_privileged_dba(
        "DELETE FROM effect_events WHERE effect_id = %s AND sequence = 2",
        [record.effect_id],
    )
    with pytest.raises(EventChainBrokenError) as err:
        store.verify_event_chain(record.effect_id)
    assert err.value.details["sequence"] == 2


@pytest.mark.django_db
def test_a_record_read_without_its_head_digest_still_chains_correctly(tenant) -> None:
    # A record built from a read that did not carry the head digest (e.g. the ORM
    # listing) makes the write fetch it first; the chain it extends stays valid.
    record = dataclasses.replace(reserve(tenant), head_digest=None)
    moved = transition(
        record, EffectStatus.DISPATCHING, event_type="t", actor="w1", now=now(record)
    )
    assert moved.version == 2
    assert store.verify_event_chain(record.effect_id) == 2


@pytest.mark.django_db
def test_a_write_on_top_of_a_missing_event_is_refused_and_writes_nothing(
    tenant,
) -> None:
    record = reserve(tenant)
    moved = transition(
        record, EffectStatus.DISPATCHING, event_type="t", actor="w1", now=now(record)
    )
    _as_privileged_dba(
        "DELETE FROM effect_events WHERE effect_id = %s AND sequence = 2",
        [record.effect_id],
    )
    reread = store.load_effect_for_worker(record.effect_id)
    assert reread.head_digest is None  # the subselect found no event at version 2
    with pytest.raises(EventChainBrokenError) as err:
        transition(
            reread,
            EffectStatus.OUTCOME_UNKNOWN,
            event_type="t",
            actor="w1",
            now=now(moved),
        )
    assert err.value.details["sequence"] == 2
    assert EffectIntent.objects.get(pk=record.effect_id).version == 2
    assert EffectEvent.objects.filter(effect_id=record.effect_id).count() == 1
