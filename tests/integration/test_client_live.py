"""The SDK against a real broker: uvicorn serving config.asgi in a subprocess, a real
``procrastinate worker`` process, and the crash-matrix target service, all on the
test database. Submit -> wait -> receipt, replay, payload conflict, an unknown outcome
reaching the caller as one, and a proxy's 503 that the client rides out - including
the 503 that arrives after the broker committed, where only the operation key makes
the resend safe.

Waiting for a person (issue 23, item 3): ``wait(until="settled")`` and
``perform(on_unknown="wait")`` over the long-poll ``GET /v1/effects/{id}/wait``, while
an operator resolves the effect with ``effect-broker effects resolve`` (a real CLI
process). The server runs with a pool of two connections and two request slots, so a
long-poll that held either would starve the next request."""

from __future__ import annotations

import asyncio
import json
import math
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.db import connection

from config.database import url_from_settings
from effect_broker.client import (
    AsyncBrokerClient,
    BrokerClient,
    Effect,
    EffectFailed,
    OutcomeUnknown,
    PayloadConflict,
    RetryPolicy,
    WaitTimeout,
)
from effect_broker.domain.waits import MAX_WAIT_SECONDS
from effect_broker.models import EffectIntent
from effect_broker.services import resolution
from effect_broker.services.inspection import tenant_of
from effect_broker.services.tenants import create_tenant
from examples.crash_matrix.contracts import TOOLS, write_contracts
from examples.crash_matrix.target_client import TargetProcess, start_target
from examples.crash_matrix.workers import ROOT, WorkerProcess, broker_env
from tests.integration.conftest import make_operator
from tests.job_tables import forget_old_jobs

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ARGS = {"order": "42", "amount_minor": 1999, "currency": "EUR"}
#: The served API's pool size (and so its in-flight limit).
POOL = 2
NEW_KEY_ADVICE = re.compile(
    r"(new|different|fresh|another)\s+(operation[ _])?key", re.IGNORECASE
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LiveBroker:
    """A running broker (API + worker) and the target it charges."""

    url: str
    target: TargetProcess
    server: subprocess.Popen[bytes]
    worker: WorkerProcess
    env: dict[str, str]

    def client(self, api_key: str, base_url: str | None = None, **options: Any):
        return BrokerClient(base_url or self.url, api_key, **options)


@pytest.fixture(scope="module")
def live(django_db_setup: None, django_db_blocker: Any) -> Iterator[LiveBroker]:
    with django_db_blocker.unblock():
        connection.ensure_connection()
        forget_old_jobs()
        database_url = url_from_settings(connection.settings_dict)
    workdir = tempfile.TemporaryDirectory(prefix="eb-sdk-live-")
    target = start_target(database_url, settlement_delay="500ms", schema="sdk_target")
    contracts = write_contracts(Path(workdir.name) / "contracts.toml", target.url)
    env = broker_env(
        database_url,
        contracts,
        settings.EFFECT_BROKER_MASTER_KEY,
        # Two connections, so two request slots: the long-poll tests show that a
        # waiting request holds neither (issue 23).
        extra={
            "EFFECT_BROKER_API_DB_POOL_MAX_SIZE": str(POOL),
            "EFFECT_BROKER_API_DB_POOL_MIN_SIZE": "1",
        },
    )
    port = free_port()
    log = (Path(workdir.name) / "uvicorn.log").open("wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "config.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    worker = WorkerProcess("sdk-live", env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz", trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                log.flush()
                tail = (Path(workdir.name) / "uvicorn.log").read_text(errors="replace")
                raise RuntimeError(f"uvicorn did not start:\n{tail[-2000:]}")
            time.sleep(0.1)
        yield LiveBroker(url, target, server, worker, env)
    finally:
        worker.stop()
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
        target.stop()
        workdir.cleanup()


@pytest.fixture
def api_key(live: LiveBroker) -> str:
    live.target.reset()
    return create_tenant("sdk-live")[1]


def test_submit_wait_receipt_and_history_over_real_http(live, api_key) -> None:
    with live.client(api_key) as broker:
        effect = broker.submit("order:42:charge:v1", TOOLS["idempotent"], ARGS)
        assert (effect.status, effect.created) == ("prepared", True)
        done = broker.wait(effect.effect_id, timeout=30)
        receipt = broker.receipt(effect.effect_id)
        history = broker.history(effect.effect_id)
    assert done.status == "succeeded"
    assert receipt.effect_id == effect.effect_id
    assert receipt.external_id
    assert history.events[-1].new_status == "succeeded"
    assert live.target.count_charges(mode="idempotent") == 1


def test_the_decorator_replays_instead_of_charging_twice(live, api_key) -> None:
    with live.client(api_key) as broker:

        @broker.effect(
            tool=TOOLS["idempotent"], key=lambda order, **_: f"order:{order}:charge:v1"
        )
        def charge(order: str, amount_minor: int, currency: str) -> dict: ...

        first = charge("42", 1999, "EUR")
        again = charge("42", 1999, "EUR")
        replay = broker.submit("order:42:charge:v1", TOOLS["idempotent"], ARGS)
    assert first == again
    assert (replay.created, replay.replayed) == (False, True)
    assert live.target.count_charges(mode="idempotent") == 1


def test_a_payload_conflict_is_typed_and_nothing_is_charged_twice(live, api_key) -> None:
    with live.client(api_key) as broker:
        first = broker.submit("order:43:charge:v1", TOOLS["idempotent"], ARGS)
        with pytest.raises(PayloadConflict) as error:
            broker.submit(
                "order:43:charge:v1", TOOLS["idempotent"], {**ARGS, "amount_minor": 1}
            )
        broker.wait(first.effect_id, timeout=30)
    # The SDK sends the key as Idempotency-Key too, so drift is the draft's 422.
    assert (error.value.status, error.value.effect_id) == (422, first.effect_id)
    assert "inspect the existing effect" in str(error.value).lower()
    assert not NEW_KEY_ADVICE.search(str(error.value))
    assert live.target.count_charges(mode="idempotent") == 1


def test_an_unknown_outcome_reaches_the_caller_as_one(live, api_key) -> None:
    # Given an unsafe target that commits the charge and then drops the connection
    live.target.inject("drop_connection_after_commit")
    with live.client(api_key) as broker:

        @broker.effect(tool=TOOLS["unsafe"], key=lambda order, **_: f"order:{order}:u:v1")
        def charge(order: str, amount_minor: int, currency: str) -> dict: ...

        # Then the call raises OutcomeUnknown - not a result, not a failure
        with pytest.raises(OutcomeUnknown) as error:
            charge("44", 1999, "EUR")
    assert error.value.needs_operator is True
    assert error.value.effect is not None
    assert error.value.effect.status == "outcome_unknown"
    assert not NEW_KEY_ADVICE.search(str(error.value))
    # and the target had charged once: "unknown" was the honest answer
    assert live.target.count_charges(mode="unsafe") == 1


@dataclass
class FlakyProxy:
    """A local HTTP proxy in front of the broker that answers the first POST with
    503 + Retry-After: 0, either instead of forwarding it or after forwarding it (the
    broker committed; its answer is lost on the way back)."""

    upstream: str
    forward_first: bool
    forwarded: list[str] = field(default_factory=list)
    refused: int = 0

    def __post_init__(self) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.command == "POST" and proxy.refused == 0:
                    proxy.refused += 1
                    if proxy.forward_first:
                        proxy._forward(self, body)
                    self._answer(503, b"upstream unavailable", {"Retry-After": "0"})
                    return
                status, content, headers = proxy._forward(self, body)
                self._answer(status, content, headers)

            def _answer(self, status: int, content: bytes, headers: dict) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = _relay

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _forward(self, handler: BaseHTTPRequestHandler, body: bytes):
        self.forwarded.append(handler.command)
        response = httpx.request(
            handler.command,
            self.upstream + handler.path,
            content=body or None,
            headers={
                k: v
                for k, v in handler.headers.items()
                if k.lower() in {"authorization", "content-type", "accept"}
            },
            trust_env=False,
        )
        headers = {"Content-Type": response.headers.get("content-type", "text/plain")}
        return response.status_code, response.content, headers

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("forward_first", "created"),
    [(False, True), (True, False)],
    ids=["503-before-the-broker", "503-after-the-broker-committed"],
)
def test_a_proxy_503_is_ridden_out_and_never_makes_two_effects(
    live, api_key, forward_first, created
) -> None:
    proxy = FlakyProxy(live.url, forward_first=forward_first)
    sleeps: list[float] = []
    try:
        with live.client(
            api_key,
            base_url=proxy.url,
            retry=RetryPolicy(attempts=3, initial_delay=0.05),
            sleep=sleeps.append,
        ) as broker:
            effect = broker.submit("order:45:charge:v1", TOOLS["idempotent"], ARGS)
            done = broker.wait(effect.effect_id, timeout=30)
    finally:
        proxy.close()
    # The client resent once; when the broker had committed, the resend was a replay
    assert proxy.refused == 1
    assert len([s for s in sleeps if s > 0]) >= 1
    assert (effect.created, effect.replayed) == (created, not created)
    assert proxy.forwarded.count("POST") == (2 if forward_first else 1)
    assert EffectIntent.objects.filter(operation_key="order:45:charge:v1").count() == 1
    assert done.status == "succeeded"
    assert live.target.count_charges(mode="idempotent") == 1


def test_the_async_client_and_decorator_over_real_http(live, api_key) -> None:
    async def scenario() -> tuple[dict, Any]:
        async with AsyncBrokerClient(live.url, api_key) as broker:

            @broker.effect(
                tool=TOOLS["reconcilable"],
                key=lambda order, **_: f"order:{order}:charge:v1",
            )
            async def charge(order: str, amount_minor: int, currency: str) -> dict: ...

            result = await charge(**ARGS)
            replay = await broker.submit(
                "order:42:charge:v1", TOOLS["reconcilable"], ARGS
            )
            return result, replay

    result, replay = asyncio.run(scenario())
    assert result
    assert replay.replayed is True
    assert live.target.count_charges(mode="reconcilable") == 1


def test_a_client_written_only_from_the_idempotency_key_draft(live, api_key) -> None:
    # Given a client that knows the draft, the tool and its arguments, and nothing of
    # the broker's body format (issue 21's acceptance line), over real HTTP
    headers = {"Authorization": f"Bearer {api_key}"}
    body = {"tool": TOOLS["idempotent"], "arguments": ARGS}
    with httpx.Client(base_url=live.url, headers=headers, trust_env=False) as http:

        def post(key: Any, json: Any = body) -> httpx.Response:
            keyed = [("Idempotency-Key", k) for k in key] if key else []
            return http.post("/v1/effects", json=json, headers=keyed)

        first = post(['"order:77:charge"'])
        again = post(['"order:77:charge"'])
        drift = post(['"order:77:charge"'], {**body, "arguments": {**ARGS, "x": 1}})
        missing = post([])
        twice = post(['"order:78:charge"', '"order:79:charge"'])
        described = http.get(drift.json()["type"])
    # Then: a creation (202), a marked replay, the draft's 422, and 400s
    assert first.status_code == 202
    assert (again.status_code, again.headers["Idempotent-Replayed"]) == (200, "true")
    assert again.json()["effect_id"] == first.json()["effect_id"]
    assert drift.status_code == 422
    assert drift.headers["Content-Type"] == "application/problem+json"
    assert drift.json()["code"] == "payload_conflict"
    assert (missing.status_code, missing.json()["code"]) == (400, "invalid_request")
    # Two header lines reach the application joined: refused, nothing reserved
    assert (twice.status_code, twice.json()["field"]) == (400, "Idempotency-Key")
    assert "one header" in twice.json()["detail"]
    assert (
        not EffectIntent.objects.filter(operation_key__startswith="order:7")
        .exclude(operation_key="order:77:charge")
        .exists()
    )
    # And the problem's type resolves, on the broker that answered
    assert described.status_code == 200
    assert "What to do:" in described.text
    with live.client(api_key) as broker:
        broker.wait(first.json()["effect_id"], timeout=30)
    assert live.target.count_charges(mode="idempotent") == 1


# --- waiting for a person: until="settled" over the long-poll (issue 23, item 3) ------

EVIDENCE = {"source": "the target's charges table", "reference": "row for order 42"}


def unknown_effect(broker: BrokerClient, live: LiveBroker, key: str) -> Effect:
    """An unsafe charge the target committed and whose answer it dropped: the broker
    cannot know, so the effect waits in outcome_unknown for an operator."""
    live.target.inject("drop_connection_after_commit")
    submitted = broker.submit(key, TOOLS["unsafe"], ARGS)
    with pytest.raises(OutcomeUnknown) as unknown:
        broker.wait(submitted.effect_id, timeout=30)
    assert unknown.value.needs_operator is True
    return unknown.value.effect


def resolve_from_cli(live: LiveBroker, effect_id: str, *verdict: str) -> str:
    """``effect-broker effects resolve`` as an operator runs it, in its own process."""
    make_operator("olga")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "effect_broker.cli", "effects", "resolve"),
            *(effect_id, *verdict, "--as", "olga"),
        ],
        cwd=ROOT,
        env=live.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def status_of(key: str) -> str | None:
    """The status of the effect ``key`` names, None before it is reserved."""
    return (
        EffectIntent.objects.filter(operation_key=key)
        .values_list("status", flat=True)
        .first()
    )


def until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Waiter(threading.Thread):
    """Runs one blocking SDK call, keeping what it returned or raised."""

    def __init__(self, call: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.result: Any = None
        self.error: BaseException | None = None
        self.returned_at = 0.0

    def run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as exc:
            self.error = exc
        self.returned_at = time.monotonic()


def counted_client(live: LiveBroker, api_key: str, paths: list[str]) -> BrokerClient:
    """A client whose every request's path is appended to ``paths``."""
    http = httpx.Client(
        base_url=live.url,
        trust_env=False,
        timeout=10.0,
        event_hooks={"request": [lambda request: paths.append(request.url.path)]},
    )
    return BrokerClient(live.url, api_key, http_client=http)


def test_perform_waits_for_the_operator_who_resolves_it_from_the_cli(
    live, api_key
) -> None:
    # Given an unsafe charge whose answer was lost after the target committed it,
    # performed by a workflow step that would rather wait for a person than fail
    live.target.inject("drop_connection_after_commit")
    paths: list[str] = []
    key = "order:46:charge:v1"
    with counted_client(live, api_key, paths) as broker:
        waiter = Waiter(
            lambda: broker.perform(
                key,
                tool=TOOLS["unsafe"],
                arguments=ARGS,
                on_unknown="wait",
                timeout=120,
            )
        )
        started = time.monotonic()
        waiter.start()
        until(lambda: status_of(key) == "outcome_unknown", "the unknown outcome")
        # the call does not raise OutcomeUnknown: it keeps waiting for the operator
        waiter.join(1.0)
        assert waiter.is_alive()
        # When an operator who checked the target resolves it from the CLI
        effect_id = str(EffectIntent.objects.get(operation_key=key).id)
        said = resolve_from_cli(
            live,
            effect_id,
            "--succeeded",
            "--reason",
            "charge found in the target's table",
            "--evidence",
            json.dumps(EVIDENCE),
        )
        resolved_at = time.monotonic()
        waiter.join(60)
    # Then the call returns the resolution's result, and the target charged once
    assert "outcome_unknown -> succeeded" in said
    assert waiter.error is None, waiter.error
    assert waiter.result == EVIDENCE
    assert live.target.count_charges(mode="unsafe") == 1
    # Woken by the change, not found by reading every second: long-polls only (one
    # per MAX_WAIT_SECONDS at most), then the receipt
    waits = [p for p in paths if p.endswith("/wait")]
    waited = waiter.returned_at - started
    assert 1 <= len(waits) <= math.ceil(waited / MAX_WAIT_SECONDS) + 1, paths
    assert waiter.returned_at - resolved_at < MAX_WAIT_SECONDS / 2
    assert [p for p in paths if p not in waits] == [
        "/v1/effects",
        f"/v1/effects/{effect_id}/receipt",
    ]
    print(
        f"\n{len(waits)} long-poll(s) over {waited:.1f}s; answered "
        f"{waiter.returned_at - resolved_at:.2f}s after the CLI exited"
    )


def test_an_operators_failed_verdict_ends_the_wait_with_the_final_failure(
    live, api_key
) -> None:
    with live.client(api_key) as broker:
        effect = unknown_effect(broker, live, "order:47:charge:v1")
        waiter = Waiter(
            lambda: broker.wait(effect.effect_id, timeout=120, until="settled")
        )
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive()
        # (the operator's service, as the CLI above calls it: one CLI start is enough)
        resolution.resolve(
            tenant_of(effect.effect_id),
            effect.effect_id,
            "failed",
            operator=make_operator("olga"),
            reason="customer cancelled",
        )
        waiter.join(60)
        assert not waiter.is_alive()
        assert waiter.error is None, waiter.error
        # wait() returns the settled effect; perform() raises its final failure
        assert waiter.result.status == "failed_final"
        with pytest.raises(EffectFailed) as failed:
            broker.perform(
                "order:47:charge:v1",
                tool=TOOLS["unsafe"],
                arguments=ARGS,
                on_unknown="wait",
            )
    # and says what is known: an operator's decision, not proof that nothing happened
    assert failed.value.effect.effect_id == effect.effect_id
    assert "nothing proved that it did not take effect" in str(failed.value)
    assert live.target.count_charges(mode="unsafe") == 1


def test_a_settled_wait_that_runs_out_is_still_unknown_or_still_running(
    live, api_key
) -> None:
    with live.client(api_key) as broker:
        # An operator's effect nobody resolves: OutcomeUnknown, and it stays unknown
        effect = unknown_effect(broker, live, "order:48:charge:v1")
        started = time.monotonic()
        with pytest.raises(OutcomeUnknown) as unknown:
            broker.wait(effect.effect_id, timeout=1.5, until="settled")
        assert time.monotonic() - started >= 1.5
        assert unknown.value.needs_operator is True
        assert "No operator had after 1.5s" in str(unknown.value)
        assert broker.get(effect.effect_id).status == "outcome_unknown"
        # An effect still in flight (the target holds its answer): WaitTimeout
        live.target.inject("slow_after_commit", seconds=3)
        slow = broker.submit("order:49:charge:v1", TOOLS["idempotent"], ARGS)
        with pytest.raises(WaitTimeout) as running:
            broker.wait(slow.effect_id, timeout=1.0, until="settled")
        assert running.value.effect.status in {"prepared", "dispatching"}
        assert broker.wait(slow.effect_id, timeout=30, until="settled").settled


def test_long_polls_hold_no_connection_nor_slot_and_wake_on_the_resolution(
    live, api_key
) -> None:
    # Given an effect waiting for an operator, and twice as many long-polls on it as
    # the server has connections and request slots
    with live.client(api_key) as broker:
        effect = unknown_effect(broker, live, "order:50:charge:v1")
    headers = {"Authorization": f"Bearer {api_key}"}
    path = f"/v1/effects/{effect.effect_id}/wait"
    query = {"timeout": str(MAX_WAIT_SECONDS), "until": "settled"}

    def poll() -> httpx.Response:
        return httpx.get(
            live.url + path, params=query, headers=headers, trust_env=False, timeout=60
        )

    polls = [Waiter(poll) for _ in range(2 * POOL)]
    for waiter in polls:
        waiter.start()
    time.sleep(1.0)  # every poll is in, and waiting
    # When other requests arrive meanwhile, they are answered at once: no poll holds
    # a pooled connection or one of the in-flight slots
    started = time.monotonic()
    with live.client(api_key, retry=RetryPolicy(attempts=1)) as other:
        assert other.get(effect.effect_id).status == "outcome_unknown"
        assert other.submit("order:51:charge:v1", TOOLS["idempotent"], ARGS).created
    served_in = time.monotonic() - started
    assert all(waiter.is_alive() for waiter in polls)
    # And when the operator resolves the effect, every poll answers with it, woken by
    # the change long before its 25 s were up
    resolution.resolve(
        tenant_of(effect.effect_id),
        effect.effect_id,
        "succeeded",
        operator=make_operator("olga"),
        reason="charge found",
        evidence=EVIDENCE,
    )
    resolved_at = time.monotonic()
    for waiter in polls:
        waiter.join(60)
    answers = [waiter.result for waiter in polls]
    assert [a.status_code for a in answers] == [200] * len(polls), answers
    assert {a.json()["status"] for a in answers} == {"succeeded"}
    woken_in = max(waiter.returned_at for waiter in polls) - resolved_at
    assert woken_in < MAX_WAIT_SECONDS / 2
    print(f"\nother requests served in {served_in:.2f}s; polls woken in {woken_in:.2f}s")


def test_the_long_poll_is_tenant_scoped_and_bounded(live, api_key) -> None:
    with live.client(api_key) as broker:
        done = broker.submit("order:52:charge:v1", TOOLS["idempotent"], ARGS)
        broker.wait(done.effect_id, timeout=30)
    path = f"{live.url}/v1/effects/{done.effect_id}/wait"
    mine = {"Authorization": f"Bearer {api_key}"}
    theirs = {"Authorization": f"Bearer {create_tenant('sdk-live-other')[1]}"}

    def get(headers: dict[str, str], **query: str) -> httpx.Response:
        return httpx.get(path, params=query, headers=headers, trust_env=False, timeout=60)

    started = time.monotonic()
    settled = get(mine, timeout=str(MAX_WAIT_SECONDS))
    # A settled effect is answered at once, as GET /v1/effects/{id} answers it
    assert time.monotonic() - started < MAX_WAIT_SECONDS / 2
    assert settled.status_code == 200
    plain = httpx.get(
        f"{live.url}/v1/effects/{done.effect_id}", headers=mine, trust_env=False
    )
    assert settled.json() == plain.json()
    # Another tenant's key sees no such effect; no key is a 401
    assert (get(theirs).status_code, get(theirs).json()["code"]) == (
        404,
        "effect_not_found",
    )
    assert get({}).status_code == 401
    # Longer than the cap, negative, not a number, an unknown until: 422, at once
    for query in (
        {"timeout": str(MAX_WAIT_SECONDS + 1)},
        {"timeout": "-1"},
        {"timeout": "nan"},
        {"until": "resolved"},
    ):
        refused = get(mine, **query)
        assert (refused.status_code, refused.json()["code"]) == (422, "invalid_request")
