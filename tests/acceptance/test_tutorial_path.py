"""The tutorial's first steps work on a machine with no PostgreSQL (issue 20).

Step 0 exported a DATABASE_URL for a server on 127.0.0.1:5432 right after saying none
was needed, and step 1's target crashed without it. Now step 0 takes the URL from
``effect-broker db url`` (the embedded server); this runs steps 0, 1 and 3 as written,
on a scratch database of that server, with a free port instead of 8081.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest

from tests import docs_pages

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = "docs/tutorial/first-hour.md"
pytestmark = pytest.mark.slow


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effect_broker.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_steps_0_1_and_3_run_on_the_embedded_server(tmp_path: Path) -> None:
    # Given step 0 as the tutorial prints it
    setup = docs_pages.snippet("run-it-setup")
    assert "export DATABASE_URL=$(effect-broker db url)" in setup
    tutorial = docs_pages.page(TUTORIAL)
    target_line = re.search(
        r"^python -m examples\.crash_matrix\.target_service .*$", tutorial, re.M
    )
    assert target_line is not None
    assert '--database-url "$DATABASE_URL" --port 8081' in target_line.group(0)
    # When `effect-broker db url` gives the URL (a scratch database, not the default)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    name = f"eb_tutorial_{uuid.uuid4().hex[:8]}"
    found = cli("db", "url", "--dbname", name, env=env)
    assert found.returncode == 0, found.stderr
    url = found.stdout.strip()
    env = {**env, "DATABASE_URL": url}
    port = free_port()
    log = (tmp_path / "target.log").open("wb")
    target = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "examples.crash_matrix.target_service",
            "--database-url",
            url,
            "--port",
            str(port),
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        # Then step 1's target starts and answers
        deadline = time.monotonic() + 60
        while True:
            assert target.poll() is None, (tmp_path / "target.log").read_text()[-2000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/stats").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the target did not start"
            time.sleep(0.2)
        # And step 3 migrates and creates the tenant on the same database
        assert cli("migrate", "-v0", env=env).returncode == 0
        created = cli("tenants", "create", "acme", env=env)
        assert created.returncode == 0, created.stderr
        assert "api key (shown once): eb_" in created.stdout
    finally:
        target.terminate()
        target.wait(15)
        log.close()
        with psycopg.connect(
            url.replace(f"/{name}?", "/postgres?"), autocommit=True
        ) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
