"""A procrastinate worker that does not lose a job's wake-up (issue 13).

procrastinate 3.10 wakes an idle worker with a ``job_inserted`` NOTIFY: the listener
sets ``Worker._new_job_event`` and the run loop fetches. But ``_fetch_and_process_jobs``
clears that event after EVERY fetch (its ``finally: self._new_job_event.clear()``),
including the fetch that ends a pass because it found nothing. A job whose transaction
commits after that fetch's snapshot was taken, and whose NOTIFY reaches the listener
before the fetch returns, is therefore neither fetched nor remembered: its wake-up is
cleared, and the job waits for the next poll (``fetch_job_polling_interval``, 1 s
here, procrastinate's default 5 s). This is the ~1 s p99 of the one-at-a-time
end-to-end bench: the caller sees the receipt, submits the next effect at once, and
its NOTIFY lands while the worker's last fetch after the previous job is in flight.

A second wake-up is lost to job locks. A fetch skips a job whose ``lock`` a running
job holds (``procrastinate_fetch_job_v2``), and finishing that running job sends no
NOTIFY. The broker's effect jobs share ``lock="effect:<id>"``, and a dispatch that
loses its response defers the reconcile job from inside the running dispatch job: with
more than one slot (the worker's default is 4) a free slot fetches, finds the reconcile
job locked, and the pass ends; when the dispatch job finishes nothing wakes the worker,
and the reconcile job waits for the poll.

The fix keeps procrastinate's loop unchanged and counts the wake-ups instead:

* when a ``job_inserted`` notification arrived while a pass's last (empty) fetch ran,
  the pass cleared it, so the event is set again and the run loop fetches once more;
* when a job that held a lock finishes and a job was inserted while it ran, that job
  may have been skipped for the lock, so the event is set as well.

Each costs at most one extra fetch, and only when a new job's NOTIFY overlapped a
pass's last fetch or a locked job's run; never a poll. Lowering the poll interval
instead would cost idle fetches on every worker all the time and still leave up to one
interval of stall.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from procrastinate import job_context, jobs
from procrastinate.worker import Worker


class _WakeEvent(asyncio.Event):
    """procrastinate's wake-up event, remembering the wake-up count at its last two
    clears: procrastinate clears it after every fetch, so the count at the clear
    before a pass's last fetch is what that fetch was bound to see."""

    def __init__(self, count: Callable[[], int]) -> None:
        super().__init__()
        self._count = count
        #: The wake-up count at the clear before last, and at the last clear.
        self.cleared_at = (0, 0)

    def clear(self) -> None:
        self.cleared_at = (self.cleared_at[1], self._count())
        super().clear()


class WakeKeepingWorker(Worker):
    """procrastinate's worker, fetching again when a wake-up may have been lost."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        #: ``job_inserted`` notifications received since the worker was built.
        self.wakeups = 0
        #: Times the wake-up was set again (what a test or a bench reads).
        self.rewakes = 0
        self._new_job_event: _WakeEvent = _WakeEvent(lambda: self.wakeups)

    async def _handle_notification(
        self, *, channel: str, notification: jobs.Notification
    ) -> None:
        if notification["type"] == "job_inserted":
            # Counted before procrastinate sets the event: a pass that reads the count
            # after the event is set sees this notification too.
            self.wakeups += 1
        await super()._handle_notification(channel=channel, notification=notification)

    async def _process_job(self, context: job_context.JobContext) -> None:
        seen = self.wakeups
        try:
            await super()._process_job(context)  # ends once the job is finished
        finally:
            if context.job.lock is not None and self.wakeups != seen:
                # Its lock is released now; a job inserted meanwhile may have been
                # skipped for it, and no NOTIFY will come for that job again.
                self._wake_again()

    async def _fetch_and_process_jobs(self) -> None:
        at_start = self.wakeups
        await super()._fetch_and_process_jobs()
        before_last_fetch, after_last_fetch = self._new_job_event.cleared_at
        # Notifications before the pass's last fetch began were seen by that fetch
        # (a NOTIFY is sent after its commit); one that arrived while it ran may be of
        # a job committed after its snapshot, and procrastinate cleared its wake-up.
        if after_last_fetch != max(at_start, before_last_fetch):
            self._wake_again()

    def _wake_again(self) -> None:
        if not self._stop_event.is_set():
            self.rewakes += 1
            self._new_job_event.set()
