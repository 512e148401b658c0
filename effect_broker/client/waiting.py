"""What a wait concludes from the effect it read: done, keep waiting, or tell the
caller plainly that nobody knows yet. Shared by every client (HTTP, async,
in-process), so they cannot disagree.

The rule the SDK must never bend (docs/explanation/guarantees.md): an unknown outcome is
neither a success nor a failure. ``wait`` raises ``OutcomeUnknown`` for it, with the
effect, and the decorator does the same; neither ever turns it into a result or an
``EffectFailed``.
"""

from __future__ import annotations

from collections.abc import Iterator

from effect_broker.client.errors import (
    EffectCompensated,
    EffectFailed,
    OutcomeUnknown,
    WaitTimeout,
)
from effect_broker.client.models import UNKNOWN_STATUSES, Effect

#: First and largest pause between two reads of a waited-on effect, in seconds.
POLL_FIRST = 0.05
POLL_MAX = 1.0


def poll_intervals(
    first: float = POLL_FIRST, largest: float = POLL_MAX
) -> Iterator[float]:
    """Pauses between reads: quick at first (most effects settle in milliseconds),
    then growing by half to ``largest``."""
    pause = first
    while True:
        yield pause
        pause = min(largest, pause * 1.5)


def check(effect: Effect) -> Effect | None:
    """The effect if it has settled; None to keep waiting; raise ``OutcomeUnknown``
    when only an operator can move it on (waiting longer cannot help)."""
    if effect.settled:
        return effect
    if effect.needs_operator:
        raise outcome_unknown(effect)
    return None


def timed_out(effect: Effect, timeout: float) -> Exception:
    """The error for a wait that ran out: ``OutcomeUnknown`` if the broker was still
    finding out whether the effect happened, else ``WaitTimeout`` (still running)."""
    if effect.status in UNKNOWN_STATUSES:
        return outcome_unknown(effect, waited=timeout)
    return WaitTimeout(
        f"effect {effect.effect_id} ({effect.tool}) is still {effect.status} after "
        f"{timeout:g}s. Wait for it again, or submit the same operation key "
        f"{effect.operation_key!r} with the same arguments: that replays this effect.",
        effect=effect,
    )


def outcome_unknown(effect: Effect, *, waited: float | None = None) -> OutcomeUnknown:
    """``OutcomeUnknown`` for ``effect``, saying plainly what is and is not known."""
    if effect.needs_operator:
        next_step = (
            "Nothing automatic will settle it: an operator must check the target and "
            "record what happened (docs/how-to/operators.md)."
        )
    else:
        after = f" after {waited:g}s" if waited is not None else ""
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
