"""The digest chain over an effect's transition events.

Spec "Data model" (effect_events): each event stores the previous event's digest, so an
edited, deleted or reordered event is detected by ``verify_chain``. As the spec says,
this detects accidents and supports deterministic verification; it is not protection
against a privileged database administrator, who can recompute the chain.

    digest(0) = 32 zero bytes
    digest(n) = SHA-256(digest(n-1) || canonical_json(facts(n)))
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType

from effect_broker.domain.canonical import canonical_json
from effect_broker.domain.errors import EventChainBrokenError

GENESIS_DIGEST = bytes(32)
"""The ``prev_digest`` of an effect's first event (sequence 1)."""

DIGEST_BYTES = 32
"""Length of an event digest (SHA-256)."""

BytesLike = bytes | bytearray | memoryview
"""Digests as a database driver may return them (bytea can arrive as memoryview)."""


def format_timestamp(moment: datetime) -> str:
    """Return ``moment`` as ISO-8601 UTC with microseconds: ``...T07:00:00.000000Z``."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("timestamp must be timezone-aware")
    # One fixed textual form: the digest must not depend on the offset a driver or
    # caller happened to use for the same instant.
    return (
        moment.astimezone(UTC).replace(tzinfo=None).isoformat("T", "microseconds") + "Z"
    )


@dataclass(frozen=True, slots=True)
class EventFacts:
    """The hashed content of one transition event (everything but the digests)."""

    effect_id: str
    sequence: int
    event_type: str
    old_status: str | None
    new_status: str
    version: int
    actor: str
    occurred_at: datetime
    metadata: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.occurred_at.tzinfo is None or self.occurred_at.utcoffset() is None:
            # STYLE rule 7: a naive time has no single instant, so no single digest.
            raise ValueError("occurred_at must be timezone-aware (UTC)")
        if isinstance(self.sequence, bool) or self.sequence < 1:
            raise ValueError(f"sequence is 1-based, got {self.sequence!r}")
        object.__setattr__(self, "occurred_at", self.occurred_at.astimezone(UTC))
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))

    def as_document(self) -> dict[str, object]:
        """Return the JSON document whose canonical bytes are hashed."""
        return {
            "effect_id": self.effect_id,
            "sequence": self.sequence,
            "event_type": self.event_type,
            "old_status": self.old_status,
            "new_status": self.new_status,
            "version": self.version,
            "actor": self.actor,
            "occurred_at": format_timestamp(self.occurred_at),
            "metadata": self.metadata,
        }


def event_digest(prev_digest: BytesLike, facts: EventFacts) -> bytes:
    """Return SHA-256(prev_digest || canonical_json(facts)) for one event."""
    prev = bytes(prev_digest)
    if len(prev) != DIGEST_BYTES:
        raise ValueError(f"prev_digest must be {DIGEST_BYTES} bytes, got {len(prev)}")
    return hashlib.sha256(prev + canonical_json(facts.as_document())).digest()


def _broken(sequence: int, reason: str, *, prefix: bool = True) -> EventChainBrokenError:
    message = f"event {sequence}: {reason}" if prefix else reason
    return EventChainBrokenError(message, sequence=sequence, reason=reason)


def verify_chain(
    events: Sequence[tuple[EventFacts, BytesLike, BytesLike]],
    *,
    expected_last_sequence: int | None = None,
) -> None:
    """Verify ``(facts, prev_digest, digest)`` rows in order; raise on the first break.

    ``expected_last_sequence`` (for example the count the intent row implies) also
    detects deletion of the newest events, which a chain alone cannot see.
    """
    sequences = [facts.sequence for facts, _, _ in events]
    expected_prev = GENESIS_DIGEST
    for position, (facts, prev_stored, digest_stored) in enumerate(events, start=1):
        if facts.sequence != position:
            if facts.sequence < position or position in sequences[position:]:
                raise _broken(
                    position,
                    f"found event {facts.sequence} here (duplicated or reordered?)",
                )
            raise _broken(position, f"missing event {position} (deleted?)", prefix=False)
        if bytes(prev_stored) != expected_prev:
            raise _broken(
                position, "prev_digest does not match the previous event (chain broken)"
            )
        if event_digest(expected_prev, facts) != bytes(digest_stored):
            raise _broken(position, "digest mismatch (edited?)")
        expected_prev = bytes(digest_stored)
    if expected_last_sequence is None:
        return
    if len(events) < expected_last_sequence:
        missing = len(events) + 1
        raise _broken(missing, f"missing event {missing} (truncated?)", prefix=False)
    if len(events) > expected_last_sequence:
        raise _broken(
            expected_last_sequence + 1,
            f"unexpected: the chain should end at event {expected_last_sequence}",
        )
