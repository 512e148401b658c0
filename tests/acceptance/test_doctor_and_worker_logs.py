"""``doctor`` and the worker's log, against a real worker process and a real target.

Issue 11 acceptance: "``doctor`` reports a dead worker and an aged unknown effect".
The worker here is really SIGKILLed (its heartbeat stops; procrastinate's row stays),
and the unknown effect is a real dispatch whose response the target really dropped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from effect_broker import store
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus
from effect_broker.models import Tenant
from effect_broker.services.submission import submit
from examples.crash_matrix.contracts import TOOLS
from examples.crash_matrix.target_client import TargetProcess
from examples.crash_matrix.workers import (
    FAST_RECOVERY,
    ROOT,
    WorkerProcess,
    broker_env,
    wait_until,
)
from tests.acceptance.target_world import target_world

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: A value that must never reach a log line: it is an argument of the effect.
SECRET = "tok_live_5ecr3t_" + uuid.uuid4().hex


@dataclass
class World:
    target: TargetProcess
    contracts: Path
    database_url: str
    tenant: Tenant

    def env(self, **extra: str) -> dict[str, str]:
        return broker_env(
            self.database_url,
            self.contracts,
            settings.EFFECT_BROKER_MASTER_KEY,
            extra=extra,
        )

    def submit_idempotent(self) -> EffectRecord:
        request = EffectRequest(
            operation_key=f"order:{uuid.uuid4().hex[:6]}:charge",
            tool=TOOLS["idempotent"],
            arguments={"order": "44", "amount_minor": 700, "currency": "EUR"},
        )
        return submit(self.tenant, request).effect  # type: ignore[return-value]

    def submit_unsafe_with_lost_response(self) -> EffectRecord:
        """An unsafe charge whose response the target drops after committing."""
        self.target.inject("drop_connection_after_commit")
        request = EffectRequest(
            operation_key=f"order:{uuid.uuid4().hex[:6]}:charge",
            tool=TOOLS["unsafe"],
            arguments={
                "order": "42",
                "amount_minor": 1999,
                "currency": "EUR",
                "card_token": SECRET,
            },
        )
        return submit(self.tenant, request).effect  # type: ignore[return-value]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with target_world(tmp_path, schema="doctor_target", tenant_prefix="doctor") as parts:
        yield World(*parts)


def status_of(record: EffectRecord) -> EffectStatus:
    return store.load_effect_for_worker(record.effect_id).status


def doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effect_broker.cli", "doctor", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def checks(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    body = json.loads(result.stdout)
    return {check["name"]: check for check in body["checks"]}


def test_doctor_reports_a_dead_worker_and_an_aged_unknown_effect(world: World) -> None:
    # Given a live worker, and an unsafe effect whose response was lost
    worker = WorkerProcess("doctor-worker", world.env())
    try:
        record = world.submit_unsafe_with_lost_response()
        wait_until(
            lambda: status_of(record) is EffectStatus.OUTCOME_UNKNOWN,
            timeout=60,
            what="the lost response to make the effect outcome_unknown",
        )
        # While the worker lives, doctor finds it alive and the effect waiting
        alive = doctor(world.env(), "--json", "--max-waiting-age", "1h")
        assert alive.returncode == 0, alive.stdout + alive.stderr
        before = checks(alive)
        assert before["workers"]["status"] == "ok"
        assert [w["state"] for w in before["workers"]["details"]] == ["alive"]
        assert before["waiting_effects"]["status"] == "warn"
        # When the worker is SIGKILLed (no unregistering; its heartbeat just stops)
        # while it waits on a target that committed a charge and does not answer
        worker_id = before["workers"]["details"][0]["worker_id"]
        world.target.inject("hang_after_commit", seconds=30)
        hung = world.submit_idempotent()
        wait_until(
            lambda: status_of(hung) is EffectStatus.DISPATCHING,
            timeout=30,
            what="the worker to be inside the hung dispatch",
        )
        worker.kill()
    finally:
        worker.stop()
    stalled = float(FAST_RECOVERY["EFFECT_BROKER_STALLED_JOB_SECONDS"])
    time.sleep(stalled + 1.5)
    time.sleep(max(0.0, 2.0 - (time.time() - record.created_at.timestamp())))
    result = doctor(world.env(), "--json", "--max-waiting-age", "2s")
    # Then doctor fails, naming the dead worker and the aged unknown effect
    assert result.returncode == 1, result.stdout + result.stderr
    found = checks(result)
    workers = found["workers"]
    assert workers["status"] == "fail"
    assert "no live worker" in workers["summary"]
    assert f"worker {worker_id} last seen" in workers["summary"]
    assert [(w["worker_id"], w["state"]) for w in workers["details"]] == [
        (worker_id, "dead")
    ]
    assert workers["details"][0]["heartbeat_age_seconds"] > stalled
    waiting = found["waiting_effects"]
    assert waiting["status"] == "fail"
    assert waiting["details"] == [
        {
            "tool": TOOLS["unsafe"],
            "status": "outcome_unknown",
            "count": 1,
            "oldest_effect_id": record.effect_id,
            "oldest_age_seconds": waiting["details"][0]["oldest_age_seconds"],
            "oldest_age": waiting["details"][0]["oldest_age"],
        }
    ]
    assert waiting["details"][0]["oldest_age_seconds"] > 2.0
    assert record.effect_id in waiting["summary"]
    assert json.loads(result.stdout)["failed"] == ["workers", "waiting_effects"]
    # The dead worker's job is still marked running: a stalled job, named by effect.
    stalled_jobs = found["stalled_jobs"]
    assert stalled_jobs["status"] == "warn"
    # (a periodic sweep or job-table cleanup the worker happened to be running when
    # killed is one too)
    held = [(j["task"], j["effect_id"], j["worker_id"]) for j in stalled_jobs["details"]]
    assert ("effect_broker.dispatch_effect", hung.effect_id, worker_id) in held
    assert {w for _, _, w in held} == {worker_id}
    assert {task for task, effect, _ in held if effect is None} <= {
        "effect_broker.sweep",
        "effect_broker.remove_finished_jobs",
    }
    # ... and the human table says the same in one line each
    human = doctor(world.env(), "--max-waiting-age", "2s")
    assert human.returncode == 1
    lines = {line.split()[0]: line for line in human.stdout.splitlines() if line}
    assert lines["workers"].split()[1] == "FAIL"
    assert "dead" in lines["workers"]
    assert lines["waiting_effects"].split()[1] == "FAIL"
    assert TOOLS["unsafe"] in lines["waiting_effects"]
    # ... with a line per tool and per worker below the table
    assert (
        f"  {TOOLS['unsafe']}: 1 outcome_unknown, oldest {record.effect_id} waiting "
        in human.stdout
    )
    assert f"  worker {worker_id}: dead, last heartbeat " in human.stdout
    assert "Traceback" not in human.stderr


def test_worker_logs_jobs_and_the_unknown_effect_id_never_its_arguments(
    world: World,
) -> None:
    # Given a worker logging JSON at its default level
    env = world.env(EFFECT_BROKER_LOG_FORMAT="json")
    env.pop("EFFECT_BROKER_LOG_LEVEL", None)
    worker = WorkerProcess("log-worker", env)
    try:
        # When an effect with a secret-looking argument ends outcome_unknown
        record = world.submit_unsafe_with_lost_response()
        wait_until(
            lambda: status_of(record) is EffectStatus.OUTCOME_UNKNOWN,
            timeout=60,
            what="the lost response to make the effect outcome_unknown",
        )
        # (the job's end is logged after the task returns)
        wait_until(
            lambda: "ended with status" in worker.log_path.read_text(errors="replace"),
            timeout=30,
            what="the job's end to be logged",
        )
        text = worker.log_path.read_text(errors="replace")
    finally:
        worker.stop()
    # Then every line is JSON, the job's start, end and the unknown outcome are
    # there with the effect id, and the argument value is nowhere
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert lines, text[-2000:]
    unknown = [line for line in lines if line.get("action") == "outcome_unknown"]
    assert len(unknown) == 1, text[-3000:]
    assert unknown[0]["effect_id"] == record.effect_id
    assert unknown[0]["level"] == "WARNING"
    assert unknown[0]["tool"] == TOOLS["unsafe"]
    assert unknown[0]["safety"] == "unsafe"
    actions = {line.get("action") for line in lines}
    assert {"start_job", "job_success"} <= actions, sorted(map(str, actions))
    started = [
        line
        for line in lines
        if line.get("action") == "start_job" and record.effect_id in line["message"]
    ]
    assert started, "the dispatch job's start names the effect"
    assert SECRET not in text
    assert SECRET[len("tok_live_") :] not in text
