"""Operator controls with three real ``effect-broker worker`` processes (issue 24).

A target in this process records every request it gets: when it arrived, how many
were in flight at that moment, and for which downstream key. Three workers with two
job slots each (six sends at once, were nothing to stop them) dispatch against it:

* a paused tool dispatches nothing until it is resumed, then exactly once;
* ``max_in_flight = 2``: the target never has more than two requests of the contract
  at once;
* ``rate_limit = 4``: in any one second at most 4 + 1 attempts are admitted (the
  bucket's one token of burst; docs/how-to/operator-controls.md), on the database's
  clock, and at most that many requests reach the target;

and every effect succeeds, each with one request: a wait is never a failure.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from config.database import url_from_settings
from effect_broker import store
from effect_broker.domain.contracts import load_contracts
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus
from effect_broker.models import EffectIntent
from effect_broker.services import pauses, runtime
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant
from examples.crash_matrix.workers import WorkerProcess, broker_env, wait_until
from tests.integration.conftest import make_operator
from tests.job_tables import forget_old_jobs

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: How long the target takes to answer: long enough for sends to overlap.
ANSWER_SECONDS = 0.3
MAX_IN_FLIGHT = 2
RATE_LIMIT = 4


@dataclass
class Arrival:
    """One request as the target saw it."""

    path: str
    key: str
    at: float  # time.monotonic() at arrival
    in_flight: int  # requests of this path being answered then, this one included


@dataclass
class Recorder:
    """The target's record of what reached it."""

    arrivals: list[Arrival] = field(default_factory=list)
    busy: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, path: str) -> list[Arrival]:
        with self.lock:
            return [a for a in self.arrivals if a.path == path]


def recording_target(recorder: Recorder) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            key = self.headers.get("Idempotency-Key", "")
            with recorder.lock:
                busy = recorder.busy.get(self.path, 0) + 1
                recorder.busy[self.path] = busy
                recorder.arrivals.append(Arrival(self.path, key, time.monotonic(), busy))
            try:
                time.sleep(ANSWER_SECONDS)
                body = json.dumps({"id": f"ch_{uuid.uuid4().hex[:8]}"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            finally:
                with recorder.lock:
                    recorder.busy[self.path] -= 1

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def contracts_toml(url: str) -> str:
    def contract(name: str, limits: str) -> str:
        return f"""
[[contract]]
name = "controls.{name}"
version = "1"
tool = "charge_{name}"
safety = "idempotent"
key_retention = "1h"
adapter = "http"
{limits}
[contract.adapter_options]
url = "{url}/{name}"
idempotency_header = "Idempotency-Key"
timeout = "10s"
"""

    return (
        contract("paused", "")
        + contract("in_flight", f"max_in_flight = {MAX_IN_FLIGHT}")
        + contract("rated", f"rate_limit = {RATE_LIMIT}")
    )


@dataclass
class Stack:
    recorder: Recorder
    workers: list[WorkerProcess]

    def logs(self) -> str:
        return "\n".join(f"--- {w.name}\n{w.log_tail(40)}" for w in self.workers)


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    django_db_setup: None,
    django_db_blocker: Any,
) -> Iterator[Stack]:
    with django_db_blocker.unblock():
        connection.ensure_connection()
        forget_old_jobs()
        database_url = url_from_settings(connection.settings_dict)
    recorder = Recorder()
    server = recording_target(recorder)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    path = Path(tmp_path_factory.mktemp("controls")) / "contracts.toml"
    path.write_text(contracts_toml(url), encoding="utf-8")
    env = broker_env(database_url, path, settings.EFFECT_BROKER_MASTER_KEY)
    workers = [WorkerProcess(f"controls-{n}", env, concurrency=2) for n in range(3)]
    runtime.reset()
    try:
        with runtime.override(registry=load_contracts(path)):
            yield Stack(recorder, workers)
    finally:
        runtime.reset()
        for worker in workers:
            worker.stop()
        server.shutdown()
        server.server_close()


def charge(tenant: Any, tool: str) -> EffectRecord:
    request = EffectRequest(
        operation_key=f"order:{uuid.uuid4().hex[:10]}:charge",
        tool=tool,
        arguments={"amount_minor": 1999},
    )
    return submit(tenant, request).effect


def status_of(record: EffectRecord) -> EffectStatus:
    return store.load_effect_for_worker(record.effect_id).status


def all_succeeded(records: list[EffectRecord], stack: Stack, timeout: float) -> None:
    try:
        wait_until(
            lambda: all(status_of(r) is EffectStatus.SUCCEEDED for r in records),
            timeout=timeout,
            what="every effect to succeed",
        )
    except TimeoutError:
        statuses = [status_of(r).value for r in records]
        print(f"statuses: {statuses}\n{stack.logs()}")
        raise


def dispatch_job_done(record: EffectRecord) -> bool:
    """A worker ran the effect's dispatch job to its end."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE args->>'effect_id' = %s"
            " AND task_name = 'effect_broker.dispatch_effect' AND status = 'succeeded'",
            [record.effect_id],
        )
        return bool(cur.fetchone()[0])


def test_a_paused_tool_dispatches_nothing_until_resumed(stack: Stack) -> None:
    tenant = create_tenant(f"controls-{uuid.uuid4().hex[:6]}")[0]
    operator = make_operator("ann")
    # Given an operator paused the tool
    pause = pauses.pause(
        tool="charge_paused", reason="target incident", operator=operator
    )
    # When an effect of it is submitted and a worker has run its dispatch job
    record = charge(tenant, "charge_paused")
    wait_until(
        lambda: dispatch_job_done(record), timeout=60, what="a worker to run the job"
    )
    time.sleep(2.5)  # two more sweeps, and polls of every worker: none may send it
    # Then the target got nothing, and the effect waits (not failed)
    assert stack.recorder.of("/paused") == []
    assert status_of(record) is EffectStatus.PREPARED
    # When the operator resumes the tool
    pauses.resume(pause.pause_id, operator=operator, reason="incident over")
    all_succeeded([record], stack, timeout=30)
    # Then it was sent, once: one charge
    arrivals = stack.recorder.of("/paused")
    assert len(arrivals) == 1
    assert arrivals[0].key == EffectIntent.objects.get(pk=record.effect_id).downstream_key


def test_limits_hold_across_three_workers(stack: Stack) -> None:
    tenant = create_tenant(f"controls-{uuid.uuid4().hex[:6]}")[0]
    # Given ten effects of each limited contract, submitted at once
    in_flight = [charge(tenant, "charge_in_flight") for _ in range(10)]
    rated = [charge(tenant, "charge_rated") for _ in range(10)]
    started = time.monotonic()
    all_succeeded(in_flight + rated, stack, timeout=90)
    elapsed = time.monotonic() - started
    # Then every effect succeeded with exactly one request (waits never failed one)
    for path, records in (("/in_flight", in_flight), ("/rated", rated)):
        keys = [a.key for a in stack.recorder.of(path)]
        assert sorted(keys) == sorted(
            EffectIntent.objects.get(pk=r.effect_id).downstream_key for r in records
        )
    # ... the target never had more than max_in_flight requests of the contract
    most = max(a.in_flight for a in stack.recorder.of("/in_flight"))
    assert most <= MAX_IN_FLIGHT
    # ... and no one-second window held more than rate_limit + 1 admissions (on the
    # database's clock, as the limit counts) or arrivals (at the target)
    admitted = sorted(admitted_at(r) for r in rated)
    arrived = sorted(a.at for a in stack.recorder.of("/rated"))
    worst_admitted = busiest_second([t.timestamp() for t in admitted])
    worst_arrived = busiest_second(arrived)
    assert worst_admitted <= RATE_LIMIT + 1
    assert worst_arrived <= RATE_LIMIT + 1
    print(
        f"\n3 workers x 2 slots: in flight at most {most} (limit {MAX_IN_FLIGHT}); "
        f"busiest second {worst_admitted} admitted, {worst_arrived} arrived (limit "
        f"{RATE_LIMIT} + 1); 20 effects in {elapsed:.1f}s"
    )


def admitted_at(record: EffectRecord) -> datetime:
    (event,) = [
        e
        for e in store.load_events(record.effect_id)
        if e.facts.event_type == "dispatch_started"
    ]
    return datetime.fromisoformat(str(event.facts.metadata["admitted_at"]))


def busiest_second(times: list[float]) -> int:
    """The most of ``times`` (seconds) in any window [t, t + 1 s)."""
    window = timedelta(seconds=1).total_seconds()
    return max(sum(1 for u in times if t <= u < t + window) for t in times)
