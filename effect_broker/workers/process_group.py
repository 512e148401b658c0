"""A small supervisor for ``effect-broker dev``: child processes that start, speak
and stop together.

* Each child runs in its own session, so a terminal's Ctrl-C reaches only the
  supervisor, which then sends each child exactly one SIGTERM: a second signal would
  make ``effect-broker worker`` abandon its graceful shutdown.
* On Linux each child also gets SIGTERM when the supervisor dies, even by SIGKILL
  (``PR_SET_PDEATHSIG``), so no child outlives it unseen.
* Their output is one stream, each line prefixed with the child's name.
* ``watch`` returns the first child that exits on its own: the caller decides (``dev``
  stops everything and exits non-zero - a dev stack with a dead part would only
  mislead).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

_PR_SET_PDEATHSIG = 1


class TextSink(Protocol):
    """Where the children's lines go: a text stream or a command's OutputWrapper."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> object: ...


def _die_with_parent() -> None:  # pragma: no cover - runs in the child, pre-exec
    """Ask the kernel for SIGTERM when the parent dies (Linux only)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    """One supervised process."""

    name: str
    process: subprocess.Popen[bytes]
    pump: threading.Thread
    #: Set by ``stop_all``: its exit was asked for.
    stopping: bool = field(default=False)

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.process.pid


class ProcessGroup:
    """Children started, watched and stopped together; see the module doc."""

    def __init__(self, out: TextSink | None = None) -> None:
        self.out: TextSink = out or sys.stdout
        self.children: list[Child] = []
        self._write_lock = threading.Lock()
        self._width = 6

    def say(self, name: str, line: str) -> None:
        """Write one line, prefixed with ``name``."""
        with self._write_lock:
            self.out.write(f"{name:>{self._width}} | {line}\n")
            self.out.flush()

    def start(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: str
    ) -> Child:
        """Start ``argv`` as the child ``name``; its output is prefixed and copied."""
        self._width = max(self._width, len(name))
        process = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        pump = threading.Thread(
            target=self._pump, args=(name, process), name=f"pump-{name}", daemon=True
        )
        child = Child(name, process, pump)
        pump.start()
        self.children.append(child)
        return child

    def _pump(self, name: str, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for raw in iter(process.stdout.readline, b""):
            self.say(name, raw.decode(errors="replace").rstrip())

    def watch(self, stop: threading.Event, poll: float = 0.2) -> Child | None:
        """Wait until ``stop`` is set (None) or a child exits on its own (it)."""
        while not stop.wait(poll):
            for child in self.children:
                if child.process.poll() is not None and not child.stopping:
                    return child
        return None

    def stop_all(
        self, timeout: float, report: Callable[[str], None] | None = None
    ) -> None:
        """SIGTERM every live child (newest first), wait up to ``timeout`` seconds in
        all, then SIGKILL what is left; wait for their output to drain."""
        for child in reversed(self.children):
            child.stopping = True
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in reversed(self.children):
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                if report:
                    report(f"{child.name} did not stop in {timeout:.0f}s: SIGKILL")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.process.wait()
        for child in self.children:
            child.pump.join(timeout=5)
