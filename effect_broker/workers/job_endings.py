"""A worker's job manager that does not finish a job its outcome already finished.

Issue 25: a dispatch that succeeds finishes its procrastinate job in the statement
that records the success (``services.running_jobs``), one commit where there were two.
procrastinate's worker then still asks its job manager to finish the job; this
manager answers that from memory for those jobs, and sends every other finish (and
every other query) to procrastinate as before. It is installed on the app for as
long as a worker runs (``finishing_with_outcomes``), and only a job run under it
gets a ``RunningJob`` (``effect_broker.tasks``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from procrastinate import App, jobs
from procrastinate.connector import BaseConnector
from procrastinate.manager import JobManager

from effect_broker.services.running_jobs import take_finished

logger = logging.getLogger(__name__)


class OutcomeEndingJobManager(JobManager):
    """procrastinate's job manager, skipping the finish of a job already finished."""

    def __init__(self, connector: BaseConnector, *, delete_succeeded: bool) -> None:
        super().__init__(connector)
        #: Whether this worker deletes a succeeded job (its ``delete_jobs``).
        self.delete_succeeded = delete_succeeded

    async def finish_job(
        self, job: jobs.Job, status: jobs.Status, delete_job: bool
    ) -> None:
        """Finish ``job``, unless the statement of its outcome did (then say so)."""
        if job.id is not None and take_finished(job.id):
            if status is not jobs.Status.SUCCEEDED:
                # The task raised after its outcome committed: the job already
                # ended as succeeded with that outcome, which is what the ledger says.
                logger.warning(
                    "job failed after its outcome finished it; left as finished",
                    extra={"action": "job_finished_by_outcome", "job_id": job.id},
                )
            return
        await super().finish_job(job, status, delete_job)


def _deletes_succeeded(delete_jobs: jobs.DeleteJobCondition | None) -> bool:
    return delete_jobs in (
        jobs.DeleteJobCondition.SUCCESSFUL,
        jobs.DeleteJobCondition.ALWAYS,
    )


@contextlib.contextmanager
def finishing_with_outcomes(
    app: App, delete_jobs: jobs.DeleteJobCondition | None
) -> Iterator[OutcomeEndingJobManager]:
    """Put an ``OutcomeEndingJobManager`` on ``app`` (over its current connector)
    while the block runs; ``delete_jobs``: the worker's, as it will finish a job."""
    original = app.job_manager
    manager = OutcomeEndingJobManager(
        original.connector, delete_succeeded=_deletes_succeeded(delete_jobs)
    )
    app.job_manager = manager
    try:
        yield manager
    finally:
        app.job_manager = original
