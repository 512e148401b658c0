"""A job's NOTIFY that lands while the worker's last fetch runs is not lost (issue 13).

procrastinate 3.10 clears its wake-up event after every fetch, so a job inserted after
a fetch's snapshot whose NOTIFY arrives before that (empty) fetch returns waits for the
next poll (``effect_broker.workers.wakeups``). The test makes that race happen every
time: after a first job, the worker's next fetch finds nothing, and before it returns
a second job is deferred and its NOTIFY received. The poll interval is 30 s, so a lost
wake-up shows up as the second job still queued when the test gives up (10 s); no
timing is asserted. procrastinate's own ``Worker`` fails this test.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from procrastinate import PsycopgConnector, jobs
from procrastinate.contrib.django import app
from procrastinate.contrib.django.utils import connector_params

from effect_broker.workers.wakeups import WakeKeepingWorker

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "test_wakeups"
TASK_NAME = "tests.integration.test_worker_wakeups.noop"
#: Far longer than the test waits: a job it runs was woken, never polled for.
POLL_SECONDS = 30.0
#: How long the test waits for a job (or the listener) before it fails.
GIVE_UP_SECONDS = 10.0


@pytest.fixture
def noop_task() -> Iterator[Any]:
    """A no-op task on a queue of its own (other tests leave jobs on the broker's)."""

    async def noop(n: int) -> None:
        """Nothing: the test watches the job, not the task."""

    task = app.task(name=TASK_NAME, queue=QUEUE)(noop)
    try:
        yield task
    finally:
        app.tasks.pop(TASK_NAME, None)
        with psycopg.connect(**connector_params(), autocommit=True) as conn:
            conn.execute("DELETE FROM procrastinate_jobs WHERE queue_name = %s", [QUEUE])


class LateJobAfterEmptyFetch:
    """Wraps ``JobManager.fetch_job``: once armed, the next fetch that finds nothing
    defers ``task`` and, before returning, waits until the worker's listener has
    received that job's NOTIFY (procrastinate's wake-up event is set)."""

    def __init__(self, fetch_job: Any, worker: Any, task: Any) -> None:
        self._fetch_job = fetch_job
        self._worker = worker
        self._task = task
        self.calls = 0
        self.armed = False
        self.late_job_id: int | None = None

    async def fetch_job(self, queues: Any, worker_id: int) -> jobs.Job | None:
        job = await self._fetch_job(queues=queues, worker_id=worker_id)
        self.calls += 1
        if self.armed and job is None:
            self.armed = False
            self.late_job_id = await self._task.defer_async(n=2)
            await asyncio.wait_for(self._worker._new_job_event.wait(), GIVE_UP_SECONDS)
        return job


async def _wait_for(what: str, check: Any) -> None:
    for _ in range(int(GIVE_UP_SECONDS / 0.02)):
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"gave up waiting for {what}")


async def _run(worker_class: type[WakeKeepingWorker], task: Any) -> dict[str, Any]:
    params = connector_params()
    async with await psycopg.AsyncConnection.connect(**params, autocommit=True) as db:

        async def job_status(job_id: int) -> str:
            cur = await db.execute(
                "SELECT status FROM procrastinate_jobs WHERE id = %s", [job_id]
            )
            row = await cur.fetchone()
            return str(row[0]) if row else "missing"

        async def listening() -> bool:
            cur = await db.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE %s",
                [f"LISTEN %{QUEUE}%"],
            )
            row = await cur.fetchone()
            return bool(row and row[0])

        with app.replace_connector(PsycopgConnector(kwargs=params)) as worker_app:
            async with worker_app.open_async():
                worker = worker_class(
                    app=worker_app,
                    queues=[QUEUE],
                    concurrency=1,
                    name="wakeups-test",
                    fetch_job_polling_interval=POLL_SECONDS,
                    abort_job_polling_interval=POLL_SECONDS,
                    install_signal_handlers=False,
                )
                trap = LateJobAfterEmptyFetch(
                    worker_app.job_manager.fetch_job, worker, task
                )
                # An instance attribute over the bound method; gone with the test.
                worker_app.job_manager.fetch_job = trap.fetch_job  # type: ignore[method-assign]
                running = asyncio.create_task(worker.run())
                try:
                    # Given an idle worker, listening, past its first (empty) fetch
                    await _wait_for("the listener", listening)
                    await _wait_for("the first fetch", lambda: _true(trap.calls >= 1))
                    # When a job runs, and the fetch after it finds nothing while the
                    # next job is deferred and its NOTIFY received
                    trap.armed = True
                    first = await task.defer_async(n=1)
                    await _wait_for("the late job", lambda: _true(trap.late_job_id))
                    late = trap.late_job_id
                    assert late is not None
                    # Then the late job runs without waiting for the 30 s poll
                    with_status = {first: "", late: ""}

                    async def both_done() -> bool:
                        for job_id in with_status:
                            with_status[job_id] = await job_status(job_id)
                        return set(with_status.values()) == {"succeeded"}

                    # (on a timeout, the statuses say which job waited)
                    with contextlib.suppress(AssertionError):
                        await _wait_for("both jobs", both_done)
                    return {
                        "first": with_status[first],
                        "late": with_status[late],
                        "rewakes": worker.rewakes if hasattr(worker, "rewakes") else 0,
                    }
                finally:
                    del worker_app.job_manager.fetch_job
                    worker.stop()
                    await asyncio.wait_for(running, GIVE_UP_SECONDS)


async def _true(value: Any) -> bool:
    return bool(value)


def test_a_job_notified_during_an_empty_fetch_runs_without_waiting_for_the_poll(
    noop_task: Any,
) -> None:
    seen = asyncio.run(_run(WakeKeepingWorker, noop_task))
    assert seen == {"first": "succeeded", "late": "succeeded", "rewakes": 1}
