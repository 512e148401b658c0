"""Fixtures for the adapter contract suite: the real target service on loopback.

The target service is a separate process with its own schema in the test database (the
one pytest-django created), so its truth survives anything the adapter under test does.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from config.database import url_from_settings
from examples.crash_matrix.target_client import TargetProcess, start_target

ROOT = Path(__file__).resolve().parents[2]
#: Short, so the reconcilable checks stay fast; the contracts below declare more.
SETTLEMENT_DELAY = "300ms"


@pytest.fixture(scope="session")
def target_database_url(django_db_setup: None, django_db_blocker: Any) -> str:
    """URL of the test database (after pytest-django created it)."""
    from django.db import connection

    with django_db_blocker.unblock():
        connection.ensure_connection()  # starts the embedded server if that is in use
        url = url_from_settings(connection.settings_dict)
        connection.close()
    with psycopg.connect(url, autocommit=True) as conn:  # fail here, not in a child
        conn.execute("SELECT 1")
    return url


@pytest.fixture(scope="session")
def target_service(target_database_url: str) -> Iterator[TargetProcess]:
    """One target service process for the session; tests reset it before use."""
    target = start_target(
        target_database_url, settlement_delay=SETTLEMENT_DELAY, schema="contract_target"
    )
    try:
        yield target
    finally:
        # Stopped before pytest-django drops the test database it is connected to.
        target.stop()


@pytest.fixture
def target(target_service: TargetProcess) -> TargetProcess:
    """The session's target service, reset to an empty table and no faults."""
    target_service.reset()
    return target_service


@pytest.fixture
def http_payments(target: TargetProcess, tmp_path: Path) -> Iterator[str]:
    """The example payments MCP server over streamable HTTP, charging via ``target``:
    its ``/mcp`` URL once it has written the port it bound."""
    port_file = tmp_path / "port"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "examples.mcp_upstream.payments_server",
            "--target",
            target.url,
            "--transport",
            "http",
            "--port",
            "0",
            "--port-file",
            str(port_file),
        ],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    try:
        # A hang guard: the server starts in about a second alone, but took over 30 s
        # on a machine at load average 28.
        deadline = time.monotonic() + 120
        while not port_file.exists():
            assert process.poll() is None, "the payments server exited"
            assert time.monotonic() < deadline, "the payments server did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{int(port_file.read_text())}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=10)
