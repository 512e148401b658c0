"""Injectable time: services ask a clock, tests move it (STYLE rule 7)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """Something that tells the current timezone-aware UTC time."""

    def now(self) -> datetime:
        """Return the current time (tz-aware, UTC)."""
        ...


class SystemClock:
    """The wall clock."""

    def now(self) -> datetime:
        """Return ``datetime.now(UTC)``."""
        return datetime.now(UTC)


class ManualClock:
    """A clock that only moves when told to; for tests and simulations."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("ManualClock needs a timezone-aware start")

    def now(self) -> datetime:
        """Return the clock's current time."""
        return self._now

    def advance(self, delta: timedelta) -> datetime:
        """Move forward by ``delta`` and return the new time."""
        if delta < timedelta(0):
            raise ValueError("time does not go backwards")
        self._now += delta
        return self._now
