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

Jobs are configured by task NAME (``app.configure_task``), never by importing
``effect_broker.tasks``: the services use this module, and the tasks use the services,
so the use cases stay free of the delivery layer (STYLE "Wiring in one place").
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from procrastinate import exceptions, jobs, manager
from procrastinate.contrib.django import app
from procrastinate.contrib.django.django_connector import DjangoConnector

from effect_broker.store.ledger import QueuedJob

_manager = manager.JobManager(DjangoConnector())

#: The engine's job names (``effect_broker.tasks`` registers them under these).
DISPATCH_TASK = "effect_broker.dispatch_effect"
RECONCILE_TASK = "effect_broker.reconcile_effect"
#: The operators' notice of an effect awaiting approval (the webhook; issue 24).
NOTIFY_APPROVAL_TASK = "effect_broker.notify_approval"


def _configure(
    task_name: str,
    *,
    effect_id: str,
    kind: str,
    at: datetime | None,
    locked: bool = True,
) -> jobs.Job:
    # allow_unknown=False: a typo must fail here, not queue a job no worker runs.
    return app.configure_task(
        task_name,
        allow_unknown=False,
        # One running job per effect across dispatch and reconcile (procrastinate lock),
        # and at most one queued job per effect and kind (queueing lock). A notice
        # takes no effect lock: procrastinate runs a lock's jobs in order, so a notice
        # waiting for its retry would hold back the dispatch its approval queued.
        lock=f"effect:{effect_id}" if locked else None,
        queueing_lock=f"{kind}:{effect_id}",
        schedule_at=at,
    ).job


def _defer(
    task_name: str,
    *,
    effect_id: str,
    kind: str,
    at: datetime | None,
    locked: bool = True,
) -> None:
    job = _configure(task_name, effect_id=effect_id, kind=kind, at=at, locked=locked)
    try:
        with transaction.atomic():
            jobs.JobDeferrer(job_manager=_manager, job=job).defer(effect_id=effect_id)
    except exceptions.AlreadyEnqueued:
        # A job for this effect is already waiting; it reads the ledger when it runs.
        pass


def _queued(
    task_name: str, *, effect_id: str, kind: str, locked: bool = True
) -> QueuedJob:
    """A job as the row a reservation statement inserts with its intent."""
    job = _configure(task_name, effect_id=effect_id, kind=kind, at=None, locked=locked)
    return QueuedJob(
        queue_name=job.queue,
        task_name=job.task_name,
        priority=job.priority,
        lock=job.lock,
        queueing_lock=job.queueing_lock,
        args={"effect_id": effect_id},
        scheduled_at=job.scheduled_at,
    )


class ProcrastinateScheduler:
    """The production scheduler: procrastinate jobs on the Django connection."""

    def dispatch(self, effect_id: str, *, at: datetime | None = None) -> None:
        """Defer ``dispatch_effect``."""
        _defer(DISPATCH_TASK, effect_id=effect_id, kind="dispatch", at=at)

    def reservation_job(self, effect_id: str) -> QueuedJob:
        """``dispatch_effect(effect_id)`` as the row the reservation inserts."""
        return _queued(DISPATCH_TASK, effect_id=effect_id, kind="dispatch")

    def approval_notice_job(self, effect_id: str) -> QueuedJob:
        """``notify_approval(effect_id)`` as the row the reservation inserts."""
        return _queued(
            NOTIFY_APPROVAL_TASK, effect_id=effect_id, kind="notice", locked=False
        )

    def notify_approval(self, effect_id: str) -> None:
        """Defer ``notify_approval`` (an effect waits for an operator again)."""
        _defer(
            NOTIFY_APPROVAL_TASK,
            effect_id=effect_id,
            kind="notice",
            at=None,
            locked=False,
        )

    def reconcile(self, effect_id: str, *, at: datetime | None = None) -> None:
        """Defer ``reconcile_effect``."""
        _defer(RECONCILE_TASK, effect_id=effect_id, kind="reconcile", at=at)


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

    def approval_notice_job(self, effect_id: str) -> None:
        """No job row: submit calls ``notify_approval``, which records the request."""
        return None

    def notify_approval(self, effect_id: str) -> None:
        """Record a notice request."""
        self.requests.append(("notify_approval", effect_id, None))
