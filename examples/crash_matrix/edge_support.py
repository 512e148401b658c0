"""What the edge cells share: their result row, the checks behind a verdict, reads of
the truth (target table, ledger rows, events), and the names of the cases.

The truth is read where it lives: charges from the target's own table by downstream
key (idempotency or correlation key; an unsafe charge carries no key, so by the
cell's unique body), requests from the target's own counter, states and events from
the ledger. Nothing here asks the broker what it believes it did.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.db import connection
from psycopg import sql

from effect_broker import failpoints, store
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import (
    EffectAttempt,
    EffectEvent,
    EffectReceipt,
    StaleWrite,
    Tenant,
)
from effect_broker.services.submission import submit
from examples.crash_matrix.cells import CellResult
from examples.crash_matrix.plan import (
    CLOCK_AHEAD,
    CLOCK_BEHIND,
    EDGE_CASES,
    EXHAUSTED,
    FROZEN,
    IN_PROGRESS,
    OPERATOR,
    SLOW_COMMIT,
    TERMINAL,
)
from examples.crash_matrix.rig import OPERATION_KEY, SETTLED, Rig
from examples.crash_matrix.workers import WorkerProcess, wait_until

#: Event types that say a lease was declared dead (dispatch or reconciliation).
LEASE_EXPIRY_EVENTS = frozenset({"lease_expired", "reconcile_lease_expired"})


@dataclass
class EdgeCellResult(CellResult):
    """A matrix row plus the facts its verdict was drawn from (JSON-ready)."""

    facts: dict[str, Any] = field(default_factory=dict)


class Checks:
    """The rules of one cell's verdict; every broken rule is named in the note."""

    def __init__(self) -> None:
        self.broken: list[str] = []

    def expect(self, ok: bool, rule: str) -> None:
        """Record ``rule`` as broken unless ``ok``."""
        if not ok:
            self.broken.append(rule)


def judge_edge(checks: Checks, passed_note: str) -> tuple[bool, str]:
    """An edge cell passes only if every one of its rules held (no partial credit)."""
    if checks.broken:
        return False, "; ".join(checks.broken)
    return True, passed_note


def edge_result(
    scenario: str,
    case: str,
    *,
    started: float,
    checks: Checks,
    passed_note: str,
    effects: int,
    record: EffectRecord,
    receipts: int,
    facts: dict[str, Any],
) -> EdgeCellResult:
    """The finished row (and the Django connection of this thread closed)."""
    ok, note = judge_edge(checks, passed_note)
    connection.close()
    return EdgeCellResult(
        scenario=scenario,
        case=case,
        target_effects=effects,
        status=record.status.value,
        receipts=receipts,
        naive_effects=None,
        verdict="pass" if ok else "FAIL",
        note=note,
        seconds=round(time.monotonic() - started, 1),
        facts=facts,
    )


# --- the broker side --------------------------------------------------------------


def submit_tool(
    tenant: Tenant, tool: str, body: Mapping[str, Any], key: str = OPERATION_KEY
) -> EffectRecord:
    """The agent's call, for any tool (``Rig.submit`` knows only the four classes)."""
    request = EffectRequest(operation_key=key, tool=tool, arguments=dict(body))
    return submit(tenant, request).effect


def effect_by_key(tenant: Tenant, key: str = OPERATION_KEY) -> EffectRecord:
    """The tenant's effect under ``key`` as the ledger has it now."""
    return store.reads.get_effect_by_key(str(tenant.id), key)


def wait_for(
    tenant: Tenant,
    until: Callable[[EffectRecord], bool],
    *,
    what: str,
    key: str = OPERATION_KEY,
    timeout: float = 60,
) -> EffectRecord:
    """Poll the effect until ``until(record)``; TimeoutError names ``what``."""
    try:
        return wait_until(
            lambda: r if until(r := effect_by_key(tenant, key)) else None,
            timeout=timeout,
            interval=0.1,
            what=what,
        )
    finally:
        connection.close()


def settled(record: EffectRecord) -> bool:
    """Nothing more happens without an operator (unsafe + unknown included)."""
    return record.status in SETTLED or (
        record.status is EffectStatus.OUTCOME_UNKNOWN
        and record.safety is SafetyClass.UNSAFE
    )


def events(record: EffectRecord) -> list[tuple[str, str, dict[str, Any]]]:
    """(event type, new status, metadata) of every event, in order."""
    rows = EffectEvent.objects.filter(effect_id=record.effect_id).order_by("sequence")
    return [(e.event_type, e.new_status, dict(e.metadata)) for e in rows]


def event_types(record: EffectRecord) -> list[str]:
    """Just the event types, in order."""
    return [kind for kind, _, _ in events(record)]


def ever_failed_final(record: EffectRecord) -> bool:
    """True if any event ever moved the effect to failed_final."""
    return EffectEvent.objects.filter(
        effect_id=record.effect_id, new_status=EffectStatus.FAILED_FINAL.value
    ).exists()


def reason_of(record: EffectRecord, event_type: str) -> str:
    """The ``reason`` of the last ``event_type`` event ('' if none)."""
    found = [m for kind, _, m in events(record) if kind == event_type]
    return str(found[-1].get("reason", "")) if found else ""


def attempts(record: EffectRecord) -> list[dict[str, Any]]:
    """The effect's attempt rows, in order."""
    rows = EffectAttempt.objects.filter(effect_id=record.effect_id).order_by("ordinal")
    return [
        {
            "ordinal": a.ordinal,
            "worker": a.worker,
            "outcome": a.outcome,
            "bytes_may_have_left": a.bytes_may_have_left,
        }
        for a in rows
    ]


def stale_writes(record: EffectRecord) -> list[dict[str, str]]:
    """The fence's refusals for the effect: who, and what they tried to write."""
    rows = StaleWrite.objects.filter(effect_id=record.effect_id).order_by("id")
    return [{"actor": s.actor, "attempted": s.attempted} for s in rows]


def lock_waiters() -> int:
    """Sessions of this database waiting on a row lock of the ledger's intents."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query ILIKE %s",
            ["%effect_intents%"],
        )
        row = cur.fetchone()
    return int(row[0]) if row else 0


# --- the target side --------------------------------------------------------------


def worker_that_fired(rig: Rig, tenant: Tenant, failpoint: str) -> WorkerProcess:
    """The pool worker in which ``failpoint`` fired for the tenant's charge (by the
    pid the failpoint recorded: a transactional claim names no owner yet)."""
    subject = f"{tenant.id}/{OPERATION_KEY}"
    pid = wait_until(
        lambda: failpoints.fired_by(rig.fp_dir, subject, failpoint),
        timeout=10,
        what="the pid of the stalled worker",
    )
    worker = rig.pool.by_pid(pid) if rig.pool else None
    if worker is None:
        raise RuntimeError(f"the stalled process {pid} is not a live pool worker")
    return worker


def requests_seen(rig: Rig) -> int:
    """Create requests that reached the target so far (its own counter)."""
    return int(rig.target.stats()["requests"])


def charges(rig: Rig, mode: str, record: EffectRecord, body: Mapping[str, Any]) -> int:
    """Charges of this effect in the target's own table.

    By downstream key where the target stores one (idempotency or correlation key);
    the unsafe endpoint stores none, so by the cell's unique body; transactional
    effects live in the broker's own table, by key.
    """
    # Through the rig, so every count is also a claim: a charge no cell counted fails
    # the run (examples/crash_matrix/attribution.py).
    return rig.target_effects(mode, dict(body), record.downstream_key)


def charge_ids_by_body(rig: Rig, body: Mapping[str, Any]) -> list[str]:
    """Ids of the target's charges made from exactly ``body``."""
    digest = hashlib.sha256(
        json.dumps(dict(body), sort_keys=True, separators=(",", ":")).encode()
    ).digest()
    query = sql.SQL("SELECT id FROM {}.charges WHERE body_hash = %s ORDER BY id").format(
        sql.Identifier(rig.target.schema)
    )
    with psycopg.connect(rig.target.database_url, autocommit=True) as conn:
        return [str(row[0]) for row in conn.execute(query, [digest]).fetchall()]


def receipts(record: EffectRecord) -> int:
    """Receipts the broker holds for the effect."""
    return EffectReceipt.objects.filter(effect_id=record.effect_id).count()


# --- the cases ---------------------------------------------------------------------

# The case names are the plan's (examples/crash_matrix/plan.py: listing the cells
# needs no database); re-exported here for the cells.
__all__ = [
    "CLOCK_AHEAD",
    "CLOCK_BEHIND",
    "EDGE_CASES",
    "EXHAUSTED",
    "FROZEN",
    "IN_PROGRESS",
    "OPERATOR",
    "SLOW_COMMIT",
    "TERMINAL",
]

CLASSES = ("idempotent", "reconcilable", "transactional", "unsafe")

#: How long the failpoint stalls the dispatching thread: time to SIGSTOP its process.
FREEZE_PAUSE = 3.0
#: The fork's operation key (cell 5).
FORK_KEY = "order:42:charge:v2"
