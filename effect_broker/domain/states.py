"""Safety classes, effect statuses and the state machine as data.

Spec "State machine" (plus operator resolution of MANUAL_REVIEW). The store checks every
fenced compare-and-swap against ``TRANSITIONS`` before writing, so the diagram is
enforced in exactly one place and tested exhaustively.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from effect_broker.domain.errors import IllegalTransitionError


class SafetyClass(StrEnum):
    """What the target promises, and so what the broker may honestly guarantee."""

    TRANSACTIONAL = "transactional"
    IDEMPOTENT = "idempotent"
    RECONCILABLE = "reconcilable"
    UNSAFE = "unsafe"


class EffectStatus(StrEnum):
    """Where an effect intent stands in the state machine."""

    PREPARED = "prepared"
    DISPATCHING = "dispatching"
    RETRYABLE = "retryable"
    OUTCOME_UNKNOWN = "outcome_unknown"
    RECONCILING = "reconciling"
    SUCCEEDED = "succeeded"
    FAILED_FINAL = "failed_final"
    MANUAL_REVIEW = "manual_review"
    COMPENSATED = "compensated"
    #: Reserved, not yet sendable: an operator must approve it first (issue 24).
    #: Listed last so that the existing values keep their order.
    AWAITING_APPROVAL = "awaiting_approval"


class ProbeStatus(StrEnum):
    """An adapter's authoritative answer to "did this effect commit?"."""

    COMMITTED = "committed"
    NOT_COMMITTED = "not_committed"
    UNKNOWN = "unknown"


_S = EffectStatus

TERMINAL_STATUSES: frozenset[EffectStatus] = frozenset(
    {_S.SUCCEEDED, _S.FAILED_FINAL, _S.COMPENSATED}
)
"""Statuses with a final receipt (MANUAL_REVIEW is not: an operator resolves it)."""

TRANSITIONS: Mapping[EffectStatus, frozenset[EffectStatus]] = MappingProxyType(
    {
        # Issue 24: a contract that asks for approval reserves the effect here, before
        # anything can be sent. An operator's approval makes it PREPARED (one dispatch
        # job); a denial, or no approval before the deadline, ends it FAILED_FINAL
        # with no attempt ever made.
        _S.AWAITING_APPROVAL: frozenset({_S.PREPARED, _S.FAILED_FINAL}),
        # Claimed by a worker; or refused by contract/validation before any dispatch.
        # AWAITING_APPROVAL: the approval no longer matches the contract the worker
        # holds (a redeploy changed it), so it goes back to an operator unsent.
        _S.PREPARED: frozenset({_S.DISPATCHING, _S.FAILED_FINAL, _S.AWAITING_APPROVAL}),
        # Rules 2-3: only a proved non-commit is RETRYABLE; timeouts, lost connections
        # and expired leases are OUTCOME_UNKNOWN, never an ordinary retry.
        _S.DISPATCHING: frozenset(
            {_S.SUCCEEDED, _S.FAILED_FINAL, _S.RETRYABLE, _S.OUTCOME_UNKNOWN}
        ),
        # Backoff redispatch; retry limit exhausted -> FAILED_FINAL; MANUAL_REVIEW when
        # the target's idempotency horizon has lapsed (guarantee vocabulary).
        _S.RETRYABLE: frozenset({_S.DISPATCHING, _S.FAILED_FINAL, _S.MANUAL_REVIEW}),
        # Rule 6: ambiguity is resolved by a probe or by an operator, never by a blind
        # redispatch (OUTCOME_UNKNOWN -> DISPATCHING is deliberately absent).
        _S.OUTCOME_UNKNOWN: frozenset({_S.RECONCILING, _S.MANUAL_REVIEW}),
        # PREPARED: conclusive not_committed, requeue (rule 5). DISPATCHING: idempotent
        # redispatch with the same key inside the retention horizon (rule 4).
        # OUTCOME_UNKNOWN: probe inconclusive, wait for the settlement bound.
        # FAILED_FINAL: conclusive not_committed with retries exhausted.
        _S.RECONCILING: frozenset(
            {
                _S.SUCCEEDED,
                _S.PREPARED,
                _S.DISPATCHING,
                _S.OUTCOME_UNKNOWN,
                _S.MANUAL_REVIEW,
                _S.FAILED_FINAL,
            }
        ),
        # Operator: proof of success, mark failed, or proof of non-commit and requeue.
        _S.MANUAL_REVIEW: frozenset({_S.SUCCEEDED, _S.FAILED_FINAL, _S.PREPARED}),
        # Rule 7: a terminal receipt is never rewritten; compensation is a new event.
        _S.SUCCEEDED: frozenset({_S.COMPENSATED}),
        _S.FAILED_FINAL: frozenset(),
        _S.COMPENSATED: frozenset(),
    }
)
"""Allowed ``old -> new`` status changes: the spec's state machine as data."""


def _coerce(status: EffectStatus | str, old: object, new: object) -> EffectStatus:
    try:
        return EffectStatus(status)
    except ValueError as exc:
        raise IllegalTransitionError(
            f"unknown status {status!r}", old=str(old), new=str(new)
        ) from exc


def check_transition(old: EffectStatus | str, new: EffectStatus | str) -> None:
    """Raise IllegalTransitionError unless ``old -> new`` is in ``TRANSITIONS``."""
    source = _coerce(old, old, new)
    target = _coerce(new, old, new)
    if target not in TRANSITIONS[source]:
        raise IllegalTransitionError(
            f"illegal transition {source.value} -> {target.value}",
            old=source.value,
            new=target.value,
        )


def is_terminal(status: EffectStatus | str) -> bool:
    """Return True if ``status`` carries a final receipt."""
    return EffectStatus(status) in TERMINAL_STATUSES
