"""``effect-broker demo agent`` as a user runs it (issue 10, items 7 and 8): the scripted
agent's charge, delivered three times over a real MCP stdio session while a real
worker process is SIGKILLed after the target committed, leaves exactly one charge in
the target's own table - read here with our own SQL, not from the demo's output."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow]


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    # The user's environment minus broker settings; DATABASE_URL stays if set, so the
    # demo runs where the rest of the suite runs (embedded PostgreSQL otherwise).
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_BROKER_")}
    return subprocess.run(
        [sys.executable, "-m", "effect_broker.cli", "demo", "agent", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def drop(url: str) -> None:
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_scripted_agent_under_a_worker_kill_leaves_exactly_one_target_charge() -> (
    None
):
    # When the demo runs (keeping its scratch database so we can look ourselves)
    result = run_demo("--keep-database")
    out = result.stdout
    kept = re.search(r"^kept database: (\S+)$", out, flags=re.MULTILINE)
    try:
        # Then it exits 0 with the count and the verdict, and no traceback anywhere
        assert result.returncode == 0, out + result.stderr
        assert "TARGET CHARGE COUNT: 1" in out
        assert "verdict: PASS" in out
        assert "Traceback" not in out + result.stderr
        # the call really was delivered three times and the worker really was killed
        assert out.count("delivery ") == 3
        assert re.search(r"delivery [123]/3: succeeded", out)
        assert "SIGKILLed at after_target_commit" in out
        assert "replacement worker w2" in out
        # and the receipt is printed
        assert '"receipt_id"' in out
        assert kept is not None, out

        # And the target's own table, read directly, holds exactly one charge, made
        # under the downstream key the demo reports
        with psycopg.connect(kept.group(1), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT id, mode, idempotency_key FROM agent_demo_target.charges"
            ).fetchall()
            intents = conn.execute("SELECT count(*) FROM effect_intents").fetchone()
        assert len(rows) == 1
        charge_id, mode, key = rows[0]
        assert mode == "idempotent"
        assert f"under this effect's Idempotency-Key {key}" in out
        assert f'"external_id": "{charge_id}"' in out
        # the three deliveries were one intent in the broker's ledger
        assert intents == (1,)
    finally:
        if kept is not None:
            drop(kept.group(1))


def test_a_delivery_count_out_of_range_is_one_line_and_exit_2() -> None:
    result = run_demo("--deliveries", "0")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "effect-broker: error [invalid_request]: --deliveries must be between 1 and 10"
    ]
    assert result.stdout == ""  # refused before anything was started
