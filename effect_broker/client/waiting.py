"""What a wait concludes from the effect it read: done, keep waiting, or tell the
caller plainly that nobody knows yet. Shared by every client (HTTP, async,
in-process), so they cannot disagree; when a wait ends is ``domain.waits``'s rule,
which the broker's long-poll applies too.

The rule the SDK must never bend (docs/explanation/guarantees.md): an unknown outcome is
neither a success nor a failure. ``wait`` raises ``OutcomeUnknown`` for it, with the
effect, and the decorator does the same; neither ever turns it into a result or an
``EffectFailed``. ``until="settled"`` only moves the moment: it waits for the
operator's resolution, and a wait that runs out first still raises ``OutcomeUnknown``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from effect_broker.client.errors import (
    EffectCompensated,
    EffectFailed,
    OutcomeUnknown,
    WaitTimeout,
)
from effect_broker.client.models import APPROVAL_STATUSES, UNKNOWN_STATUSES, Effect
from effect_broker.domain.waits import Until, stops

#: ``wait``'s ``until``: ``"answer"`` (default) or ``"settled"`` (``domain.waits``).
UntilName = Literal["answer", "settled"]
#: ``perform``'s ``on_unknown``: ``"raise"`` (default) or ``"wait"`` for the operator.
OnUnknown = Literal["raise", "wait"]

#: First and largest pause between two reads of a waited-on effect, in seconds.
POLL_FIRST = 0.05
POLL_MAX = 1.0
#: The pause between two reads while the effect waits for a person (a client without
#: the broker's long-poll): an operator decides in minutes, so reading every second
#: for an hour would be 3,600 reads for nothing.
POLL_OPERATOR = 5.0


def on_unknown_until(on_unknown: object) -> Until:
    """``perform``'s ``on_unknown`` as the ``until`` of its wait."""
    if on_unknown == "raise":
        return Until.ANSWER
    if on_unknown == "wait":
        return Until.SETTLED
    if not isinstance(on_unknown, str):
        raise TypeError(
            f"on_unknown must be 'raise' or 'wait', not {type(on_unknown).__name__}"
        )
    raise ValueError(
        "on_unknown must be 'raise' (OutcomeUnknown as soon as only an operator can "
        f"settle the effect) or 'wait' (wait for the operator), got {on_unknown!r}"
    )


def poll_intervals(
    first: float = POLL_FIRST, largest: float = POLL_MAX
) -> Iterator[float]:
    """Pauses between reads: quick at first (most effects settle in milliseconds),
    then growing by half to ``largest``."""
    pause = first
    while True:
        yield pause
        pause = min(largest, pause * 1.5)


def check(effect: Effect, until: Until = Until.ANSWER) -> Effect | None:
    """The effect if it has settled; None to keep waiting; for ``until="answer"``,
    raise ``OutcomeUnknown`` when only an operator can move it on (waiting longer
    cannot help without one). Any other state keeps the wait going."""
    if stops(until, final=effect.settled, needs_operator=effect.needs_operator):
        if not effect.settled:
            raise outcome_unknown(effect)
        return effect
    return None


def next_pause(pauses: Iterator[float], effect: Effect) -> float:
    """The pause before the next read of ``effect``: the growing schedule, or
    ``POLL_OPERATOR`` while the wait waits for a person: an operator's resolution
    (``settled``) or approval (either way: the broker answers a long-poll at once
    for an effect awaiting approval, so the pause is what paces the reads)."""
    step = next(pauses)
    waits_for_person = effect.needs_operator or effect.status in APPROVAL_STATUSES
    return max(step, POLL_OPERATOR) if waits_for_person else step


def timed_out(effect: Effect, timeout: float) -> Exception:
    """The error for a wait that ran out: ``OutcomeUnknown`` if nobody knows yet
    whether the effect happened (the broker still reconciling, or an operator yet to
    decide), else ``WaitTimeout`` (still running)."""
    if effect.status in UNKNOWN_STATUSES or effect.needs_operator:
        return outcome_unknown(effect, waited=timeout)
    if effect.status in APPROVAL_STATUSES:
        until = (
            f", until {effect.approval_deadline.isoformat()}"
            if effect.approval_deadline
            else ""
        )
        return WaitTimeout(
            f"effect {effect.effect_id} ({effect.tool}) is still awaiting_approval after "
            f"{timeout:g}s: it waits for an operator's approval{until}, and nothing has "
            "been sent. Wait for it again, or submit the same operation key "
            f"{effect.operation_key!r} with the same arguments: that replays it.",
            effect=effect,
        )
    return WaitTimeout(
        f"effect {effect.effect_id} ({effect.tool}) is still {effect.status} after "
        f"{timeout:g}s. Wait for it again, or submit the same operation key "
        f"{effect.operation_key!r} with the same arguments: that replays this effect.",
        effect=effect,
    )


def outcome_unknown(effect: Effect, *, waited: float | None = None) -> OutcomeUnknown:
    """``OutcomeUnknown`` for ``effect``, saying plainly what is and is not known."""
    after = f" after {waited:g}s" if waited is not None else ""
    if effect.needs_operator:
        next_step = (
            "Nothing automatic will settle it: an operator must check the target and "
            "record what happened (docs/how-to/operators.md)."
        )
        if waited is not None:
            next_step += f" No operator had{after}; wait for it again (until='settled')."
    else:
        next_step = (
            f"The broker is still reconciling it with the target{after}; wait for it "
            "again."
        )
    return OutcomeUnknown(
        f"effect {effect.effect_id} ({effect.tool}, {effect.safety_class}) is "
        f"{effect.status}: nobody knows yet whether it happened. {next_step} Do not "
        f"treat it as failed or as succeeded. Any retry must reuse operation key "
        f"{effect.operation_key!r}, which replays this effect and sends nothing twice.",
        code=OutcomeUnknown.code,
        extras={"effect_id": effect.effect_id, "effect_status": effect.status},
        effect=effect,
    )


def failed_text(effect: Effect) -> str:
    """What is known about a ``failed_final`` effect, said without claiming more."""
    if effect.outcome_in_doubt:
        # An operator's "resolve failed" needs no evidence, and it ends an effect whose
        # attempt may have reached the target: the broker has no proof either way.
        return (
            f"effect {effect.effect_id} ({effect.tool}) ended failed_final by an "
            "operator's decision while an attempt may have reached the target "
            "unanswered: nothing proved that it did not take effect. It will not be "
            "sent again. Check the target (and the effect's history for the "
            "operator's reason) before you repeat the operation: if it did take "
            "effect, a repeat does it twice."
        )
    return (
        f"effect {effect.effect_id} ({effect.tool}) ended failed_final: no attempt "
        "was left unanswered (each was refused or never sent, or a check proved it "
        "absent at the target), so the broker holds proof that it did not take "
        "effect. See its history for why."
    )


def result_of(effect: Effect) -> None:
    """Raise unless a settled ``effect`` succeeded (then its receipt holds the result)."""
    if effect.status == "failed_final":
        raise EffectFailed(failed_text(effect), effect=effect)
    if effect.status == "compensated":
        raise EffectCompensated(
            f"effect {effect.effect_id} ({effect.tool}) succeeded and was then "
            "compensated.",
            effect=effect,
        )
