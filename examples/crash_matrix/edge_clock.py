"""Edge cells: one worker, and one sweeper, whose wall clock is off (issue 9, defect 7;
``edge_cells``), and how such a process is made."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from django.db import connection

from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus
from effect_broker.models import EffectEvent, Tenant
from effect_broker.services.sweeper import sweep
from examples.crash_matrix.cells import charge_body
from examples.crash_matrix.contracts import TOOLS
from examples.crash_matrix.edge_support import (
    CLOCK_AHEAD,
    CLOCK_BEHIND,
    LEASE_EXPIRY_EVENTS,
    Checks,
    EdgeCellResult,
    attempts,
    charges,
    edge_result,
    effect_by_key,
    event_types,
    receipts,
    requests_seen,
    settled,
    submit_tool,
    wait_for,
)
from examples.crash_matrix.rig import SETTLED, Rig
from examples.crash_matrix.workers import ROOT, WorkerProcess, wait_until

# --- a host whose wall clock is off -----------------------------------------------

_SITECUSTOMIZE = '''"""Shift this process's wall clock by EFFECT_BROKER_EDGE_CLOCK_SKEW.

Written by examples/crash_matrix/edge_support.py when libfaketime is not installed:
time.time(), time.time_ns() and datetime.now()/utcnow()/today() move; the monotonic
clock does not, as on a real host whose wall clock is off.
"""
import datetime as _dt
import os as _os
import time as _time

_skew = float(_os.environ.get("EFFECT_BROKER_EDGE_CLOCK_SKEW") or 0)
if _skew:
    _real_time, _real_time_ns = _time.time, _time.time_ns
    _time.time = lambda: _real_time() + _skew
    _time.time_ns = lambda: _real_time_ns() + int(_skew * 1e9)
    _Real = _dt.datetime
    _delta = _dt.timedelta(seconds=_skew)

    class _Meta(type):
        # A real datetime must still pass isinstance(x, datetime) everywhere.
        def __instancecheck__(cls, obj):
            return isinstance(obj, _Real)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, _Real)

    class datetime(_Real, metaclass=_Meta):
        @classmethod
        def now(cls, tz=None):
            return _Real.now(tz) + _delta

        @classmethod
        def utcnow(cls):
            return _Real.utcnow() + _delta

        @classmethod
        def today(cls):
            return _Real.today() + _delta

    _dt.datetime = datetime
'''


def faketime_library() -> str | None:
    """The installed libfaketime (multithreaded build first), or None."""
    for name in ("libfaketimeMT.so.1", "libfaketime.so.1"):
        found = sorted(glob.glob(f"/usr/lib/*/faketime/{name}"))
        if found:
            return found[0]
    return None


def skewed_env(
    env: Mapping[str, str], seconds: int, workdir: Path
) -> tuple[dict[str, str], str]:
    """``env`` for a child whose wall clock is ``seconds`` off; and how it was done.

    libfaketime when installed (``apt-get install faketime``), with the monotonic
    clock left real; otherwise a ``sitecustomize`` on PYTHONPATH that shifts Python's
    wall clock. ``EFFECT_BROKER_EDGE_SKEW=python`` forces the fallback.
    """
    skewed = dict(env)
    library = faketime_library()
    if library and os.environ.get("EFFECT_BROKER_EDGE_SKEW", "auto") != "python":
        skewed.update(
            {
                "LD_PRELOAD": library,
                "FAKETIME": f"{seconds:+d}s",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            }
        )
        return skewed, f"libfaketime {seconds:+d}s"
    folder = workdir / f"clock{seconds:+d}s"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE, encoding="utf-8")
    paths = [str(folder), *filter(None, [skewed.get("PYTHONPATH", "")])]
    skewed["PYTHONPATH"] = os.pathsep.join(paths)
    skewed["EFFECT_BROKER_EDGE_CLOCK_SKEW"] = str(seconds)
    return skewed, f"python sitecustomize {seconds:+d}s (libfaketime not used)"


def start_skewed_worker(
    rig: Rig, name: str, env: Mapping[str, str], *, concurrency: int = 2
) -> WorkerProcess:
    """An extra worker process beside the pool; returns once it listens for jobs.

    Its database sessions carry its name (libpq's PGAPPNAME), so readiness is read
    from the server: the session that issued LISTEN for its last queue.
    """
    worker = WorkerProcess(name, {**env, "PGAPPNAME": name}, concurrency=concurrency)
    try:
        wait_until(
            lambda: worker.alive() and listening(name),
            timeout=60,
            interval=0.1,
            what=f"worker {name} to listen for jobs",
        )
    except TimeoutError:
        tail = worker.log_tail()
        worker.stop()
        raise RuntimeError(f"worker {name} did not start: {tail}") from None
    finally:
        connection.close()
    return worker


def listening(application_name: str) -> bool:
    """True once a session of ``application_name`` has LISTENed on every queue (the
    worker listens to its queues in order; ``maintenance`` is the last)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s AND query LIKE %s",
            [application_name, "LISTEN%maintenance%"],
        )
        row = cur.fetchone()
    return bool(row and row[0])


_SWEEPER = """
import json, os, sys, time
from datetime import UTC, datetime
import django
django.setup()
from django.db import connection
from effect_broker.services.sweeper import sweep
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    if line.strip() != "sweep":
        break
    with connection.cursor() as cur:
        cur.execute("SELECT extract(epoch FROM clock_timestamp())")
        database_now = float(cur.fetchone()[0])
    report = sweep(actor="edge-skewed-sweeper")
    print(json.dumps({
        "time_minus_database": round(time.time() - database_now, 3),
        "datetime_minus_database": round(
            datetime.now(UTC).timestamp() - database_now, 3),
        **report.__dict__,
    }), flush=True)
"""


class SkewedSweeper:
    """A process on the skewed clock that sweeps when told to (``sweep()``).

    It is started ahead of time, so Django's start-up is not in the way when a live
    lease has to be swept right now.
    """

    def __init__(self, env: Mapping[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SWEEPER],
            cwd=ROOT,
            env={**env, "DJANGO_SETTINGS_MODULE": "config.settings"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        if json.loads(self._line()).get("ready") is not True:
            raise RuntimeError("the skewed sweeper did not start")

    def _line(self) -> str:
        out: IO[str] | None = self.process.stdout
        line = out.readline() if out is not None else ""
        if not line:
            raise RuntimeError(f"skewed sweeper exited ({self.process.poll()})")
        return line

    def sweep(self) -> dict[str, Any]:
        """One sweep on the skewed clock: its report and its clock's offset."""
        assert self.process.stdin is not None
        self.process.stdin.write("sweep\n")
        self.process.stdin.flush()
        result: dict[str, Any] = json.loads(self._line())
        return result

    def close(self) -> None:
        """Ask it to stop; kill it if it does not."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


# --- 6. one worker with a skewed clock ----------------------------------------------

#: Effects dispatched at once in a clock cell: one more than the pool's single-slot
#: workers, so the skewed worker (two slots) necessarily takes at least one.
CLOCK_EFFECTS = 4


def _stamp_offset(record: EffectRecord, worker_name: str) -> float | None:
    """How far the skewed worker's clock was off when it claimed ``record``.

    One statement wrote both: the claim event's stamp (the worker's clock) and
    ``first_dispatch_at`` (the database's clock, set by the first claim only).
    """
    claims = EffectEvent.objects.filter(
        effect_id=record.effect_id, event_type="dispatch_started"
    ).order_by("sequence")
    first = claims.first()
    if (
        first is None
        or not first.actor.startswith(worker_name)
        or record.first_dispatch_at is None
    ):
        return None
    return round((first.occurred_at - record.first_dispatch_at).total_seconds(), 1)


def _while_skewed_lease_is_live(
    cells: list[tuple[Tenant, dict[str, Any]]], worker_name: str
) -> int:
    """Wait until the skewed worker holds a live lease on one of ``cells``' effects;
    return how many of them are in flight then (0: the pool's workers took them all)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        records = [effect_by_key(t) for t, _ in cells]
        live = [r for r in records if r.status is EffectStatus.DISPATCHING]
        if any((r.lease_owner or "").startswith(worker_name) for r in live):
            return len(live)
        if all(r.status in SETTLED for r in records):
            return 0
        time.sleep(0.05)
    return 0


#: Batches a clock cell may submit before the skewed worker has taken an effect. On a
#: loaded machine the pool's workers can win every fetch of one batch; that proves
#: nothing either way, so the cell tries again rather than pass or fail on it.
CLOCK_ROUNDS = 3


def clock_skew_cell(rig: Rig, scenario: str, seconds: int, run: str) -> EdgeCellResult:
    """An extra worker and a sweeper whose wall clocks are ``seconds`` off.

    The target answers each of the cell's effects after 1 s (well inside the attempt's
    limit of 2.5 s). While the skewed worker holds one of their leases, two sweeps
    run: the skewed sweeper's (a lease compared with a +20 s clock looks expired) and
    one on the true clock (a lease written from a -20 s clock would look expired to
    it). Neither may expire anything: leases are written and compared on the
    database's clock.
    """
    case = CLOCK_AHEAD if seconds > 0 else CLOCK_BEHIND
    started = time.monotonic()
    env, method = skewed_env(rig.env(), seconds, Path(tempfile.mkdtemp(dir=rig.workdir)))
    name = f"edge-clock{seconds:+d}s"
    sweeper = SkewedSweeper(env)
    try:
        worker = start_skewed_worker(rig, name, env)
        phases = {"ready": round(time.monotonic() - started, 1)}
        try:
            requests_before = requests_seen(rig)
            cells: list[tuple[Tenant, dict[str, Any]]] = []
            live = rounds = 0
            while not live and rounds < CLOCK_ROUNDS:
                rounds += 1
                rig.target.inject("slow_after_commit", times=CLOCK_EFFECTS, seconds=1.0)
                batch = []
                for i in range(CLOCK_EFFECTS):
                    label = f"{rounds}-{i}"
                    tenant = rig.new_tenant(f"{scenario}-clock{seconds:+d}-{label}")
                    body = charge_body(scenario, f"clock{seconds:+d}", f"{run}-{label}")
                    submit_tool(tenant, TOOLS[scenario], body)
                    batch.append((tenant, body))
                cells += batch
                live = _while_skewed_lease_is_live(batch, name)
            phases["in_flight"] = round(time.monotonic() - started, 1)
            phases["rounds"] = rounds
            # Both sides of the skew, while the leases are live: the skewed sweeper
            # (a +20 s clock would see them all expired), and one on this host's
            # clock (a lease written from a -20 s clock would look expired to it).
            swept = sweeper.sweep()
            swept_here = sweep(actor="edge-true-clock-sweeper").__dict__
            records = [wait_for(t, settled, what="settlement") for t, _ in cells]
            phases["settled"] = round(time.monotonic() - started, 1)
        finally:
            worker.stop()
        phases["stopped"] = round(time.monotonic() - started, 1)
    finally:
        sweeper.close()
    sent = requests_seen(rig) - requests_before
    counts = [
        charges(rig, scenario, r, b) for r, (_, b) in zip(records, cells, strict=True)
    ]
    kinds = [event_types(r) for r in records]
    by_skewed = [
        r for r in records if any(a["worker"].startswith(name) for a in attempts(r))
    ]
    offsets = [_stamp_offset(r, name) for r in by_skewed]
    checks = Checks()
    checks.expect(counts == [1] * len(cells), f"charges by key per effect: {counts}")
    checks.expect(
        all(r.status is EffectStatus.SUCCEEDED and receipts(r) == 1 for r in records),
        f"not all succeeded: {[r.status.value for r in records]}",
    )
    checks.expect(sent == len(cells), f"expected {len(cells)} requests, got {sent}")
    checks.expect(
        not any(
            k in LEASE_EXPIRY_EVENTS or k == "outcome_unknown" for ks in kinds for k in ks
        ),
        "a lease was declared expired or an outcome unknown",
    )
    checks.expect(live > 0, "the skewed worker held no live lease when swept")
    checks.expect(
        swept.get("leases_expired") == 0,
        f"the skewed sweeper expired {swept.get('leases_expired')} live lease(s)",
    )
    checks.expect(
        swept_here["leases_expired"] == 0,
        f"a sweeper on the true clock expired {swept_here['leases_expired']} lease(s)",
    )
    checks.expect(
        abs(float(swept.get("datetime_minus_database", 0)) - seconds) < 2,
        f"the sweeper's clock is not {seconds:+d}s off: {swept}",
    )
    checks.expect(bool(by_skewed), "the skewed worker dispatched no effect")
    checks.expect(
        all(o is not None and abs(o - seconds) < 1 for o in offsets),
        f"the skewed worker's stamps are not {seconds:+d}s off: {offsets}",
    )
    return edge_result(
        scenario,
        case,
        started=started,
        checks=checks,
        passed_note=(
            f"{method}; {len(by_skewed)} of {len(cells)} effects dispatched by the "
            "skewed worker; its sweeper expired no live lease"
        ),
        effects=max(counts),
        record=records[0],
        receipts=receipts(records[0]),
        facts={
            "method": method,
            "charges": counts,
            "requests": sent,
            "leases_live_when_swept": live,
            "seconds_at": phases,
            "sweep": swept,
            "sweep_on_true_clock": swept_here,
            "dispatched_by_skewed_worker": len(by_skewed),
            "skewed_worker_stamp_offsets": offsets,
            "events": kinds,
        },
    )
