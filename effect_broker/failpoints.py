"""Failpoints: named places where a broker process can be told to die (or stall).

Two ways to arm them; only the crash matrix and crash tests do:

* ``EFFECT_BROKER_FAILPOINTS=name[@N],...`` arms a failpoint for this whole process;
  it fires on the N-th hit (default the first).
* ``EFFECT_BROKER_FAILPOINT_DIR=/some/dir`` lets a driver arm a failpoint for ONE
  operation key from outside, while workers keep running: it writes
  ``<dir>/armed/<digest of the operation key>`` holding ``name`` or ``name pause=S``.
  The failpoint fires once across all processes (an ``O_EXCL`` marker in
  ``<dir>/fired`` is created before firing), so a restarted worker does not die again.

Firing means SIGKILL of the current process: no ``finally`` blocks, no atexit, no
flushing - exactly what an OOM kill or a power cut does. ``pause=S`` sleeps instead,
holding whatever transaction is open (used to restart the database underneath).
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

#: Every failpoint the code defines, in the order an effect passes them. The
#: reservation and the receipt are each one statement that carries its own commit, so
#: ``before_reservation_commit`` fires before a submit's first statement (its read by
#: key, which answers a replay; a new key's reservation follows it) - for every submit,
#: a replay included - and ``before_receipt_commit`` just before the receipt's
#: statement is sent, for every receipt write (one the fence will refuse included); the
#: ``after_`` ones once that statement returned.
FAILPOINTS = (
    "before_reservation_commit",
    "after_reservation_commit",
    "before_request_write",
    "after_target_commit",
    "before_receipt_commit",
    "after_receipt_commit",
)
#: Inside the HTTP adapter's write of one request (adapters/http_attempt.py), where
#: the crash matrix freezes a worker (issue 19, item 4): after httpcore handed over
#: the headers and before the body, and after the send gate's last check, right
#: before the one socket write. Not kill points of every class (``FAILPOINTS``).
WIRE_FAILPOINTS = ("between_headers_and_body", "after_send_gate")
_KNOWN = FAILPOINTS + WIRE_FAILPOINTS

_lock = threading.Lock()
_hits: dict[str, int] = {}


def _check_name(name: str) -> None:
    if name not in _KNOWN:  # a typo must not silently disarm a crash test
        raise ValueError(f"unknown failpoint {name!r}; known: {', '.join(_KNOWN)}")


def _process_armed() -> dict[str, int]:
    raw = os.environ.get("EFFECT_BROKER_FAILPOINTS", "")
    armed: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, _, nth = item.partition("@")
        _check_name(name)
        armed[name] = int(nth) if nth else 1
    return armed


def subject_digest(subject: str) -> str:
    """File name under which a failpoint is armed for a subject."""
    return hashlib.sha256(subject.encode("utf-8")).hexdigest()[:32]


def arm(directory: Path, subject: str, name: str, *, pause: float | None = None) -> None:
    """Arm failpoint ``name`` for one operation key (driver side)."""
    _check_name(name)
    (directory / "armed").mkdir(parents=True, exist_ok=True)
    (directory / "fired").mkdir(parents=True, exist_ok=True)
    spec = name if pause is None else f"{name} pause={pause}"
    (directory / "armed" / subject_digest(subject)).write_text(spec)


def fired(directory: Path, subject: str, name: str) -> bool:
    """True once the failpoint armed for ``subject`` has fired (driver side)."""
    return (directory / "fired" / f"{subject_digest(subject)}-{name}").exists()


def fired_by(directory: Path, subject: str, name: str) -> int | None:
    """The pid of the process in which the failpoint fired, once it has (driver side)."""
    marker = directory / "fired" / f"{subject_digest(subject)}-{name}"
    try:
        text = marker.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def _die(name: str) -> None:
    sys.stderr.write(
        f"effect-broker: failpoint {name} fired, SIGKILL pid {os.getpid()}\n"
    )
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _hit_armed_for_subject(name: str, subject: str) -> None:
    directory = os.environ.get("EFFECT_BROKER_FAILPOINT_DIR", "")
    if not directory:
        return
    digest = subject_digest(subject)
    try:
        spec = (Path(directory) / "armed" / digest).read_text().split()
    except FileNotFoundError:
        return
    if not spec or spec[0] != name:
        return
    marker = Path(directory) / "fired" / f"{digest}-{name}"
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return  # already fired once, in this or another process
    try:
        # Which process fired: a driver that freezes it (SIGSTOP) needs its pid even
        # where the ledger names no owner yet (a transactional claim not committed).
        os.write(fd, str(os.getpid()).encode("ascii"))
    finally:
        os.close(fd)
    pause = next((float(p[6:]) for p in spec[1:] if p.startswith("pause=")), None)
    if pause is None:
        _die(name)
    assert pause is not None  # _die() SIGKILLs this process, so it never returns
    time.sleep(pause)


def hit(name: str, *, subject: str | None = None) -> None:
    """Pass failpoint ``name`` for ``subject`` (``tenant_id/operation_key``) if known."""
    _check_name(name)
    if subject is not None:
        _hit_armed_for_subject(name, subject)
    armed = _process_armed()
    if name not in armed:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        fire = _hits[name] == armed[name]
    if fire:
        _die(name)
