"""``dbos_key`` against DBOS's documented retry semantics, with DBOS itself running.

DBOS keeps its workflow state in a system database. It runs on PostgreSQL here, as it
would in production next to the broker (its SQLite store fails to start on Python 3.13:
``NOT NULL constraint failed: application_versions.version_timestamp``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from config.database import url_from_settings
from effect_broker.keys import dbos_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def system_database() -> Iterator[str]:
    """A URL for a DBOS system database on the test server; dropped afterwards."""
    name = f"dbos_keys_{uuid.uuid4().hex[:8]}"
    yield url_from_settings(connection.settings_dict, dbname=name)
    admin = url_from_settings(connection.settings_dict)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_dbos_key_is_the_same_across_step_retries_and_workflow_reruns(
    system_database: str,
) -> None:
    dbos = pytest.importorskip("dbos")
    dbos.DBOS(config={"name": "keys-test", "system_database_url": system_database})
    seen: list[str] = []
    failures = {"left": 2}

    @dbos.DBOS.step(retries_allowed=True, max_attempts=3, interval_seconds=0.01)
    def charge(order: str) -> str:
        seen.append(dbos_key(dbos.DBOS.workflow_id, dbos.DBOS.step_id))
        if failures["left"]:
            failures["left"] -= 1
            raise ConnectionError("answer lost")
        return "charged"

    @dbos.DBOS.step()
    def email(order: str) -> str:
        seen.append(dbos_key(dbos.DBOS.workflow_id, dbos.DBOS.step_id))
        return "sent"

    @dbos.DBOS.workflow()
    def checkout(order: str) -> str:
        return charge(order) + email(order)

    dbos.DBOS.launch()
    try:
        for _ in range(2):  # the second run of the same workflow id replays
            with dbos.SetWorkflowID("checkout-42"):
                assert checkout("42") == "chargedsent"
    finally:
        dbos.DBOS.destroy(destroy_registry=True)
    charge_key, email_key = seen[0], seen[-1]
    # Three attempts of the step, one key; the next step has its own; nothing re-ran.
    assert seen == [charge_key] * 3 + [email_key]
    assert charge_key.startswith("dbos:checkout-42:")
    assert charge_key != email_key
