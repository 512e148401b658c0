"""The procrastinate job a dispatch runs in, when its outcome may finish it (issue 25).

procrastinate's worker finishes a job in a transaction of its own once the task
returns: after the outcome's commit, one more commit (and WAL flush) per effect. A
dispatch that records its success in one autocommit statement finishes its job in
that statement instead (``store.finish_job``), and tells the worker here, so the
worker's job manager (``effect_broker.workers.job_endings``) skips its own finish for
that job. The job ends when its effect's outcome commits, not a round trip later: a
worker that dies between the two no longer leaves a running job for the sweeper to
retry.

Only a worker whose job manager knows to skip gets a ``RunningJob``
(``effect_broker.tasks``): under any other worker procrastinate's finish would meet a
job already finished and fail.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

_lock = threading.Lock()
#: Jobs finished by their outcome's statement whose worker has not yet skipped its
#: own finish. An id leaves when the worker asks to finish that job.
_finished: set[int] = set()


@dataclass
class RunningJob:
    """The job a dispatch runs in, and how its worker ends a succeeded job."""

    id: int
    #: Whether the worker deletes a succeeded job (``delete_jobs``) or keeps it.
    delete: bool
    #: Set once an outcome statement that finished this job has committed.
    finished: bool = False

    def finished_by_outcome(self) -> None:
        """Record, after the commit, that the outcome's statement finished the job."""
        self.finished = True
        with _lock:
            _finished.add(self.id)


def take_finished(job_id: int) -> bool:
    """True (once) when ``job_id`` was finished by its outcome's statement."""
    with _lock:
        if job_id in _finished:
            _finished.discard(job_id)
            return True
        return False
