"""Bounded lock waits: what a statement that gave up waiting looks like, and the
sweep's guard (issue 19 item 7).

Every session starts with ``lock_timeout`` and ``statement_timeout``
(``config.database.SESSION_TIMEOUTS``): a statement that meets a lock a stuck session
holds fails instead of waiting with it. Such a failure says nothing about the effect:
nothing was written (the statement, or its savepoint, rolled back), so the job that
met it tries again later; it is never a failed effect.

The sweep runs as one transaction behind a transaction-level advisory lock: a second
sweep that starts while one runs returns at once instead of taking a job slot, and a
sweeper frozen inside its sweep loses the lock with its session
(``idle_in_transaction_session_timeout``), so the next sweep is not stopped by it. A
session-level advisory lock would not be released by that timeout: an idle frozen
session keeps it for as long as its TCP connection lives.
"""

from __future__ import annotations

from django.db import connection

#: SQLSTATEs of a statement that gave up waiting: ``lock_not_available`` (55P03:
#: ``lock_timeout``, ``NOWAIT``) and ``query_canceled`` (57014: ``statement_timeout``).
GAVE_UP_WAITING = frozenset({"55P03", "57014"})

#: The advisory lock key only the sweep takes (a fixed signed 64-bit number that no
#: other code uses).
SWEEP_LOCK_KEY = 0x3C5E_1B2F_0A47_6D19

#: How long one sweep waits for a lock before it skips that row or job. Short: a
#: row somebody else holds is being worked on, and the next sweep comes within
#: seconds; waiting longer only keeps the one sweep from the other rows.
SWEEP_LOCK_TIMEOUT_MS = 500


def gave_up_waiting(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps: Django and procrastinate wrap psycopg's
    error) is a statement that gave up waiting for a lock or ran out of time."""
    seen: BaseException | None = exc
    for _ in range(5):  # a short chain: Django or procrastinate over psycopg
        if seen is None:
            return False
        if getattr(seen, "sqlstate", None) in GAVE_UP_WAITING:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def try_sweep_lock() -> bool:
    """Inside the sweep's transaction: take the sweep's lock, or False at once when
    another sweep holds it. Also bounds this transaction's lock waits
    (``SWEEP_LOCK_TIMEOUT_MS``); both end with the transaction."""
    if not connection.in_atomic_block:
        raise RuntimeError("the sweep lock is held by a transaction: run in atomic()")
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_xact_lock(%s)", [SWEEP_LOCK_KEY])
        row = cur.fetchone()
        if not (row and row[0]):
            return False
        cur.execute(
            "SELECT set_config('lock_timeout', %s, true)", [f"{SWEEP_LOCK_TIMEOUT_MS}ms"]
        )
    return True


#: What ``migrate`` lifts for its own session: a migration may legitimately run long
#: (an index build over a big ledger) or wait for a table lock behind live traffic.
_MIGRATION_UNBOUNDED = ("statement_timeout", "lock_timeout")


def unbound_for_migrations(using: str = "default", **_: object) -> None:
    """``pre_migrate``: lift the statement and lock timeouts for this session."""
    from django.db import connections

    with connections[using].cursor() as cur:
        for name in _MIGRATION_UNBOUNDED:
            cur.execute("SELECT set_config(%s, '0', false)", [name])


def rebound_after_migrations(using: str = "default", **_: object) -> None:
    """``post_migrate``: back to the session's configured timeouts."""
    from django.db import connections

    with connections[using].cursor() as cur:
        for name in _MIGRATION_UNBOUNDED:
            cur.execute(f"RESET {name}")
