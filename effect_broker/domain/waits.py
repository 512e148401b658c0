"""When a wait for an effect ends: the one rule the SDK's ``wait`` and the API's
long-poll (``GET /v1/effects/{id}/wait``) share, so a client and the broker cannot
disagree about it.

Two ways to wait (issue 23, item 3):

- ``answer`` (the default, and what ``wait`` always did): stop at a final state, or as
  soon as only an operator can move the effect on - the caller hears at once that
  nobody knows whether it happened (``OutcomeUnknown``) and decides what to do;
- ``settled``: keep waiting through ``outcome_unknown`` and ``manual_review`` until an
  operator's resolution (or the broker) brings the effect to a final state - for a
  durable workflow that would rather pause than fail.

Neither turns an unknown outcome into a success or a failure: a wait that runs out
reports the effect as it then is. Any state that is neither final nor one only an
operator can leave (in progress, reconciling, or a state a later release adds) simply
keeps a wait of either kind waiting.
"""

from __future__ import annotations

from enum import StrEnum


class Until(StrEnum):
    """What a waiter waits for."""

    #: A final state, or the news that only an operator can settle the effect.
    ANSWER = "answer"
    #: A final state only: an operator's resolution is waited for.
    SETTLED = "settled"


#: The longest one long-poll request waits, in seconds. Below ``effect-broker serve``'s
#: default graceful-shutdown timeout (30 s), so a graceful restart lets every poll end
#: with an answer, and below the 60 s idle timeout of common proxies and load
#: balancers. A longer wait is a loop of polls (the SDK's ``wait`` does that).
MAX_WAIT_SECONDS = 25.0


def until_of(value: object) -> Until:
    """``value`` as an ``Until``; a ``TypeError`` or ``ValueError`` naming the choices."""
    if isinstance(value, Until):
        return value
    if not isinstance(value, str):
        raise TypeError(
            f"until must be 'answer' or 'settled', not {type(value).__name__}"
        )
    try:
        return Until(value)
    except ValueError:
        raise ValueError(
            f"until must be 'answer' (stop when only an operator can settle the "
            f"effect) or 'settled' (wait for the operator too), got {value!r}"
        ) from None


def stops(until: Until, *, final: bool, needs_operator: bool) -> bool:
    """True when a wait for ``until`` ends at an effect in this state."""
    return final or (until is Until.ANSWER and needs_operator)
