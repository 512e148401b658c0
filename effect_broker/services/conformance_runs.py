"""Stored ``contracts conform`` runs, per contract version (issue 22, item 1).

A contract that claims ``idempotent`` or ``reconcilable`` makes the broker retry or
settle on the strength of a promise the target has to keep. The kit proves it; this
module keeps the verdict where ``doctor`` and the start of ``worker`` / ``serve`` read
it, across processes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db import DatabaseError

from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.states import SafetyClass

if TYPE_CHECKING:  # the kit imports the MCP SDK: a second of every worker's start
    from effect_broker.adapters.conformance_kit import KitPlan, KitRow

logger = logging.getLogger(__name__)

#: Classes whose promise the broker acts on without asking anyone: unproved, a
#: retry can charge twice or a settlement can call a commit "not committed".
PROVABLE = (SafetyClass.IDEMPOTENT, SafetyClass.RECONCILABLE)


@dataclass(frozen=True)
class Proof:
    """Where a provable contract version stands: its latest run, if any."""

    contract: str
    version: str
    safety: str
    proved: bool
    #: "never run", "last run <when> failed: <checks>" or "passed <when> ...".
    why: str

    def line(self) -> str:
        """One line for a log or a terminal."""
        if self.proved:
            return f"contract {self.contract}@{self.version} ({self.safety}): {self.why}"
        return (
            f"contract {self.contract}@{self.version} claims {self.safety} but has no "
            f"passing conformance run ({self.why}); prove it: effect-broker contracts "
            f"conform {self.contract}@{self.version}"
        )


def record_run(plan: KitPlan, rows: list[KitRow], *, effect_requests: int) -> str:
    """Store one run; return its id."""
    from effect_broker.adapters.conformance_kit import rows_passed
    from effect_broker.models import ConformanceRun

    run = ConformanceRun.objects.create(
        contract_name=plan.contract,
        contract_version=plan.version,
        safety=plan.safety.value,
        target=plan.target,
        passed=rows_passed(rows),
        rows=[row.as_dict() for row in rows],
        effect_requests=effect_requests,
    )
    return str(run.id)


def proofs(contracts: Iterable[EffectContract]) -> list[Proof]:
    """The latest run of each active idempotent / reconcilable contract version."""
    from effect_broker.models import ConformanceRun

    found = []
    for contract in contracts:
        if not contract.active or contract.safety not in PROVABLE:
            continue
        latest = (
            ConformanceRun.objects.filter(
                contract_name=contract.name, contract_version=contract.version
            )
            .order_by("-ran_at")
            .first()
        )
        if latest is None:
            proved, why = False, "never run"
        else:
            when = f"{latest.ran_at:%Y-%m-%d %H:%M} UTC against {latest.target}"
            failed = [r["check"] for r in latest.rows if r.get("outcome") == "FAIL"]
            proved = latest.passed
            why = (
                f"passed {when}"
                if proved
                else f"last run {when} failed: {', '.join(failed)}"
            )
        found.append(
            Proof(contract.name, contract.version, contract.safety.value, proved, why)
        )
    return found


def unproved(contracts: Iterable[EffectContract]) -> list[Proof]:
    """The active idempotent / reconcilable contracts whose latest run did not pass."""
    return [proof for proof in proofs(contracts) if not proof.proved]


def warn_unproved_at_start(role: str) -> list[str]:
    """Log a warning per unproved contract at a process's start; return the lines.

    Never stops the start: an unreadable contracts file or database is reported by
    ``doctor`` and by the first request, not here.
    """
    from django.conf import settings

    from effect_broker.domain.contracts import load_contracts
    from effect_broker.domain.errors import EffectBrokerError

    try:
        registry = load_contracts(settings.EFFECT_BROKER_CONTRACTS)
        lines = [item.line() for item in unproved(registry)]
    except (EffectBrokerError, DatabaseError):
        return []
    for line in lines:
        logger.warning("%s", line, extra={"action": "conformance_unproved", "role": role})
    return lines


__all__ = [
    "PROVABLE",
    "Proof",
    "proofs",
    "record_run",
    "unproved",
    "warn_unproved_at_start",
]
