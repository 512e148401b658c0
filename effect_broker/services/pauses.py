"""Pause and resume dispatch per tool, contract or tenant (issue 24, item 7).

The one place a pause is made or lifted: ``effect-broker tools pause|resume``, the
admin's pauses page and the operator API call these, on an operator's authority (the
same as resolution: an active staff user holding ``effect_broker.resolve_effect``,
``services.operators``). A pause is a row kept for audit (who, when, why; who resumed
it; migration 0018), and each change is logged.

What a pause holds is ``domain/pauses.py``. The dispatch job reads whether one holds
its effect in its one read (``store/sql.py``) and then ends without sending and
without scheduling itself again: nothing polls while a tool is paused, and the
sweeper leaves held effects alone. ``resume`` therefore defers their jobs again, in
its own transaction; past ``REDEFER_LIMIT`` effects, the sweeper finds the rest (it
sees them again as soon as nothing holds them).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from effect_broker import store
from effect_broker.domain.errors import (
    AlreadyPausedError,
    PauseNotFoundError,
    TenantNotFoundError,
    UnknownContractError,
)
from effect_broker.domain.pauses import (
    Pause,
    PauseScope,
    holds,
    parse_contract_ref,
    require_reason,
)
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import DispatchPause, Tenant
from effect_broker.services.operators import operator_name
from effect_broker.services.runtime import Runtime, get_runtime
from effect_broker.store import dispatch_controls

logger = logging.getLogger(__name__)

#: How many held effects ``resume`` defers itself; the sweeper finds any others.
REDEFER_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class Resumed:
    """A resumed pause, and how many held effects' jobs were deferred again."""

    pause: Pause
    redeferred: int


def pause(
    *,
    tool: str | None = None,
    contract: str | None = None,
    tenant: str | None = None,
    reason: str,
    operator: Any,
    runtime: Runtime | None = None,
) -> Pause:
    """Pause dispatch of every effect in the scope (a tool, a contract ``NAME`` or
    ``NAME@VERSION``, a tenant's name, or several): they wait until it is resumed."""
    rt = runtime or get_runtime()
    who = operator_name(operator)
    text = require_reason(reason)
    scope, tenant_row = _scope(rt, tool=tool, contract=contract, tenant=tenant)
    try:
        with transaction.atomic():
            row = DispatchPause.objects.create(
                tool=scope.tool,
                contract_name=scope.contract_name,
                contract_version=scope.contract_version,
                tenant=tenant_row,
                reason=text,
                paused_by=who,
                paused_at=rt.clock.now(),
            )
    except IntegrityError:
        # The one constraint a valid scope can break: an active pause of this scope.
        existing = _active_with_scope(scope)
        if existing is None:
            raise
        raise AlreadyPausedError(
            f"{existing.describe()} is already paused (pause {existing.pause_id}, by "
            f"{existing.paused_by} at {existing.paused_at:%Y-%m-%dT%H:%M:%SZ}: "
            f"{existing.reason}); nothing was changed",
            pause_id=existing.pause_id,
        ) from None
    paused = pause_of(row)
    logger.warning(
        "dispatch paused",
        extra={
            "action": "dispatch_pause",
            "pause_id": paused.pause_id,
            "scope": paused.describe(),
            "operator": who,
        },
    )
    return paused


def resume(
    pause_id: str | None = None,
    *,
    tool: str | None = None,
    contract: str | None = None,
    tenant: str | None = None,
    operator: Any,
    reason: str = "",
    runtime: Runtime | None = None,
) -> Resumed:
    """Resume one active pause, by id or by its exact scope, and defer the jobs of
    the effects it held (they are sent as if never paused, limits permitting)."""
    rt = runtime or get_runtime()
    who = operator_name(operator)
    text = require_reason(reason, required=False)
    if pause_id is None:
        scope, _ = _scope(rt, tool=tool, contract=contract, tenant=tenant)
        found = _active_with_scope(scope)
        if found is None:
            raise PauseNotFoundError(
                f"no active pause of exactly {scope.describe(tenant)}"
                + _covering_hint(scope),
            )
        pause_id = found.pause_id
    key = _pause_uuid(pause_id)
    with transaction.atomic():
        # Resumed once: the row changes only while it is still active.
        changed = DispatchPause.objects.filter(id=key, resumed_at__isnull=True).update(
            resumed_at=rt.clock.now(), resumed_by=who, resume_reason=text
        )
        if not changed:
            raise PauseNotFoundError(
                f"no active pause {pause_id} (it was resumed already, or never existed)",
                pause_id=str(pause_id),
            )
        redeferred = _redefer_held(rt, str(key))
    resumed = get_pause(str(key))
    logger.warning(
        "dispatch resumed",
        extra={
            "action": "dispatch_resume",
            "pause_id": resumed.pause_id,
            "scope": resumed.describe(),
            "operator": who,
            "redeferred": redeferred,
        },
    )
    return Resumed(resumed, redeferred)


def get_pause(pause_id: str) -> Pause:
    """One pause, active or resumed."""
    row = (
        DispatchPause.objects.select_related("tenant")
        .filter(id=_pause_uuid(pause_id))
        .first()
    )
    if row is None:
        raise PauseNotFoundError(f"no pause {pause_id}", pause_id=str(pause_id))
    return pause_of(row)


def active_pauses() -> list[Pause]:
    """Every active pause, oldest first."""
    rows = DispatchPause.objects.select_related("tenant").filter(resumed_at__isnull=True)
    return [pause_of(row) for row in rows.order_by("paused_at", "id")]


def list_pauses(*, include_resumed: bool = False, limit: int = 100) -> list[Pause]:
    """Active pauses, oldest first; with ``include_resumed``, then resumed ones,
    newest first (at most ``limit`` in all)."""
    found = active_pauses()
    if include_resumed:
        resumed = (
            DispatchPause.objects.select_related("tenant")
            .filter(resumed_at__isnull=False)
            .order_by("-resumed_at", "-id")
        )
        found += [pause_of(row) for row in resumed[: max(0, limit - len(found))]]
    return found[: max(1, limit)]


def pause_holding(
    record: EffectRecord, active: Iterable[Pause] | None = None
) -> Pause | None:
    """The oldest active pause that holds ``record`` now, if any (pass ``active``,
    from ``active_pauses()``, to look up many records with one query)."""
    return holding(
        status=record.status,
        safety=record.safety,
        tool=record.tool,
        contract_name=record.contract_name,
        contract_version=record.contract_version,
        tenant_id=record.tenant_id,
        active=active,
    )


def holding(
    *,
    status: EffectStatus,
    safety: SafetyClass,
    tool: str,
    contract_name: str,
    contract_version: str,
    tenant_id: str,
    active: Iterable[Pause] | None = None,
) -> Pause | None:
    """``pause_holding`` for an effect given by its facts (the admin's model row)."""
    if not holds(status, safety):
        return None
    for candidate in active_pauses() if active is None else active:
        if candidate.active and candidate.scope.covers(
            tool=tool,
            contract_name=contract_name,
            contract_version=contract_version,
            tenant_id=tenant_id,
        ):
            return candidate
    return None


def held_total() -> int:
    """How many effects any active pause holds now (each counted once)."""
    return sum(int(row[4]) for row in dispatch_controls.held_by_contract())


def held_count(pause_id: str) -> int:
    """How many effects in the pause's scope are waiting to be sent."""
    return dispatch_controls.count_held_by_pause(str(_pause_uuid(pause_id)))


# --- internals --------------------------------------------------------------------


def _scope(
    rt: Runtime, *, tool: str | None, contract: str | None, tenant: str | None
) -> tuple[PauseScope, Tenant | None]:
    """The scope named by a tool, a contract reference and a tenant's name, each
    checked against the contracts and tenants that exist (a typo pauses nothing, so
    it is refused rather than recorded)."""
    contracts = list(rt.registry)
    if tool is not None and not any(c.tool == tool for c in contracts):
        known = ", ".join(sorted({c.tool for c in contracts})) or "none"
        raise UnknownContractError(
            f"no contract for tool {tool!r}; tools: {known}", tool=tool
        )
    name = version = None
    if contract is not None:
        name, version = parse_contract_ref(contract)
        versions = [c.version for c in contracts if c.name == name]
        if not versions or (version is not None and version not in versions):
            raise UnknownContractError(
                f"no contract {contract!r}; contracts: "
                + (
                    ", ".join(sorted({c.label for c in contracts}))
                    if contracts
                    else "none"
                ),
                contract=name,
                version=version,
            )
    tenant_row = None
    if tenant is not None:
        tenant_row = Tenant.objects.filter(name=tenant).first()
        if tenant_row is None:
            raise TenantNotFoundError(f"no tenant named {tenant!r}")
    scope = PauseScope(
        tool=tool,
        contract_name=name,
        contract_version=version,
        tenant_id=None if tenant_row is None else str(tenant_row.id),
    )
    return scope, tenant_row


def _active_with_scope(scope: PauseScope) -> Pause | None:
    exact: dict[str, Any] = {
        "tool": scope.tool,
        "contract_name": scope.contract_name,
        "contract_version": scope.contract_version,
        "tenant_id": scope.tenant_id,
    }
    row = (
        DispatchPause.objects.select_related("tenant")
        .filter(resumed_at__isnull=True, **exact)
        .first()
    )
    return None if row is None else pause_of(row)


def _covering_hint(scope: PauseScope) -> str:
    """The active pauses that cover part of ``scope``: what to resume instead."""
    near = [
        p
        for p in active_pauses()
        if (scope.tool is None or p.scope.tool in (None, scope.tool))
        and (
            scope.contract_name is None
            or p.scope.contract_name in (None, scope.contract_name)
        )
        and (scope.tenant_id is None or p.scope.tenant_id in (None, scope.tenant_id))
    ]
    if not near:
        return "; no pause is active" if not active_pauses() else ""
    return "; active: " + "; ".join(f"{p.pause_id} ({p.describe()})" for p in near)


def _redefer_held(rt: Runtime, pause_id: str) -> int:
    """Defer again the jobs of the effects the pause held (their jobs ended when
    they found it). Queueing locks drop any that already have a job waiting."""
    now = store.database_now(rt.clock.database_offset())
    count = 0
    for effect_id, status, due in dispatch_controls.held_by_pause(
        pause_id, limit=REDEFER_LIMIT
    ):
        at = due if due is not None and due > now else None
        if status == EffectStatus.OUTCOME_UNKNOWN.value:
            rt.scheduler.reconcile(effect_id, at=at)
        else:
            rt.scheduler.dispatch(effect_id, at=at)
        count += 1
    return count


def _pause_uuid(pause_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(pause_id))
    except ValueError:
        raise PauseNotFoundError(f"no pause {pause_id}", pause_id=str(pause_id)) from None


def pause_of(row: DispatchPause) -> Pause:
    """A pause row as the domain's ``Pause`` (its tenant read with it)."""
    return Pause(
        pause_id=str(row.id),
        scope=PauseScope(
            tool=row.tool,
            contract_name=row.contract_name,
            contract_version=row.contract_version,
            tenant_id=None if row.tenant_id is None else str(row.tenant_id),
        ),
        reason=row.reason,
        paused_by=row.paused_by,
        paused_at=row.paused_at,
        tenant_name=None if row.tenant is None else row.tenant.name,
        resumed_by=row.resumed_by,
        resumed_at=row.resumed_at,
        resume_reason=row.resume_reason,
    )
