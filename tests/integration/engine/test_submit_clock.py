"""Issue 19, item 2: the first due time comes from the database's clock, not the
submitting host's.

Both reservation statements (single and batch) wrote ``next_action_at`` from the API
process's wall clock; with that host 10 minutes ahead, a worker with a correct clock
found every new effect "not due yet" and re-deferred it by 10 minutes. Here the
SUBMITTING process's clock is skewed; the worker's is not: through an injected clock
(the engine bench), and in a real process whose wall clock runs ahead.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection

from effect_broker import store
from effect_broker.domain.clock import ManualClock
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import EffectIntent
from effect_broker.services.batch_submission import CREATED, submit_many
from effect_broker.services.dispatch import dispatch
from effect_broker.services.runtime import Runtime, get_runtime
from effect_broker.services.submission import submit
from examples.crash_matrix.edge_clock import skewed_env
from examples.crash_matrix.workers import ROOT
from tests.integration.engine.harness import TOOLS, Bench
from tests.integration.mcp_support import open_world

IDEMPOTENT = SafetyClass.IDEMPOTENT
SKEW = timedelta(minutes=10)


class AheadClock:
    """The submitting host's clock: its wall time runs ``skew`` ahead; the
    database offset (what a test moved) is the bench's, as on every host."""

    def __init__(self, inner: ManualClock, skew: timedelta) -> None:
        self.inner = inner
        self.skew = skew

    def now(self) -> datetime:
        return self.inner.now() + self.skew

    def monotonic(self) -> float:
        return self.inner.monotonic()

    def database_offset(self) -> timedelta:
        return self.inner.database_offset()


def _ahead(bench: Bench) -> Runtime:
    return replace(get_runtime(), clock=AheadClock(bench.clock, SKEW))


def _request(key: str) -> EffectRequest:
    return EffectRequest(
        operation_key=key, tool=TOOLS[IDEMPOTENT], arguments={"amount_minor": 100}
    )


def _redeferred(bench: Bench, record: EffectRecord) -> list[datetime | None]:
    """Dispatch requests for ``record`` that name a later time (a re-defer)."""
    return [
        at
        for kind, effect_id, at in bench.scheduler.requests
        if kind == "dispatch" and effect_id == record.effect_id and at is not None
    ]


@pytest.mark.parametrize("how", ["single", "batch"])
def test_a_submitting_host_10_minutes_ahead_writes_the_databases_due_time(
    bench: Bench, how: str
) -> None:
    # Given an API process whose wall clock runs 10 minutes ahead of the database's
    ahead = _ahead(bench)
    offset = bench.clock.database_offset()
    before = store.database_now(offset)
    # When it submits one effect, or a batch of three (the batch statement)
    if how == "single":
        records = [submit(bench.tenant, _request("clock:single"), runtime=ahead).effect]
    else:
        results = submit_many(
            bench.tenant, [_request(f"clock:batch:{n}") for n in range(3)], runtime=ahead
        )
        assert [r.outcome for r in results] == [CREATED] * 3
        records = [r.effect for r in results if r.effect is not None]
    after = store.database_now(offset)
    # Then each first due time is the database's clock at the write, not the host's
    assert len(records) == (1 if how == "single" else 3)
    for record in records:
        assert record.next_action_at is not None
        assert before <= record.next_action_at <= after
        stored = store.load_effect_for_worker(record.effect_id)
        assert stored.next_action_at == record.next_action_at
    # And a worker with a correct clock dispatches each at once, re-deferring none
    for record in records:
        done = dispatch(record.effect_id, worker="w-correct-clock")
        assert done.status is EffectStatus.SUCCEEDED
        assert _redeferred(bench, record) == []
    assert bench.targets[IDEMPOTENT].requests == len(records)


def test_a_test_clock_moved_forward_moves_the_first_due_time_with_it(
    bench: Bench,
) -> None:
    # Given a test clock advanced by an hour (its offset shifts the database's clock)
    bench.advance(3600)
    offset = bench.clock.database_offset()
    before = store.database_now(offset)
    # When an effect is submitted and a batch of two
    single = submit(bench.tenant, _request("clock:moved:single")).effect
    batch = [
        r.effect
        for r in submit_many(
            bench.tenant, [_request(f"clock:moved:{n}") for n in range(2)]
        )
    ]
    after = store.database_now(offset)
    # Then their due times are on the shifted database clock, an hour from real now
    for record in [single, *batch]:
        assert record is not None
        assert record.next_action_at is not None
        assert before <= record.next_action_at <= after
        assert record.next_action_at - store.database_now() > timedelta(minutes=59)


# --- a real process whose wall clock runs ahead ----------------------------------------

_SUBMITTER = """
import json, sys
import django
django.setup()
from effect_broker.domain.records import EffectRequest
from effect_broker.models import Tenant
from effect_broker.services.batch_submission import submit_many
from effect_broker.services.submission import submit

tenant = Tenant.objects.get(name=sys.argv[1])
def request(key):
    return EffectRequest(key, "charge_idempotent", {"order": key, "amount_minor": 5})
single = submit(tenant, request("skewed:single")).effect
batch = submit_many(tenant, [request("skewed:batch:1"), request("skewed:batch:2")])
print(json.dumps([single.effect_id, *[r.effect.effect_id for r in batch]]))
"""


def test_a_submitting_process_whose_wall_clock_runs_ahead_writes_the_databases_due_time(
    transactional_db: None, tmp_path: Path
) -> None:
    """The production clock (``SystemClock``) in a process whose wall clock is really
    10 minutes ahead (libfaketime, or a ``sitecustomize`` that shifts Python's clock),
    submitting one effect and a batch of two with the production scheduler."""
    with open_world(tmp_path) as world:
        env, _how = skewed_env(
            {**world.env, "DJANGO_SETTINGS_MODULE": "config.settings"},
            int(SKEW.total_seconds()),
            tmp_path,
        )
        before = store.database_now()
        done = subprocess.run(
            [sys.executable, "-c", _SUBMITTER, world.tenant.name],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        after = store.database_now()
        assert done.returncode == 0, done.stderr[-2000:]
        ids = json.loads(done.stdout.strip().splitlines()[-1])
        assert len(ids) == 3
        for effect_id in ids:
            row = EffectIntent.objects.get(pk=effect_id)
            # The process's clock really ran ahead: its stamp is 10 minutes early
            assert row.created_at - after > SKEW - timedelta(seconds=30)
            # Yet the first due time is the database's clock at the write
            assert row.next_action_at is not None
            assert before <= row.next_action_at <= after
            # And its dispatch job is due at once on the database's clock
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT scheduled_at FROM procrastinate_jobs"
                    " WHERE args->>'effect_id' = %s",
                    [effect_id],
                )
                assert cur.fetchall() == [(None,)]
