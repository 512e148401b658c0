"""Issue 9, defect 9 "Fencing on every model save is only partly true": the fence is a
database fact checked at commit (migration 0006), and the ORM paths Django uses
internally (the base manager, ``save_base``) are refused in Python too.

These tests commit for real (``transaction=True``): a deferred constraint trigger only
runs at COMMIT, so a test wrapped in a rolled-back transaction would never see it.
Each bypass is refused and, read back after the rollback, left nothing written.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, models, transaction
from django.db.models import F

from effect_broker import store
from effect_broker.domain.errors import UnfencedWriteError
from effect_broker.domain.ids import new_row_id
from effect_broker.domain.records import EffectRequest
from effect_broker.domain.states import EffectStatus
from effect_broker.models import (
    EffectAttempt,
    EffectEvent,
    EffectIntent,
    EffectReceipt,
    FencedQuerySet,
    StaleWrite,
)
from effect_broker.services.submission import submit
from effect_broker.store.ledger import ReceiptData, receipt, transition

pytestmark = pytest.mark.django_db(transaction=True)


def reserve(tenant, key: str = "order:9:charge:v1"):
    return submit(
        tenant,
        EffectRequest(
            operation_key=key,
            tool="charge_card",
            arguments={"order": "9", "amount_minor": 100, "currency": "EUR"},
        ),
    ).effect


def later(record):
    return record.updated_at + timedelta(seconds=1)


def committed_state(effect_id: str) -> tuple[str, int, int, int]:
    """(status, version, events, receipts) as committed: read in a fresh transaction
    after the refused one rolled back."""
    assert not connection.in_atomic_block
    row = EffectIntent.objects.get(pk=effect_id)
    return (
        row.status,
        row.version,
        EffectEvent.objects.filter(effect_id=effect_id).count(),
        EffectReceipt.objects.filter(effect_id=effect_id).count(),
    )


def insert_receipt(cur, effect_id: str, receipt_id: str) -> None:
    cur.execute(
        "INSERT INTO effect_receipts (id, effect_id, external_id, result_ciphertext,"
        " result_key_id, result_preview, evidence_digest, contract_version,"
        " downstream_key_digest, created_at)"
        " VALUES (%s, %s, 'ch_forged', 'x', 'k1', '{}', '', '1', 'd', now())",
        [receipt_id, effect_id],
    )


# --- bypass 1: the base manager ---------------------------------------------------------


def test_the_base_manager_is_the_fenced_manager(tenant) -> None:
    record = reserve(tenant)
    with pytest.raises(UnfencedWriteError):
        EffectIntent._base_manager.filter(pk=record.effect_id).update(
            status="succeeded", version=F("version") + 1
        )
    assert committed_state(record.effect_id) == ("prepared", 1, 1, 0)


@pytest.mark.parametrize(
    "model", [EffectIntent, EffectAttempt, EffectReceipt, EffectEvent, StaleWrite]
)
def test_every_ledger_model_fences_its_base_manager_and_save_base(model) -> None:
    assert isinstance(model._base_manager.all(), FencedQuerySet)
    with pytest.raises(UnfencedWriteError):
        model._base_manager.all().update(pk=None)
    with pytest.raises(UnfencedWriteError):
        model().save_base()


def test_a_plain_queryset_update_with_a_version_bump_is_refused_at_commit(
    tenant,
) -> None:
    # Given a write that skips every Python guard (a bare QuerySet, not our manager)
    record = reserve(tenant)
    plain = models.QuerySet(model=EffectIntent).filter(pk=record.effect_id)
    # When it bumps the version (so the row trigger of 0002 is satisfied) but writes
    # no event, then the commit is refused
    with pytest.raises(DatabaseError, match="no event at sequence 2"):
        plain.update(status="succeeded", version=F("version") + 1)
    assert committed_state(record.effect_id) == ("prepared", 1, 1, 0)


# --- bypass 2: save_base ----------------------------------------------------------------


def test_save_base_is_refused_in_python(tenant) -> None:
    record = reserve(tenant)
    row = EffectIntent.objects.get(pk=record.effect_id)
    row.status, row.version = "succeeded", row.version + 1
    with pytest.raises(UnfencedWriteError):
        row.save_base()
    assert committed_state(record.effect_id) == ("prepared", 1, 1, 0)


def test_model_save_base_bypassing_the_override_is_refused_at_commit(tenant) -> None:
    record = reserve(tenant)
    row = EffectIntent.objects.get(pk=record.effect_id)
    row.status, row.version = "succeeded", row.version + 1
    with pytest.raises(DatabaseError, match="no event at sequence 2"):
        models.Model.save_base(row)
    assert committed_state(record.effect_id) == ("prepared", 1, 1, 0)


# --- bypass 3: raw SQL ------------------------------------------------------------------


def test_a_raw_update_that_bumps_the_version_without_an_event_is_refused(
    tenant,
) -> None:
    record = reserve(tenant)
    with pytest.raises(DatabaseError, match="no event at sequence 2"):
        bump_without_event(record.effect_id)
    assert committed_state(record.effect_id) == ("prepared", 1, 1, 0)


def bump_without_event(effect_id: str) -> str:
    """The raw bypass; returns the status it sees before its transaction commits."""
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE effect_intents SET status = 'succeeded', version = version + 1"
            " WHERE id = %s",
            [effect_id],
        )
        cur.execute("SELECT status FROM effect_intents WHERE id = %s", [effect_id])
        return cur.fetchone()[0]


def bump_in_a_transaction(effect_id: str) -> None:
    with transaction.atomic():
        # Deferred: inside the transaction nothing has been checked yet.
        assert bump_without_event(effect_id) == "succeeded"


def test_a_raw_update_inside_a_transaction_is_refused_at_its_commit(tenant) -> None:
    record = reserve(tenant)
    with pytest.raises(DatabaseError, match="no event at sequence 2"):
        bump_in_a_transaction(record.effect_id)
    assert committed_state(record.effect_id) == ("prepared", 1, 1, 0)


def test_a_raw_intent_insert_without_its_reserved_event_is_refused(tenant) -> None:
    effect_id = new_row_id()
    with (
        pytest.raises(DatabaseError, match="no event at sequence 1"),
        connection.cursor() as cur,
    ):
        cur.execute(
            "INSERT INTO effect_intents (id, tenant_id, operation_key, tool,"
            " request_hash, arguments_ciphertext, arguments_key_id,"
            " arguments_preview, contract_name, contract_version, safety_class,"
            " downstream_key, status, version, attempt_count, requested_by,"
            " created_at, updated_at) VALUES (%s, %s, 'raw', 'charge_card', 'h',"
            " 'c', 'k1', '{}', 'payments.charge', '1', 'idempotent', 'd',"
            " 'succeeded', 1, 0, '', now(), now())",
            [effect_id, str(tenant.id)],
        )
    assert not EffectIntent.objects.filter(pk=effect_id).exists()


# --- bypass 4: a receipt with no transition ---------------------------------------------


def test_a_receipt_inserted_without_a_transition_is_refused(tenant) -> None:
    record = reserve(tenant)
    with (
        pytest.raises(DatabaseError, match="never reached succeeded"),
        connection.cursor() as cur,
    ):
        insert_receipt(cur, record.effect_id, new_row_id())
    assert committed_state(record.effect_id) == ("prepared", 1, 1, 0)


def test_a_receipt_other_than_the_one_the_success_names_is_refused(tenant) -> None:
    # Given an effect moved to SUCCEEDED naming receipt X, its receipt not yet written
    record = reserve(tenant)
    moving = transition(
        record, EffectStatus.DISPATCHING, event_type="t", actor="w", now=later(record)
    )
    named = new_row_id()

    def succeed_with_another_receipt() -> None:
        with transaction.atomic():
            transition(
                moving,
                EffectStatus.SUCCEEDED,
                event_type="succeeded",
                actor="w",
                now=later(moving),
                changes={"receipt_id": named},
            )
            # When the receipt written is another one
            with connection.cursor() as cur:
                insert_receipt(cur, record.effect_id, new_row_id())

    with pytest.raises(DatabaseError, match="never reached succeeded"):
        succeed_with_another_receipt()
    # Then the whole transaction is refused, the transition with it
    assert committed_state(record.effect_id) == ("dispatching", 2, 2, 0)


# --- the store's own writes still commit ------------------------------------------------


def _succeed(record, *, receipt_id: str | None = None):
    rid = receipt_id or new_row_id()
    return transition(
        record,
        EffectStatus.SUCCEEDED,
        event_type="succeeded",
        actor="w",
        now=later(record),
        metadata={"receipt_id": rid},
        changes={"receipt_id": rid},
        riders=(
            receipt(
                record,
                ReceiptData(
                    external_id="ch_1",
                    result_ciphertext=b"x",
                    result_key_id="k1",
                    result_preview={},
                    evidence_digest="",
                    downstream_key_digest="d",
                    contract_version="1",
                ),
                now=later(record),
                receipt_id=rid,
            ),
        ),
    )


def test_store_writes_commit_in_autocommit(tenant) -> None:
    record = reserve(tenant)
    moving = transition(
        record, EffectStatus.DISPATCHING, event_type="t", actor="w", now=later(record)
    )
    done = _succeed(moving)
    assert committed_state(record.effect_id) == ("succeeded", 3, 3, 1)
    assert store.verify_event_chain(done.effect_id) == 3


def test_store_writes_commit_inside_a_callers_transaction(tenant) -> None:
    with transaction.atomic():
        record = reserve(tenant)
        moving = transition(
            record, EffectStatus.DISPATCHING, event_type="t", actor="w", now=later(record)
        )
        store.touch(moving, event_type="heartbeat", actor="w", now=later(moving))
        moving = store.load_effect_for_worker(record.effect_id)
        _succeed(moving)
    assert committed_state(record.effect_id) == ("succeeded", 4, 4, 1)
    assert store.verify_event_chain(record.effect_id) == 4


def test_a_receipt_written_before_its_transition_in_one_transaction_commits(
    tenant,
) -> None:
    # Deferred, not immediate: the check runs on the state at COMMIT, so the order of
    # statements inside one transaction does not matter, only what it commits.
    record = reserve(tenant)
    moving = transition(
        record, EffectStatus.DISPATCHING, event_type="t", actor="w", now=later(record)
    )
    rid = new_row_id()
    with transaction.atomic():
        with connection.cursor() as cur:
            insert_receipt(cur, record.effect_id, rid)
        transition(
            moving,
            EffectStatus.SUCCEEDED,
            event_type="succeeded",
            actor="w",
            now=later(moving),
            changes={"receipt_id": rid},
        )
    assert committed_state(record.effect_id) == ("succeeded", 3, 3, 1)
