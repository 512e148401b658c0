"""Turn raw ledger rows into domain records."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.store.sql import INTENT_COLUMNS


def json_value(raw: Any) -> Any:
    """Django's psycopg loader hands jsonb back as text; decode it here."""
    return json.loads(raw) if isinstance(raw, str | bytes) else raw


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


_WITH_HEAD = len(INTENT_COLUMNS) + 1


def record_from_row(row: Sequence[Any]) -> EffectRecord:
    """Build an ``EffectRecord`` from a row in ``INTENT_COLUMNS`` order, optionally
    followed by the head digest (``sql.SELECT_INTENT`` and every write return it)."""
    if len(row) not in (len(INTENT_COLUMNS), _WITH_HEAD):
        raise ValueError(f"intent row has {len(row)} columns, expected {_WITH_HEAD}")
    head = row[-1] if len(row) == _WITH_HEAD else None
    r = dict(zip(INTENT_COLUMNS, row[: len(INTENT_COLUMNS)], strict=True))
    return EffectRecord(
        effect_id=str(r["id"]),
        tenant_id=str(r["tenant_id"]),
        operation_key=r["operation_key"],
        tool=r["tool"],
        request_hash=bytes(r["request_hash"]),
        downstream_key=r["downstream_key"],
        contract_name=r["contract_name"],
        contract_version=r["contract_version"],
        safety=SafetyClass(r["safety_class"]),
        status=EffectStatus(r["status"]),
        version=int(r["version"]),
        attempt_count=int(r["attempt_count"]),
        arguments_preview=json_value(r["arguments_preview"]),
        next_action_at=r["next_action_at"],
        lease_owner=r["lease_owner"],
        lease_expires_at=r["lease_expires_at"],
        first_dispatch_at=r["first_dispatch_at"],
        retention_deadline=r["retention_deadline"],
        settlement_deadline=r["settlement_deadline"],
        outcome_in_doubt=bool(r["outcome_in_doubt"]),
        receipt_id=_str_or_none(r["receipt_id"]),
        trace_id=r["trace_id"],
        requested_by=r["requested_by"],
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        head_digest=None if head is None else bytes(head),
        trace_context=r["trace_context"],
    )
