"""Keep one procrastinate worker running in this process across database outages.

Why this exists (issue 11): procrastinate 3.10 stops its worker for good when the
database goes away. The listener's reconnect raises while the server is down
(``PsycopgConnector.listen_notify``), ``Worker._monitor_side_tasks`` then stops the
worker, and ``procrastinate worker`` exits 0 (procrastinate #1116). Under a fault test
every worker exited after every crash and nothing restarted them.

``WorkerSupervisor.run`` owns the process's life instead:

* it runs a fresh ``procrastinate.worker.Worker`` over a freshly opened connector pool;
* when procrastinate stops the worker on its own, the worker's pool is closed at once,
  so its shutdown does not wait out pool timeouts on a dead database;
* a stop nobody asked for is logged with procrastinate's error; it then waits
  with capped backoff (every wait logged) until the database answers as a writable
  primary with procrastinate's tables, and runs the worker again - same process, same
  pid, so the same worker finishes the work;
* the worker id the stopped worker could not unregister (the database was gone) is
  unregistered once it is back, so its jobs count as stalled at once and the sweeper
  (``effect_broker.tasks.retry_stalled_jobs``) requeues them without waiting for the
  heartbeat timeout;
* SIGTERM or SIGINT stop it gracefully, as procrastinate does: running jobs get
  ``shutdown_graceful_timeout`` to finish, then are aborted (and retried); a second
  signal gets the default action. Only such a requested stop returns 0; giving up
  after ``max_outage`` returns ``EXIT_GAVE_UP``. An unexpected stop never exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from procrastinate import App
from procrastinate.worker import Worker

from effect_broker.workers.job_endings import finishing_with_outcomes
from effect_broker.workers.wakeups import WakeKeepingWorker

logger = logging.getLogger(__name__)

#: Every queue the broker's tasks use (``effect_broker.tasks``); a unit test checks
#: that no task names a queue outside it.
BROKER_QUEUES = ("dispatch", "reconcile", "maintenance")
#: What a reconciler runs: reconciliation and the periodic sweep, never dispatch.
RECONCILER_QUEUES = ("reconcile", "maintenance")

#: Exit code of a requested stop (SIGTERM, SIGINT).
EXIT_STOPPED = 0
#: Exit code when the database stayed away longer than ``max_outage``.
EXIT_GAVE_UP = 3

#: A worker that ran this long before stopping restarts with the shortest backoff; one
#: that keeps stopping sooner backs off further each time (a bug, not an outage, must
#: not spin).
STABLE_SECONDS = 60.0

#: Why the database does not answer, or None when it does.
Probe = Callable[[], Awaitable[str | None]]


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with jitter between database checks."""

    initial: float = 0.5
    multiplier: float = 2.0
    cap: float = 5.0

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds before check number ``attempt`` (0-based): doubling, capped, and
        +-20% jitter so many workers restarted by one outage do not probe in step."""
        base = min(self.cap, self.initial * self.multiplier ** min(attempt, 32))
        return min(self.cap, base * (0.8 + 0.4 * rand()))


@dataclass(frozen=True)
class WorkerPlan:
    """What one supervised worker runs."""

    queues: tuple[str, ...]
    concurrency: int
    name: str
    #: Give up (``EXIT_GAVE_UP``) after the database has been away this many seconds;
    #: None waits for ever, which is what a worker under a restart policy wants.
    max_outage: float | None = None
    backoff: Backoff = field(default_factory=Backoff)


_PROBE_SQL = "SELECT pg_is_in_recovery(), to_regclass('procrastinate_jobs') IS NOT NULL"


def one_line(exc: BaseException) -> str:
    """An exception as one short log line (psycopg's messages span lines)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


def database_probe(params: Mapping[str, Any]) -> Probe:
    """A probe that connects with ``params`` (procrastinate's connector parameters,
    so keepalives and ``connect_timeout`` apply) and asks the one question a worker
    needs answered: can it write procrastinate's tables here?"""

    async def probe() -> str | None:
        try:
            conn = await psycopg.AsyncConnection.connect(**params, autocommit=True)
            async with conn:
                cursor = await conn.execute(_PROBE_SQL)
                row = await cursor.fetchone()
        except psycopg.Error as exc:
            return one_line(exc)
        in_recovery, has_schema = row if row else (False, False)
        if in_recovery:
            # A failover's old address may still name a standby for a while.
            return "the server is a read-only standby (in recovery)"
        if not has_schema:
            return "procrastinate's tables are missing: run `effect-broker migrate`"
        return None

    return probe


class _StopReason(logging.Handler):
    """Catches the error procrastinate logs when it stops its worker on its own."""

    #: ``Worker._monitor_side_tasks``'s log actions (procrastinate 3.10).
    ACTIONS = frozenset({"side_task_failed", "side_task_monitor_failed"})

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.message: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.message is None and getattr(record, "action", None) in self.ACTIONS:
            with contextlib.suppress(Exception):
                # procrastinate's text is "Database error."; the cause says which.
                exc = record.exc_info[1] if record.exc_info else None
                cause = exc.__cause__ if exc is not None else None
                task = getattr(record, "task_name", "a side task")
                self.message = (
                    f"procrastinate stopped it: its {task} failed: {one_line(cause)}"
                    if cause is not None
                    else one_line(Exception(record.getMessage()))
                )


class _SupervisedWorker(WakeKeepingWorker):
    """procrastinate's worker (without its lost wake-up), telling the supervisor when
    it stops itself."""

    def __init__(self, on_own_stop: Callable[[], None], **options: Any) -> None:
        super().__init__(**options)
        self._on_own_stop = on_own_stop
        self._stop_called = False

    def stop(self) -> None:
        # The supervisor's own stop sets its flag first; any other caller is
        # procrastinate stopping itself (Worker._monitor_side_tasks).
        if not self._stop_called:
            self._stop_called = True
            self._on_own_stop()
        super().stop()


class WorkerSupervisor:
    """Runs ``plan``'s worker until a signal asks it to stop (see the module doc)."""

    def __init__(
        self,
        app: App,
        plan: WorkerPlan,
        *,
        probe: Probe,
        worker_options: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.plan = plan
        self.probe = probe
        self.worker_options = dict(worker_options or {})
        self.clock = clock
        #: Stops nobody asked for, since start (what a test or a metric reads).
        self.unexpected_stops = 0
        self._stopping = asyncio.Event()
        self._worker: Worker | None = None
        self._background: set[asyncio.Task[None]] = set()

    # --- signals ---------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop gracefully: the running worker finishes or aborts its jobs."""
        if not self._stopping.is_set():
            logger.warning(
                "stop requested: finishing running jobs",
                extra={"action": "worker_stop_requested", "worker": self.plan.name},
            )
        self._stopping.set()
        if self._worker is not None:
            self._worker.stop()

    def _on_signal(self, loop: asyncio.AbstractEventLoop) -> None:
        # As procrastinate does: the first signal stops gracefully and gives the
        # signals back, so a second one gets the default action (stop now).
        self._remove_signal_handlers(loop)
        self.request_stop()

    @staticmethod
    def _remove_signal_handlers(loop: asyncio.AbstractEventLoop) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    # --- the loop --------------------------------------------------------------------

    async def run(self) -> int:
        """Supervise until stopped; return the process exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, loop)
        try:
            return await self._supervise()
        finally:
            with contextlib.suppress(Exception):
                self._remove_signal_handlers(loop)

    async def _supervise(self) -> int:
        failures = 0  # unexpected stops in a row, each sooner than STABLE_SECONDS
        down_since: float | None = None
        stale_worker_id: int | None = None
        while not self._stopping.is_set():
            if not await self._wait_for_database(failures, down_since):
                return EXIT_GAVE_UP
            if self._stopping.is_set():
                break
            if down_since is not None:
                logger.warning(
                    "database answers again after %.1fs: restarting the worker",
                    self.clock() - down_since,
                    extra={"action": "worker_restart", "worker": self.plan.name},
                )
            started = self.clock()
            worker, why = await self._run_once(stale_worker_id)
            # None when it unregistered itself; else unregister it once we can.
            stale_worker_id = worker.worker_id if worker else stale_worker_id
            if self._stopping.is_set():
                break
            self.unexpected_stops += 1
            ran = self.clock() - started
            failures = 1 if ran >= STABLE_SECONDS else failures + 1
            down_since = self.clock()
            logger.error(
                "worker stopped without a stop request after %.1fs (%s); it will run "
                "again once the database answers",
                ran,
                why,
                extra={
                    "action": "worker_stopped_unexpectedly",
                    "worker": self.plan.name,
                    "unexpected_stops": self.unexpected_stops,
                },
            )
        logger.warning(
            "worker stopped", extra={"action": "worker_stopped", "worker": self.plan.name}
        )
        return EXIT_STOPPED

    async def _run_once(self, stale_worker_id: int | None) -> tuple[Worker | None, str]:
        """Open the connector, run one worker until it stops; return it and why."""
        last_error = _StopReason()
        procrastinate_logger = logging.getLogger("procrastinate")
        procrastinate_logger.addHandler(last_error)
        worker: Worker | None = None
        why = "procrastinate gave no reason"
        try:
            async with self.app.open_async():
                if stale_worker_id is not None:
                    await self._forget_worker(stale_worker_id)
                worker = _SupervisedWorker(
                    self._abandon_connector,
                    app=self.app,
                    **{
                        **self.app.worker_defaults,
                        **self.worker_options,
                        "queues": list(self.plan.queues),
                        "concurrency": self.plan.concurrency,
                        "name": self.plan.name,
                        # Ours instead: procrastinate's stop for good after one run.
                        "install_signal_handlers": False,
                    },
                )
                self._worker = worker
                if self._stopping.is_set():  # a signal while the pool opened
                    return worker, "stopped before start"
                # A dispatch that succeeds finishes its job with its outcome (issue
                # 25); procrastinate's own finish is skipped for that job.
                with finishing_with_outcomes(self.app, worker.delete_jobs):
                    await worker.run()
        except Exception as exc:  # the database went away under the worker or pool
            # What procrastinate logged first says more (the listener's failure) than
            # the error its shutdown then hit (unregistering from a dead database).
            why = last_error.message or f"{type(exc).__name__}: {one_line(exc)}"
        else:
            why = last_error.message or why
        finally:
            self._worker = None
            procrastinate_logger.removeHandler(last_error)
        return worker, why

    def _abandon_connector(self) -> None:
        """procrastinate is stopping its worker on its own: the database is gone
        (or the worker broke). Close the worker's pool now, so the shutdown's waits
        for a connection (finishing jobs, unregistering) fail at once instead of
        each waiting out the pool timeout - after the database is back, even, since
        psycopg_pool serves no waiter once its reconnect attempt gave up. The jobs
        left ``doing`` are requeued once the database is back (``_forget_worker``)."""
        if self._stopping.is_set():
            return
        logger.warning(
            "procrastinate is stopping the worker on its own: closing its connections",
            extra={"action": "worker_abandon_connector", "worker": self.plan.name},
        )
        connector = self.app.connector
        task = asyncio.get_running_loop().create_task(connector.close_async())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _forget_worker(self, worker_id: int) -> None:
        """Unregister the worker id a stopped worker left behind (best effort: the
        heartbeat timeout prunes it anyway)."""
        try:
            await self.app.job_manager.unregister_worker(worker_id)
        except Exception as exc:
            logger.warning(
                "could not unregister stopped worker %s: %s",
                worker_id,
                one_line(exc),
                extra={"action": "worker_unregister_failed", "worker": self.plan.name},
            )

    async def _wait_for_database(self, failures: int, down_since: float | None) -> bool:
        """Return once the database answers (True) or the outage outlasted
        ``max_outage`` (False). Returns True at once when a stop is requested."""
        backoff = self.plan.backoff
        if failures:
            # Even when the database answers at once: a worker that keeps stopping
            # for another reason must not restart in a tight loop.
            await self._sleep(backoff.delay(failures - 1))
        attempt = 0
        while not self._stopping.is_set():
            reason = await self.probe()
            if reason is None:
                return True
            now = self.clock()
            down_since = now if down_since is None else down_since
            outage = now - down_since
            if self.plan.max_outage is not None and outage >= self.plan.max_outage:
                logger.error(
                    "giving up: the database has not answered for %.0fs (--max-outage "
                    "%.0fs): %s",
                    outage,
                    self.plan.max_outage,
                    reason,
                    extra={"action": "worker_gave_up", "worker": self.plan.name},
                )
                return False
            delay = backoff.delay(attempt)
            if self.plan.max_outage is not None:  # give up on time, not a wait late
                delay = min(delay, self.plan.max_outage - outage)
            attempt += 1
            logger.warning(
                "database unavailable for %.1fs (%s); next check in %.1fs",
                outage,
                reason,
                delay,
                extra={"action": "worker_waiting_for_database", "worker": self.plan.name},
            )
            await self._sleep(delay)
        return True

    async def _sleep(self, seconds: float) -> None:
        """Sleep, cut short by a stop request."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)
