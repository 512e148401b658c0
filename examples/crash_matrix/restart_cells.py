"""The database crashes under load: workers must outlive it (issue 11).

An agent keeps submitting charges while the broker's PostgreSQL is SIGKILLed (every
backend with it) and comes back through crash recovery. Verdict: every charge the
broker accepted finishes with exactly one target charge and one receipt, and no
worker process exited - the workers that were running before the crash finish the
work, nobody had to replace them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import connection

from effect_broker.domain.states import EffectStatus
from examples.crash_matrix.cells import CellResult, charge_body, replaced_note
from examples.crash_matrix.rig import Rig

CASE = "postgres restart under load"
SCENARIO = "idempotent"
#: Seconds of submits before the crash, of outage, and of submits after it is back.
BEFORE, DOWN, AFTER = 1.5, 2.0, 3.0
#: Pause between two submits of the agent.
INTERVAL = 0.05


@dataclass
class _Stream:
    """What the submitting agent saw."""

    accepted: list[tuple[str, dict[str, object], float]] = field(default_factory=list)
    refused: int = 0


def _submit_until(rig: Rig, tenant: object, stop: threading.Event, seen: _Stream) -> None:
    serial = 0
    while not stop.is_set():
        serial += 1
        key = f"order:{serial}:charge:v1"
        body = charge_body(SCENARIO, "dbload", f"{id(seen)}-{serial}")
        try:
            rig.submit(tenant, SCENARIO, body, operation_key=key)  # type: ignore[arg-type]
        except Exception:  # the database is down: the agent was told, nothing accepted
            seen.refused += 1
        else:
            seen.accepted.append((key, body, time.monotonic()))
        finally:
            connection.close()  # a connection from before the crash is dead
        stop.wait(INTERVAL)


@contextmanager
def _agent_connects_like_a_client() -> Iterator[None]:
    """While it runs, a new thread's connection uses the stock PostgreSQL backend.

    The rig's process uses the embedded backend, which starts its server on connect:
    the agent's first submit after the kill would bring the database straight back,
    and the outage would never be seen. A client of a real deployment cannot do that.
    """
    entry = connection.settings_dict  # shared by every thread's connection
    engine = entry["ENGINE"]
    entry["ENGINE"] = "django.db.backends.postgresql"
    try:
        yield
    finally:
        entry["ENGINE"] = engine


def db_restart_under_load_cell(rig: Rig, run: str) -> CellResult:
    """Crash the database while charges stream in; judge every accepted one."""
    if rig.embedded_project_dir is None or rig.pool is None:
        return CellResult(
            SCENARIO, CASE, 0, "-", 0, None, "skipped",
            "needs the embedded server (DATABASE_URL is external)", 0.0,
        )  # fmt: skip
    started = time.monotonic()
    tenant = rig.new_tenant(f"{SCENARIO}-dbload-{run}")
    mark = rig.pool.exit_mark()
    pids = rig.pool.pids()
    seen, stop = _Stream(), threading.Event()
    agent = threading.Thread(target=_submit_until, args=(rig, tenant, stop, seen))
    with _agent_connects_like_a_client():
        agent.start()
        try:
            time.sleep(BEFORE)
            crashed = time.monotonic()
            back = rig.crash_database(DOWN)
            time.sleep(AFTER)
        finally:
            stop.set()
            agent.join()
    connection.close()
    after = sum(1 for _, _, at in seen.accepted if at > back)
    effects: list[int] = []
    receipts: list[int] = []
    statuses: set[str] = set()
    for key, body, _ in seen.accepted:
        record = rig.wait_settled(tenant, SCENARIO, operation_key=key)
        effects.append(rig.target_effects(SCENARIO, body, record.downstream_key))
        receipts.append(rig.receipts(record))
        statuses.add(record.status.value)
    exited = rig.pool.exits_since(mark)
    # Worst per-effect figures, so the table's "1" means "one each".
    worst_effects = max(effects, default=0) if set(effects) != {1} else 1
    worst_receipts = max(receipts, default=0) if set(receipts) != {1} else 1
    problems = []
    if set(effects) != {1}:
        problems.append(f"charges per effect {sorted(set(effects))}, expected 1 each")
    if set(receipts) != {1}:
        problems.append(f"receipts per effect {sorted(set(receipts))}, expected 1 each")
    if statuses != {EffectStatus.SUCCEEDED.value}:
        problems.append(f"statuses {sorted(statuses)}, expected succeeded")
    if not after or len(seen.accepted) == after:
        problems.append("the submit stream did not span the crash")
    if exited:
        problems.append(replaced_note(exited))
    elif set(rig.pool.pids()) != set(pids):
        problems.append("the worker pids changed")
    accepted = len(seen.accepted)
    note = "; ".join(problems) or (
        f"{accepted} accepted ({accepted - after} before the crash, {after} after "
        f"it was back in {back - crashed:.1f}s), {seen.refused} refused while down; "
        f"one charge each; the same {len(pids)} workers, none replaced"
    )
    return CellResult(
        scenario=SCENARIO,
        case=CASE,
        target_effects=worst_effects,
        status=" ".join(sorted(statuses)) or "-",
        receipts=worst_receipts,
        naive_effects=None,
        verdict="FAIL" if problems else "pass",
        note=note,
        seconds=round(time.monotonic() - started, 1),
    )
