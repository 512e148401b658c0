"""procrastinate jobs: thin glue that calls one service each.

Every job is safe to run twice: it re-reads the ledger and acts only if the effect is
still in a state that asks for that work. Effect jobs share ``lock="effect:<id>"`` so
dispatch and reconciliation of one effect never run at the same time.
"""

from __future__ import annotations

import logging
import os

from asgiref.sync import async_to_sync
from django.conf import settings
from procrastinate import JobContext, exceptions, utils
from procrastinate.contrib.django import app
from procrastinate.jobs import Status

from effect_broker.scheduling import DISPATCH_TASK, RECONCILE_TASK
from effect_broker.services import dispatch, reconcile, sweeper

logger = logging.getLogger(__name__)

_SWEEP_SECONDS = max(1, int(settings.EFFECT_BROKER_TIMING["sweep_seconds"]))


def _actor(context: JobContext) -> str:
    job_id = context.job.id if context.job else "?"
    return f"{context.worker_name or 'worker'}:{os.getpid()}:job{job_id}"


@app.task(queue="dispatch", name=DISPATCH_TASK, pass_context=True)
def dispatch_effect(context: JobContext, effect_id: str) -> None:
    """Dispatch one effect (no-op unless it is prepared or due for retry)."""
    dispatch.dispatch(effect_id, worker=_actor(context))


@app.task(queue="reconcile", name=RECONCILE_TASK, pass_context=True)
def reconcile_effect(context: JobContext, effect_id: str) -> None:
    """Reconcile one effect whose outcome is unknown (no-op for unsafe effects)."""
    reconcile.reconcile(effect_id, worker=_actor(context))


# Only a queueing lock: a `lock` on the sweeper can stall it (procrastinate #1408).
@app.periodic(cron=f"* * * * * */{_SWEEP_SECONDS}", periodic_id="sweep")
@app.task(
    queue="maintenance",
    name="effect_broker.sweep",
    queueing_lock="effect_broker.sweep",
    pass_context=True,
)
def sweep(context: JobContext, timestamp: int) -> None:
    """Recover from worker death: stalled jobs, expired leases, due work."""
    retry_stalled_jobs()
    sweeper.sweep(actor=_actor(context))


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
    manager = app.job_manager
    stalled = async_to_sync(manager.get_stalled_jobs)(seconds_since_heartbeat=seconds)
    count = 0
    for job in stalled:
        if job.id is None:
            continue
        try:
            manager.retry_job_by_id(job.id, retry_at=utils.utcnow())
            action = "retried"
        except exceptions.UniqueViolation:
            async_to_sync(manager.finish_job_by_id_async)(
                job.id, status=Status.FAILED, delete_job=False
            )
            action = "failed (a queued twin exists)"
        except exceptions.ProcrastinateException:
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
