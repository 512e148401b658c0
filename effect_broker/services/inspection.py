"""Read-only inspection of effects: lookup, history, receipts and the operator listing.

Spec "Replay and time-travel semantics": history only folds stored events; it never
invokes an adapter. Nothing here writes a ledger row, schedules a job or calls a target.

Kept apart from ``services.resolution`` (the operator's write side) so that the reads
every surface needs - the API's history and receipt endpoints, the CLI's ``list`` and
``inspect``, tenant lookup for privileged tools - do not live in the module whose job is
fenced writes. The dependency points one way: resolution reads effects through
``get_effect`` here; nothing here imports resolution.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from effect_broker import store
from effect_broker.domain.canonical import parse_json_strict
from effect_broker.domain.errors import (
    EffectNotFoundError,
    EventChainBrokenError,
    InvalidRequestError,
    TenantNotFoundError,
)
from effect_broker.domain.payload_crypto import decrypt
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import EffectFork, EffectIntent, EffectReceipt, Tenant
from effect_broker.services.payloads import result_aad
from effect_broker.services.runtime import Runtime, get_runtime
from effect_broker.store.reads import MAX_PAGE, StoredEvent
from effect_broker.store.rows import record_from_row
from effect_broker.store.sql import INTENT_COLUMNS

# verify_event_chain reads the version, then the events; a write committing in between
# looks like one event too many. A real break survives a re-read, a race does not.
_VERIFY_TRIES = 3


@dataclass(frozen=True, slots=True)
class EffectHistory:
    """An effect folded from its verified events up to ``at_sequence`` (read-only)."""

    effect_id: str
    at_sequence: int
    latest_sequence: int
    status: EffectStatus
    version: int
    events: tuple[StoredEvent, ...]


@dataclass(frozen=True, slots=True)
class StoredReceipt:
    """A terminal receipt with its result decrypted."""

    receipt_id: str
    effect_id: str
    external_id: str | None
    result: Mapping[str, Any]
    result_preview: Mapping[str, Any]
    evidence_digest: str
    target_timestamp: datetime | None
    contract_version: str
    downstream_key_digest: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ForkLinks:
    """The fork links of one effect: the effect it was forked from, and its fork."""

    forked_from: str | None
    forked_to: str | None


@dataclass(frozen=True, slots=True)
class OperatorRow:
    """One line of the cross-tenant operator listing."""

    effect: EffectRecord
    tenant_name: str
    needs_operator: bool


# A read of the record, not a resolution step: the listing and ``inspect`` compute it,
# resolution never does, and keeping it here keeps resolution -> inspection one-way.
def needs_operator(record: EffectRecord) -> bool:
    """True when only an operator can move the effect on (nothing automatic will but,
    for an effect awaiting approval, its expiry)."""
    if record.status in (EffectStatus.MANUAL_REVIEW, EffectStatus.AWAITING_APPROVAL):
        return True
    return (
        record.status is EffectStatus.OUTCOME_UNKNOWN
        and record.safety is SafetyClass.UNSAFE
    )


def history(
    tenant: Tenant, effect_id: str, at_sequence: int | None = None
) -> EffectHistory:
    """Fold the verified event chain into the state at ``at_sequence`` (default: now)."""
    record = get_effect(tenant, effect_id)
    verified = _verified_length(record)
    # Events are append-only, so the verified prefix re-read here is the one verified.
    events = [
        e for e in store.load_events(record.effect_id) if e.facts.sequence <= verified
    ]
    last = verified if at_sequence is None else at_sequence
    if isinstance(last, bool) or not 1 <= last <= verified:
        raise InvalidRequestError(
            f"at_sequence must be between 1 and {verified} for effect {record.effect_id}",
            latest_sequence=verified,
        )
    status: str | None = None
    for event in events[:last]:
        if event.facts.old_status != status:
            raise EventChainBrokenError(
                f"event {event.facts.sequence}: leaves {event.facts.old_status} but the "
                f"effect was {status}",
                sequence=event.facts.sequence,
            )
        status = event.facts.new_status
    folded = events[last - 1].facts
    return EffectHistory(
        effect_id=record.effect_id,
        at_sequence=last,
        latest_sequence=verified,
        status=EffectStatus(folded.new_status),
        version=folded.version,
        events=tuple(events[:last]),
    )


def get_receipt(
    tenant: Tenant, effect_id: str, *, runtime: Runtime | None = None
) -> StoredReceipt:
    """Return the effect's stored receipt with its result decrypted."""
    rt = runtime or get_runtime()
    record = get_effect(tenant, effect_id)
    row = EffectReceipt.objects.filter(effect_id=uuid.UUID(record.effect_id)).first()
    if row is None:
        raise EffectNotFoundError(
            f"effect {record.effect_id} has no receipt (status {record.status.value}); "
            "only a succeeded effect has one",
            effect_id=record.effect_id,
            effect_status=record.status.value,
        )
    plaintext = decrypt(
        rt.keyring,
        row.result_key_id,
        row.result_ciphertext,
        aad=result_aad(record.tenant_id, record.operation_key),
    )
    result = parse_json_strict(plaintext)
    return StoredReceipt(
        receipt_id=str(row.id),
        effect_id=record.effect_id,
        external_id=row.external_id,
        result=result if isinstance(result, dict) else {"value": result},
        result_preview=dict(row.result_preview),
        evidence_digest=row.evidence_digest,
        target_timestamp=row.target_timestamp,
        contract_version=row.contract_version,
        downstream_key_digest=row.downstream_key_digest,
        created_at=row.created_at,
    )


def list_for_operators(
    *,
    tenant_name: str | None = None,
    status: EffectStatus | None = None,
    tool: str | None = None,
    limit: int = 50,
) -> list[OperatorRow]:
    """List effects across tenants, newest first: privileged (CLI and admin only)."""
    query = EffectIntent.objects.all()
    if tenant_name is not None:
        tenant = Tenant.objects.filter(name=tenant_name).first()
        if tenant is None:
            raise TenantNotFoundError(f"no tenant named {tenant_name!r}")
        query = query.filter(tenant_id=tenant.id)
    if status is not None:
        query = query.filter(status=status.value)
    if tool is not None:
        query = query.filter(tool=tool)
    rows = query.order_by("-created_at", "-id").values_list(*INTENT_COLUMNS)
    records = [record_from_row(row) for row in rows[: max(1, min(limit, MAX_PAGE))]]
    names = dict(
        Tenant.objects.filter(id__in={r.tenant_id for r in records}).values_list(
            "id", "name"
        )
    )
    return [
        OperatorRow(r, names.get(uuid.UUID(r.tenant_id), "?"), needs_operator(r))
        for r in records
    ]


def get_effect(tenant: Tenant, effect_id: str) -> EffectRecord:
    """Return one effect of ``tenant`` (a malformed id is simply not found)."""
    return store.get_effect(str(tenant.id), _effect_uuid(effect_id))


def list_effects(
    tenant: Tenant,
    *,
    status: EffectStatus | None = None,
    tool: str | None = None,
    operation_prefix: str | None = None,
    limit: int = 50,
) -> list[EffectRecord]:
    """List ``tenant``'s effects, newest first, with optional filters."""
    return store.list_effects(
        str(tenant.id),
        status=status,
        tool=tool,
        operation_prefix=operation_prefix,
        limit=limit,
    )


def fork_links(record: EffectRecord) -> ForkLinks:
    """Which effect ``record`` was forked from, and which effect is its fork (if any);
    ``record`` was read tenant-scoped, and a fork never leaves its tenant."""
    effect = uuid.UUID(record.effect_id)
    origin = EffectFork.objects.filter(new_effect_id=effect).values_list(
        "old_effect_id", flat=True
    )
    fork = EffectFork.objects.filter(old_effect_id=effect).values_list(
        "new_effect_id", flat=True
    )
    forked_from, forked_to = origin.first(), fork.first()
    return ForkLinks(
        forked_from=str(forked_from) if forked_from else None,
        forked_to=str(forked_to) if forked_to else None,
    )


def count_events(effect_id: str) -> int:
    """How many transition events ``effect_id`` has (demo output)."""
    return len(store.load_events(str(effect_id)))


def verify_chain(effect_id: str) -> int:
    """Verify ``effect_id``'s event digest chain; return its length."""
    return store.verify_event_chain(str(effect_id))


def tenant_of(effect_id: str) -> Tenant:
    """The tenant owning ``effect_id``: privileged, for operator tools acting across
    tenants (CLI, admin); callers of the API get their tenant from their key."""
    tenant = Tenant.objects.filter(effects__id=_effect_uuid(effect_id)).first()
    if tenant is None:
        raise EffectNotFoundError(f"no effect {effect_id}")
    return tenant


# --- internals --------------------------------------------------------------------


def _effect_uuid(effect_id: str) -> str:
    try:
        return str(uuid.UUID(str(effect_id)))
    except ValueError:
        raise EffectNotFoundError(f"no effect {effect_id}") from None


def _verified_length(record: EffectRecord) -> int:
    for _ in range(_VERIFY_TRIES - 1):
        before = store.get_effect(record.tenant_id, record.effect_id).version
        try:
            return store.verify_event_chain(record.effect_id)
        except EventChainBrokenError:
            if store.get_effect(record.tenant_id, record.effect_id).version == before:
                raise
    return store.verify_event_chain(record.effect_id)
