"""The state machine as data (spec "State machine", build plan step 5)."""

from __future__ import annotations

import itertools
from collections import deque

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from effect_broker.domain.errors import IllegalTransitionError
from effect_broker.domain.states import (
    TERMINAL_STATUSES,
    TRANSITIONS,
    EffectStatus,
    ProbeStatus,
    SafetyClass,
    check_transition,
    is_terminal,
)

S = EffectStatus

# The table from the spec diagram plus operator resolution, spelled out independently.
SPEC_TABLE = {
    # Issue 24: approval comes before anything is sent; an approval that no longer
    # matches the pinned contract sends the prepared effect back to an operator.
    S.AWAITING_APPROVAL: {S.PREPARED, S.FAILED_FINAL},
    S.PREPARED: {S.DISPATCHING, S.FAILED_FINAL, S.AWAITING_APPROVAL},
    S.DISPATCHING: {S.SUCCEEDED, S.FAILED_FINAL, S.RETRYABLE, S.OUTCOME_UNKNOWN},
    S.RETRYABLE: {S.DISPATCHING, S.FAILED_FINAL, S.MANUAL_REVIEW},
    S.OUTCOME_UNKNOWN: {S.RECONCILING, S.MANUAL_REVIEW},
    S.RECONCILING: {
        S.SUCCEEDED,
        S.PREPARED,
        S.DISPATCHING,
        S.OUTCOME_UNKNOWN,
        S.MANUAL_REVIEW,
        S.FAILED_FINAL,
    },
    S.MANUAL_REVIEW: {S.SUCCEEDED, S.FAILED_FINAL, S.PREPARED},
    S.SUCCEEDED: {S.COMPENSATED},
    S.FAILED_FINAL: set(),
    S.COMPENSATED: set(),
}


def test_given_enums_then_values_are_the_spec_strings() -> None:
    assert [s.value for s in SafetyClass] == [
        "transactional",
        "idempotent",
        "reconcilable",
        "unsafe",
    ]
    assert [s.value for s in EffectStatus] == [
        "prepared",
        "dispatching",
        "retryable",
        "outcome_unknown",
        "reconciling",
        "succeeded",
        "failed_final",
        "manual_review",
        "compensated",
        "awaiting_approval",
    ]
    assert [s.value for s in ProbeStatus] == ["committed", "not_committed", "unknown"]


def test_given_transition_table_then_it_is_exactly_the_spec_table() -> None:
    assert {old: set(new) for old, new in TRANSITIONS.items()} == SPEC_TABLE


def test_given_transition_table_then_it_cannot_be_mutated() -> None:
    with pytest.raises(TypeError):
        TRANSITIONS[S.FAILED_FINAL] = frozenset({S.PREPARED})  # type: ignore[index]


@pytest.mark.parametrize(
    ("old", "new"),
    list(itertools.product(EffectStatus, EffectStatus)),
    ids=lambda status: status.value,
)
def test_given_any_pair_then_check_transition_passes_iff_the_table_allows_it(
    old: EffectStatus, new: EffectStatus
) -> None:
    if new in SPEC_TABLE[old]:
        check_transition(old, new)
    else:
        with pytest.raises(IllegalTransitionError) as caught:
            check_transition(old, new)
        assert str(caught.value) == f"illegal transition {old.value} -> {new.value}"
        assert caught.value.details == {"old": old.value, "new": new.value}


def test_given_outcome_unknown_when_redispatched_blindly_then_refused() -> None:
    # Rule 3/6: ambiguity is never an ordinary retry.
    with pytest.raises(IllegalTransitionError) as caught:
        check_transition(S.OUTCOME_UNKNOWN, S.DISPATCHING)
    assert str(caught.value) == "illegal transition outcome_unknown -> dispatching"


def test_given_status_strings_then_they_are_accepted_like_enums() -> None:
    check_transition("prepared", "dispatching")
    with pytest.raises(IllegalTransitionError):
        check_transition("succeeded", "prepared")


def test_given_unknown_status_string_then_illegal_transition() -> None:
    with pytest.raises(IllegalTransitionError) as caught:
        check_transition("prepared", "exploded")
    assert str(caught.value) == "unknown status 'exploded'"


def test_given_terminal_statuses_then_only_compensation_leaves_success() -> None:
    assert frozenset({S.SUCCEEDED, S.FAILED_FINAL, S.COMPENSATED}) == TERMINAL_STATUSES
    outgoing = {(old, new) for old in TERMINAL_STATUSES for new in TRANSITIONS[old]}
    assert outgoing == {(S.SUCCEEDED, S.COMPENSATED)}


def test_given_manual_review_then_it_is_not_terminal() -> None:
    assert not is_terminal(S.MANUAL_REVIEW)
    assert not is_terminal("outcome_unknown")
    assert all(is_terminal(status) for status in TERMINAL_STATUSES)


def test_given_prepared_then_every_status_is_reachable() -> None:
    seen, queue = {S.PREPARED}, deque([S.PREPARED])
    while queue:
        for target in TRANSITIONS[queue.popleft()]:
            if target not in seen:
                seen.add(target)
                queue.append(target)
    assert seen == set(EffectStatus)


def test_given_any_non_terminal_status_then_a_terminal_status_is_reachable() -> None:
    # No status can trap an effect forever: every path can still end with a receipt.
    for start in set(EffectStatus) - TERMINAL_STATUSES:
        seen, queue = {start}, deque([start])
        while queue:
            for target in TRANSITIONS[queue.popleft()]:
                if target not in seen:
                    seen.add(target)
                    queue.append(target)
        assert seen & TERMINAL_STATUSES, start


class EffectLifecycle(RuleBasedStateMachine):
    """Random walks through the machine: every attempted move obeys the table."""

    def __init__(self) -> None:
        super().__init__()
        self.status = S.PREPARED
        self.history = [S.PREPARED]

    @rule(new=st.sampled_from(EffectStatus))
    def attempt(self, new: EffectStatus) -> None:
        if new in SPEC_TABLE[self.status]:
            check_transition(self.status, new)
            self.status = new
            self.history.append(new)
        else:
            with pytest.raises(IllegalTransitionError):
                check_transition(self.status, new)

    @invariant()
    def ambiguity_is_resolved_before_any_redispatch(self) -> None:
        # After OUTCOME_UNKNOWN, DISPATCHING is reached only via RECONCILING (a probe)
        # or MANUAL_REVIEW (an operator), never directly.
        for before, after in itertools.pairwise(self.history):
            assert (before, after) != (S.OUTCOME_UNKNOWN, S.DISPATCHING)

    @invariant()
    def nothing_is_dispatched_straight_from_awaiting_approval(self) -> None:
        # Issue 24: an approval makes the effect prepared (one dispatch job); no edge
        # sends an effect that still waits for one.
        for before, after in itertools.pairwise(self.history):
            if before is S.AWAITING_APPROVAL:
                assert after in (S.PREPARED, S.FAILED_FINAL)

    @invariant()
    def terminal_failure_and_compensation_are_absorbing(self) -> None:
        for index, status in enumerate(self.history):
            if status in (S.FAILED_FINAL, S.COMPENSATED):
                assert set(self.history[index:]) == {status}


TestEffectLifecycle = EffectLifecycle.TestCase
