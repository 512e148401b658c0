"""What the MCP server lists: four management tools and the contracts' proxy tools.

Proxy tools come only from contracts that declare ``[contract.mcp]`` with
``expose = true``: a tool with no versioned contract cannot be listed or forwarded
(strict mode; spec "Operation identity": every effect pins a contract version). There
are no resolution tools: an agent never resolves its own effects (issue 10, item 2).
"""

from __future__ import annotations

from typing import Any

import mcp.types as types

from effect_broker.domain.contracts import ContractRegistry, EffectContract
from effect_broker.domain.states import SafetyClass
from effect_broker.mcp import output_schemas as outputs

GET_EFFECT = "get_effect"
LIST_UNKNOWN_EFFECTS = "list_unknown_effects"
GET_RECEIPT = "get_receipt"
REQUEST_RECONCILIATION = "request_reconciliation"

OPERATION_KEY_DESCRIPTION = (
    "The identity of this business operation, the same on every retry of it. Build it "
    "from what stays stable when your run retries: the workflow or run id plus this "
    "step's identity (for example 'run:7f3a:step:charge-order-42', or a business key "
    "such as 'order:42:charge:v1'). Never generate a fresh random value per call: "
    "calling again with the same key returns the same effect instead of acting twice, "
    "and any other key starts a second operation."
)

_EFFECT_ID = {
    "type": "object",
    "properties": {"effect_id": {"type": "string", "description": "The effect's id."}},
    "required": ["effect_id"],
    "additionalProperties": False,
}

_READ_ONLY = types.ToolAnnotations(read_only_hint=True, open_world_hint=False)

MANAGEMENT_TOOLS = (
    types.Tool(
        name=GET_EFFECT,
        description="Return one of your effects: its status, contract and attempts.",
        input_schema=_EFFECT_ID,
        output_schema=outputs.EFFECT,
        annotations=_READ_ONLY,
    ),
    types.Tool(
        name=LIST_UNKNOWN_EFFECTS,
        description=(
            "List your effects whose outcome nobody knows yet (outcome_unknown, "
            "manual_review), newest first. An operator resolves them; do not redo them "
            "under another operation key."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "limit": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50}
            },
            "additionalProperties": False,
        },
        output_schema=outputs.EFFECT_LIST,
        annotations=_READ_ONLY,
    ),
    types.Tool(
        name=GET_RECEIPT,
        description="Return the receipt of a succeeded effect, its result included.",
        input_schema=_EFFECT_ID,
        output_schema=outputs.RECEIPT,
        annotations=_READ_ONLY,
    ),
    types.Tool(
        name=REQUEST_RECONCILIATION,
        description=(
            "Ask the broker to check with the target whether an effect with an unknown "
            "outcome happened. Never resends anything; refused for unsafe tools, which "
            "only an operator can resolve."
        ),
        input_schema=_EFFECT_ID,
        output_schema=outputs.RECONCILIATION,
        annotations=types.ToolAnnotations(
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    ),
)
MANAGEMENT_NAMES = frozenset(tool.name for tool in MANAGEMENT_TOOLS)


def exposed_contracts(registry: ContractRegistry) -> dict[str, EffectContract]:
    """The active contracts with an exposed MCP face, by tool name."""
    exposed: dict[str, EffectContract] = {}
    for name in registry.tools():
        contract = registry.for_tool(name)
        if contract.mcp is not None and contract.mcp.expose:
            exposed[name] = contract
    # A contract's tool may not take a management tool's name: the call would be
    # ambiguous. Management wins; the proxy tool is not listed.
    return {k: v for k, v in exposed.items() if k not in MANAGEMENT_NAMES}


def proxy_input_schema(contract: EffectContract) -> dict[str, Any]:
    """The contract's argument schema plus the required ``operation_key``."""
    assert contract.mcp is not None
    schema = contract.mcp.input_schema
    properties = dict(schema.get("properties", {}))
    properties["operation_key"] = {
        "type": "string",
        "minLength": 1,
        "description": OPERATION_KEY_DESCRIPTION,
    }
    required = [r for r in schema.get("required", []) if r != "operation_key"]
    return {**schema, "properties": properties, "required": ["operation_key", *required]}


def proxy_tool(contract: EffectContract) -> types.Tool:
    """The listed face of a contract's tool, with annotations its safety class earns."""
    assert contract.mcp is not None
    text = contract.mcp.description or contract.description or contract.tool
    safety = contract.safety
    guarantee = {
        SafetyClass.TRANSACTIONAL: "exactly once per operation key",
        SafetyClass.IDEMPOTENT: "once per operation key while the target keeps its key",
        SafetyClass.RECONCILABLE: "once per operation key, checked against the target",
        SafetyClass.UNSAFE: (
            "at most once per operation key; if its answer is lost, nobody knows "
            "whether it happened until an operator checks"
        ),
    }[safety]
    return types.Tool(
        name=contract.tool,
        description=(
            f"{text}\n\nSide effect through effect-broker (contract {contract.name} "
            f"v{contract.version}, {safety.value}): {guarantee}. Pass the same "
            "operation_key on every retry of this step."
        ),
        input_schema=proxy_input_schema(contract),
        output_schema=outputs.proxy_output_schema(contract),
        annotations=types.ToolAnnotations(
            read_only_hint=False,
            destructive_hint=contract.mcp.destructive,
            # The broker enforces one effect per operation key, whatever the target
            # promises: a repeated call with the same arguments (the key among them)
            # replays the recorded effect and sends nothing (issue 21). Unsafe differs
            # only in what is known after a lost answer, not in how often it is sent.
            idempotent_hint=True,
            # Every proxy tool acts on a target outside the broker.
            open_world_hint=True,
        ),
    )


def list_tools(registry: ContractRegistry) -> list[types.Tool]:
    """Every tool the server lists: management tools, then proxy tools by name."""
    proxies = [proxy_tool(c) for _, c in sorted(exposed_contracts(registry).items())]
    return [*MANAGEMENT_TOOLS, *proxies]
