"""Ledger writes: reservation, fenced compare-and-swap transitions, attempts, receipts.

Every write is ONE statement (a data-modifying CTE, ``store/sql.py``): the row, its event
and whatever must commit with it (the dispatch job, an attempt, a receipt). In
autocommit that statement is its own transaction: one round trip, one commit, nothing
half-written if it fails. Run inside a caller's ``transaction.atomic()`` it commits or
rolls back with the caller's other writes (e.g. a re-deferred job). Each version bump
appends exactly one event whose ``sequence`` equals the new version, so "events ==
version" is an invariant a reader can check without trusting the writer.

The reservation and the compare-and-swap are prepared on the server, once per
connection (``store/prepared.py``; ``EFFECT_BROKER_DB_PREPARED_STATEMENTS=off`` sends
them as Django sends everything else).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from django.db import connection

from effect_broker.domain.canonical import canonical_json
from effect_broker.domain.errors import EventChainBrokenError, StaleWriteError
from effect_broker.domain.event_chain import GENESIS_DIGEST, EventFacts, event_digest
from effect_broker.domain.ids import new_row_id
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, check_transition
from effect_broker.store import prepared, sql
from effect_broker.store.conflicts import retryable_conflicts
from effect_broker.store.db_time import DbTime
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
    #: The submit span's W3C traceparent (effect_broker.observability.tracing).
    trace_context: str | None = None
    effect_id: str = field(default_factory=new_row_id)
    #: PREPARED, or AWAITING_APPROVAL when its contract's rule asks for an operator
    #: first (issue 24): then no dispatch job is queued with it.
    status: EffectStatus = EffectStatus.PREPARED
    #: Added to the database's clock for the first due time (``next_action_at``):
    #: an awaiting effect's approval deadline, its contract's ``approval_ttl``.
    due_in: timedelta = timedelta(0)
    #: The approval rule in words, recorded in the ``reserved`` event ("" if none).
    approval_rule: str = ""


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


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A procrastinate job inserted by the reservation statement itself (its columns
    are those of procrastinate's ``procrastinate_job_to_defer_v1``)."""

    queue_name: str
    task_name: str
    priority: int
    lock: str | None
    queueing_lock: str | None
    args: Mapping[str, object]
    scheduled_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Rider:
    """A write that commits with a fenced transition, in the same statement.

    Its SQL selects FROM the transition's ``cas`` CTE, so it happens only if the fence
    held; build riders with ``open_attempt``, ``close_attempt`` and ``receipt``.
    """

    sql: str
    params: tuple[Any, ...]


def _json(value: Mapping[str, object]) -> str:
    # Canonical text, so what is stored is what was hashed into the event digest.
    return canonical_json(dict(value)).decode("utf-8")


def _event_params(
    record_id: str,
    *,
    sequence: int,
    event_type: str,
    old_status: EffectStatus | None,
    new_status: EffectStatus,
    actor: str,
    now: datetime,
    metadata: Mapping[str, object],
    prev: bytes,
) -> tuple[list[Any], bytes]:
    """The bound values of one event row (``sql._EVENT_OF``) and its digest."""
    facts = EventFacts(
        effect_id=record_id,
        sequence=sequence,
        event_type=event_type,
        old_status=old_status.value if old_status is not None else None,
        new_status=new_status.value,
        version=sequence,
        actor=actor,
        occurred_at=now,
        metadata=dict(metadata),
    )
    digest = event_digest(prev, facts)
    params = [
        record_id,
        sequence,
        event_type,
        facts.old_status,
        facts.new_status,
        sequence,
        actor,
        now,
        _json(metadata),
        prev,
        digest,
    ]
    return params, digest


def reserved_metadata(intent: NewIntent) -> dict[str, str]:
    """What an intent's ``reserved`` event records: the contract it is pinned to, and
    the approval rule that made it wait (never a value of its arguments)."""
    metadata = {"contract": f"{intent.contract_name}@{intent.contract_version}"}
    if intent.approval_rule:
        metadata["approval_rule"] = intent.approval_rule
    return metadata


def reserved_event_params(
    intent: NewIntent, *, now: datetime, actor: str
) -> tuple[list[Any], bytes]:
    """The bound values and digest of an intent's first event, ``reserved``: one
    definition for a single reservation and a batch's."""
    return _event_params(
        intent.effect_id,
        sequence=1,
        event_type="reserved",
        old_status=None,
        new_status=intent.status,
        actor=actor,
        now=now,
        # No request hash here: events are shown by /history and the admin, and the
        # hash binds the payload, not the story (issue 9, defect 10).
        metadata=reserved_metadata(intent),
        prev=GENESIS_DIGEST,
    )


def reserve(
    intent: NewIntent,
    *,
    now: datetime,
    actor: str,
    job: QueuedJob | None = None,
    database_offset: timedelta = timedelta(0),
) -> tuple[EffectRecord, bool]:
    """Insert the intent unless (tenant, operation_key) exists; return (row, created).

    ``now`` stamps the row and its event; the first due time is the database's clock
    plus ``database_offset`` (a test clock's; zero in production), never ``now``.

    The intent, its ``reserved`` event and ``job`` (if given) are one statement: in
    autocommit that is one round trip and one commit; inside a caller's transaction it
    commits or rolls back with it. A replay is answered by the same statement; only a
    concurrent insert of the same key that commits after it started reads twice.
    """
    event, _ = reserved_event_params(intent, now=now, actor=actor)
    params: list[Any] = [
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
        intent.status.value,
        # next_action_at: the database's clock (sql.RESERVE_INTENT); for an effect
        # awaiting approval, its deadline on that clock.
        database_offset + intent.due_in,
        intent.trace_id,
        intent.requested_by,
        now,
        now,
        intent.trace_context,
        *event,
    ]
    if job is not None:
        statement = sql.RESERVE_INTENT.format(job=sql.RESERVE_JOB, job_source=", job")
        params += [
            job.queue_name,
            job.task_name,
            job.priority,
            job.lock,
            job.queueing_lock,
            json.dumps(dict(job.args)),
            job.scheduled_at,
        ]
    else:
        statement = sql.RESERVE_INTENT.format(job="", job_source="")
    params += [intent.tenant_id, intent.operation_key]
    # Prepared on the server: the hottest statement of all, planned once per
    # connection instead of on every submit (store/prepared.py). A deadlock or
    # serialization failure wrote nothing and is the caller's to retry (503).
    with retryable_conflicts(), prepared.cursor() as cur:
        cur.execute(statement, params)
        row = cur.fetchone()
    if row is not None:
        return record_from_row(row[1:]), bool(row[0])
    # Both branches empty: ON CONFLICT waited for a concurrent inserter of this key
    # whose commit this statement's snapshot predates. A new statement sees it; it is
    # rare, so it is not prepared (a first execution costs a round trip more).
    with connection.cursor() as cur:
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
    riders: Sequence[Rider] = (),
) -> EffectRecord:
    """Move ``record`` to ``target`` iff the row is still at ``record.version``.

    ``riders`` (attempt and receipt writes) commit with the transition, in its
    statement, and happen only if it does. Raises ``IllegalTransitionError`` for a move
    the state machine forbids and ``StaleWriteError`` when another writer got there
    first; neither changes anything.
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
        riders=riders,
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
        riders=(),
    )


def _set_clause(changes: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """``SET`` items for ``changes``: bound values, or database-computed ``DbTime``s."""
    unknown = set(changes) - sql.MUTABLE_INTENT_COLUMNS
    if unknown:
        raise ValueError(f"not a mutable intent column: {sorted(unknown)}")
    clause: list[str] = []
    params: list[Any] = []
    for name in sorted(changes):
        value = changes[name]
        if isinstance(value, DbTime):
            clause.append(f", {name} = {value.sql}")
            params.extend(value.params)
        else:
            clause.append(f", {name} = %s")
            params.append(value)
    return "".join(clause), params


def _head_digest(cur: Any, record: EffectRecord) -> bytes:
    """The digest the next event chains to: read with the record, or (for a record
    built without it) read now; a missing event is a broken chain."""
    if record.head_digest is not None:
        return record.head_digest
    cur.execute(sql.SELECT_EVENT_DIGEST, [record.effect_id, record.version])
    row = cur.fetchone()
    if row is None:
        raise EventChainBrokenError(
            f"event {record.version} of effect {record.effect_id} is missing",
            sequence=record.version,
        )
    return bytes(row[0])


def _compare_and_swap(
    record: EffectRecord,
    target: EffectStatus,
    *,
    event_type: str,
    actor: str,
    now: datetime,
    metadata: Mapping[str, object] | None,
    changes: Mapping[str, Any] | None,
    riders: Sequence[Rider],
) -> EffectRecord:
    extra, values = _set_clause(changes or {})
    # One statement, no savepoint and no transaction of its own: in autocommit it is
    # its own transaction (one round trip, one commit); inside a caller's transaction a
    # refused CAS writes nothing and leaves that transaction usable, and any error
    # rolls the whole statement back - event and riders included. Prepared on the
    # server (store/prepared.py): a dispatch runs two of these, claim and outcome.
    with prepared.cursor() as cur:
        event, _ = _event_params(
            record.effect_id,
            sequence=record.version + 1,
            event_type=event_type,
            old_status=record.status,
            new_status=target,
            actor=actor,
            now=now,
            metadata=metadata or {},
            prev=_head_digest(cur, record),
        )
        statement = sql.CAS_UPDATE_TEMPLATE.format(
            extra=extra,
            riders="".join(
                f", rider_{n} AS ({rider.sql})" for n, rider in enumerate(riders)
            ),
        )
        params = [target.value, now, *values, record.effect_id, record.version, *event]
        for rider in riders:
            params.extend(rider.params)
        cur.execute(statement, params)
        row = cur.fetchone()
    if row is not None:
        return record_from_row(row)
    with connection.cursor() as cur:  # a refused fence: rare, not prepared
        cur.execute(sql.SELECT_VERSION, [record.effect_id])
        current = cur.fetchone()
    raise StaleWriteError(
        f"stale write refused: effect {record.effect_id} is no longer at "
        f"version {record.version}",
        effect_id=record.effect_id,
        expected_version=record.version,
        actual_version=current[0] if current else None,
        attempted=f"{event_type}:{record.status}->{target}",
    )


def open_attempt(
    record: EffectRecord, *, attempt_id: str, worker: str, now: datetime
) -> Rider:
    """The attempt row a transition to DISPATCHING commits with (fenced at the new
    version; until the adapter says otherwise, bytes may leave)."""
    return Rider(
        sql.RIDER_OPEN_ATTEMPT,
        (
            attempt_id,
            record.effect_id,
            record.attempt_count + 1,
            worker,
            record.version + 1,
            now,
            record.request_hash.hex(),
            True,
        ),
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
    updated = transition(
        record,
        EffectStatus.DISPATCHING,
        event_type="dispatch_started",
        actor=worker,
        now=now,
        metadata={"attempt": ordinal, **(metadata or {})},
        changes={**changes, "attempt_count": ordinal},
        riders=(open_attempt(record, attempt_id=attempt_id, worker=worker, now=now),),
    )
    return updated, attempt_id


def close_attempt(attempt_id: str, outcome: AttemptOutcome, *, now: datetime) -> Rider:
    """Record how an attempt ended, with the transition that says so (an attempt
    closes once; the trigger refuses a second close, so this updates only an open
    attempt)."""
    return Rider(
        sql.RIDER_CLOSE_ATTEMPT,
        (
            now,
            outcome.response_digest,
            json.dumps(dict(outcome.transport_meta), sort_keys=True),
            outcome.error_category,
            outcome.outcome,
            outcome.bytes_may_have_left,
            attempt_id,
        ),
    )


def receipt(
    record: EffectRecord, data: ReceiptData, *, now: datetime, receipt_id: str
) -> Rider:
    """The one terminal receipt of an effect, with the transition to SUCCEEDED."""
    return Rider(
        sql.RIDER_RECEIPT,
        (
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
        ),
    )


def finish_job(job_id: int, *, delete: bool) -> Rider:
    """The dispatch job ``job_id`` finished as succeeded with the transition that
    ends it (deleted, when its worker deletes succeeded jobs): issue 25, one commit
    instead of the outcome's and then procrastinate's own."""
    return Rider(
        sql.RIDER_DELETE_SUCCEEDED_JOB if delete else sql.RIDER_MARK_JOB_SUCCEEDED,
        (job_id,),
    )


def fork_link(
    record: EffectRecord, *, new_effect_id: str, operator: str, now: datetime
) -> Rider:
    """The link from a settled effect to its fork, with the settling transition."""
    return Rider(sql.RIDER_FORK_LINK, (record.effect_id, new_effect_id, operator, now))


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
