"""Issue 11 acceptance: "/metrics shows the unknown count for that tool".

A scripted run against the system as deployed - ``uvicorn config.asgi:application``
(the API, with its connection pool), one ``effect-broker procrastinate worker`` with
its own metrics port, and the demo target over real HTTP - then both are scraped:

* the API counts what it was asked (new, replayed, conflicting submits) and reads the
  ledger: one unsafe effect of that tool with an unknown outcome, none of the other;
* the worker counts what it did: one success with a receipt, one lost response;
* django-prometheus's HTTP and query metrics come from the pooled API process.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from config.database import url_from_settings
from effect_broker.services.tenants import create_tenant
from examples.crash_matrix.contracts import TOOLS, write_contracts
from examples.crash_matrix.target_client import TargetProcess, start_target
from examples.crash_matrix.workers import WorkerProcess, broker_env, wait_until
from tests.job_tables import forget_old_jobs

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
IDEMPOTENT, UNSAFE = TOOLS["idempotent"], TOOLS["unsafe"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Api:
    """``uvicorn config.asgi:application`` in its own process."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "config.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--no-access-log",
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(self._ready, timeout=60, what="the API to listen")

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"the API exited with {self.process.returncode}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self._log.close()


@dataclass
class Deployment:
    api: Api
    worker: WorkerProcess
    worker_metrics: str
    target: TargetProcess
    api_key: str

    def submit(self, key: str, tool: str, amount: int) -> httpx.Response:
        return httpx.post(
            f"{self.api.url}/v1/effects",
            json={
                "operation_key": key,
                "tool": tool,
                "arguments": {"order": "7", "amount_minor": amount, "currency": "EUR"},
            },
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=30,
        )

    def status(self, effect_id: str) -> str:
        answer = httpx.get(
            f"{self.api.url}/v1/effects/{effect_id}",
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=30,
        )
        return str(answer.json()["status"])


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    connection.ensure_connection()
    forget_old_jobs()
    url = url_from_settings(connection.settings_dict)
    target = start_target(url, settlement_delay="500ms", schema="metrics_target")
    target.reset()
    contracts = write_contracts(tmp_path / "contracts.toml", target.url, timeout="5s")
    api_key = create_tenant(f"metrics-{uuid.uuid4().hex[:6]}")[1]
    metrics_port = free_port()
    env = broker_env(
        url,
        contracts,
        settings.EFFECT_BROKER_MASTER_KEY,
        extra={"EFFECT_BROKER_WORKER_METRICS_PORT": str(metrics_port)},
    )
    env.pop("EFFECT_BROKER_PROCESS_ROLE", None)
    api = worker = None
    try:
        api = Api(env, tmp_path / "api.log")
        worker = WorkerProcess("metrics-worker", env)
        worker_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        wait_until(
            lambda: _answers(worker_metrics), timeout=60, what="the worker's metrics port"
        )
        yield Deployment(api, worker, worker_metrics, target, api_key)
    finally:
        if worker is not None:
            worker.stop()
        if api is not None:
            api.stop()
        target.stop()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    body = httpx.get(url, timeout=30).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def total(samples: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    """The sum of ``name`` over every series whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, lbl), v in samples.items() if n == name and wanted <= lbl)


def test_a_scripted_run_shows_in_the_api_and_worker_metrics(deployment) -> None:
    d = deployment
    paid = f"order:7:charge:{uuid.uuid4().hex[:8]}"
    # Given one idempotent charge that succeeds ...
    first = d.submit(paid, IDEMPOTENT, 1999)
    assert first.status_code == 202
    effect_id = first.json()["effect_id"]
    wait_until(lambda: d.status(effect_id) == "succeeded", timeout=60, what="the charge")
    # ... replayed once by its caller, and once reused with another amount
    assert d.submit(paid, IDEMPOTENT, 1999).status_code == 200
    assert d.submit(paid, IDEMPOTENT, 2500).status_code == 409
    # ... and one unsafe charge whose response the target loses after committing
    d.target.inject("drop_connection_after_commit")
    lost = d.submit(f"order:8:charge:{uuid.uuid4().hex[:8]}", UNSAFE, 500)
    assert lost.status_code == 202
    wait_until(
        lambda: d.status(lost.json()["effect_id"]) == "outcome_unknown",
        timeout=60,
        what="the lost response to be recorded",
    )
    time.sleep(0.5)  # the worker counts right after its write returns

    # When both are scraped
    api = scrape(f"{d.api.url}/metrics")
    worker = scrape(d.worker_metrics)

    # Then the API counted the submits under each tool ...
    assert total(api, "effect_broker_effects_submitted_total", tool=IDEMPOTENT) == 1
    assert total(api, "effect_broker_effects_submitted_total", tool=UNSAFE) == 1
    assert total(api, "effect_broker_effects_deduplicated_total", tool=IDEMPOTENT) == 1
    assert (
        total(
            api,
            "effect_broker_effects_conflicted_total",
            tool=IDEMPOTENT,
            reason="payload_drift",
        )
        == 1
    )
    # ... and read the ledger: one unknown outcome, of the unsafe tool only
    assert total(api, "effect_broker_unknown_effects", tool=UNSAFE) == 1
    assert total(api, "effect_broker_unknown_effects", tool=IDEMPOTENT) == 0
    assert total(api, "effect_broker_unknown_effects") == 1
    assert total(api, "effect_broker_unknown_effect_oldest_age_seconds", tool=UNSAFE) >= 0
    assert total(api, "effect_broker_ledger_scrape_success") == 1
    # ... with django-prometheus's HTTP and query metrics from the pooled process
    responses = "django_http_responses_total_by_status_view_method_total"
    assert total(api, responses, status="202") == 2  # only a new submit is 202
    assert total(api, responses, status="409") == 1
    assert total(api, "django_db_execute_total") > 0
    # And the worker counted what it did, on its own port
    assert total(worker, "effect_broker_effects_succeeded_total", tool=IDEMPOTENT) == 1
    assert (
        total(
            worker,
            "effect_broker_dispatch_attempts_total",
            tool=IDEMPOTENT,
            outcome="succeeded",
        )
        == 1
    )
    assert (
        total(worker, "effect_broker_submit_to_receipt_seconds_count", tool=IDEMPOTENT)
        == 1
    )
    assert (
        total(
            worker,
            "effect_broker_effects_unknown_total",
            tool=UNSAFE,
            safety_class="unsafe",
        )
        == 1
    )
    assert (
        total(
            worker,
            "effect_broker_dispatch_attempts_total",
            tool=UNSAFE,
            outcome="unknown",
        )
        == 1
    )
    assert total(worker, "effect_broker_effects_submitted_total") == 0
    # The ledger is reported once, by the API: never on a worker's port
    assert total(worker, "effect_broker_unknown_effects") == 0
    assert not any(name == "effect_broker_unknown_effects" for name, _ in worker)
