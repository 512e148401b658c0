"""The worker's job manager skips the finish of a job its outcome finished (issue 25),
and only that: every other finish reaches procrastinate, once."""

from __future__ import annotations

import asyncio

from procrastinate import jobs, testing

from effect_broker.services import running_jobs
from effect_broker.workers.job_endings import (
    OutcomeEndingJobManager,
    finishing_with_outcomes,
)


def _job(job_id: int | None) -> jobs.Job:
    return jobs.Job(
        id=job_id,
        queue="dispatch",
        lock=f"effect:{job_id}",
        queueing_lock=None,
        task_name="effect_broker.dispatch",
        task_kwargs={"effect_id": "x"},
    )


def _finishes(connector: testing.InMemoryConnector) -> list[dict[str, object]]:
    return [args for name, args in connector.queries if name == "finish_job"]


def test_a_job_finished_by_its_outcome_is_not_finished_again() -> None:
    connector = testing.InMemoryConnector()
    manager = OutcomeEndingJobManager(connector, delete_succeeded=True)
    running_jobs.RunningJob(9101, delete=True).finished_by_outcome()
    asyncio.run(manager.finish_job(_job(9101), jobs.Status.SUCCEEDED, delete_job=True))
    assert _finishes(connector) == []
    # Told once: a second finish of the same id (it cannot come from the same run)
    # goes to procrastinate.
    assert not running_jobs.take_finished(9101)


def test_every_other_job_is_finished_by_procrastinate() -> None:
    connector = testing.InMemoryConnector()
    manager = OutcomeEndingJobManager(connector, delete_succeeded=True)

    async def defer_and_finish() -> int:
        job = await manager.defer_job_async(_job(None))
        assert job.id is not None
        await manager.finish_job(job, jobs.Status.FAILED, delete_job=False)
        return job.id

    job_id = asyncio.run(defer_and_finish())
    assert _finishes(connector) == [
        {"job_id": job_id, "status": "failed", "delete_job": False}
    ]
    assert connector.jobs[job_id]["status"] == "failed"


def test_the_manager_is_on_the_app_only_while_a_worker_runs() -> None:
    from procrastinate import App

    app = App(connector=testing.InMemoryConnector())
    original = app.job_manager
    with finishing_with_outcomes(app, jobs.DeleteJobCondition.SUCCESSFUL) as manager:
        assert app.job_manager is manager
        assert manager.delete_succeeded
        assert manager.connector is original.connector
    assert app.job_manager is original
    with finishing_with_outcomes(app, jobs.DeleteJobCondition.NEVER) as manager:
        assert not manager.delete_succeeded
