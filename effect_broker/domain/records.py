"""Immutable snapshots of ledger rows as the services and adapters see them.

Services never hand a Django model instance to an adapter: an ``EffectRecord`` is a
frozen read of one row at one ``version``, and every write names that version (the
fence). A record is therefore also the proof of what the writer believed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from effect_broker.domain.states import EffectStatus, SafetyClass

JsonObject = Mapping[str, object]

MAX_REQUESTED_BY_LENGTH = 200
"""Longest ``requested_by`` accepted, in characters (issue 12: 200 KB was taken)."""

MAX_TRACE_ID_LENGTH = 200
"""Longest ``trace_id`` accepted, in characters (a W3C trace id is 32)."""

MAX_TOOL_LENGTH = 200
"""Longest ``tool`` name accepted, in characters (an unknown one is echoed back)."""


@dataclass(frozen=True, slots=True)
class EffectRequest:
    """What a caller asks for: a business operation, a tool and its arguments."""

    operation_key: str
    tool: str
    arguments: JsonObject
    requested_by: str = ""
    trace_id: str | None = None


@dataclass(frozen=True, slots=True)
class EffectRecord:
    """One effect intent row at one version (decrypted arguments only when loaded)."""

    effect_id: str
    tenant_id: str
    operation_key: str
    tool: str
    request_hash: bytes
    downstream_key: str
    contract_name: str
    contract_version: str
    safety: SafetyClass
    status: EffectStatus
    version: int
    attempt_count: int
    arguments_preview: JsonObject
    next_action_at: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    first_dispatch_at: datetime | None
    retention_deadline: datetime | None
    settlement_deadline: datetime | None
    #: True once an attempt may have reached the target with no answer seen (and no
    #: proof of non-commit since): no later refusal may end the effect failed_final.
    outcome_in_doubt: bool
    receipt_id: str | None
    trace_id: str | None
    requested_by: str
    created_at: datetime
    updated_at: datetime
    #: Digest of the event at ``version`` (the next event chains to it), when read
    #: with the row; None when the row was read without it.
    head_digest: bytes | None = None
    #: W3C ``traceparent`` of the submit's span: a worker's spans continue its trace.
    trace_context: str | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    """The answer to a submit: the effect, and whether this call created it."""

    effect: EffectRecord
    created: bool
    replayed: bool
