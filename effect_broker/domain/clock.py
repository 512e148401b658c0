"""Injectable time: services ask a clock, tests move it (STYLE rule 7).

Three readings, for three different jobs:

* ``now()``: the wall clock, for stamps a person reads (event times). Never used to
  decide anything another process relies on: hosts disagree.
* ``monotonic()``: seconds on a clock that cannot jump and keeps counting while the
  host is suspended (``lease_seconds``, below). A worker proves it still holds its
  lease with it (the send gate): a paused, suspended or clock-stepped host cannot make
  an old claim look young.
* ``database_offset()``: added to the database server's clock wherever leases,
  retention and settlement deadlines are written or compared (in SQL). Zero in
  production, so one clock, the database's, decides; a test clock that was moved
  forward moves the database's view of time with it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

#: Per platform, the clock id that keeps counting while the host is suspended.
_SUSPEND_COUNTING = (("linux", "CLOCK_BOOTTIME"), ("darwin", "CLOCK_MONOTONIC_RAW"))


def _suspend_counting_clock() -> tuple[str, Callable[[], float]]:
    """The host's clock that cannot jump and counts a suspend, and its name.

    ``time.monotonic()`` is CLOCK_MONOTONIC on Linux and mach_absolute_time on macOS:
    neither advances while the host is suspended (a laptop lid, a VM paused with
    suspend), so a host resumed after its lease ran out would find its claim as
    young as when it stopped and send late (issue 19, item 4c). Linux counts the
    suspend in CLOCK_BOOTTIME, macOS in CLOCK_MONOTONIC_RAW (the clock libc++ moved
    ``steady_clock`` to for this reason, LLVM D74341). Elsewhere (Windows, the BSDs)
    ``time.monotonic()`` is what Python offers; whether it counts a suspend is the
    platform's (docs/explanation/guarantees.md).
    """
    name = next((n for p, n in _SUSPEND_COUNTING if sys.platform.startswith(p)), "")
    clock_id: int | None = getattr(time, name, None) if name else None
    if clock_id is None:
        return "time.monotonic", time.monotonic
    chosen: int = clock_id

    def read() -> float:
        # Looked up at each call, so a test can move the clock a suspend moves.
        return time.clock_gettime(chosen)

    try:
        read()
    except OSError:  # a kernel without it (Linux < 2.6.39): the best Python offers
        return "time.monotonic", time.monotonic
    return name, read


#: The name of the clock the send gate counts leases on (``CLOCK_BOOTTIME`` on Linux).
LEASE_CLOCK_NAME, lease_seconds = _suspend_counting_clock()


class Clock(Protocol):
    """Something that tells the current time."""

    def now(self) -> datetime:
        """Return the current time (tz-aware, UTC)."""
        ...

    def monotonic(self) -> float:
        """Return seconds on a clock that is never set and counts a host suspend."""
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
        """Return ``lease_seconds()``: cannot jump, counts a suspend of the host."""
        return lease_seconds()

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
