"""The one definition of a contracts file's fields: names, value shapes and meanings.

The parser (``contracts.py``, ``upstream.py``) takes its allowed keys from here, so a
field cannot exist in one place and not the other; ``json_schema()`` turns the same
table into the JSON Schema editors use to check ``contracts.toml`` as it is typed (a
``#:schema`` line at the top of the file), and the docs' contract reference is
generated from it. Validation that needs more than a shape (a class's required fields,
a lookup without a key, a duration's range) stays in the parser, which gives every
problem as ``file:contract@version:field: reason``; the schema is the editor's early
warning, never the judge.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: ``"<number><ms|s|m|h|d>"``, as ``contracts.parse_duration`` accepts it.
DURATION: Mapping[str, Any] = {
    "type": "string",
    "pattern": r"^[0-9]+(\.[0-9]+)?(ms|s|m|h|d)$",
}
TEXT: Mapping[str, Any] = {"type": "string", "minLength": 1}
TEXTS: Mapping[str, Any] = {"type": "array", "items": {"type": "string", "minLength": 1}}
FLAG: Mapping[str, Any] = {"type": "boolean"}
TABLE: Mapping[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class ContractField:
    """One key of a contracts-file table."""

    name: str
    shape: Mapping[str, Any]
    meaning: str
    default: str = ""
    required: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    def schema(self) -> dict[str, Any]:
        """This field's JSON Schema, its meaning as the description."""
        described = self.meaning + (f" Default: {self.default}." if self.default else "")
        return {**self.shape, **self.extra, "description": described}


CONTRACT: tuple[ContractField, ...] = (
    ContractField(
        "name", TEXT, "The contract's name; with version, its identity.", required=True
    ),
    ContractField(
        "version",
        TEXT,
        'A string ("1"). An effect pins name@version when it is reserved.',
        required=True,
    ),
    ContractField("tool", TEXT, "The tool name callers submit.", "the name"),
    ContractField(
        "safety",
        {"enum": ["transactional", "idempotent", "reconcilable", "unsafe"]},
        "What the target can prove; it decides what the broker promises.",
        required=True,
    ),
    ContractField(
        "retry_limit",
        {"type": "integer", "minimum": 0},
        "Attempts after the first, only ever after proof that nothing was committed.",
        "3",
    ),
    ContractField(
        "key_retention",
        DURATION,
        "How long the target keeps idempotency "
        "keys; required for idempotent. No retry is sent past it.",
    ),
    ContractField(
        "settlement_bound",
        DURATION,
        "After this, a lookup that does not "
        "find the effect proves it was not committed; required for "
        "reconcilable.",
    ),
    ContractField(
        "backoff_initial",
        DURATION,
        "The first delay between retries; it doubles up to backoff_max.",
        "1s",
    ),
    ContractField("backoff_max", DURATION, "The longest delay between retries.", "60s"),
    ContractField(
        "attempt_timeout",
        DURATION,
        "Total time one attempt may take, however slowly the target answers.",
        "the lease less the send margin",
    ),
    ContractField(
        "unknown_alert_after",
        DURATION,
        "How long an unknown outcome may wait before the shipped alert fires.",
        "EFFECT_BROKER_UNKNOWN_ALERT_AFTER_SECONDS (15m)",
    ),
    ContractField(
        "adapter",
        {"enum": ["http", "stripe", "mcp", "simulated", "simulated-local"]},
        "How the target is reached.",
        "simulated",
    ),
    ContractField(
        "adapter_options",
        TABLE,
        "The adapter's options (docs: contract "
        "reference); unknown options are refused by the adapter.",
        "{}",
    ),
    ContractField(
        "preview_fields",
        TEXTS,
        "Top-level arguments shown unredacted in "
        "the effect's preview; every other value is redacted.",
        "[]",
    ),
    ContractField(
        "active",
        FLAG,
        "At most one active contract per tool; keep old "
        "versions with active = false while effects reference them.",
        "true",
    ),
    ContractField("description", {"type": "string"}, "Free text."),
    ContractField(
        "mcp", TABLE, "The tool's face on the broker's own MCP server ([contract.mcp])."
    ),
    ContractField(
        "secrets",
        {"type": "array", "items": {"type": "string", "pattern": "^(env|file):.+"}},
        'The secret references ("env:NAME", "file:name") any tenant\'s arguments '
        "may name for this contract; any other reference is refused at submit.",
        "[]",
    ),
    ContractField(
        "tenant_secrets",
        {
            "type": "object",
            "additionalProperties": {
                "type": "array",
                "items": {"type": "string", "pattern": "^(env|file):.+"},
            },
        },
        "More references one tenant may name, by tenant name "
        "([contract.tenant_secrets]).",
    ),
    ContractField(
        "upstream",
        TABLE,
        "The upstream MCP server and tool "
        '([contract.upstream]); required for adapter = "mcp".',
    ),
    ContractField(
        "sandbox",
        FLAG,
        "The target is a sandbox: `contracts conform` may send it requests without "
        "--yes-send-requests.",
        "false",
    ),
    ContractField(
        "key_template",
        {**TEXT, "pattern": "^(?!-).*\\{key\\}"},
        'How the downstream key is written to the target, e.g. "eb-{key}" for an '
        "upstream whose key is a name: {key} exactly once, no other braces, never "
        "starting with '-'.",
        '"{key}"',
    ),
    ContractField(
        "approval",
        {"enum": ["required"]},
        "Every effect waits in awaiting_approval until an operator approves it (or "
        "denies it; docs: how-to/approvals). Not with approval_when.",
    ),
    ContractField(
        "approval_when",
        {
            "type": "object",
            "properties": {
                "pointer": {"type": "string", "pattern": "^/"},
                "above": {"type": "number"},
            },
            "required": ["pointer", "above"],
            "additionalProperties": False,
        },
        'An effect waits for approval when the JSON pointer ("/amount_minor") names '
        "a number greater than above in its arguments, or anything that is not a "
        "number (missing included). Not with approval.",
    ),
    ContractField(
        "approval_ttl",
        DURATION,
        "How long an effect waits for approval, on the database's clock; then it "
        "ends failed_final (approval_expired), never sent. Only with approval or "
        "approval_when.",
        "1h",
    ),
    ContractField(
        "key_alphabet",
        {"enum": ["base64url", "hex"]},
        "hex: the same key as 64 lowercase hex digits, which never start with '-' "
        "(a base64url key does, 1 time in 64); used by every attempt and lookup.",
        "base64url",
    ),
    # Operator controls (issue 24, item 7): limits every worker shares, counted in
    # PostgreSQL (domain/dispatch_limits.py); not for transactional contracts.
    ContractField(
        "max_in_flight",
        {"type": "integer", "minimum": 1},
        "At most this many attempts of the contract at once, across every worker "
        "(every version of the contract counts). An effect over it waits; it never "
        "fails for it.",
        "no limit",
    ),
    ContractField(
        "rate_limit",
        {"type": "number", "exclusiveMinimum": 0},
        "At most this many attempts per second across every worker (a number: 0.5 "
        "is one attempt every 2 s); in any one second at most rate_limit + 1 start. "
        "An effect over it waits; it never fails for it.",
        "no limit",
    ),
)

MCP: tuple[ContractField, ...] = (
    ContractField(
        "expose",
        FLAG,
        "List and forward the tool on the broker's MCP "
        "server. A contract with no [contract.mcp] table is not listed.",
        "true",
    ),
    ContractField(
        "destructive",
        FLAG,
        "The proxy tool's MCP destructiveHint; false for tools that only add.",
        "true",
    ),
    ContractField(
        "description", {"type": "string"}, "The tool's description.", "the contract's"
    ),
    ContractField(
        "input_schema",
        TABLE,
        "The arguments' JSON Schema, of type "
        '"object" (or input_schema_file; exactly one).',
    ),
    ContractField(
        "input_schema_file",
        TEXT,
        "A JSON file holding the input schema, relative to the contracts file.",
    ),
    ContractField(
        "output_schema",
        TABLE,
        "The receipt result's JSON Schema, of type \"object\" (the tool's outputSchema).",
    ),
)

UPSTREAM: tuple[ContractField, ...] = (
    ContractField(
        "command",
        TEXT,
        'A stdio server\'s executable (or url; exactly one). "{python}" is the '
        "Python interpreter running the broker, so a server installed in the "
        "broker's virtualenv starts without it being activated.",
    ),
    ContractField("args", TEXTS, "The stdio server's arguments.", "[]"),
    ContractField(
        "cwd", TEXT, "The stdio server's directory, relative to the contracts file."
    ),
    ContractField(
        "env",
        {"type": "object", "additionalProperties": {"type": "string"}},
        "Environment variables set for the stdio server.",
    ),
    ContractField(
        "inherit_env",
        TEXTS,
        "Names of the broker's environment variables "
        "handed to the stdio server (secrets stay out of the file).",
    ),
    ContractField(
        "url",
        {"type": "string", "pattern": "^https?://"},
        "A streamable HTTP server's MCP endpoint.",
    ),
    ContractField(
        "bearer_token_env",
        TEXT,
        "The environment variable holding a bearer token for url.",
    ),
    ContractField(
        "tool", TEXT, "The upstream tool each attempt calls once.", required=True
    ),
    ContractField(
        "key_argument",
        TEXT,
        "The argument the broker fills with the "
        "downstream key on every attempt; required for idempotent.",
    ),
    ContractField(
        "lookup_tool",
        TEXT,
        "The upstream tool that looks a call up; required for reconcilable.",
    ),
    ContractField(
        "lookup_argument", TEXT, "The lookup tool's argument for the key.", "key_argument"
    ),
    ContractField(
        "lookup_by",
        TEXT,
        '"downstream_key" or the name of a call argument (a business key).',
        "downstream_key",
    ),
    ContractField(
        "found_field", TEXT, "The lookup answer's field that says found.", "found"
    ),
    ContractField(
        "external_id_field", TEXT, "Dotted path to the target's id in the answer.", "id"
    ),
    ContractField(
        "error_field",
        TEXT,
        "The code in an isError result's structured content.",
        "error",
    ),
    ContractField(
        "tool_error",
        {"enum": ["terminal", "unknown"]},
        "An isError result with no documented code: unknown (it may have "
        "acted) or terminal (a refusal, at your risk).",
        "unknown",
    ),
    ContractField(
        "retryable_errors", TEXTS, "Codes the upstream documents as not committed."
    ),
    ContractField("unknown_errors", TEXTS, 'Codes that mean "may have happened".'),
    ContractField("terminal_errors", TEXTS, "Codes that are final refusals."),
    ContractField(
        "terminal_rpc_codes",
        {"type": "array", "items": {"type": "integer"}},
        "JSON-RPC errors meaning nothing ran.",
        "[-32601]",
    ),
    ContractField(
        "connect_timeout",
        DURATION,
        "Start and initialize, before tools/call is written.",
        "10s",
    ),
    ContractField("timeout", DURATION, "The tools/call answer.", "10s"),
    ContractField(
        "answer",
        TABLE,
        "How to read a call's answer ([contract.upstream.answer]): one value, by "
        "a JSON pointer or a regular expression, and what it proves.",
    ),
    ContractField(
        "lookup_answer",
        TABLE,
        "How to read the lookup tool's answer ([contract.upstream.lookup_answer]), "
        "instead of found_field; committed and not_committed are both required.",
    ),
)

#: ``[contract.upstream.answer]`` and ``[contract.upstream.lookup_answer]``.
ANSWER: tuple[ContractField, ...] = (
    ContractField(
        "pointer",
        {"type": "string", "pattern": "^(/.*)?$"},
        "A JSON pointer into the structured content, or into a text block that is "
        "JSON (give pointer or pattern).",
    ),
    ContractField(
        "pattern",
        TEXT,
        'A regular expression over the text content: its "status" group, else the '
        "whole match, is the value.",
    ),
    ContractField(
        "id_pointer",
        {"type": "string", "pattern": "^(/.*)?$"},
        "With a pointer: where the external id is.",
        "the upstream's external_id_field",
    ),
    ContractField(
        "id_pattern",
        TEXT,
        'With a pattern: a regular expression for the external id (its "id" group, '
        "else its first group, else the match).",
    ),
    ContractField("committed", TEXTS, "Values meaning committed (lookup: found)."),
    ContractField(
        "not_committed",
        TEXTS,
        "Values documented as not committed: retryable (lookup: not found).",
    ),
    ContractField("failed", TEXTS, "Values meaning committed, but failed: terminal."),
    ContractField(
        "already_done",
        TEXTS,
        'Calls only: values proving this key already took effect ("already exists" '
        "when the key is a name): the commit found again, the answer kept as "
        "evidence. Needs key_argument.",
    ),
)

PASSTHROUGH: tuple[ContractField, ...] = (
    ContractField(
        "tool", TEXT, "The name listed (and, by default, the upstream's).", required=True
    ),
    ContractField(
        "read_only",
        FLAG,
        "Required; strict mode also needs the upstream's own readOnlyHint.",
        required=True,
    ),
    ContractField(
        "description", {"type": "string"}, "The tool's description.", "the upstream's"
    ),
    ContractField(
        "upstream", TABLE, "The upstream server ([passthrough.upstream]).", required=True
    ),
)


def names(fields: tuple[ContractField, ...]) -> tuple[str, ...]:
    """The keys a table may hold, in the order of the definition."""
    return tuple(item.name for item in fields)


def _table(fields: tuple[ContractField, ...], **nested: Any) -> dict[str, Any]:
    properties = {item.name: item.schema() for item in fields}
    for name, schema in nested.items():
        properties[name] = {**schema, "description": properties[name]["description"]}
    return {
        "type": "object",
        "properties": properties,
        "required": [item.name for item in fields if item.required],
        "additionalProperties": False,
    }


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a contracts file, for editors (``#:schema`` in the TOML)."""
    upstream = _table(UPSTREAM, answer=_table(ANSWER), lookup_answer=_table(ANSWER))
    passthrough_upstream = {**upstream, "required": []}  # tool defaults to the entry's
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "effect-broker contracts file",
        "description": "Versioned tool contracts (docs/how-to/contracts.md). Generated "
        "by `effect-broker contracts schema` from "
        "effect_broker/domain/contract_fields.py.",
        "type": "object",
        "properties": {
            "contract": {
                "type": "array",
                "items": _table(CONTRACT, mcp=_table(MCP), upstream=upstream),
            },
            "passthrough": {
                "type": "array",
                "items": _table(PASSTHROUGH, upstream=passthrough_upstream),
            },
        },
        "additionalProperties": False,
    }


def schema_text() -> str:
    """``json_schema()`` as the file the examples ship (sorted keys, two spaces)."""
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def unknown_key(key: str, allowed: Iterable[str]) -> str:
    """The reason a table's ``key`` is refused: the allowed keys, and the closest one."""
    close = difflib.get_close_matches(key, list(allowed), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key{hint} (allowed: {', '.join(sorted(allowed))})"
