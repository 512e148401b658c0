"""The outputSchema of each MCP tool: what a successful call's structured content is.

MCP clients validate a result against the listed ``outputSchema`` (the SDK's
``ClientSession.call_tool`` does, and raises on a mismatch); a tool error
(``isError``) is not validated, so these describe successes only. The server answers
only with content these schemas accept (``effect_broker.mcp.server``).
"""

from __future__ import annotations

from typing import Any

from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.states import EffectStatus, SafetyClass

_TEXT = {"type": "string"}
_TEXT_OR_NULL = {"type": ["string", "null"]}
_TIMESTAMP = {"type": "string", "format": "date-time"}
_STATUS = {"type": "string", "enum": [s.value for s in EffectStatus]}

#: One effect, as ``get_effect`` and the other management tools return it.
EFFECT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "effect_id": _TEXT,
        "operation_key": _TEXT,
        "tool": _TEXT,
        "contract": {**_TEXT, "description": "<contract name>@<version>"},
        "safety_class": {"type": "string", "enum": [s.value for s in SafetyClass]},
        "status": _STATUS,
        "attempt_count": {"type": "integer", "minimum": 0},
        "needs_operator": {"type": "boolean"},
        "receipt_id": _TEXT_OR_NULL,
        "created_at": _TIMESTAMP,
        "updated_at": _TIMESTAMP,
    },
    "required": [
        "effect_id",
        "operation_key",
        "tool",
        "contract",
        "safety_class",
        "status",
        "attempt_count",
        "needs_operator",
        "receipt_id",
        "created_at",
        "updated_at",
    ],
    "additionalProperties": False,
}

RECEIPT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "receipt_id": _TEXT,
        "effect_id": _TEXT,
        "external_id": _TEXT_OR_NULL,
        "result": {"type": "object"},
        "contract_version": _TEXT,
        "created_at": _TIMESTAMP,
    },
    "required": [
        "receipt_id",
        "effect_id",
        "external_id",
        "result",
        "contract_version",
        "created_at",
    ],
    "additionalProperties": False,
}

#: A proxy call that answered before its effect settled; ``paused`` when an
#: operator's pause holds it (issue 24): why, since when, and what is paused; one
#: awaiting an operator's approval also says until when, and where the approval
#: page is (issue 24).
RUNNING: dict[str, Any] = {
    "type": "object",
    "properties": {
        "effect_id": _TEXT,
        "status": _STATUS,
        "done": {"const": False},
        "paused": {
            "type": "object",
            "properties": {"reason": _TEXT, "since": _TIMESTAMP, "scope": _TEXT},
            "required": ["reason", "since", "scope"],
            "additionalProperties": False,
        },
        "approval_deadline": {"type": ["string", "null"], "format": "date-time"},
        "approval_url": _TEXT_OR_NULL,
    },
    "required": ["effect_id", "status", "done"],
    "additionalProperties": False,
}

#: ``list_unknown_effects``.
EFFECT_LIST: dict[str, Any] = {
    "type": "object",
    "properties": {"effects": {"type": "array", "items": EFFECT}},
    "required": ["effects"],
    "additionalProperties": False,
}

#: ``request_reconciliation``: the effect, and whether a reconcile job was deferred.
RECONCILIATION: dict[str, Any] = {
    **EFFECT,
    "properties": {**EFFECT["properties"], "reconcile_requested": {"type": "boolean"}},
    "required": [*EFFECT["required"], "reconcile_requested"],
}


def proxy_output_schema(contract: EffectContract) -> dict[str, Any]:
    """A proxy call's success: the receipt's result (of the contract's declared
    ``output_schema``, else any object), or "still running" (``RUNNING``)."""
    assert contract.mcp is not None
    result = contract.mcp.output_schema or {"type": "object"}
    return {"type": "object", "anyOf": [result, RUNNING]}
