"""Ledger writes: reservation, fenced compare-and-swap transitions, attempts, receipts.

Every function here runs its statements on Django's connection, so a caller's
``transaction.atomic()`` (and a procrastinate defer made inside it) commits or rolls
back together with the ledger write. Each version bump appends exactly one event whose
``sequence`` equals the new version, so "events == version" is an invariant a reader can
check without trusting the writer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from django.db import connection, transaction

from effect_broker.domain.canonical import canonical_json
from effect_broker.domain.errors import EventChainBrokenError, StaleWriteError
from effect_broker.domain.event_chain import GENESIS_DIGEST, EventFacts, event_digest
from effect_broker.domain.ids import new_row_id
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, check_transition
from effect_broker.store import sql
from effect_broker.store.rows import record_from_row


@dataclass(frozen=True, slots=True)
class NewIntent:
    """Everything a reservation writes; computed by the submission service."""

    tenant_id: str
    operation_key: str
    tool: str
    request_hash: bytes
    arguments_ciphertext: bytes
    arguments_key_id: str
    arguments_preview: Mapping[str, object]
    contract_name: str
    contract_version: str
    safety_class: str
    downstream_key: str
    requested_by: str = ""
    trace_id: str | None = None
    effect_id: str = field(default_factory=new_row_id)


@dataclass(frozen=True, slots=True)
class AttemptOutcome:
    """How an attempt ended, as recorded on its row (digests, never raw payloads)."""

    outcome: str
    error_category: str = ""
    response_digest: str = ""
    transport_meta: Mapping[str, object] = field(default_factory=dict)
    bytes_may_have_left: bool = True


@dataclass(frozen=True, slots=True)
class ReceiptData:
    """The content of a terminal receipt (result already encrypted by the service)."""

    external_id: str | None
    result_ciphertext: bytes
    result_key_id: str
    result_preview: Mapping[str, object]
    evidence_digest: str
    downstream_key_digest: str
    contract_version: str
    target_timestamp: datetime | None = None


def _json(value: Mapping[str, object]) -> str:
    # Canonical text, so what is stored is what was hashed into the event digest.
    return canonical_json(dict(value)).decode("utf-8")


def reserve(intent: NewIntent, *, now: datetime, actor: str) -> tuple[EffectRecord, bool]:
    """Insert the intent unless (tenant, operation_key) exists; return (row, created)."""
    # No savepoint of its own: nested, the caller's atomic block (submit's) rolls back
    # everything on an error; outermost, this block is the transaction. A savepoint
    # would cost two round trips per submit for nothing (docs/benchmarks.md).
    with transaction.atomic(savepoint=False), connection.cursor() as cur:
        cur.execute(
            sql.RESERVE_INTENT,
            [
                intent.effect_id,
                intent.tenant_id,
                intent.operation_key,
                intent.tool,
                intent.request_hash,
                intent.arguments_ciphertext,
                intent.arguments_key_id,
                _json(intent.arguments_preview),
                intent.contract_name,
                intent.contract_version,
                intent.safety_class,
                intent.downstream_key,
                EffectStatus.PREPARED.value,
                now,
                intent.trace_id,
                intent.requested_by,
                now,
                now,
            ],
        )
        row = cur.fetchone()
        if row is not None:
            record = record_from_row(row)
            _append_event(
                cur,
                record,
                prev=GENESIS_DIGEST,
                old_status=None,
                event_type="reserved",
                actor=actor,
                now=now,
                metadata={
                    "contract": f"{intent.contract_name}@{intent.contract_version}",
                    "request_hash": intent.request_hash.hex(),
                },
            )
            return record, True
        cur.execute(sql.SELECT_INTENT_BY_KEY, [intent.tenant_id, intent.operation_key])
        existing = cur.fetchone()
    if existing is None:  # pragma: no cover - a conflict implies the row exists
        raise RuntimeError("reservation conflicted but no row was found")
    return record_from_row(existing), False


def transition(
    record: EffectRecord,
    target: EffectStatus,
    *,
    event_type: str,
    actor: str,
    now: datetime,
    metadata: Mapping[str, object] | None = None,
    changes: Mapping[str, Any] | None = None,
) -> EffectRecord:
    """Move ``record`` to ``target`` iff the row is still at ``record.version``.

    Raises ``IllegalTransitionError`` for a move the state machine forbids and
    ``StaleWriteError`` when another writer got there first; neither changes anything.
    """
    check_transition(record.status, target)
    return _compare_and_swap(
        record,
        target,
        event_type=event_type,
        actor=actor,
        now=now,
        metadata=metadata,
        changes=changes,
    )


def touch(
    record: EffectRecord,
    *,
    event_type: str,
    actor: str,
    now: datetime,
    metadata: Mapping[str, object] | None = None,
    changes: Mapping[str, Any] | None = None,
) -> EffectRecord:
    """A fenced write that keeps the status (lease heartbeat, schedule change)."""
    return _compare_and_swap(
        record,
        record.status,
        event_type=event_type,
        actor=actor,
        now=now,
        metadata=metadata,
        changes=changes,
    )


def _set_clause(changes: Mapping[str, Any]) -> tuple[str, list[Any]]:
    unknown = set(changes) - sql.MUTABLE_INTENT_COLUMNS
    if unknown:
        raise ValueError(f"not a mutable intent column: {sorted(unknown)}")
    names = sorted(changes)
    return "".join(f", {name} = %s" for name in names), [changes[n] for n in names]


def _compare_and_swap(
    record: EffectRecord,
    target: EffectStatus,
    *,
    event_type: str,
    actor: str,
    now: datetime,
    metadata: Mapping[str, object] | None,
    changes: Mapping[str, Any] | None,
) -> EffectRecord:
    extra, values = _set_clause(changes or {})
    stale: StaleWriteError | None = None
    # No savepoint (it would cost two round trips per transition): a refused CAS has
    # written nothing, and is raised after the block, so it leaves an enclosing
    # transaction usable; any other error here marks the enclosing transaction for
    # rollback, which is what a half-written transition needs.
    with transaction.atomic(savepoint=False), connection.cursor() as cur:
        cur.execute(
            sql.CAS_UPDATE_TEMPLATE.format(extra=extra),
            [target.value, now, *values, record.effect_id, record.version],
        )
        row = cur.fetchone()
        if row is None:
            cur.execute(sql.SELECT_VERSION, [record.effect_id])
            current = cur.fetchone()
            stale = StaleWriteError(
                f"stale write refused: effect {record.effect_id} is no longer at "
                f"version {record.version}",
                effect_id=record.effect_id,
                expected_version=record.version,
                actual_version=current[0] if current else None,
                attempted=f"{event_type}:{record.status}->{target}",
            )
        else:
            updated = record_from_row(row[:-1])
            _append_event(
                cur,
                updated,
                prev=None if row[-1] is None else bytes(row[-1]),
                old_status=record.status,
                event_type=event_type,
                actor=actor,
                now=now,
                metadata=metadata or {},
            )
    if stale is not None:
        raise stale
    return updated


def _append_event(
    cur: Any,
    record: EffectRecord,
    *,
    prev: bytes | None,
    old_status: EffectStatus | None,
    event_type: str,
    actor: str,
    now: datetime,
    metadata: Mapping[str, object],
) -> None:
    """Insert the event of ``record.version``, chained to ``prev`` (the digest of the
    event before it, read by the caller; None when that event is missing)."""
    sequence = record.version
    if prev is None:
        raise EventChainBrokenError(
            f"event {sequence - 1} of effect {record.effect_id} is missing",
            sequence=sequence - 1,
        )
    facts = EventFacts(
        effect_id=record.effect_id,
        sequence=sequence,
        event_type=event_type,
        old_status=old_status.value if old_status is not None else None,
        new_status=record.status.value,
        version=record.version,
        actor=actor,
        occurred_at=now,
        metadata=dict(metadata),
    )
    cur.execute(
        sql.INSERT_EVENT,
        [
            record.effect_id,
            sequence,
            event_type,
            facts.old_status,
            facts.new_status,
            record.version,
            actor,
            now,
            _json(metadata),
            prev,
            event_digest(prev, facts),
        ],
    )


def start_attempt(
    record: EffectRecord,
    *,
    worker: str,
    now: datetime,
    changes: Mapping[str, Any],
    metadata: Mapping[str, object] | None = None,
) -> tuple[EffectRecord, str]:
    """Commit DISPATCHING and the attempt row together, before any network I/O."""
    attempt_id = new_row_id()
    ordinal = record.attempt_count + 1
    with transaction.atomic():
        updated = transition(
            record,
            EffectStatus.DISPATCHING,
            event_type="dispatch_started",
            actor=worker,
            now=now,
            metadata={"attempt": ordinal, **(metadata or {})},
            changes={**changes, "attempt_count": ordinal},
        )
        with connection.cursor() as cur:
            cur.execute(
                sql.INSERT_ATTEMPT,
                [
                    attempt_id,
                    record.effect_id,
                    ordinal,
                    worker,
                    updated.version,
                    now,
                    record.request_hash.hex(),
                    # Until the adapter says otherwise, assume bytes may leave.
                    True,
                ],
            )
    return updated, attempt_id


def close_attempt(attempt_id: str, outcome: AttemptOutcome, *, now: datetime) -> None:
    """Record how an attempt ended; call inside the transition's transaction."""
    with connection.cursor() as cur:
        cur.execute(
            sql.CLOSE_ATTEMPT,
            [
                now,
                outcome.response_digest,
                json.dumps(dict(outcome.transport_meta), sort_keys=True),
                outcome.error_category,
                outcome.outcome,
                outcome.bytes_may_have_left,
                attempt_id,
            ],
        )


def insert_receipt(
    record: EffectRecord,
    data: ReceiptData,
    *,
    now: datetime,
    receipt_id: str | None = None,
) -> str:
    """Insert the one terminal receipt of an effect; returns its id."""
    receipt_id = receipt_id or new_row_id()
    with connection.cursor() as cur:
        cur.execute(
            sql.INSERT_RECEIPT,
            [
                receipt_id,
                record.effect_id,
                data.external_id,
                data.result_ciphertext,
                data.result_key_id,
                _json(data.result_preview),
                data.evidence_digest,
                data.target_timestamp,
                data.contract_version,
                data.downstream_key_digest,
                now,
            ],
        )
    return receipt_id


def record_stale_write(error: StaleWriteError, *, actor: str, now: datetime) -> None:
    """Persist a fence refusal; call outside the refused (rolled back) transaction."""
    details = error.details
    with connection.cursor() as cur:
        cur.execute(
            sql.INSERT_STALE_WRITE,
            [
                cast(str | None, details.get("effect_id")),
                actor,
                cast(int | None, details.get("expected_version")),
                cast(int | None, details.get("actual_version")),
                str(details.get("attempted", "")),
                now,
            ],
        )
