"""The real ``effect-broker`` console script, run as a subprocess like a user would."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "effect_broker.cli", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def scratch_db_env() -> dict[str, str]:
    """Point the subprocess at a scratch database on the same server as the tests."""
    name = f"eb_cli_{uuid.uuid4().hex[:8]}"
    url = os.environ.get("DATABASE_URL")
    if url:
        base, _, _ = url.rpartition("/")
        query = ""
        if "?" in url:
            query = "?" + url.split("?", 1)[1]
        return {"DATABASE_URL": f"{base}/{name}{query}", "EB_SCRATCH": name}
    return {"EFFECT_BROKER_DB_NAME": name, "EB_SCRATCH": name}


def drop(name: str) -> None:
    from django.db import connection

    with connection._nodb_cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.django_db
def test_demo_reservation_reserves_replays_and_refuses_drift() -> None:
    env = scratch_db_env()
    if "DATABASE_URL" in env:
        from django.db import connection

        with connection._nodb_cursor() as cur:
            cur.execute(f'CREATE DATABASE "{env["EB_SCRATCH"]}"')
    try:
        result = run("demo", "reservation", env=env)
    finally:
        drop(env["EB_SCRATCH"])
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "created=True status=prepared" in out
    assert "created=False replayed=True same effect=True" in out
    assert "refused [payload_conflict]" in out
    assert "result: 1 intent, 1 event, event chain verified (1)" in out


def test_a_bad_master_key_is_one_line_and_exit_2() -> None:
    result = run("check", env={"EFFECT_BROKER_MASTER_KEY": "not-base64!"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "effect-broker: error [configuration]: "
        "EFFECT_BROKER_MASTER_KEY is not valid base64"
    ]
    assert "Traceback" not in result.stderr


def test_production_refuses_to_start_without_its_settings() -> None:
    env = {
        "EFFECT_BROKER_ENV": "production",
        "DATABASE_URL": "",
        "EFFECT_BROKER_MASTER_KEY": "",
        "SECRET_KEY": "",
    }
    result = run("check", env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("effect-broker: refusing to start in production:")
    for missing in ("DATABASE_URL", "EFFECT_BROKER_MASTER_KEY", "SECRET_KEY"):
        assert missing in lines[0]


def test_help_lists_the_project_commands() -> None:
    result = run("help")
    assert result.returncode == 0
    for command in ("db", "demo", "tenants"):
        assert command in result.stdout


def test_a_reader_that_leaves_early_ends_the_command_quietly() -> None:
    # Given a pipe whose reader has already gone (`effect-broker help | head -0`)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        # When a command writes to it
        result = subprocess.run(
            [sys.executable, "-m", "effect_broker.cli", "help"],
            cwd=ROOT,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    # Then it stops as a Unix tool stopped by SIGPIPE does: no error line, no traceback
    assert result.stderr == ""
    assert result.returncode == 141


@pytest.mark.django_db
def test_an_unmigrated_database_names_the_command_that_fixes_it() -> None:
    # Given a database with no broker tables
    env = scratch_db_env()
    from django.db import connection

    with connection._nodb_cursor() as cur:
        cur.execute(f'CREATE DATABASE "{env["EB_SCRATCH"]}"')
    try:
        # When an operator lists effects there
        result = run("effects", "list", env=env)
    finally:
        drop(env["EB_SCRATCH"])
    # Then one line says what is wrong and what to run
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "does not exist" in lines[0]
    assert "run `effect-broker migrate` first" in lines[0]
