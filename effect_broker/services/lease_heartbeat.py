"""One heartbeat thread per worker process, beating for every lease in flight.

Issue 13: a thread started per dispatch cost a thread start and join on every effect,
although almost no call outlives a heartbeat interval (10 s by default) and so almost
no keeper ever beats. Here the keepers of a process register with one long-lived
thread that sleeps until the earliest registered keeper is due and beats only those.
A dispatch pays a lock, a dict entry and a notify.

What the per-dispatch thread guaranteed still holds:

* each keeper beats every ``heartbeat`` seconds after its claim, as long as its call
  runs, until its lease is taken away or its attempt outlives its limit (the keeper
  decides, ``LeaseKeeper.beat_due``);
* ``remove`` returns only once no beat of that keeper is in flight, so the version the
  keeper hands to the outcome writer is the newest one written (a beat landing after
  the outcome would otherwise fence the outcome out);
* the send gate never depends on this thread being alive: a beat that does not happen
  only lets ``provable_until`` pass, and the gate then refuses. Beats of several keepers
  run one after another, so a slow beat can delay another keeper's; that costs
  liveness (a refused send, retried later), never safety.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Protocol

from django.db import connection

logger = logging.getLogger(__name__)


class Beating(Protocol):
    """What the heartbeat thread needs of a keeper."""

    def beat_due(self) -> bool:
        """Beat once; False when this keeper must not beat again."""


class Heartbeats:
    """The registry of keepers in flight and the thread that beats for them."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition()
        #: keeper -> (next beat, on ``time.monotonic``; interval in seconds)
        self._due: dict[Beating, tuple[float, float]] = {}
        self._beating: Beating | None = None
        #: When the thread wakes up next by itself (``time.monotonic``; inf: never).
        self._wakes_at = float("inf")
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        #: How many threads this registry started (tests: one per process).
        self.threads_started = 0

    def add(self, keeper: Beating, interval: float) -> None:
        """Beat for ``keeper`` every ``interval`` seconds from now until ``remove``."""
        if self._pid != os.getpid():
            # A forked child has the registry but not the thread: start afresh.
            self._reset()
        at = time.monotonic() + interval
        with self._cond:
            self._due[keeper] = (at, interval)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="lease-heartbeat", daemon=True
                )
                self._thread.start()
                self.threads_started += 1
            if at < self._wakes_at:
                # Wake the thread only when this keeper is due before it wakes anyway:
                # at a steady rate of dispatches it sleeps through most of them.
                self._cond.notify_all()

    def remove(self, keeper: Beating) -> None:
        """Stop beating for ``keeper``; return once none of its beats is in flight."""
        with self._cond:
            self._due.pop(keeper, None)
            while self._beating is keeper:
                self._cond.wait()

    def active(self) -> int:
        """How many keepers are registered."""
        with self._cond:
            return len(self._due)

    def _next(self) -> tuple[Beating, float]:
        """Block until a keeper is due; mark it as beating. Holds no lock on return."""
        with self._cond:
            while True:
                if not self._due:
                    self._wakes_at = float("inf")
                    self._cond.wait()
                    continue
                keeper, (at, interval) = min(self._due.items(), key=lambda kv: kv[1][0])
                wait = at - time.monotonic()
                if wait <= 0:
                    self._beating = keeper
                    self._wakes_at = float("-inf")  # awake: no notify needed
                    return keeper, interval
                # Keepers removed meanwhile are skipped when it wakes (not in _due).
                self._wakes_at = at
                self._cond.wait(wait)

    def _run(self) -> None:
        while True:
            keeper, interval = self._next()
            try:
                again = keeper.beat_due()
            except Exception:
                # beat_due handles database errors itself; anything else must not
                # end the thread every keeper of the process relies on.
                logger.exception(
                    "lease heartbeat failed", extra={"action": "lease_heartbeat_failed"}
                )
                again = True
            with self._cond:
                self._beating = None
                if keeper in self._due:
                    if again:
                        self._due[keeper] = (time.monotonic() + interval, interval)
                    else:
                        del self._due[keeper]
                idle = not self._due
                self._cond.notify_all()
            if idle:
                # No lease to keep: give the connection back rather than hold a
                # backend per idle worker process (the next beat opens a new one).
                connection.close()


#: The process's registry; every ``LeaseKeeper`` registers here.
HEARTBEATS = Heartbeats()
