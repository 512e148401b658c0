"""A server process a test started: wait until its /healthz answers, stop it after."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

import httpx


def wait_healthy(
    process: subprocess.Popen[bytes],
    base: str,
    what: str,
    log: IO[bytes] | None = None,
    timeout: float = 60,
) -> None:
    """Block until ``base``/healthz answers 200; fail with ``log``'s tail if it exits."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            tail = ""
            if log is not None:
                log.seek(0)
                tail = ":\n" + log.read().decode(errors="replace")[-3000:]
            raise AssertionError(f"{what} exited{tail}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{what} did not start"
        time.sleep(0.2)


@contextmanager
def served(
    process: subprocess.Popen[bytes],
    base: str,
    what: str,
    log: IO[bytes] | None = None,
) -> Iterator[str]:
    """``base`` once healthy; SIGTERM (then SIGKILL) the process afterwards."""
    try:
        wait_healthy(process, base, what, log)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
