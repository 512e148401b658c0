"""A dispatch job finished by the statement of its effect's success (issue 25).

The rider (``store.finish_job``) is procrastinate's ``procrastinate_finish_job_v1``
written out, so these tests hold it to that function, on real jobs: the same row
afterwards (or none), the same procrastinate events. If procrastinate's finish
changes, they fail. And a job that is no longer running never costs the outcome its
commit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from effect_broker import store
from effect_broker.adapters.simulated_adapter import Fault
from effect_broker.domain.errors import StaleWriteError
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.services import running_jobs
from effect_broker.services.dispatch import dispatch
from tests.integration.engine.harness import Bench, engine_bench

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def bench() -> Iterator[Bench]:
    with engine_bench() as b:
        yield b


def _job(status: str = "doing") -> int:
    """A dispatch job row, as a worker's fetch leaves it (or in ``status``)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT unnest(procrastinate_defer_jobs_v1(ARRAY[ROW("
            "'dispatch', 'effect_broker.dispatch', 0, NULL, NULL, %s::jsonb, NULL"
            ")::procrastinate_job_to_defer_v1]))",
            [json.dumps({"effect_id": "x"})],
        )
        row = cur.fetchone()
        assert row is not None
        job_id = int(row[0])
        cur.execute(
            "UPDATE procrastinate_jobs SET status = %s WHERE id = %s", [status, job_id]
        )
    return job_id


def _state(job_id: int) -> tuple[Any, ...] | None:
    """The job row's finish-relevant columns and its event types, or None if gone."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT status, attempts, abort_requested FROM procrastinate_jobs "
            "WHERE id = %s",
            [job_id],
        )
        row = cur.fetchone()
        cur.execute(
            "SELECT array_agg(type::text ORDER BY id) FROM procrastinate_events "
            "WHERE job_id = %s",
            [job_id],
        )
        events = cur.fetchone()
    return None if row is None else (*row, events[0] if events else None)


def _procrastinate_finish(job_id: int, *, delete: bool) -> None:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT procrastinate_finish_job_v1(%s, 'succeeded', %s)", [job_id, delete]
        )


def _transition_finishing(bench: Bench, job_id: int, *, delete: bool) -> EffectRecord:
    record = bench.submit(SafetyClass.IDEMPOTENT)
    return store.transition(
        record,
        EffectStatus.DISPATCHING,
        event_type="dispatch_started",
        actor="w1",
        now=bench.clock.now(),
        riders=(store.finish_job(job_id, delete=delete),),
    )


@pytest.mark.parametrize("delete", [False, True], ids=["kept", "deleted"])
def test_the_rider_finishes_a_job_as_procrastinates_finish_does(
    bench: Bench, delete: bool
) -> None:
    theirs, ours = _job(), _job()
    _procrastinate_finish(theirs, delete=delete)
    moved = _transition_finishing(bench, ours, delete=delete)
    assert moved.status is EffectStatus.DISPATCHING
    assert _state(ours) == _state(theirs)
    if delete:
        assert _state(ours) is None
    else:
        events = ["deferred", "started", "succeeded"]
        assert _state(ours) == ("succeeded", 1, False, events)


def test_a_job_no_longer_running_is_left_alone_and_the_outcome_commits(
    bench: Bench,
) -> None:
    """procrastinate's function raises for such a job; the rider must not: the
    effect's outcome commits whatever its queue row says."""
    failed = _job("failed")
    before = _state(failed)
    moved = _transition_finishing(bench, failed, delete=True)
    assert moved.status is EffectStatus.DISPATCHING
    assert store.load_effect_for_worker(moved.effect_id).version == moved.version
    assert _state(failed) == before


def test_a_refused_fence_finishes_no_job(bench: Bench) -> None:
    job_id = _job()
    record = bench.submit(SafetyClass.IDEMPOTENT)
    store.touch(record, event_type="lease_extended", actor="w2", now=bench.clock.now())
    with pytest.raises(StaleWriteError):
        store.transition(
            record,  # the version before the touch
            EffectStatus.DISPATCHING,
            event_type="dispatch_started",
            actor="w1",
            now=bench.clock.now(),
            riders=(store.finish_job(job_id, delete=True),),
        )
    assert _state(job_id) is not None
    assert not running_jobs.take_finished(job_id)


@pytest.mark.parametrize("delete", [False, True], ids=["kept", "deleted"])
def test_a_successful_dispatch_finishes_its_job_with_the_receipt(
    bench: Bench, delete: bool
) -> None:
    job_id = _job()
    job = running_jobs.RunningJob(job_id, delete=delete)
    record = bench.submit(SafetyClass.IDEMPOTENT)
    done = dispatch(record.effect_id, worker="w1", job=job)
    assert done.status is EffectStatus.SUCCEEDED
    assert job.finished
    # The worker's manager is told once, and only for this job.
    assert running_jobs.take_finished(job_id)
    assert not running_jobs.take_finished(job_id)
    expected = None if delete else ("succeeded", 1, False)
    state = _state(job_id)
    assert (state[:3] if state else None) == expected


def test_a_dispatch_that_does_not_succeed_leaves_its_job_to_procrastinate(
    bench: Bench,
) -> None:
    job_id = _job()
    job = running_jobs.RunningJob(job_id, delete=True)
    record = bench.submit(SafetyClass.IDEMPOTENT)
    bench.targets[SafetyClass.IDEMPOTENT].inject(Fault.LOSE_RESPONSE)
    after = dispatch(record.effect_id, worker="w1", job=job)
    assert after.status is EffectStatus.OUTCOME_UNKNOWN
    assert not job.finished
    assert not running_jobs.take_finished(job_id)
    state = _state(job_id)
    assert state is not None
    assert state[0] == "doing"
