"""Production serves as a role that is not the tables' owner (issue 20, item 4).

docs/fencing.md: nothing binds a table's owner, so the compose stack migrates as the
owner and runs the API and workers as a role granted by ``effect-broker db grant``.
Given such a role on a freshly migrated database, the broker's whole write path works
(tenant, submit with its job, claim, attempt, outcome, receipt), and what only an
owner or a DELETE grant could do to the ledger is refused by PostgreSQL itself.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors

from config.database import url_from_settings

ROOT = Path(__file__).resolve().parents[2]

SERVE = """
from effect_broker.domain.records import EffectRequest
from effect_broker.services.dispatch import dispatch
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant
tenant = create_tenant("shop")[0]
effect = submit(tenant, EffectRequest(operation_key="order:1:charge", tool="charge_card",
    arguments={"order": "1", "amount_minor": 100, "currency": "EUR"})).effect
print("STATUS=" + dispatch(effect.effect_id, worker="w1").status.value)
"""


def as_role(url: str, role: str) -> str:
    return re.sub(r"^(postgresql://)[^@/]*@", rf"\g<1>{role}@", url)


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_BROKER_")}
    return subprocess.run(
        [sys.executable, "-m", "effect_broker.cli", *args],
        cwd=ROOT,
        env={**env, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.fixture
def database(django_db_blocker: Any) -> Iterator[tuple[str, str, str]]:
    """A scratch database owned by a fresh owner role, and a fresh serving role."""
    from django.db import connection

    suffix = uuid.uuid4().hex[:8]
    name, owner, app = f"eb_roles_{suffix}", f"eb_owner_{suffix}", f"eb_app_{suffix}"
    with django_db_blocker.unblock():
        connection.ensure_connection()
        url = url_from_settings(connection.settings_dict, dbname=name)
        with connection._nodb_cursor() as cur:
            cur.execute(f'CREATE ROLE "{owner}" LOGIN')
            cur.execute(f'CREATE ROLE "{app}" LOGIN')
            cur.execute(f'CREATE DATABASE "{name}" OWNER "{owner}"')
    try:
        yield url, owner, app
    finally:
        with django_db_blocker.unblock(), connection._nodb_cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            cur.execute(f'DROP ROLE IF EXISTS "{app}"')
            cur.execute(f'DROP ROLE IF EXISTS "{owner}"')


@pytest.mark.slow
def test_a_granted_role_serves_and_cannot_rewrite_the_ledger(
    database: tuple[str, str, str],
) -> None:
    url, owner, app = database
    # Given the owner migrated and granted the serving role
    for args in (["migrate", "-v0"], ["db", "grant", "--role", app]):
        done = cli(as_role(url, owner), *args)
        assert done.returncode == 0, done.stderr[-2000:]
    # When the serving role runs the write path: tenant, submit, dispatch
    served = cli(as_role(url, app), "shell", "-c", SERVE)
    # Then it works
    assert served.returncode == 0, served.stderr[-2000:]
    assert "STATUS=succeeded" in served.stdout
    # And PostgreSQL refuses it what only an owner or a DELETE grant could do
    refused = {
        "TRUNCATE effect_events": errors.InsufficientPrivilege,
        "DELETE FROM effect_intents": errors.InsufficientPrivilege,
        "ALTER TABLE effect_events DISABLE TRIGGER ALL": errors.InsufficientPrivilege,
        "DROP TRIGGER effect_events_append_only ON effect_events": (
            errors.InsufficientPrivilege
        ),
        "CREATE TABLE eb_extra (id int)": errors.InsufficientPrivilege,
    }
    with psycopg.connect(as_role(url, app), autocommit=True) as conn:
        for statement, error in refused.items():
            with pytest.raises(error):
                conn.execute(statement)
        # while the jobs it must clean up stay deletable
        conn.execute("DELETE FROM procrastinate_jobs WHERE false")
        events = conn.execute("SELECT count(*) FROM effect_events").fetchone()
    assert events is not None
    assert events[0] >= 3


def test_grant_without_a_role_is_one_line_and_exit_2() -> None:
    done = cli("postgresql://nobody@127.0.0.1:1/none", "db", "grant")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "effect-broker: error [invalid_request]: "
        "db grant needs --role NAME (the serving role)"
    ]
