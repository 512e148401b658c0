"""The MCP server: a low-level ``mcp.server.Server`` whose handlers call the services.

Thin glue (STYLE rule 4): a handler finds the caller's tenant, checks arguments, calls
one service and shapes its answer. Services are synchronous Django code, so each call
runs in a worker thread (``anyio.to_thread``); the event loop keeps serving.

A domain error reaches the agent as a tool error (``is_error``) carrying the error's
stable ``code`` (``EffectBrokerError.to_dict``), the same code the HTTP API returns.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema
import mcp.types as types
from mcp.server import Server, ServerRequestContext

from effect_broker.api.rate_limit import charge_submit
from effect_broker.domain.errors import (
    ConfigurationError,
    DatabaseConflictError,
    EffectBrokerError,
)
from effect_broker.domain.pauses import Pause
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus
from effect_broker.domain.storable_text import require_storable
from effect_broker.mcp import tools
from effect_broker.mcp.passthrough import PassThroughMirror
from effect_broker.models import Tenant
from effect_broker.services import (
    approval_notices,
    awaiting,
    inspection,
    pauses,
    resolution,
)
from effect_broker.services.awaiting import in_thread
from effect_broker.services.runtime import get_runtime
from effect_broker.services.submission import submit

logger = logging.getLogger(__name__)

#: Finds the caller's tenant for a request (fixed for stdio, per request for HTTP).
TenantResolver = Callable[[ServerRequestContext[Any, Any]], Tenant]


#: Default bound on how long a proxy call waits for its effect to settle.
DEFAULT_WAIT_SECONDS = 10.0


#: The environment variable that sets ``wait_seconds``.
WAIT_ENV = "EFFECT_BROKER_MCP_WAIT_SECONDS"
#: Strict mode (default on): pass-through tools only when verified read-only.
STRICT_ENV = "EFFECT_BROKER_MCP_STRICT"
_SWITCH = {"1": True, "true": True, "yes": True, "on": True}
_SWITCH |= {"0": False, "false": False, "no": False, "off": False}


@dataclass(frozen=True)
class McpSettings:
    """How the server behaves; ``wait_seconds`` bounds a proxy call's wait."""

    wait_seconds: float = DEFAULT_WAIT_SECONDS
    #: Strict mode: a pass-through is listed and forwarded only when verified
    #: read-only (effect_broker/mcp/passthrough.py).
    strict: bool = True


def mcp_settings_from_env(
    wait_seconds: float | None = None, *, no_strict: bool = False
) -> McpSettings:
    """``McpSettings`` from ``wait_seconds``, else ``$EFFECT_BROKER_MCP_WAIT_SECONDS``,
    else the default; one ``ConfigurationError`` line for a value that is no number."""
    if wait_seconds is None:
        raw = os.environ.get(WAIT_ENV, "").strip()
        try:
            wait_seconds = float(raw) if raw else DEFAULT_WAIT_SECONDS
        except ValueError:
            raise ConfigurationError(
                f"{WAIT_ENV} must be a number of seconds, got {raw!r}"
            ) from None
        if not math.isfinite(wait_seconds):
            raise ConfigurationError(f"{WAIT_ENV} must be finite, got {raw!r}")
    strict_text = os.environ.get(STRICT_ENV, "1").strip().lower() or "1"
    if strict_text not in _SWITCH:
        raise ConfigurationError(f"${STRICT_ENV} must be 1 or 0, got {strict_text!r}")
    strict = _SWITCH[strict_text] and not no_strict
    return McpSettings(wait_seconds=max(0.0, wait_seconds), strict=strict)


def build_server(resolve_tenant: TenantResolver, settings: McpSettings) -> Server[Any]:
    """The effect-broker MCP server for the tenants ``resolve_tenant`` returns."""
    mirror = PassThroughMirror(strict=settings.strict)

    async def on_list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        registry = get_runtime().registry
        listed = tools.list_tools(registry)
        listed += await mirror.list_tools(registry, {tool.name for tool in listed})
        return types.ListToolsResult(tools=listed)

    async def on_call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        arguments = dict(params.arguments or {})
        try:
            # The storable-text rule every surface applies to its input before any
            # service sees it (issue 12: NUL reached PostgreSQL as a 500).
            require_storable(arguments)
            tenant = resolve_tenant(ctx)
            registry = get_runtime().registry
            passthrough = mirror.find(registry, params.name)
            if passthrough is not None and params.name not in tools.MANAGEMENT_NAMES:
                # No ledger: forwarded as it is, if strict mode allows it.
                return await mirror.call(passthrough, arguments)
            step = await in_thread(_call, tenant, params.name, arguments)
            if isinstance(step, types.CallToolResult):
                return step
            # The wait holds no thread and no connection (services.awaiting).
            record = await awaiting.wait_until_settled(
                tenant, step.effect_id, settings.wait_seconds
            )
            return await in_thread(_outcome, tenant, record)
        except EffectBrokerError as exc:
            return _domain_error(exc)
        except Exception as exc:
            # A deadlock or serialization failure the store did not already raise as
            # the domain error: retryable, as over HTTP, never internal (issue 19).
            conflict = DatabaseConflictError.of(exc)
            if conflict is not None:
                return _domain_error(conflict)
            # Never a traceback or an internal message to an agent (a database error's
            # text can name tables and values); the log keeps the detail.
            logger.exception("mcp tool call failed", extra={"tool": params.name})
            return _error(
                "internal_error",
                "internal error in the broker; this answer says nothing about the "
                "call's outcome: call again with the same operation_key (a resend is a "
                "replay), never under another key",
            )

    return Server(
        "effect-broker",
        instructions=(
            "Side-effecting tools go through effect-broker: pass the same operation_key "
            "on every retry of a step. An unknown outcome is reported as such; never "
            "redo it under another key."
        ),
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
    )


# --- calls (each service call runs in a worker thread: ``awaiting.in_thread``) --------


def _call(
    tenant: Tenant, name: str, arguments: dict[str, Any]
) -> types.CallToolResult | EffectRecord:
    """A management tool's answer, a refusal, or the effect a proxy call submitted
    (which the caller then waits for)."""
    if name in tools.MANAGEMENT_NAMES:
        return _management(tenant, name, arguments)
    contract = tools.exposed_contracts(get_runtime().registry).get(name)
    if contract is None:
        # Strict: only a listed tool is forwarded, and only a contract lists one.
        return _error(
            "unknown_tool",
            f"There is no tool {name!r}: only the listed tools can be called, and a "
            "side-effecting tool is listed only with a versioned contract. Nothing was "
            "done.",
        )
    # The tenant's submit rate, charged as REST charges it: before the arguments are
    # checked, stored or sent, sized like a REST body (api/rate_limit.py). A refusal
    # is a ``rate_limited`` tool error carrying ``retry_after_seconds``.
    charge_submit(str(tenant.pk), len(json.dumps(arguments).encode()))
    problems = _schema_problems(tools.proxy_input_schema(contract), arguments)
    if problems:
        return _error(
            "invalid_arguments",
            "Arguments refused, nothing was stored or sent: " + "; ".join(problems),
            fields=[p.split(":", 1)[0] for p in problems],
        )
    operation_key = arguments.pop("operation_key")
    reservation = submit(
        tenant,
        EffectRequest(
            operation_key=operation_key,
            tool=name,
            arguments=arguments,
            requested_by="mcp",
        ),
    )
    held = pauses.pause_holding(reservation.effect)
    if held is not None:
        # Waiting cannot help while an operator's pause holds it: answer now.
        return _paused(reservation.effect, held)
    return reservation.effect


def _schema_problems(schema: dict[str, Any], arguments: dict[str, Any]) -> list[str]:
    """Every way ``arguments`` break ``schema``, each as '<field path>: <reason>'."""
    validator_class = jsonschema.validators.validator_for(schema)
    validator = validator_class(schema)
    problems = []
    errors = validator.iter_errors(arguments)
    for error in sorted(errors, key=lambda e: [str(part) for part in e.path]):
        path = ".".join(str(part) for part in error.path)
        if not path and error.validator == "required":
            # "'x' is a required property": name the missing field itself.
            missing = [f for f in error.validator_value if f not in arguments]
            path = missing[0] if len(missing) == 1 else ",".join(missing)
        problems.append(f"{path or '(arguments)'}: {error.message}")
    return problems


def _outcome(tenant: Tenant, record: EffectRecord) -> types.CallToolResult:
    """The agent's answer for an effect as it stands after the wait."""
    status = record.status
    ids = {"effect_id": record.effect_id, "status": status.value}
    if status is EffectStatus.SUCCEEDED:
        receipt = inspection.get_receipt(tenant, record.effect_id)
        result = dict(receipt.result)
        mismatch = _result_mismatch(record.tool, result)
        if mismatch:
            # A client validates a success against the listed outputSchema and fails
            # the whole call on a mismatch, so the agent would not even learn that
            # the effect happened. Say so plainly instead, as a tool error.
            logger.warning(
                "receipt result does not match the declared output schema",
                extra={"action": "mcp_call", "effect_id": record.effect_id},
            )
            return _error(
                "result_schema_mismatch",
                f"The effect SUCCEEDED (effect {record.effect_id}, receipt "
                f"{receipt.receipt_id}) and will not be done again, but the target's "
                f"result does not match this tool's declared output schema ({mismatch})."
                " Read it with get_receipt. Do not call this tool again under another "
                "operation key: that would do it twice.",
                receipt_id=receipt.receipt_id,
                **ids,
            )
        return types.CallToolResult(
            content=[_text(json.dumps(result, sort_keys=True))],
            structured_content=result,
            _meta={"effect_broker/effect_id": record.effect_id},
        )
    if status is EffectStatus.AWAITING_APPROVAL:
        return _awaiting_approval(record)
    if status in (EffectStatus.OUTCOME_UNKNOWN, EffectStatus.MANUAL_REVIEW):
        who = (
            "An operator will look at the target and resolve it"
            if inspection.needs_operator(record)
            else "The broker is checking with the target; if that cannot settle it, an "
            "operator will resolve it"
        )
        return _error(
            "outcome_unknown",
            f"Nobody knows yet whether this happened (effect {record.effect_id}, status "
            f"{status.value}): the request may have reached the target and its answer "
            f"was lost. {who}. Do NOT retry it under another operation key - that could "
            "do it twice. Calling again with the same operation key is safe and returns "
            "this effect's state.",
            **ids,
        )
    if status is EffectStatus.FAILED_FINAL and record.outcome_in_doubt:
        # An operator gave up on it without proof (issue 19, item 1): say so, or the
        # agent redoes the step under a new key over a charge that may exist.
        return _error(
            status.value,
            f"Effect {record.effect_id} ended failed_final by an operator's decision "
            "while its request may have reached the target unanswered: nothing proved "
            "that it did not happen. It will not be sent again. Do NOT redo it under "
            "another operation key without checking the target - that could do it "
            "twice. Calling again with the same operation key returns this same answer.",
            **ids,
        )
    if status in awaiting.FINAL:
        return _error(
            status.value,
            f"Effect {record.effect_id} ended {status.value}; it will not be sent again. "
            "Calling again with the same operation key returns this same answer.",
            **ids,
        )
    held = pauses.pause_holding(record)
    if held is not None:
        return _paused(record, held)
    return types.CallToolResult(
        content=[
            _text(
                f"Still running: effect {record.effect_id} is {status.value}. Call this "
                "tool again with the same operation_key and arguments to get its "
                "outcome; do not use a new key."
            )
        ],
        structured_content={**ids, "done": False},
    )


def _paused(record: EffectRecord, held: Pause) -> types.CallToolResult:
    """An operator's pause holds the effect (issue 24): it waits, nothing failed."""
    paused = {
        "reason": held.reason,
        "since": held.paused_at.isoformat(),
        "scope": held.scope.describe(),
    }
    return types.CallToolResult(
        content=[
            _text(
                f"Paused by an operator: effect {record.effect_id} is recorded "
                f"({record.status.value}) and waits; dispatch of "
                f"{paused['scope']} is paused ({held.reason}). Nothing of it has "
                "been sent while paused, and it will be sent when an operator "
                "resumes dispatch. Call this tool again with the same operation_key "
                "and arguments to get its outcome; do not use a new key."
            )
        ],
        structured_content={
            "effect_id": record.effect_id,
            "status": record.status.value,
            "done": False,
            "paused": paused,
        },
    )


def _awaiting_approval(record: EffectRecord) -> types.CallToolResult:
    """Issue 24: reserved, nothing sent, an operator must approve it first. Not an
    error (nothing failed), and no reason to redo anything: the same call later
    returns its outcome. The approval page's URL, when the broker knows where it is,
    is what the MCP spec's URL-mode elicitation would send a person to."""
    deadline = record.next_action_at.isoformat() if record.next_action_at else None
    url = approval_notices.approval_url(record.effect_id)
    where = f" The approval page: {url}" if url else ""
    return types.CallToolResult(
        content=[
            _text(
                f"Awaiting approval by an operator: effect {record.effect_id} was "
                f"recorded and nothing has been sent. Call this tool again with the "
                f"same operation_key and arguments to get its outcome once an operator "
                f"has decided (until {deadline}; not approved by then, it is never "
                f"sent); do not use a new key.{where}"
            )
        ],
        structured_content={
            "effect_id": record.effect_id,
            "status": record.status.value,
            "done": False,
            "approval_deadline": deadline,
            "approval_url": url,
        },
    )


def _result_mismatch(tool: str, result: dict[str, Any]) -> str:
    """Why ``result`` breaks the output schema listed for ``tool`` ("" when it fits,
    or when the contract declares none)."""
    contract = tools.exposed_contracts(get_runtime().registry).get(tool)
    schema = contract.mcp.output_schema if contract and contract.mcp else None
    if schema is None:
        return ""
    return "; ".join(_schema_problems(schema, result))


def _management(
    tenant: Tenant, name: str, arguments: dict[str, Any]
) -> types.CallToolResult:
    schema = next(t.input_schema for t in tools.MANAGEMENT_TOOLS if t.name == name)
    problems = _schema_problems(schema, arguments)
    if problems:
        return _error("invalid_arguments", "; ".join(problems))
    if name == tools.GET_EFFECT:
        record = inspection.get_effect(tenant, arguments["effect_id"])
        return _data(_effect(record))
    if name == tools.GET_RECEIPT:
        receipt = inspection.get_receipt(tenant, arguments["effect_id"])
        return _data(
            {
                "receipt_id": receipt.receipt_id,
                "effect_id": receipt.effect_id,
                "external_id": receipt.external_id,
                "result": dict(receipt.result),
                "contract_version": receipt.contract_version,
                "created_at": receipt.created_at.isoformat(),
            }
        )
    if name == tools.LIST_UNKNOWN_EFFECTS:
        limit = arguments.get("limit", 50)
        records = [
            record
            for status in (EffectStatus.OUTCOME_UNKNOWN, EffectStatus.MANUAL_REVIEW)
            for record in inspection.list_effects(tenant, status=status, limit=limit)
        ]
        records.sort(key=lambda r: r.created_at, reverse=True)
        return _data({"effects": [_effect(r) for r in records[:limit]]})
    asked = resolution.request_reconciliation(
        tenant, arguments["effect_id"], requested_by="mcp"
    )
    return _data({**_effect(asked.effect), "reconcile_requested": asked.deferred})


def _effect(record: EffectRecord) -> dict[str, Any]:
    return {
        "effect_id": record.effect_id,
        "operation_key": record.operation_key,
        "tool": record.tool,
        "contract": f"{record.contract_name}@{record.contract_version}",
        "safety_class": record.safety.value,
        "status": record.status.value,
        "attempt_count": record.attempt_count,
        "needs_operator": inspection.needs_operator(record),
        "receipt_id": record.receipt_id,
        "created_at": record.created_at.isoformat(),
        "updated_at": record.updated_at.isoformat(),
    }


# --- results ----------------------------------------------------------------------


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def _data(data: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[_text(json.dumps(data, sort_keys=True))], structured_content=data
    )


def _error(code: str, message: str, **details: object) -> types.CallToolResult:
    return types.CallToolResult(
        content=[_text(f"[{code}] {message}")],
        # Details are JSON-safe (no datetimes or bytes reach the agent unencoded).
        structured_content=json.loads(
            json.dumps(
                {"code": code, "message": message, "details": details}, default=str
            )
        ),
        is_error=True,
    )


def _domain_error(exc: EffectBrokerError) -> types.CallToolResult:
    """A domain error as a tool error, with the code the HTTP API uses."""
    # Another tenant's effect is simply not found: the store reads tenant-scoped.
    logger.info("mcp tool refused", extra={"action": "mcp_call", "code": exc.code})
    return _error(exc.code, exc.message, **exc.details)
