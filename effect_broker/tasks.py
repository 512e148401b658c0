"""procrastinate jobs: thin glue that calls one service each.

Every job is safe to run twice: it re-reads the ledger and acts only if the effect is
still in a state that asks for that work. Effect jobs share ``lock="effect:<id>"`` so
dispatch and reconciliation of one effect never run at the same time.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import timedelta

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import DatabaseError, transaction
from procrastinate import JobContext, RetryStrategy, exceptions, manager, utils
from procrastinate import sql as procrastinate_sql
from procrastinate.contrib.django import app
from procrastinate.contrib.django.django_connector import DjangoConnector
from procrastinate.jobs import Status

from effect_broker.scheduling import DISPATCH_TASK, NOTIFY_APPROVAL_TASK, RECONCILE_TASK
from effect_broker.services import approval_notices, dispatch, reconcile, sweeper
from effect_broker.services.running_jobs import RunningJob
from effect_broker.services.runtime import get_runtime
from effect_broker.store.lock_waits import gave_up_waiting, try_sweep_lock
from effect_broker.workers.job_endings import OutcomeEndingJobManager

logger = logging.getLogger(__name__)

_SWEEP_SECONDS = max(1, int(settings.EFFECT_BROKER_TIMING["sweep_seconds"]))

#: When an effect job that met a lock it gave up waiting for runs again.
BUSY_RETRY = timedelta(seconds=1)

#: procrastinate's queries on this thread's Django connection: inside the sweep's
#: transaction, under its lock timeout (the worker's own connector is another pool).
_sweep_connector = DjangoConnector()
_sweep_jobs = manager.JobManager(_sweep_connector)


def _actor(context: JobContext) -> str:
    job_id = context.job.id if context.job else "?"
    return f"{context.worker_name or 'worker'}:{os.getpid()}:job{job_id}"


def _running_job(context: JobContext) -> RunningJob | None:
    """The job, for a success to finish in its own statement - only under a worker
    whose job manager then skips procrastinate's finish (issue 25)."""
    manager = context.app.job_manager if context.app else None
    if not isinstance(manager, OutcomeEndingJobManager) or context.job.id is None:
        return None
    return RunningJob(context.job.id, delete=manager.delete_succeeded)


@app.task(queue="dispatch", name=DISPATCH_TASK, pass_context=True)
def dispatch_effect(context: JobContext, effect_id: str) -> None:
    """Dispatch one effect (no-op unless it is prepared or due for retry)."""
    job = _running_job(context)
    retry_later_if_busy(
        "dispatch",
        effect_id,
        lambda: dispatch.dispatch(effect_id, worker=_actor(context), job=job),
    )


@app.task(queue="reconcile", name=RECONCILE_TASK, pass_context=True)
def reconcile_effect(context: JobContext, effect_id: str) -> None:
    """Reconcile one effect whose outcome is unknown (no-op for unsafe effects)."""
    retry_later_if_busy(
        "reconcile",
        effect_id,
        lambda: reconcile.reconcile(effect_id, worker=_actor(context)),
    )


#: The approval webhook's retries: 7 attempts, the waits doubling up to about 2
#: minutes (about 4 minutes in all), then the job is left failed (the admin's linked
#: jobs show it).
NOTICE_RETRY = RetryStrategy(max_attempts=7, exponential_wait=2)


@app.task(
    queue="maintenance",
    name=NOTIFY_APPROVAL_TASK,
    pass_context=True,
    retry=NOTICE_RETRY,
)
def notify_approval(context: JobContext, effect_id: str) -> None:
    """POST the approval webhook's notice for one effect awaiting approval (off the
    request path; a failed POST fails the job, which is retried)."""
    approval_notices.send_notice(effect_id)


def retry_later_if_busy(kind: str, effect_id: str, work: Callable[[], object]) -> None:
    """Run ``work``; when a statement gave up waiting for a lock (another session,
    perhaps a stuck one, holds the effect's row), defer the job again instead of
    failing it. That statement (and its transaction) wrote nothing, so the effect is
    as its last committed write left it: still due (the job runs again in
    ``BUSY_RETRY``), or claimed by this worker, whose lease then runs out and is
    taken over as after a worker death - never failed for it."""
    try:
        work()
    except DatabaseError as exc:
        if not gave_up_waiting(exc):
            raise
        rt = get_runtime()
        at = rt.clock.now() + BUSY_RETRY
        if kind == "dispatch":
            rt.scheduler.dispatch(effect_id, at=at)
        else:
            rt.scheduler.reconcile(effect_id, at=at)
        logger.warning(
            "effect busy: gave up waiting for a lock; retrying later",
            extra={"action": f"{kind}_busy", "effect_id": effect_id},
        )


# Only a queueing lock: a `lock` on the sweeper can stall it (procrastinate #1408: a
# dead sweeper's job keeps its lock, and only a sweep would recover it). At most one
# sweep runs at a time all the same: the sweep's advisory lock (store.lock_waits).
@app.periodic(cron=f"* * * * * */{_SWEEP_SECONDS}", periodic_id="sweep")
@app.task(
    queue="maintenance",
    name="effect_broker.sweep",
    queueing_lock="effect_broker.sweep",
    pass_context=True,
)
def sweep(context: JobContext, timestamp: int) -> None:
    """Recover from worker death: stalled jobs, expired leases, due work."""
    run_sweep(actor=_actor(context))


def run_sweep(*, actor: str) -> bool:
    """One sweep, unless another one is running (then return False at once).

    Issue 19 item 7: sweeps waited on a row a frozen worker's transaction held, with
    no timeout, and a new one started every second until every job slot of every
    worker was taken. Now the sweep is one transaction holding the sweep's advisory
    lock, its lock waits are bounded (``SWEEP_LOCK_TIMEOUT_MS``), and it skips the
    rows and jobs it cannot lock; the next sweep tries them again.
    """
    with transaction.atomic():
        if not try_sweep_lock():
            return False
        retry_stalled_jobs()
        sweeper.sweep(actor=actor)
    return True


# How often finished jobs are removed: hourly. procrastinate's delete query reads every
# retained job with its events whether or not it deletes any (100k retained jobs:
# ~1.5 s on the 2-vCPU bench machine), so it runs seldom; a job outlives its
# retention by at most an hour.
_REMOVE_FINISHED_CRON = "23 * * * *"


@app.periodic(cron=_REMOVE_FINISHED_CRON, periodic_id="remove_finished_jobs")
@app.task(
    queue="maintenance",
    name="effect_broker.remove_finished_jobs",
    queueing_lock="effect_broker.remove_finished_jobs",
)
def remove_finished_jobs_task(timestamp: int) -> None:
    """Keep procrastinate's job tables bounded (settings.EFFECT_BROKER_JOB_RETENTION)."""
    remove_finished_jobs()


def remove_finished_jobs() -> None:
    """Delete finished jobs past their retention, with their events (issue 13).

    procrastinate's own ``delete_old_jobs`` (what its builtin ``remove_old_jobs``
    task runs), called twice: succeeded jobs after ``succeeded_hours``, then every
    finished job (failed, aborted and cancelled too) after ``finished_hours``. Queued
    and running jobs are never removed, so the sweeper and ``doctor`` still see
    stalled ones; the ledger is not touched.
    """
    retention = settings.EFFECT_BROKER_JOB_RETENTION
    delete = async_to_sync(app.job_manager.delete_old_jobs)
    delete(nb_hours=retention["succeeded_hours"])
    delete(
        nb_hours=retention["finished_hours"],
        include_failed=True,
        include_cancelled=True,
        include_aborted=True,
    )


def retry_stalled_jobs() -> int:
    """Put jobs whose worker stopped heartbeating back to ``todo``; return how many.

    A SIGKILLed job stays ``doing`` and keeps its ``effect:<id>`` lock, which blocks
    every later job of that effect; nothing in procrastinate recovers it. Our jobs are
    idempotent (they re-read the ledger), so retrying is safe. When a queued twin
    already exists (same queueing lock, e.g. re-deferred by this sweeper), the retry
    would violate the queueing lock: the stalled job is finished as failed instead,
    which releases its lock and lets the twin run.
    """
    seconds = settings.EFFECT_BROKER_TIMING["stalled_job_seconds"]
    stalled = async_to_sync(app.job_manager.get_stalled_jobs)(
        seconds_since_heartbeat=seconds
    )
    count = 0
    for job in stalled:
        if job.id is None:
            continue
        try:
            action = _recover(job.id)
        except exceptions.ProcrastinateException as exc:
            if gave_up_waiting(exc):
                # A stuck session holds the job or its twin (an uncommitted retry
                # job): skip it, the next sweep tries again.
                logger.warning(
                    "stalled job busy: skipped",
                    extra={"action": "retry_stalled_job", "job_id": job.id},
                )
                continue
            # One odd job must not stop the sweep that recovers all the others.
            logger.exception(
                "could not recover stalled job",
                extra={"action": "retry_stalled_job", "job_id": job.id},
            )
            continue
        count += 1
        logger.warning(
            "recovered stalled job",
            extra={
                "action": "retry_stalled_job",
                "job_id": job.id,
                "task": job.task_name,
                "result": action,
            },
        )
    return count


def _recover(job_id: int) -> str:
    """Retry one stalled job, or fail it when a queued twin exists; in a savepoint on
    this thread's connection, so inside a sweep a lock it gave up waiting for undoes
    only this job (and waits no longer than the sweep's lock timeout)."""
    try:
        with transaction.atomic():
            _sweep_jobs.retry_job_by_id(job_id, retry_at=utils.utcnow())
        return "retried"
    except exceptions.UniqueViolation:
        with transaction.atomic():
            # finish_job_by_id_async's query, run synchronously on this connection.
            _sweep_connector.execute_query(
                query=procrastinate_sql.queries["finish_job"],
                job_id=job_id,
                status=Status.FAILED.value,
                delete_job=False,
            )
        return "failed (a queued twin exists)"
