"""Deferring engine jobs so they commit (or roll back) with the ledger write.

Inside a ``procrastinate worker`` the app's connector is the worker's own pool, so a
plain ``task.defer()`` there would NOT join the Django transaction (it would survive a
rollback). We therefore always defer through a ``JobManager`` over a ``DjangoConnector``,
which runs on the calling thread's Django connection. Each defer sits in a savepoint so
that a duplicate (``AlreadyEnqueued`` from the queueing lock) does not poison the
enclosing transaction.

A new effect's dispatch job needs neither: nothing can be queued for an id that did not
exist, so ``reservation_job`` hands the job to the reservation statement itself, which
inserts it through procrastinate's versioned ``procrastinate_defer_jobs_v1`` (what
``defer()`` calls) - one round trip and one commit for intent, event and job.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from procrastinate import exceptions, jobs, manager
from procrastinate.contrib.django.django_connector import DjangoConnector
from procrastinate.tasks import Task

from effect_broker.store.ledger import QueuedJob

_manager = manager.JobManager(DjangoConnector())


def _configure(task: Task, *, effect_id: str, kind: str, at: datetime | None) -> jobs.Job:
    return task.configure(
        # One running job per effect across dispatch and reconcile (procrastinate lock),
        # and at most one queued job per effect and kind (queueing lock).
        lock=f"effect:{effect_id}",
        queueing_lock=f"{kind}:{effect_id}",
        schedule_at=at,
    ).job


def _defer(task: Task, *, effect_id: str, kind: str, at: datetime | None) -> None:
    job = _configure(task, effect_id=effect_id, kind=kind, at=at)
    try:
        with transaction.atomic():
            jobs.JobDeferrer(job_manager=_manager, job=job).defer(effect_id=effect_id)
    except exceptions.AlreadyEnqueued:
        # A job for this effect is already waiting; it reads the ledger when it runs.
        pass


class ProcrastinateScheduler:
    """The production scheduler: procrastinate jobs on the Django connection."""

    def dispatch(self, effect_id: str, *, at: datetime | None = None) -> None:
        """Defer ``dispatch_effect``."""
        from effect_broker.tasks import dispatch_effect

        _defer(dispatch_effect, effect_id=effect_id, kind="dispatch", at=at)

    def reservation_job(self, effect_id: str) -> QueuedJob:
        """``dispatch_effect(effect_id)`` as the row the reservation inserts."""
        from effect_broker.tasks import dispatch_effect

        job = _configure(dispatch_effect, effect_id=effect_id, kind="dispatch", at=None)
        return QueuedJob(
            queue_name=job.queue,
            task_name=job.task_name,
            priority=job.priority,
            lock=job.lock,
            queueing_lock=job.queueing_lock,
            args={"effect_id": effect_id},
            scheduled_at=job.scheduled_at,
        )

    def reconcile(self, effect_id: str, *, at: datetime | None = None) -> None:
        """Defer ``reconcile_effect``."""
        from effect_broker.tasks import reconcile_effect

        _defer(reconcile_effect, effect_id=effect_id, kind="reconcile", at=at)


class RecordingScheduler:
    """A scheduler that only records requests; for tests that drive services directly."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, datetime | None]] = []

    def dispatch(self, effect_id: str, *, at: datetime | None = None) -> None:
        """Record a dispatch request."""
        self.requests.append(("dispatch", effect_id, at))

    def reconcile(self, effect_id: str, *, at: datetime | None = None) -> None:
        """Record a reconcile request."""
        self.requests.append(("reconcile", effect_id, at))

    def reservation_job(self, effect_id: str) -> None:
        """No job row: submit calls ``dispatch``, which records the request."""
        return None
