"""Ledger reads. Anything a caller can reach is scoped by tenant in the SQL itself."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from effect_broker.domain.errors import EffectNotFoundError
from effect_broker.domain.event_chain import EventFacts, verify_chain
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus
from effect_broker.store import prepared, sql
from effect_broker.store.rows import json_value, record_from_row


def _params(*values: Any) -> list[Any]:
    """Bound parameters: psycopg adapts ``timedelta`` to an interval, which Django's
    cursor stubs do not list."""
    return list(values)


MAX_PAGE = 500


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One event row with its stored chain digests."""

    facts: EventFacts
    prev_digest: bytes
    digest: bytes


def database_now(offset: timedelta = timedelta(0)) -> datetime:
    """The database server's clock (``clock_timestamp()``), plus ``offset`` (a test
    clock's ``database_offset()``; zero in production).

    Leases, key retention and settlement deadlines are written and compared on this
    one clock, never on a worker's own: a host whose clock is off must not expire a
    live lease or make a "not found" conclusive early (issue: one host's clock).
    """
    with connection.cursor() as cur:
        cur.execute(sql.SELECT_DATABASE_NOW, _params(offset))
        row = cur.fetchone()
    assert row is not None
    return row[0]


def lock_awaiting_approval(
    record: EffectRecord, offset: timedelta = timedelta(0)
) -> bool | None:
    """Inside a transaction: lock ``record``'s row while it still awaits approval at
    ``record.version``; True while its deadline is ahead (database clock), False once
    it has passed, None when the row has moved on (someone else decided first)."""
    with connection.cursor() as cur:
        cur.execute(
            sql.LOCK_AWAITING_APPROVAL, _params(offset, record.effect_id, record.version)
        )
        row = cur.fetchone()
    return None if row is None else bool(row[0])


def get_effect(tenant_id: str, effect_id: str) -> EffectRecord:
    """Return one effect of this tenant; another tenant's id is simply not found."""
    with connection.cursor() as cur:
        cur.execute(sql.SELECT_INTENT_BY_ID_SCOPED, [effect_id, tenant_id])
        row = cur.fetchone()
    if row is None:
        raise EffectNotFoundError(f"no effect {effect_id} for this tenant")
    return record_from_row(row)


def get_effect_by_key(tenant_id: str, operation_key: str) -> EffectRecord:
    """Return this tenant's effect for an operation key."""
    record = find_effect_by_key(tenant_id, operation_key)
    if record is None:
        raise EffectNotFoundError(f"no effect for operation key {operation_key!r}")
    return record


def find_effect_by_key(tenant_id: str, operation_key: str) -> EffectRecord | None:
    """This tenant's effect for an operation key, or None: a submit's first read, so a
    replay is this one indexed read (issue 25, item 3). Prepared on the server, as the
    reservation that follows it when the key is new."""
    with prepared.cursor() as cur:
        cur.execute(sql.SELECT_INTENT_BY_KEY, [tenant_id, operation_key])
        row = cur.fetchone()
    return None if row is None else record_from_row(row)


def load_effect_for_worker(effect_id: str) -> EffectRecord:
    """Unscoped read for workers, which act on ids from the job queue, not callers."""
    with connection.cursor() as cur:
        cur.execute(sql.SELECT_INTENT_BY_ID, [effect_id])
        row = cur.fetchone()
    if row is None:
        raise EffectNotFoundError(f"no effect {effect_id}")
    return record_from_row(row)


@dataclass(frozen=True, slots=True)
class SealedArguments:
    """An effect's arguments as stored: AES-GCM ciphertext and the key id."""

    ciphertext: bytes
    key_id: str


@dataclass(frozen=True, slots=True)
class DispatchRead:
    """What a dispatch job reads in one statement."""

    record: EffectRecord
    sealed: SealedArguments
    #: The database's clock at the read (shifted by the offset asked for).
    database_now: datetime
    #: The id of the oldest active operator pause covering the effect, if any
    #: (whether it holds the effect depends on its status: domain/pauses.py).
    pause_id: str | None = None


def load_for_dispatch(
    effect_id: str, *, offset: timedelta = timedelta(0)
) -> DispatchRead:
    """A worker's single read before a dispatch: the row, its sealed arguments and the
    database's clock. Prepared on the server, as the claim and outcome after it."""
    with prepared.cursor() as cur:
        cur.execute(sql.SELECT_INTENT_FOR_DISPATCH, _params(offset, effect_id))
        row = cur.fetchone()
    if row is None:
        raise EffectNotFoundError(f"no effect {effect_id}")
    return DispatchRead(
        record_from_row(row[:-4]),
        SealedArguments(bytes(row[-4]), row[-3]),
        row[-2],
        None if row[-1] is None else str(row[-1]),
    )


def load_arguments(effect_id: str) -> tuple[bytes, str, str, str]:
    """Return (ciphertext, key id, tenant id, operation key) for decryption."""
    with connection.cursor() as cur:
        cur.execute(sql.SELECT_ARGUMENTS, [effect_id])
        row = cur.fetchone()
    if row is None:
        raise EffectNotFoundError(f"no effect {effect_id}")
    return bytes(row[0]), row[1], str(row[2]), row[3]


def open_attempt_id(effect_id: str) -> str | None:
    """The attempt still open for an effect (its worker never recorded an end)."""
    with connection.cursor() as cur:
        cur.execute(sql.SELECT_OPEN_ATTEMPT, [effect_id])
        row = cur.fetchone()
    return str(row[0]) if row else None


def list_effects(
    tenant_id: str,
    *,
    status: EffectStatus | None = None,
    tool: str | None = None,
    operation_prefix: str | None = None,
    created_before: datetime | None = None,
    limit: int = 50,
) -> list[EffectRecord]:
    """List this tenant's effects, newest first, with optional filters."""
    clauses = ["tenant_id = %s"]
    params: list[str | int | datetime] = [tenant_id]
    if status is not None:
        clauses.append("status = %s")
        params.append(status.value)
    if tool is not None:
        clauses.append("tool = %s")
        params.append(tool)
    if operation_prefix:
        # starts_with() avoids LIKE wildcards in caller-supplied prefixes.
        clauses.append("starts_with(operation_key, %s)")
        params.append(operation_prefix)
    if created_before is not None:
        clauses.append("created_at < %s")
        params.append(created_before)
    params.append(max(1, min(limit, MAX_PAGE)))
    query = (
        sql.SELECT_INTENT
        + " WHERE "
        + " AND ".join(clauses)
        + " ORDER BY created_at DESC, id DESC LIMIT %s"
    )
    with connection.cursor() as cur:
        cur.execute(query, params)
        return [record_from_row(r) for r in cur.fetchall()]


def load_events(effect_id: str) -> list[StoredEvent]:
    """Return an effect's events in sequence order, with their digests."""
    with connection.cursor() as cur:
        cur.execute(sql.SELECT_EVENTS, [effect_id])
        rows = cur.fetchall()
    return [
        StoredEvent(
            facts=EventFacts(
                effect_id=effect_id,
                sequence=seq,
                event_type=event_type,
                old_status=old,
                new_status=new,
                version=int(version),
                actor=actor,
                occurred_at=occurred_at,
                metadata=json_value(metadata),
            ),
            prev_digest=bytes(prev),
            digest=bytes(digest),
        )
        for (
            seq,
            event_type,
            old,
            new,
            version,
            actor,
            occurred_at,
            metadata,
            prev,
            digest,
        ) in rows
    ]


def verify_event_chain(effect_id: str) -> int:
    """Verify an effect's digest chain; return its length or raise the first break.

    Every version bump appends exactly one event, so the intent's version is the
    sequence of its last event: that also catches deletion of the newest events.
    """
    with connection.cursor() as cur:
        cur.execute(sql.SELECT_VERSION, [effect_id])
        row = cur.fetchone()
    if row is None:
        raise EffectNotFoundError(f"no effect {effect_id}")
    events = load_events(effect_id)
    verify_chain(
        [(e.facts, e.prev_digest, e.digest) for e in events],
        expected_last_sequence=int(row[0]),
    )
    return len(events)


def expired_leases(
    statuses: list[EffectStatus],
    *,
    offset: timedelta = timedelta(0),
    limit: int = 100,
) -> list[EffectRecord]:
    """Effects whose dispatch or reconcile lease ran out by the database's clock
    (worker presumed dead)."""
    with connection.cursor() as cur:
        cur.execute(
            sql.SELECT_EXPIRED_LEASES,
            _params([s.value for s in statuses], offset, limit),
        )
        return [record_from_row(r) for r in cur.fetchall()]


def due_effects(
    status: EffectStatus,
    *,
    grace: timedelta,
    safety: list[str],
    offset: timedelta = timedelta(0),
    limit: int = 100,
) -> list[EffectRecord]:
    """Effects in ``status`` whose next action was due more than ``grace`` ago, by the
    database's clock."""
    with connection.cursor() as cur:
        cur.execute(sql.SELECT_DUE, _params(status.value, offset - grace, safety, limit))
        return [record_from_row(r) for r in cur.fetchall()]
