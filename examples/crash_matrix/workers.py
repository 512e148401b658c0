"""Real worker processes that tests and the crash matrix can kill.

A worker is ``python -m effect_broker.cli worker``: the same command an operator runs,
which keeps running through database outages (``effect_broker.workers``). It gets the
parent's database through ``DATABASE_URL``, and optional failpoints through
``EFFECT_BROKER_FAILPOINTS``; at a failpoint it SIGKILLs itself.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[2]

#: Short leases and sweeps, so a killed effect converges in seconds (defaults: 30 s).
FAST_RECOVERY = {
    "EFFECT_BROKER_LEASE_SECONDS": "3",
    "EFFECT_BROKER_HEARTBEAT_SECONDS": "1",
    # The send gate keeps this much of the lease in reserve (default 2 s of 30 s).
    "EFFECT_BROKER_SEND_MARGIN_SECONDS": "0.5",
    "EFFECT_BROKER_SWEEP_SECONDS": "1",
    "EFFECT_BROKER_STALLED_JOB_SECONDS": "4",
    "EFFECT_BROKER_REDEFER_GRACE_SECONDS": "2",
}

T = TypeVar("T")


def broker_env(
    database_url: str,
    contracts: Path,
    master_key: bytes,
    *,
    failpoints: str = "",
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment for a broker child process sharing the parent's database and keys."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EFFECT_BROKER_", "PROCRASTINATE_"))
    }
    env.update(FAST_RECOVERY)
    env.update(
        {
            "DATABASE_URL": database_url,
            "EFFECT_BROKER_CONTRACTS": str(contracts),
            "EFFECT_BROKER_MASTER_KEY": base64.b64encode(master_key).decode(),
            "EFFECT_BROKER_FAILPOINTS": failpoints,
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra or {})
    return env


class WorkerProcess:
    """One worker subprocess with the signals a crash test needs."""

    def __init__(
        self, name: str, env: Mapping[str, str], *, concurrency: int = 2
    ) -> None:
        self.name = name
        self._logdir = tempfile.TemporaryDirectory(prefix=f"eb-{name}-")
        self.log_path = Path(self._logdir.name) / "worker.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "effect_broker.cli",
                "worker",
                "-n",
                name,
                "-c",
                str(concurrency),
            ],
            cwd=ROOT,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # Its own session: a test's Ctrl-C must not reach it, our signals only.
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self.process.pid

    def alive(self) -> bool:
        """True while the process has not exited."""
        return self.process.poll() is None

    def pause(self) -> None:
        """SIGSTOP: the process and all its threads freeze (a GC pause, a VM stall)."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL, as the kernel's OOM killer would."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit; return its exit code (negative: signal)."""
        return self.process.wait(timeout=timeout)

    def stop(self, timeout: float = 15.0) -> None:
        """Ask for a graceful stop (SIGTERM), then SIGKILL if it does not go."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.close()

    def close(self) -> None:
        """Release the log file and its folder."""
        self._log.close()
        self._logdir.cleanup()

    def log_tail(self, lines: int = 30) -> str:
        """The last lines the worker printed (for failure messages)."""
        self._log.flush()
        text = self.log_path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])


def wait_until(
    check: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.1,
    what: str = "",
) -> T:
    """Poll ``check`` until it returns something truthy; raise TimeoutError after."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"timed out after {timeout:.0f}s waiting for {what or check}"
            )
        time.sleep(interval)
