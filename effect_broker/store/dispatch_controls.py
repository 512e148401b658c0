"""Operator controls in PostgreSQL: the limits' shared state and the pauses' reach.

Issue 24, item 7. Dispatch limits hold across every worker because the decision is
taken here, under one row lock per contract (``contract_limits``), in the transaction
that also claims the effect: the lock is held until that claim commits, so the next
worker's count of attempts in flight includes it. The count is read in its own
statement AFTER the lock is granted: under READ COMMITTED each statement sees what
was committed when it started, and a count taken in the locking statement would
predate the claim of the worker whose lock it waited for.

An attempt in flight is an effect in ``dispatching`` whose lease has not run out
(by the database's clock): a worker that is SIGKILLed mid-attempt frees its slot
when its lease ends, whether or not a sweep has run since.

Pauses are rows of ``dispatch_pauses`` (the model, written by ``services.pauses``);
this module only reads which effects they hold (domain/pauses.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from effect_broker.domain.dispatch_limits import BURST, BucketState
from effect_broker.store.sql import PAUSE_COVERS, PAUSE_SCOPE

#: Lock the contract's row, creating it with a full bucket the first time, and read
#: it with the database's clock. ON CONFLICT DO UPDATE locks the row as it stands
#: (the latest committed version), which a plain SELECT ... FOR UPDATE would too,
#: but this also creates it in the same round trip.
_LOCK_BUCKET = """
INSERT INTO contract_limits (contract_name, tokens, refilled_at, next_wake_at)
VALUES (%s, %s, clock_timestamp() + %s::interval, clock_timestamp() + %s::interval)
ON CONFLICT (contract_name) DO UPDATE SET contract_name = EXCLUDED.contract_name
RETURNING tokens, refilled_at, next_wake_at, clock_timestamp() + %s::interval
"""

#: Attempts of the contract (any version) in flight: claimed, lease not run out.
#: Served by the partial lease index (only in-flight rows are in it).
_IN_FLIGHT = """
SELECT count(*) FROM effect_intents
WHERE status = 'dispatching' AND contract_name = %s
  AND lease_expires_at > clock_timestamp() + %s::interval
"""

_STORE_BUCKET = """
UPDATE contract_limits SET tokens = %s, refilled_at = %s, next_wake_at = %s
WHERE contract_name = %s
"""

#: Effects a pause holds: a first send or retry, or an idempotent same-key resend.
_HELD = """
    (effect_intents.status IN ('prepared', 'retryable')
     OR (effect_intents.status = 'outcome_unknown'
         AND effect_intents.safety_class = 'idempotent'))"""

#: By the pause's scope, active or just resumed (``resume`` reads what it held).
_IN_PAUSE_SCOPE = " AND EXISTS (SELECT FROM dispatch_pauses p WHERE p.id = %s AND"

_HELD_BY_PAUSE = (
    "SELECT effect_intents.id, effect_intents.status, effect_intents.next_action_at"
    " FROM effect_intents WHERE"
    + _HELD
    + _IN_PAUSE_SCOPE
    + PAUSE_SCOPE
    + ") ORDER BY effect_intents.next_action_at NULLS FIRST LIMIT %s"
)

_COUNT_HELD_BY_PAUSE = (
    "SELECT count(*) FROM effect_intents WHERE"
    + _HELD
    + _IN_PAUSE_SCOPE
    + PAUSE_SCOPE
    + ")"
)

#: Held effects per pinned contract, under any active pause (metrics, doctor).
_HELD_BY_CONTRACT = (
    "SELECT tool, contract_name, contract_version, safety_class, count(*),"
    " EXTRACT(EPOCH FROM clock_timestamp() - min(created_at))::float8"
    " FROM effect_intents WHERE"
    + _HELD
    + " AND EXISTS (SELECT FROM "
    + PAUSE_COVERS
    + ") GROUP BY tool, contract_name, contract_version, safety_class"
)

#: Due, unsent effects of the named contracts that no pause holds: waiting for a
#: slot or a token (or, for a moment, for a free worker).
_WAITING_ON_LIMITS = (
    "SELECT tool, contract_name, contract_version, safety_class, count(*),"
    " EXTRACT(EPOCH FROM clock_timestamp() - min(next_action_at))::float8"
    " FROM effect_intents"
    " WHERE status IN ('prepared', 'retryable')"
    " AND next_action_at <= clock_timestamp() AND contract_name = ANY(%s)"
    " AND NOT EXISTS (SELECT FROM "
    + PAUSE_COVERS
    + ") GROUP BY tool, contract_name, contract_version, safety_class"
)


def lock_bucket(
    contract_name: str, *, offset: timedelta = timedelta(0)
) -> tuple[BucketState, datetime]:
    """Inside a transaction: lock ``contract_name``'s row until it ends; return the
    row and the database's clock (shifted by a test clock's ``offset``)."""
    if not connection.in_atomic_block:
        raise RuntimeError("the limits row is locked by a transaction: run in atomic()")
    with connection.cursor() as cur:
        params: list[Any] = [contract_name, BURST, offset, offset, offset]
        cur.execute(_LOCK_BUCKET, params)
        tokens, refilled_at, next_wake_at, now = cur.fetchone()
    return BucketState(float(tokens), refilled_at, next_wake_at), now


def count_in_flight(contract_name: str, *, offset: timedelta = timedelta(0)) -> int:
    """Attempts of ``contract_name`` in flight now (read after ``lock_bucket``)."""
    with connection.cursor() as cur:
        params: list[Any] = [contract_name, offset]
        cur.execute(_IN_FLIGHT, params)
        row = cur.fetchone()
    return int(row[0]) if row else 0


def store_bucket(contract_name: str, state: BucketState) -> None:
    """Write the row ``lock_bucket`` locked."""
    with connection.cursor() as cur:
        cur.execute(
            _STORE_BUCKET,
            [state.tokens, state.refilled_at, state.next_wake_at, contract_name],
        )


def held_by_pause(pause_id: str, *, limit: int) -> list[tuple[str, str, datetime | None]]:
    """(effect id, status, next action) of up to ``limit`` effects in the scope of
    the pause ``pause_id`` (active or resumed) that a pause would hold, the longest
    due first."""
    with connection.cursor() as cur:
        cur.execute(_HELD_BY_PAUSE, [pause_id, limit])
        return [(str(row[0]), row[1], row[2]) for row in cur.fetchall()]


def count_held_by_pause(pause_id: str) -> int:
    """How many effects in the scope of the pause ``pause_id`` a pause holds."""
    with connection.cursor() as cur:
        cur.execute(_COUNT_HELD_BY_PAUSE, [pause_id])
        row = cur.fetchone()
    return int(row[0]) if row else 0


def any_active_pause() -> bool:
    """True while any pause is active (one index probe)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT EXISTS (SELECT FROM dispatch_pauses WHERE resumed_at IS NULL)"
        )
        row = cur.fetchone()
    return bool(row and row[0])


def held_by_contract() -> list[tuple[str, str, str, str, int, float]]:
    """(tool, contract, version, safety, count, oldest age in s) of held effects."""
    with connection.cursor() as cur:
        cur.execute(_HELD_BY_CONTRACT)
        return [tuple(row) for row in cur.fetchall()]


def waiting_on_limits(
    contract_names: list[str],
) -> list[tuple[str, str, str, str, int, float]]:
    """(tool, contract, version, safety, count, longest wait in s) of due, unsent,
    unpaused effects of ``contract_names`` (the contracts with limits)."""
    if not contract_names:
        return []
    with connection.cursor() as cur:
        cur.execute(_WAITING_ON_LIMITS, [contract_names])
        return [tuple(row) for row in cur.fetchall()]
