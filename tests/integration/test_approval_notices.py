"""Issue 24, item 5: the approval webhook, against a real HTTP server on 127.0.0.1.

An effect that starts awaiting approval gets a ``notify_approval`` job (committed with
its reservation, never run on the submit's request path); the job POSTs a
Slack-compatible document signed with HMAC-SHA256, carrying the effect id, the tool,
the preview fields and the approval URL - never the arguments, a secret reference's
value or the operation key - and a failed POST fails the job, which procrastinate
retries.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from django.db import connection
from django.test import override_settings

from effect_broker import tasks
from effect_broker.scheduling import ProcrastinateScheduler
from effect_broker.services import approval_notices, approvals, runtime
from effect_broker.services.approval_notices import SIGNATURE_HEADER
from tests.integration.approval_support import APPROVED, approval_contracts, charge
from tests.integration.engine.harness import Bench

SECRET = "whsec_test_only"


class Receiver(ThreadingHTTPServer):
    """A webhook receiver: records every POST, answers with the next queued status."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.statuses: list[int] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hooks/approvals"


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append(({k: v for k, v in self.headers.items()}, body))
        status = self.server.statuses.pop(0) if self.server.statuses else 200
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def hooked(bench: Bench, receiver: Receiver) -> Iterator[Bench]:
    """The approval contracts deployed (with a secret reference declared), and the
    webhook pointed at the receiver."""
    with (
        approval_contracts(extra='secrets = ["env:STRIPE_KEY"]'),
        override_settings(
            EFFECT_BROKER_APPROVAL_WEBHOOK_URL=receiver.url,
            EFFECT_BROKER_APPROVAL_WEBHOOK_SECRET=SECRET,
            EFFECT_BROKER_PUBLIC_URL="https://broker.example.com/",
        ),
    ):
        yield bench


ARGUMENTS = {
    "amount_minor": 120000,
    "currency": "EUR",
    "card": "tok_4242_not_for_slack",
    "api_key": {"$secret": "env:STRIPE_KEY"},
}


def notices_asked(bench: Bench) -> list[str]:
    return [e for kind, e, _ in bench.scheduler.requests if kind == "notify_approval"]


def test_the_notice_is_signed_slack_json_with_the_preview_and_nothing_secret(
    hooked: Bench, receiver: Receiver
) -> None:
    # Given an effect that starts awaiting approval
    record = charge(hooked, key="order:99:charge", **ARGUMENTS)
    # Then its notice was asked for, and nothing was sent on the submit's path
    assert notices_asked(hooked) == [record.effect_id]
    assert receiver.received == []
    # When the job runs, and the receiver fails the first POST
    receiver.statuses = [503]
    with pytest.raises(httpx.HTTPStatusError):
        approval_notices.send_notice(record.effect_id)
    # Then the job fails (procrastinate retries it, with growing waits) ...
    assert tasks.notify_approval.retry_strategy is not None
    assert tasks.notify_approval.retry_strategy.max_attempts == 7
    # ... and its retry is delivered
    assert approval_notices.send_notice(record.effect_id) == "sent"
    assert len(receiver.received) == 2
    headers, body = receiver.received[-1]
    # Signed: HMAC-SHA256 over "<t>.<raw body>" with the shared secret
    stamp, mac = headers[SIGNATURE_HEADER].split(",")
    timestamp = stamp.removeprefix("t=")
    expected = hmac.new(
        SECRET.encode(), f"{timestamp}.".encode() + body, hashlib.sha256
    ).hexdigest()
    assert mac == f"v1={expected}"
    assert headers["Content-Type"] == "application/json"
    # Slack-compatible: text and blocks; the facts for machines beside them
    document = json.loads(body)
    url = (
        "https://broker.example.com/admin/effect_broker/effectintent/"
        f"{record.effect_id}/change/#approval"
    )
    assert url in document["text"]
    assert document["blocks"][0]["type"] == "section"
    facts = document["effect_broker"]
    assert facts == {
        "event": "approval_requested",
        "effect_id": record.effect_id,
        "tool": APPROVED,
        "contract": "t.approved@1",
        "safety_class": "idempotent",
        "approval_deadline": record.next_action_at.isoformat()
        if record.next_action_at
        else None,
        "approval_url": url,
        "preview": {"amount_minor": 120000, "currency": "EUR", "$hidden_fields": 2},
    }
    # Never an argument outside the preview, a secret reference or the operation key
    for leak in ("tok_4242", "STRIPE_KEY", "$secret", "order:99"):
        assert leak not in body.decode()


def test_a_decided_effect_is_not_announced(
    hooked: Bench, receiver: Receiver, operator: Any
) -> None:
    record = charge(hooked, **ARGUMENTS)
    approvals.approve(hooked.tenant, record.effect_id, operator=operator, reason="ok")
    assert approval_notices.send_notice(record.effect_id) == "not awaiting"
    assert receiver.received == []


def test_without_a_webhook_no_notice_is_asked_for(bench: Bench) -> None:
    with approval_contracts():
        charge(bench)
    assert notices_asked(bench) == []


@pytest.mark.django_db(transaction=True)
def test_the_notice_job_commits_with_the_reservation_and_holds_no_effect_lock(
    hooked: Bench,
) -> None:
    # With the real scheduler, the job rides in the reservation statement
    with runtime.override(scheduler=ProcrastinateScheduler()):
        record = charge(hooked)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT task_name, queue_name, lock, queueing_lock FROM procrastinate_jobs "
            "WHERE args->>'effect_id' = %s",
            [record.effect_id],
        )
        jobs = cur.fetchall()
    # One job: the notice (no dispatch job until an operator approves). No effect
    # lock: a notice waiting for its retry must not hold back the approved dispatch.
    assert jobs == [
        (
            "effect_broker.notify_approval",
            "maintenance",
            None,
            f"notice:{record.effect_id}",
        )
    ]
