"""The transactional safety class: the local effect commits or rolls back together with
whatever else the caller's ``transaction.atomic()`` writes (spec "Guarantee vocabulary":
exactly one committed local effect per operation key)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction

from effect_broker.adapters.base import DispatchRequest, ProbeRequest
from effect_broker.adapters.conformance import make_effect_record
from effect_broker.adapters.simulated_adapter import (
    SimulatedLocalAdapter,
    local_effect_count,
)
from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.errors import OutcomeUnknownError, TerminalAdapterError
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import ProbeStatus, SafetyClass

pytestmark = pytest.mark.django_db(transaction=True)

CONTRACT = EffectContract(
    name="ledger.record-charge",
    version="1",
    tool="record_charge_local",
    safety=SafetyClass.TRANSACTIONAL,
    adapter="simulated-local",
    backoff_initial=timedelta(seconds=1),
)
ARGUMENTS = {"order": "42", "amount_minor": 1999}


class Rollback(Exception):
    """Raised to abandon the surrounding transaction, as a crash before commit would."""


def new_effect() -> EffectRecord:
    return make_effect_record(
        CONTRACT, f"op:{uuid.uuid4()}", ARGUMENTS, f"dk-{uuid.uuid4().hex}"
    )


def dispatch(adapter: SimulatedLocalAdapter, effect: EffectRecord) -> str | None:
    request = DispatchRequest(effect, ARGUMENTS, str(uuid.uuid4()), CONTRACT)
    return adapter.dispatch(request).external_id


def probe(adapter: SimulatedLocalAdapter, effect: EffectRecord) -> ProbeStatus:
    return adapter.probe(ProbeRequest(effect, ARGUMENTS, CONTRACT)).status


def test_rollback_leaves_no_local_effect() -> None:
    adapter, effect = SimulatedLocalAdapter(CONTRACT), new_effect()
    seen_inside: list[int] = []

    def dispatch_then_crash() -> None:
        with transaction.atomic():
            dispatch(adapter, effect)
            seen_inside.append(local_effect_count(effect.downstream_key))
            raise Rollback

    # Given a dispatch inside a transaction that then fails before commit
    with pytest.raises(Rollback):
        dispatch_then_crash()
    assert seen_inside == [1]  # the insert happened inside the transaction
    # Then the effect did not happen, and the probe says so conclusively
    assert local_effect_count(effect.downstream_key) == 0
    assert probe(adapter, effect) is ProbeStatus.NOT_COMMITTED


def test_commit_leaves_exactly_one_local_effect() -> None:
    adapter, effect = SimulatedLocalAdapter(CONTRACT), new_effect()
    with transaction.atomic():
        external_id = dispatch(adapter, effect)
    assert local_effect_count(effect.downstream_key) == 1
    result = adapter.probe(ProbeRequest(effect, ARGUMENTS, CONTRACT))
    assert (result.status, result.external_id) == (ProbeStatus.COMMITTED, external_id)


def test_a_second_insert_of_the_key_is_refused_and_the_transaction_stays_usable() -> None:
    adapter, effect = SimulatedLocalAdapter(CONTRACT), new_effect()
    with transaction.atomic():
        dispatch(adapter, effect)
    with transaction.atomic():
        # The unique key refuses the duplicate; never reported as a failure, since
        # the effect did commit: the probe resolves it.
        with pytest.raises(OutcomeUnknownError):
            dispatch(adapter, effect)
        with connection.cursor() as cursor:  # the caller can still write its receipt
            cursor.execute("SELECT 1")
    assert local_effect_count(effect.downstream_key) == 1
    assert probe(adapter, effect) is ProbeStatus.COMMITTED


def test_outside_a_transaction_it_refuses_and_inserts_nothing() -> None:
    adapter, effect = SimulatedLocalAdapter(CONTRACT), new_effect()
    with pytest.raises(TerminalAdapterError, match=r"transaction\.atomic"):
        dispatch(adapter, effect)
    assert local_effect_count(effect.downstream_key) == 0


def test_adapter_declares_the_transactional_class() -> None:
    assert SimulatedLocalAdapter.transactional is True
    assert SimulatedLocalAdapter.name == "simulated-local"
