"""A worker does not lose a job's wake-up (issue 13, ``effect_broker.workers.wakeups``).

procrastinate 3.10 loses two: it clears its wake-up event after every fetch, so a job
whose NOTIFY lands during a pass's last (empty) fetch waits for the next poll; and a
job skipped because a running job holds its ``lock`` gets no NOTIFY when that lock is
released. Each test makes its race happen every time, with a 30 s poll interval: a lost
wake-up shows up as a job still queued when the test gives up (10 s). No timing is
asserted. procrastinate's own ``Worker`` fails both tests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from procrastinate import PsycopgConnector, jobs
from procrastinate.contrib.django import app
from procrastinate.contrib.django.utils import connector_params

from effect_broker.workers.wakeups import WakeKeepingWorker

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "test_wakeups"
NOOP = "tests.integration.test_worker_wakeups.noop"
HOLDER = "tests.integration.test_worker_wakeups.holder"
LOCK = "test_wakeups:effect"
#: Far longer than the test waits: a job it runs was woken, never polled for.
POLL_SECONDS = 30.0
#: How long the test waits for a job (or the listener) before it fails.
GIVE_UP_SECONDS = 10.0


@dataclass
class Trap:
    """Wraps ``JobManager.fetch_job`` to make a race happen on cue."""

    fetch_job: Any
    worker: Any = None
    calls: int = 0
    #: Once set: the next fetch that finds nothing defers a job and waits, before
    #: returning, until the worker received that job's NOTIFY.
    late_job_after_empty_fetch: bool = False
    late_job_id: int | None = None
    #: Set when a fetch that started after ``locked_job_id`` was deferred found nothing.
    locked_job_id: int | None = None
    locked_job_skipped: asyncio.Event = field(default_factory=asyncio.Event)

    async def fetch(self, queues: Any, worker_id: int) -> jobs.Job | None:
        after_locked_job = self.locked_job_id is not None
        job = await self.fetch_job(queues=queues, worker_id=worker_id)
        self.calls += 1
        if job is None and after_locked_job:
            self.locked_job_skipped.set()
        elif job is None and self.locked_job_id is not None:
            # The locked job's NOTIFY woke this fetch before the holder's defer call
            # returned (worker and holder share one event loop; seen once under the
            # whole suite's load): it may not have seen the job. Fetch again, now
            # certainly after it, while the holder still holds the lock - the worker
            # would not fetch again for 30 s. Instrumentation only: it skips the job,
            # as the test needs, and wakes nothing after the lock's release.
            return await self.fetch(queues, worker_id)
        if job is None and self.late_job_after_empty_fetch:
            self.late_job_after_empty_fetch = False
            self.late_job_id = await app.configure_task(NOOP).defer_async(n=2)
            await asyncio.wait_for(self.worker._new_job_event.wait(), GIVE_UP_SECONDS)
        return job


#: The running test's trap (the holder task reads it).
_trap: Trap | None = None


@pytest.fixture
def own_queue() -> Iterator[None]:
    """Two tasks on a queue of their own (other tests leave jobs on the broker's):
    a no-op, and a holder that, under a lock, defers a no-op under the same lock and
    finishes only once a fetch has skipped that job."""

    async def noop(n: int) -> None:
        """Nothing: the test watches the job, not the task."""

    async def holder() -> None:
        """Defer a job this one's lock blocks; return once the worker skipped it."""
        assert _trap is not None
        deferrer = app.configure_task(NOOP, lock=LOCK)
        _trap.locked_job_id = await deferrer.defer_async(n=3)
        await asyncio.wait_for(_trap.locked_job_skipped.wait(), GIVE_UP_SECONDS)

    app.task(name=NOOP, queue=QUEUE)(noop)
    app.task(name=HOLDER, queue=QUEUE, lock=LOCK)(holder)
    try:
        yield
    finally:
        for name in (NOOP, HOLDER):
            app.tasks.pop(name, None)
        with psycopg.connect(**connector_params(), autocommit=True) as conn:
            conn.execute("DELETE FROM procrastinate_jobs WHERE queue_name = %s", [QUEUE])


async def _wait_for(what: str, check: Callable[[], Awaitable[bool]]) -> None:
    for _ in range(int(GIVE_UP_SECONDS / 0.02)):
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"gave up waiting for {what}")


class Jobs:
    """Reads job statuses and who listens, on a connection of the test's own."""

    def __init__(self, db: psycopg.AsyncConnection[Any]) -> None:
        self.db = db

    async def status(self, job_id: int) -> str:
        cur = await self.db.execute(
            "SELECT status FROM procrastinate_jobs WHERE id = %s", [job_id]
        )
        row = await cur.fetchone()
        return str(row[0]) if row else "missing"

    async def listening(self) -> bool:
        cur = await self.db.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE %s",
            [f"LISTEN %{QUEUE}%"],
        )
        row = await cur.fetchone()
        return bool(row and row[0])

    async def statuses_once_done(self, ids: list[int]) -> list[str]:
        """The jobs' statuses once all succeeded, or when the test gives up."""
        seen = [""] * len(ids)

        async def all_done() -> bool:
            seen[:] = [await self.status(job_id) for job_id in ids]
            return set(seen) == {"succeeded"}

        with contextlib.suppress(AssertionError):  # the statuses say which waited
            await _wait_for("the jobs", all_done)
        return seen


@contextlib.asynccontextmanager
async def idle_worker(
    worker_class: type[Any], concurrency: int
) -> AsyncIterator[tuple[Any, Trap, Jobs]]:
    """A worker on the test queue, listening and past its first (empty) fetch, whose
    fetches go through a ``Trap``."""
    global _trap
    params = connector_params()
    async with await psycopg.AsyncConnection.connect(**params, autocommit=True) as db:
        with app.replace_connector(PsycopgConnector(kwargs=params)) as worker_app:
            async with worker_app.open_async():
                worker = worker_class(
                    app=worker_app,
                    queues=[QUEUE],
                    concurrency=concurrency,
                    name="wakeups-test",
                    fetch_job_polling_interval=POLL_SECONDS,
                    abort_job_polling_interval=POLL_SECONDS,
                    install_signal_handlers=False,
                )
                trap = _trap = Trap(worker_app.job_manager.fetch_job, worker)
                # An instance attribute over the bound method, deleted below.
                worker_app.job_manager.fetch_job = trap.fetch  # type: ignore[method-assign]
                running = asyncio.create_task(worker.run())
                try:
                    jobs_ = Jobs(db)
                    await _wait_for("the listener", jobs_.listening)
                    await _wait_for("the first fetch", lambda: _true(trap.calls >= 1))
                    yield worker, trap, jobs_
                finally:
                    _trap = None
                    del worker_app.job_manager.fetch_job
                    worker.stop()
                    await asyncio.wait_for(running, GIVE_UP_SECONDS)


async def _true(value: object) -> bool:
    return bool(value)


async def _notified_during_the_last_empty_fetch(worker_class: type[Any]) -> list[Any]:
    async with idle_worker(worker_class, concurrency=1) as (worker, trap, jobs_):
        # When a job runs, and the fetch after it finds nothing while the next job
        # is deferred and its NOTIFY received
        trap.late_job_after_empty_fetch = True
        first = await app.configure_task(NOOP).defer_async(n=1)
        await _wait_for("the late job", lambda: _true(trap.late_job_id))
        assert trap.late_job_id is not None
        statuses = await jobs_.statuses_once_done([first, trap.late_job_id])
        return [*statuses, worker.rewakes]


async def _skipped_for_a_lock_then_released(worker_class: type[Any]) -> list[Any]:
    async with idle_worker(worker_class, concurrency=2) as (worker, trap, jobs_):
        # When a job holding a lock defers a job under that lock, and the worker's
        # free slot fetches and skips it, before the holder finishes
        holder = await app.configure_task(HOLDER).defer_async()
        skipped = trap.locked_job_skipped
        await _wait_for("the skipped fetch", lambda: _true(skipped.is_set()))
        assert trap.locked_job_id is not None
        statuses = await jobs_.statuses_once_done([holder, trap.locked_job_id])
        return [*statuses, worker.rewakes]


def test_a_job_notified_during_an_empty_fetch_runs_without_waiting_for_the_poll(
    own_queue: None,
) -> None:
    # Then the late job runs: the pass that cleared its wake-up set it again
    seen = asyncio.run(_notified_during_the_last_empty_fetch(WakeKeepingWorker))
    assert seen == ["succeeded", "succeeded", 1]


def test_a_job_skipped_for_a_lock_runs_when_the_lock_is_released(
    own_queue: None,
) -> None:
    # Then the locked job runs once the holder finishes, without waiting for the poll
    holder, locked, rewakes = asyncio.run(
        _skipped_for_a_lock_then_released(WakeKeepingWorker)
    )
    assert (holder, locked) == ("succeeded", "succeeded")
    assert rewakes >= 1
