"""Migration 0014 notifies only changes into the states listed there (0017 added
``awaiting_approval``): every state in which a waiter (``services.awaiting``) may stop
waiting must be among them - for either way to wait (``domain.waits.Until``: the MCP
proxy's and the default long-poll's ``answer``, and ``settled``, which waits through
an operator's decision)."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest

from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.domain.waits import Until
from effect_broker.services.awaiting import settled_for_caller, stops_waiting

#: The migration that last set the trigger's list.
migration = importlib.import_module("effect_broker.migrations.0017_awaiting_approval")


def _stops(rule) -> set[str]:
    return {
        status.value
        for status in EffectStatus
        for safety in SafetyClass
        if rule(SimpleNamespace(status=status, safety=safety))
    }


@pytest.mark.parametrize("until", list(Until))
def test_every_state_a_waiter_stops_in_is_notified(until: Until) -> None:
    stops = _stops(lambda record: stops_waiting(until, record))
    assert stops <= set(migration.SETTLING_STATUSES)
    # and nothing the worker passes through on every effect
    assert not {"prepared", "dispatching", "retryable"} & set(migration.SETTLING_STATUSES)


def test_the_two_ways_to_wait_differ_only_where_an_operator_must_decide() -> None:
    answer = _stops(settled_for_caller)
    settled = _stops(lambda record: stops_waiting(Until.SETTLED, record))
    assert settled == {"succeeded", "failed_final", "compensated"}
    # An answer also comes at once for an effect awaiting approval: its caller (an
    # agent over MCP, a long-poll) learns that it waits for a person, unsent.
    assert answer - settled == {"outcome_unknown", "manual_review", "awaiting_approval"}
