"""Times the database computes inside a write, on its own clock.

Issue "correctness at the edges", defect 7: leases, key retention and settlement
deadlines were written and compared with each process's own clock, so a worker whose
clock ran 20 s ahead expired live leases and made a "not found" conclusive early. Every
such time is now an expression the write statement evaluates (``clock_timestamp()``,
shifted only by a test clock's offset, which is zero in production), and every
comparison of one runs in SQL too (``store.reads``).

The SQL here is fixed text; only the intervals are bound. Column names that appear in
an expression refer to the row's values before the update (Postgres evaluates every
``SET`` right-hand side against the old row), which is what "the lease that was held"
means in ``after_lease_end``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

#: The database's clock, shifted by the runtime clock's offset (zero in production).
NOW = "(clock_timestamp() + %s::interval)"


@dataclass(frozen=True, slots=True)
class DbTime:
    """A timestamp expression for a fenced write's ``SET`` (fixed SQL, bound values)."""

    sql: str
    params: tuple[Any, ...]


def after_now(offset: timedelta, plus: timedelta = timedelta(0)) -> DbTime:
    """The database's now plus ``plus``."""
    return DbTime(f"({NOW} + %s::interval)", (offset, plus))


def after_lease_end(offset: timedelta, plus: timedelta) -> DbTime:
    """The end of the lease the row holds (or now, if none) plus ``plus``."""
    return DbTime(f"(COALESCE(lease_expires_at, {NOW}) + %s::interval)", (offset, plus))


def first_dispatch_or_now(offset: timedelta) -> DbTime:
    """The first dispatch time already recorded, or the database's now."""
    return DbTime(f"COALESCE(first_dispatch_at, {NOW})", (offset,))


def after_first_dispatch(offset: timedelta, plus: timedelta) -> DbTime:
    """The first dispatch time (or now, for the first) plus ``plus``."""
    return DbTime(f"(COALESCE(first_dispatch_at, {NOW}) + %s::interval)", (offset, plus))


def no_earlier_than_settlement(value: DbTime) -> DbTime:
    """``value``, unless the row's settlement deadline is later: a deadline only moves
    forward (an earlier attempt's bound still holds)."""
    return DbTime(f"GREATEST(settlement_deadline, {value.sql})", value.params)
