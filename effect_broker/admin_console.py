"""The operator console's read side: what the admin shows an operator who must decide.

Issue 11 (operator console): the queue of effects waiting for a person, the facts of an
effect's last attempt, its verified timeline, which of the resolutions the services
would accept for it now, and the procrastinate jobs that name it. Everything here only
reads; every write goes through ``services.resolution`` and ``services.forking`` from
``effect_broker.admin``, and those services re-check every rule on submit, so what this
module predicts is advice for the page, never the authority.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob

from effect_broker.domain.errors import (
    EventChainBrokenError,
    IllegalTransitionError,
    UnknownContractError,
)
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, SafetyClass, is_terminal
from effect_broker.models import EffectAttempt, EffectEvent, EffectIntent
from effect_broker.services import inspection, operator_steps
from effect_broker.services.operator_steps import RESOLVABLE
from effect_broker.services.runtime import get_runtime

#: The queue's statuses: an unsafe unknown can only be settled by a person, and a
#: manual_review effect is one a worker handed over; a non-unsafe unknown waits for
#: reconciliation, but an operator may settle it sooner, so it is listed too. An
#: effect awaiting approval waits for a person's decision (issue 24).
QUEUE_STATUSES: tuple[str, ...] = tuple(
    sorted({s.value for s in RESOLVABLE} | {EffectStatus.AWAITING_APPROVAL.value})
)
#: The statuses an operator resolves or forks (the rest of the queue is approved).
RESOLVABLE_VALUES = frozenset(s.value for s in RESOLVABLE)

#: How many queue rows one page shows (oldest first; the count shows them all).
QUEUE_PAGE = 200


# --- status colours ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StatusTone:
    """How the changelist paints a status: a CSS class and a short label."""

    css: str
    label: str


def status_tone(status: str, safety: str) -> StatusTone:
    """Red: only a person can move it on. Amber: the outcome is unknown and automatic
    reconciliation is still trying (a person may step in). Blue: in flight. Grey:
    settled - nothing more will happen, so it asks for no attention."""
    if status == EffectStatus.MANUAL_REVIEW or (
        status == EffectStatus.OUTCOME_UNKNOWN and safety == SafetyClass.UNSAFE
    ):
        return StatusTone("eb-tone-operator", "Needs operator")
    if status == EffectStatus.AWAITING_APPROVAL:
        return StatusTone("eb-tone-approval", "Awaiting approval")
    if status == EffectStatus.OUTCOME_UNKNOWN:
        return StatusTone("eb-tone-unknown", "Unknown, reconciling")
    if is_terminal(EffectStatus(status)):
        return StatusTone("eb-tone-settled", "Settled")
    return StatusTone("eb-tone-active", "In flight")


def age_of(moment: datetime | None, now: datetime | None = None) -> str:
    """A short age such as ``3d 4h``, ``12m 5s`` (operators scan ages, not dates)."""
    if moment is None:
        return "-"
    seconds = max(0, int(((now or timezone.now()) - moment).total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


# --- the queue -----------------------------------------------------------------------


def queue() -> QuerySet[EffectIntent]:
    """Effects waiting for an operator, oldest first (the order they are owed)."""
    return (
        EffectIntent.objects.filter(status__in=QUEUE_STATUSES)
        .select_related("tenant")
        .order_by("created_at", "id")
    )


def queue_count() -> int:
    """How many effects wait for an operator (the admin index shows it)."""
    return queue().count()


@dataclass(frozen=True, slots=True)
class AttemptFacts:
    """What one attempt row says about the transport: the operator's evidence that a
    request did or did not leave."""

    ordinal: int
    worker: str
    outcome: str
    error_category: str
    bytes_may_have_left: bool
    answered: bool
    started_at: datetime
    ended_at: datetime | None
    transport: dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> str:
        """How long the attempt ran, or ``open`` when it never recorded an end."""
        if self.ended_at is None:
            return "open (no end recorded)"
        return f"{(self.ended_at - self.started_at).total_seconds():.3f} s"


def attempt_facts(row: EffectAttempt) -> AttemptFacts:
    """The operator-facing facts of one attempt row (never its digests' inputs)."""
    return AttemptFacts(
        ordinal=row.ordinal,
        worker=row.worker,
        outcome=row.outcome or "(none recorded)",
        error_category=row.error_category or "-",
        bytes_may_have_left=row.bytes_may_have_left,
        answered=bool(row.response_digest),
        started_at=row.started_at,
        ended_at=row.ended_at,
        transport=dict(row.transport_meta or {}),
    )


def last_attempts(effect_ids: Iterable[Any]) -> dict[str, AttemptFacts]:
    """The last attempt of each effect, in one query (PostgreSQL ``DISTINCT ON``)."""
    ids = list(effect_ids)
    if not ids:
        return {}
    rows = (
        EffectAttempt.objects.filter(effect_id__in=ids)
        .order_by("effect_id", "-ordinal")
        .distinct("effect_id")
    )
    return {str(row.effect_id): attempt_facts(row) for row in rows}


def time_left(deadline: datetime | None, now: datetime | None = None) -> str:
    """How long until ``deadline`` (an approval's), or ``expired``."""
    if deadline is None:
        return "-"
    moment = now or timezone.now()
    if deadline <= moment:
        return "expired"
    return age_of(moment, deadline)


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One line of the "Needs an operator" queue."""

    intent: EffectIntent
    age: str
    waiting: str
    tone: StatusTone
    last_attempt: AttemptFacts | None
    #: Awaiting approval: how long the operator has left (its deadline), else "".
    approval_left: str = ""


def queue_rows(limit: int = QUEUE_PAGE) -> list[QueueRow]:
    """The oldest ``limit`` queue entries with their last attempts."""
    intents = list(queue()[:limit])
    attempts = last_attempts(i.pk for i in intents)
    now = timezone.now()
    return [
        QueueRow(
            intent=i,
            age=age_of(i.created_at, now),
            waiting=age_of(i.updated_at, now),
            tone=status_tone(i.status, i.safety_class),
            last_attempt=attempts.get(str(i.pk)),
            approval_left=time_left(i.next_action_at, now)
            if i.status == EffectStatus.AWAITING_APPROVAL
            else "",
        )
        for i in intents
    ]


# --- the effect page -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One transition event as the timeline shows it."""

    sequence: int
    occurred_at: datetime
    actor: str
    event_type: str
    old_status: str | None
    new_status: str
    reason: str
    details: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ChainCheck:
    """The event chain's verification: its verified length, or where it broke."""

    ok: bool
    length: int
    message: str


def timeline(intent: EffectIntent) -> tuple[ChainCheck, list[TimelineEntry]]:
    """Verify the effect's event chain and return its events oldest first.

    A broken chain is shown, not hidden: the events are listed from the table as they
    are, under the verifier's message, so the operator sees both the break and what
    the rows say (spec "Data model": the chain detects accidents).
    """
    events = list(EffectEvent.objects.filter(effect_id=intent.pk).order_by("sequence"))
    try:
        # ``history`` re-reads on a race with a concurrent write, so a live worker's
        # transition is not mistaken for a break.
        verified = inspection.history(intent.tenant, str(intent.pk))
    except EventChainBrokenError as exc:
        check = ChainCheck(ok=False, length=len(events), message=str(exc))
    else:
        check = ChainCheck(
            ok=True,
            length=verified.latest_sequence,
            message=f"{verified.latest_sequence} event(s), digest chain intact and "
            f"ending at version {intent.version}",
        )
    return check, [_entry(e) for e in events]


def _entry(event: EffectEvent) -> TimelineEntry:
    metadata = dict(event.metadata or {})
    reason = metadata.pop("reason", "")
    return TimelineEntry(
        sequence=event.sequence,
        occurred_at=event.occurred_at,
        actor=event.actor,
        event_type=event.event_type,
        old_status=event.old_status,
        new_status=event.new_status,
        reason=str(reason),
        details=metadata,
    )


def attempts(intent: EffectIntent) -> list[AttemptFacts]:
    """Every attempt of the effect, first to last."""
    rows = EffectAttempt.objects.filter(effect_id=intent.pk).order_by("ordinal")
    return [attempt_facts(row) for row in rows]


def linked_jobs(intent: EffectIntent) -> list[ProcrastinateJob]:
    """procrastinate jobs whose arguments name this effect (dispatch, reconcile)."""
    return list(
        ProcrastinateJob.objects.filter(args__effect_id=str(intent.pk)).order_by("-id")[
            :50
        ]
    )


@dataclass(frozen=True, slots=True)
class Choice:
    """One operator choice for this effect, and why it is or is not open now."""

    value: str
    label: str
    available: bool
    note: str


def choices(intent: EffectIntent) -> list[Choice]:
    """The three resolutions and the fork, each marked open or refused for this effect
    as the services would decide now (``services.operator_steps``; the services check
    again on submit, and their answer is the one that counts)."""
    if intent.status not in RESOLVABLE_VALUES:
        note = f"the effect is {intent.status}; only outcome_unknown or manual_review "
        note += "effects are resolved or forked"
        return [
            Choice(value, label, False, note)
            for value, label in (*RESOLUTION_LABELS, ("fork", FORK_LABEL))
        ]
    record = inspection.get_effect(intent.tenant, str(intent.pk))
    requeue = _refusal(lambda: _check_requeue(record))
    fork = (
        _refusal(
            lambda: operator_steps.refuse_before_settlement(
                get_runtime(), record, action="a fork"
            )
        )
        if record.safety is SafetyClass.RECONCILABLE
        else ""
    )
    notes = {
        "succeeded": "needs evidence naming its source and the target's reference; "
        "writes a receipt",
        "not_committed": requeue
        or "needs evidence naming its source and when it was checked; the effect is "
        "dispatched again under the same downstream key",
        "failed": "settles it failed_final with no receipt; evidence optional",
    }
    return [
        *(
            Choice(value, label, not (value == "not_committed" and requeue), notes[value])
            for value, label in RESOLUTION_LABELS
        ),
        Choice(
            "fork",
            FORK_LABEL,
            not fork,
            fork
            or "settles this effect failed_final on your attestation that it never "
            "committed, and reserves a new effect with the same arguments",
        ),
    ]


RESOLUTION_LABELS: Sequence[tuple[str, str]] = (
    ("succeeded", "Proof of success: mark succeeded (receipt)"),
    ("not_committed", "Proof of non-commit: requeue"),
    ("failed", "Mark final failure"),
)
FORK_LABEL = "Fork: continue as a new effect"


def _check_requeue(record: EffectRecord) -> None:
    rt = get_runtime()
    operator_steps.refuse_requeue(rt, record)
    # The retry limit is checked inline by ``resolve_not_committed``; repeated here
    # only to grey the choice out (the service refuses it again on submit).
    try:
        contract = rt.registry.get(record.contract_name, record.contract_version)
    except UnknownContractError:  # a removed contract: the service decides
        return
    if record.attempt_count > contract.retry_limit:
        raise IllegalTransitionError(
            f"the contract allows {contract.retry_limit + 1} attempt(s) and "
            f"{record.attempt_count} were made: no resend; resolve it as failed",
        )


def _refusal(check: Any) -> str:
    try:
        check()
    except IllegalTransitionError as exc:
        return str(exc)
    return ""


__all__ = [
    "QUEUE_PAGE",
    "QUEUE_STATUSES",
    "AttemptFacts",
    "ChainCheck",
    "Choice",
    "QueueRow",
    "StatusTone",
    "TimelineEntry",
    "age_of",
    "attempts",
    "choices",
    "last_attempts",
    "linked_jobs",
    "queue",
    "queue_count",
    "queue_rows",
    "status_tone",
    "time_left",
    "timeline",
]
