"""``/readyz`` fails with reasons; ``/healthz`` stays liveness (issue 11 item 3).

Readiness means "work submitted now gets done": Postgres answers with every
migration applied, the contracts file is valid (else every submit is a 500), and a
worker heartbeated within ``EFFECT_BROKER_READY_WORKER_SECONDS``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from tests.job_tables import forget_old_jobs

pytestmark = pytest.mark.django_db


@contextmanager
def live_worker(seconds_ago: float = 0.0) -> Iterator[int]:
    """A procrastinate worker row whose last heartbeat was ``seconds_ago``."""
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO procrastinate_workers (last_heartbeat)"
            " VALUES (now() - make_interval(secs => %s)) RETURNING id",
            [seconds_ago],
        )
        worker_id = cur.fetchone()[0]
    try:
        yield worker_id
    finally:
        with connection.cursor() as cur:
            cur.execute("DELETE FROM procrastinate_workers WHERE id = %s", [worker_id])


def not_ready(client: Client) -> dict[str, Any]:
    response = client.get("/readyz")
    assert response.status_code == 503, response.content
    assert response["Content-Type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["code"] == "not_ready"
    return body


@pytest.fixture(autouse=True)
def no_workers() -> None:
    forget_old_jobs()


def test_ready_with_a_live_worker(client: Client) -> None:
    with live_worker(seconds_ago=1):
        response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready"}


def test_not_ready_without_a_worker_heartbeat_in_the_window(
    client: Client, settings: Any
) -> None:
    settings.EFFECT_BROKER_READY_WORKER_SECONDS = 30
    body = not_ready(client)
    assert body["reasons"] == [
        {"check": "workers", "detail": "no live worker (no heartbeat within 30s)"}
    ]
    with live_worker(seconds_ago=45):  # registered, but dead
        assert not_ready(client)["reasons"][0]["check"] == "workers"
    # Healthz is liveness only: the process answers whatever readiness says.
    assert client.get("/healthz").json() == {"status": "ok"}


def test_zero_window_skips_the_worker_check(client: Client, settings: Any) -> None:
    settings.EFFECT_BROKER_READY_WORKER_SECONDS = 0
    assert client.get("/readyz").status_code == 200


def test_not_ready_on_an_invalid_contracts_file(
    client: Client, settings: Any, tmp_path: Path
) -> None:
    bad = tmp_path / "contracts.toml"
    bad.write_text(
        '[[contract]]\nname = "pay"\nversion = "1"\nsafety = "idempotent"\n',
        encoding="utf-8",
    )
    settings.EFFECT_BROKER_CONTRACTS = str(bad)
    with live_worker():
        body = not_ready(client)
    assert body["reasons"] == [
        {
            "check": "contracts",
            "detail": f"{bad}:pay@1:key_retention: required for safety class idempotent",
        }
    ]
    # Fixed on disk, ready again (the file is re-read when it changes).
    bad.write_text(
        '[[contract]]\nname = "pay"\nversion = "1"\nsafety = "unsafe"\n', encoding="utf-8"
    )
    with live_worker():
        assert client.get("/readyz").status_code == 200


def test_not_ready_with_an_unapplied_migration(client: Client) -> None:
    # Given the ledger's newest migration is recorded as not applied (rolled back
    # with the test's transaction)
    from django.db.migrations.recorder import MigrationRecorder

    newest = (
        MigrationRecorder.Migration.objects.filter(app="effect_broker")
        .order_by("-name")
        .first()
    )
    assert newest is not None
    newest.delete()
    with live_worker():
        body = not_ready(client)
    assert body["reasons"] == [
        {"check": "migrations", "detail": "1 migrations not applied"}
    ]
