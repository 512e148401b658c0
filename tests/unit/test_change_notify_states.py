"""Migration 0014 notifies only changes into the states listed there (0017 added
``awaiting_approval``): every state in which a waiter (``services.awaiting``) may stop
waiting must be among them."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.services.awaiting import settled_for_caller

#: The migration that last set the trigger's list.
migration = importlib.import_module("effect_broker.migrations.0017_awaiting_approval")


def test_every_state_a_waiter_stops_in_is_notified() -> None:
    stops = {
        status.value
        for status in EffectStatus
        for safety in SafetyClass
        if settled_for_caller(SimpleNamespace(status=status, safety=safety))  # type: ignore[arg-type]
    }
    assert stops <= set(migration.SETTLING_STATUSES)
    # and nothing the worker passes through on every effect
    assert not {"prepared", "dispatching", "retryable"} & set(migration.SETTLING_STATUSES)
