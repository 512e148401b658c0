"""What the SDK hands back: frozen snapshots of the broker's JSON answers.

Field names are the wire's (docs/reference/http-api.md; ``effect_broker/api/effects.py``),
so a reader of either finds the other. Members a newer broker adds are ignored, never an
error: the SDK must keep working against a broker one release ahead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from effect_broker.client.errors import BrokerError, from_problem

#: Statuses that will not change again on their own (a receipt exists or never will).
SETTLED_STATUSES = frozenset({"succeeded", "failed_final", "compensated"})
#: Statuses in which the broker is still finding out whether the effect happened.
UNKNOWN_STATUSES = frozenset({"outcome_unknown", "reconciling"})
#: Reserved and not sent: an operator must approve it first (``approval_deadline``
#: says until when). ``wait`` keeps waiting through it, as through any status that
#: may still change; nothing has happened at the target.
APPROVAL_STATUSES = frozenset({"awaiting_approval"})


def _time(value: object) -> datetime:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        return datetime.fromisoformat(value)
    raise ValueError(f"expected an ISO 8601 time, got {value!r}")


def _optional_time(value: object) -> datetime | None:
    return None if value is None else _time(value)


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True, slots=True)
class Paused:
    """Why a due effect is not being sent: an operator paused dispatch of its tool,
    contract or tenant. It waits (it is not failed); nothing of it is sent while
    paused, and it is sent once an operator resumes dispatch."""

    reason: str
    since: datetime
    #: What is paused, in words: "tool charge_card", "this tenant", ...
    scope: str

    @classmethod
    def from_wire(cls, body: object) -> Paused | None:
        """Parse the effect's ``paused`` member (None when absent or null)."""
        if not isinstance(body, Mapping):
            return None
        return cls(
            reason=str(body.get("reason", "")),
            since=_time(body["since"]),
            scope=str(body.get("scope", "")),
        )


@dataclass(frozen=True, slots=True)
class Effect:
    """An effect as its tenant sees it: its state, never its raw arguments."""

    effect_id: str
    operation_key: str
    tool: str
    #: ``name@version`` of the contract the effect is pinned to.
    contract: str
    safety_class: str
    status: str
    version: int
    attempt_count: int
    arguments_preview: Mapping[str, Any]
    receipt_id: str | None
    created_at: datetime
    updated_at: datetime
    #: Set on a submit's answer: whether this call reserved the effect ...
    created: bool | None = None
    #: ... or found it already reserved under this key with these arguments. After
    #: the SDK resent a submit whose first answer was lost, ``replayed`` can be True
    #: for the effect this very call created.
    replayed: bool | None = None
    forked_from: str | None = None
    forked_to: str | None = None
    #: True while an attempt may have reached the target unanswered and nothing has
    #: proved what happened since; on ``failed_final``, an operator gave up on it
    #: without that proof (a broker that predates the field sends nothing: False).
    outcome_in_doubt: bool = False
    #: Set while an operator's pause holds the effect (issue 24): why it waits.
    paused: Paused | None = None
    #: While ``awaiting_approval``: when the wait ends; unapproved by then, the
    #: effect ends failed_final and is never sent (None in any other status).
    approval_deadline: datetime | None = None

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> Effect:
        """Parse the broker's effect JSON."""
        return cls(
            effect_id=str(body["effect_id"]),
            operation_key=str(body["operation_key"]),
            tool=str(body["tool"]),
            contract=str(body["contract"]),
            safety_class=str(body["safety_class"]),
            status=str(body["status"]),
            version=int(body["version"]),
            attempt_count=int(body["attempt_count"]),
            arguments_preview=dict(body.get("arguments_preview") or {}),
            receipt_id=_optional_str(body.get("receipt_id")),
            created_at=_time(body["created_at"]),
            updated_at=_time(body["updated_at"]),
            created=body.get("created"),
            replayed=body.get("replayed"),
            forked_from=_optional_str(body.get("forked_from")),
            forked_to=_optional_str(body.get("forked_to")),
            outcome_in_doubt=body.get("outcome_in_doubt") is True,
            paused=Paused.from_wire(body.get("paused")),
            approval_deadline=_optional_time(body.get("approval_deadline")),
        )

    @property
    def settled(self) -> bool:
        """True once the status cannot change on its own (succeeded, failed, ...)."""
        return self.status in SETTLED_STATUSES

    @property
    def needs_operator(self) -> bool:
        """True when only an operator can move the effect on: ``manual_review``, or
        an unsafe effect whose outcome is unknown (it has no lookup to reconcile by)."""
        return self.status == "manual_review" or (
            self.status == "outcome_unknown" and self.safety_class == "unsafe"
        )


@dataclass(frozen=True, slots=True)
class Receipt:
    """The immutable receipt of a succeeded effect, with its result."""

    receipt_id: str
    effect_id: str
    external_id: str | None
    result: Mapping[str, Any]
    result_preview: Mapping[str, Any]
    evidence_digest: str
    target_timestamp: datetime | None
    contract_version: str
    downstream_key_digest: str
    created_at: datetime

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> Receipt:
        """Parse the broker's receipt JSON."""
        return cls(
            receipt_id=str(body["receipt_id"]),
            effect_id=str(body["effect_id"]),
            external_id=_optional_str(body.get("external_id")),
            result=dict(body.get("result") or {}),
            result_preview=dict(body.get("result_preview") or {}),
            evidence_digest=str(body["evidence_digest"]),
            target_timestamp=_optional_time(body.get("target_timestamp")),
            contract_version=str(body["contract_version"]),
            downstream_key_digest=str(body["downstream_key_digest"]),
            created_at=_time(body["created_at"]),
        )


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One stored transition event of an effect."""

    sequence: int
    event_type: str
    old_status: str | None
    new_status: str
    version: int
    actor: str
    occurred_at: datetime
    metadata: Mapping[str, Any]
    digest: str

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> HistoryEvent:
        """Parse one event of the broker's history JSON."""
        return cls(
            sequence=int(body["sequence"]),
            event_type=str(body["event_type"]),
            old_status=_optional_str(body.get("old_status")),
            new_status=str(body["new_status"]),
            version=int(body["version"]),
            actor=str(body["actor"]),
            occurred_at=_time(body["occurred_at"]),
            metadata=dict(body.get("metadata") or {}),
            digest=str(body["digest"]),
        )


@dataclass(frozen=True, slots=True)
class History:
    """An effect folded from its verified event chain up to ``at_sequence``."""

    effect_id: str
    at_sequence: int
    latest_sequence: int
    status: str
    version: int
    chain_verified: bool
    events: tuple[HistoryEvent, ...]

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> History:
        """Parse the broker's history JSON."""
        return cls(
            effect_id=str(body["effect_id"]),
            at_sequence=int(body["at_sequence"]),
            latest_sequence=int(body["latest_sequence"]),
            status=str(body["status"]),
            version=int(body["version"]),
            chain_verified=bool(body["chain_verified"]),
            events=tuple(HistoryEvent.from_wire(e) for e in body.get("events") or ()),
        )


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One item of a batch submit: what ``submit`` takes, as a value."""

    operation_key: str
    tool: str
    arguments: Mapping[str, Any]
    trace_id: str | None = None
    requested_by: str = ""


#: A batch item's outcomes (``BatchResult.outcome``).
CREATED, REPLAYED, CONFLICT = "created", "replayed", "conflict"


@dataclass(frozen=True, slots=True)
class BatchResult:
    """One item's answer in a batch: ``created`` or ``replayed`` with its ``effect``,
    or ``conflict`` with the ``error`` a single submit of it would have raised
    (``PayloadConflict``, or ``UnknownContract`` for a pinned contract now gone)."""

    index: int
    outcome: str
    effect: Effect | None = None
    error: BrokerError | None = None

    def unwrap(self) -> Effect:
        """The item's effect, or raise its error (what ``submit`` would have done)."""
        if self.effect is not None:
            return self.effect
        raise self.error or BrokerError(f"batch item {self.index}: {self.outcome}")

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> BatchResult:
        """Parse one item of the broker's batch answer."""
        effect, problem = body.get("effect"), body.get("problem")
        return cls(
            index=int(body["index"]),
            outcome=str(body["outcome"]),
            effect=Effect.from_wire(effect) if isinstance(effect, Mapping) else None,
            error=(
                from_problem(int(problem.get("status") or 409), problem)
                if isinstance(problem, Mapping)
                else None
            ),
        )
