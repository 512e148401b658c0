"""Injectable time: services ask a clock, tests move it (STYLE rule 7).

Three readings, for three different jobs:

* ``now()``: the wall clock, for stamps a person reads (event times). Never used to
  decide anything another process relies on: hosts disagree.
* ``monotonic()``: seconds on a clock that cannot jump (``time.monotonic``). A worker
  proves it still holds its lease with it (the send gate): a paused, suspended or
  clock-stepped host cannot make an old claim look young.
* ``database_offset()``: added to the database server's clock wherever leases,
  retention and settlement deadlines are written or compared (in SQL). Zero in
  production, so one clock, the database's, decides; a test clock that was moved
  forward moves the database's view of time with it.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """Something that tells the current time."""

    def now(self) -> datetime:
        """Return the current time (tz-aware, UTC)."""
        ...

    def monotonic(self) -> float:
        """Return seconds on a clock that never goes back or jumps."""
        ...

    def database_offset(self) -> timedelta:
        """How far ahead of the database server's clock this clock runs."""
        ...


class SystemClock:
    """The host's clocks; the database's clock decides deadlines (offset zero)."""

    def now(self) -> datetime:
        """Return ``datetime.now(UTC)``."""
        return datetime.now(UTC)

    def monotonic(self) -> float:
        """Return ``time.monotonic()``."""
        return time.monotonic()

    def database_offset(self) -> timedelta:
        """Zero: deadlines are the database server's own clock, unshifted."""
        return timedelta(0)


class ManualClock:
    """A clock that only moves when told to; for tests and simulations.

    ``advance`` moves all three readings together: the wall time, the monotonic
    seconds and the offset applied to the database's clock.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("ManualClock needs a timezone-aware start")
        self._advanced = timedelta(0)

    def now(self) -> datetime:
        """Return the clock's current time."""
        return self._now

    def monotonic(self) -> float:
        """Seconds advanced so far (a monotonic reading that starts at zero)."""
        return self._advanced.total_seconds()

    def database_offset(self) -> timedelta:
        """How far this clock was moved: the database's clock is moved as far."""
        return self._advanced

    def advance(self, delta: timedelta) -> datetime:
        """Move forward by ``delta`` and return the new time."""
        if delta < timedelta(0):
            raise ValueError("time does not go backwards")
        self._now += delta
        self._advanced += delta
        return self._now
