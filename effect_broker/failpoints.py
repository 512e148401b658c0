"""Failpoints: named places where a broker process can be told to SIGKILL itself.

Armed by ``EFFECT_BROKER_FAILPOINTS`` (comma-separated names; ``name@N`` fires on the
N-th hit in this process, default the first). At a failpoint the process kills itself
with SIGKILL: no ``finally`` blocks, no atexit, no flushing - exactly what a power cut or
an OOM kill does to a worker. Only the crash matrix and crash tests arm them.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

#: Every failpoint the code defines, in the order an effect passes them.
FAILPOINTS = (
    "before_reservation_commit",
    "after_reservation_commit",
    "before_request_write",
    "after_target_commit",
    "before_receipt_commit",
    "after_receipt_commit",
)

_lock = threading.Lock()
_hits: dict[str, int] = {}


def _armed() -> dict[str, int]:
    raw = os.environ.get("EFFECT_BROKER_FAILPOINTS", "")
    armed: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, _, nth = item.partition("@")
        if name not in FAILPOINTS:
            raise ValueError(
                f"unknown failpoint {name!r}; known: {', '.join(FAILPOINTS)}"
            )
        armed[name] = int(nth) if nth else 1
    return armed


def hit(name: str) -> None:
    """Pass failpoint ``name``; SIGKILL this process if it is armed for this hit."""
    if name not in FAILPOINTS:  # a typo in code must not silently disarm a test
        raise ValueError(f"unknown failpoint {name!r}")
    armed = _armed()
    if name not in armed:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        fire = _hits[name] == armed[name]
    if fire:
        sys.stderr.write(
            f"effect-broker: failpoint {name} fired, SIGKILL pid {os.getpid()}\n"
        )
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
