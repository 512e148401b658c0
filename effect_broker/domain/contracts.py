"""Versioned effect contracts, loaded from TOML and validated before anything dispatches.

A contract states what a target promises (its safety class) and the broker's retry
policy for it. Spec "Operation identity and payload binding": the contract version is
pinned at reservation time, so a deploy cannot silently change retry semantics for an
in-flight effect; old versions therefore stay loadable (``active = false``) for as long
as effects reference them.

File format (``contracts.toml``)::

    [[contract]]
    name = "payments.charge"       # required, non-empty string
    version = "1"                  # required, non-empty string (not an integer)
    tool = "charge_card"           # tool name callers use; defaults to name
    safety = "idempotent"          # required: transactional | idempotent |
                                   #           reconcilable | unsafe
    retry_limit = 5                # integer >= 0; default 3
    key_retention = "24h"          # target key retention; required for idempotent
    settlement_bound = "30s"       # lookup settlement bound; required for reconcilable
    backoff_initial = "1s"         # default 1s
    backoff_max = "1m"             # default 60s; must be >= backoff_initial
    attempt_timeout = "20s"        # total time one attempt may take; default: the
                                   # worker's lease less its send margin
    unknown_alert_after = "15m"    # alert when an outcome stays unknown this long;
                                   # default EFFECT_BROKER_UNKNOWN_ALERT_AFTER_SECONDS
    adapter = "http"               # default "simulated"
    preview_fields = ["amount", "currency"]   # arguments shown unredacted
    secrets = ["env:STRIPE_KEY"]   # {"$secret": ...} references any tenant may use
    [contract.tenant_secrets]      # optional: references only one tenant may use,
    acme = ["file:card-token"]     #   by tenant name (see domain/secret_refs.py)
    active = true                  # at most one active contract per tool; default true
    sandbox = false                # true: the target is a sandbox, so `contracts
                                   #   conform` may send it requests; default false
    key_template = "eb-{key}"      # how the key is sent, for an upstream whose key is
                                   #   a name; default "{key}"
    key_alphabet = "hex"           # "base64url" (default) | "hex": 64 lowercase hex
                                   #   digits, never starting with "-"
    max_in_flight = 10             # at most 10 attempts at once, across every worker
    rate_limit = 50                # at most 50 attempts per second (+1 in any one
                                   #   second); both optional, waits never fail
    description = "Charge a card"  # optional
    approval = "required"          # every effect waits for an operator's approval
    # approval_when = { pointer = "/amount_minor", above = 50000 }   # or only some
    approval_ttl = "1h"            # then failed_final (approval_expired); default 1h
    [contract.adapter_options]     # optional table, passed to the adapter as is
    url = "http://127.0.0.1:8081/charges"
    [contract.mcp]                 # optional: the tool's face on the MCP server;
                                   #   without this table the tool is not listed
    expose = true                  # with the table: list and forward it (default)
    destructive = true             # MCP destructiveHint; false for additive-only
                                   #   tools (default true)
    description = "Charge a card once per order"   # default: the contract's
    # input_schema_file = "schemas/charge.json"  (relative to this file), or inline:
    [contract.mcp.input_schema]    # a JSON Schema of type "object"
    type = "object"
    required = ["amount"]
    properties.amount.type = "integer"
    [contract.mcp.output_schema]   # optional: the receipt result's JSON Schema, of
    type = "object"                #   type "object" (the tool's outputSchema)
    required = ["charge_id"]

An upstream MCP server (``adapter = "mcp"``; issue 10, item 4) is named in
``[contract.upstream]`` (parsed by ``effect_broker/domain/upstream.py``)::

    [contract.upstream]
    command = "python"             # a stdio server: the executable, and its
    args = ["-m", "payments_mcp"]  #   arguments; cwd (relative to this file), env
                                   #   (a table) and inherit_env (names) optional
    # url = "http://127.0.0.1:9000/mcp"   # or a streamable HTTP server, with
    # bearer_token_env = "PAYMENTS_MCP_TOKEN"  # a token from this environment variable
    tool = "charge"                # the upstream tool each attempt calls once
    key_argument = "idempotency_key"   # the argument the broker fills with the
                                   #   downstream key on every attempt
    lookup_tool = "lookup_charge"  # reconcilable: answers {"found": true, ...} or
                                   #   {"found": false}; anything else is unknown
    lookup_argument = "reference"  # its argument for the key (default key_argument)
    lookup_by = "downstream_key"   # or the name of a call argument (a business key)
    found_field = "found"          # default "found"
    external_id_field = "id"       # dotted path into the result; default "id"
    error_field = "error"          # the code in an isError result's structured content
    tool_error = "unknown"         # an isError result with no listed code: unknown
                                   #   (default; the SDK's server answers every
                                   #   exception a tool raises so, after a charge
                                   #   too) | terminal (only if it never acts first)
    retryable_errors = ["rejected"]    # codes the upstream documents as not committed
    unknown_errors = ["outcome_unknown"]  # codes that mean "may have happened"
    terminal_errors = []           # codes that are final whatever tool_error says
    terminal_rpc_codes = [-32601]  # JSON-RPC errors meaning nothing ran (default)
    connect_timeout = "10s"        # start + initialize, before tools/call is written
    timeout = "10s"                # the tools/call answer
    [contract.upstream.answer]     # optional: how to read a call's answer
    pattern = "Created|already exists"   # a regex over the text (its "status"
                                   #   group, else the match), or instead
    # pointer = "/status"          # a JSON pointer into the structured content or a
                                   #   text block that is JSON
    id_pattern = "id (rec_[0-9]+)" # the external id (id_pointer with a pointer)
    committed = ["Created"]        # committed (any other value of a non-error answer
                                   #   too; no value at all is unknown)
    not_committed = []             # documented as not committed: retryable
    failed = []                    # committed, but failed: terminal
    already_done = ["already exists"]  # this key already took effect: committed,
                                   #   the answer kept as evidence (needs key_argument)
    [contract.upstream.lookup_answer]  # optional, instead of found_field: the same,
    pattern = "^Record|no record"  #   committed -> found, not_committed -> not
    committed = ["Record"]         #   found (both required), else unknown
    not_committed = ["no record"]

The safety class follows what the upstream tool can prove, checked here. It is
required, as for every contract (no class is assumed; write ``unsafe`` for a tool
that proves nothing); idempotent only with ``key_argument``; reconcilable only with
``lookup_tool`` (and ``settlement_bound``); never transactional. A read-only upstream
tool can be mirrored on the broker's MCP server with no ledger, as a top-level table::

    [[passthrough]]
    tool = "charge_stats"          # the name listed (and, by default, the upstream's)
    read_only = true               # required; strict mode (default on) also needs
                                   #   the upstream's own readOnlyHint = true
    description = "..."            # optional; default: the upstream's
    [passthrough.upstream]         # as [contract.upstream], without key or lookup
    command = "python"
    args = ["-m", "payments_mcp"]

Durations are strings ``<positive number><unit>`` with unit ``ms``, ``s``, ``m``, ``h``
or ``d`` ("500ms", "1.5s", "24h"). Bare numbers are refused: ``key_retention = 24``
could mean seconds or hours, and guessing wrong breaks the idempotency horizon.

Unknown keys are errors (a typo such as ``retries = 5`` must not silently fall back to
the default). Every ``ContractError`` names the file, the contract and the field.
"""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

from effect_broker.domain import contract_fields
from effect_broker.domain.approval import ApprovalRule, parse_rule
from effect_broker.domain.dispatch_limits import DispatchLimits
from effect_broker.domain.errors import (
    ContractError,
    InvalidSecretRefError,
    UnknownContractError,
)
from effect_broker.domain.keys import KEY_ALPHABETS, spell_key
from effect_broker.domain.secret_refs import parse_ref_text
from effect_broker.domain.states import SafetyClass
from effect_broker.domain.upstream import (
    McpUpstream,
    PassThroughTool,
    parse_passthrough,
    parse_upstream,
)

_DURATION = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<unit>ms|s|m|h|d)")
_UNIT_MICROSECONDS = {
    "ms": 1_000,
    "s": 1_000_000,
    "m": 60_000_000,
    "h": 3_600_000_000,
    "d": 86_400_000_000,
}
_DURATION_FORM = "a duration string such as '500ms', '30s', '5m', '24h' or '7d'"


def parse_duration(value: object) -> timedelta:
    """Parse ``"<positive number><ms|s|m|h|d>"``; raise ValueError naming the form."""
    if not isinstance(value, str):
        raise ValueError(f"expected {_DURATION_FORM}, got {type(value).__name__}")
    match = _DURATION.fullmatch(value)
    if match is None:
        raise ValueError(f"expected {_DURATION_FORM}, got {value!r}")
    # Decimal, not float: "0.1s" must be exactly 100000 microseconds.
    micros = Decimal(match["number"]) * _UNIT_MICROSECONDS[match["unit"]]
    if micros <= 0:
        raise ValueError(f"must be positive, got {value!r}")
    try:
        return timedelta(microseconds=int(micros))
    except OverflowError as exc:
        raise ValueError(f"too large: {value!r}") from exc


def _freeze(value: object) -> object:
    if isinstance(value, Mapping):
        return MappingProxyType({key: _freeze(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(item) for item in value)
    return value


@dataclass(frozen=True, slots=True)
class McpFace:
    """A tool's face on the MCP server: whether it is listed, its text, its schema."""

    input_schema_json: str
    expose: bool = True
    description: str = ""
    #: The receipt result's JSON Schema ("" when the contract declares none).
    output_schema_json: str = ""
    #: MCP's ``destructiveHint``: false only when the contract says the tool's effect
    #: is additive (it may change nothing it did not create).
    destructive: bool = True

    @property
    def input_schema(self) -> dict[str, Any]:
        """The arguments' JSON Schema, a fresh mutable copy each time."""
        schema: dict[str, Any] = json.loads(self.input_schema_json)
        return schema

    @property
    def output_schema(self) -> dict[str, Any] | None:
        """The result's JSON Schema, a fresh copy each time; None when undeclared."""
        if not self.output_schema_json:
            return None
        schema: dict[str, Any] = json.loads(self.output_schema_json)
        return schema


@dataclass(frozen=True, slots=True)
class EffectContract:
    """One version of a tool's contract: its safety class and the broker's retry rules."""

    name: str
    version: str
    tool: str
    safety: SafetyClass
    retry_limit: int = 3
    key_retention: timedelta | None = None
    settlement_bound: timedelta | None = None
    backoff_initial: timedelta = timedelta(seconds=1)
    backoff_max: timedelta = timedelta(seconds=60)
    #: Total time one attempt may take, however the target trickles its answer;
    #: None means "the lease less the send margin" (``services.send_gate``).
    attempt_timeout: timedelta | None = None
    #: How long an outcome may stay unknown before the shipped alert fires
    #: (docs/observability.md); None: the deployment's default.
    unknown_alert_after: timedelta | None = None
    adapter: str = "simulated"
    adapter_options: Mapping[str, object] = field(
        default_factory=lambda: MappingProxyType({})
    )
    preview_fields: tuple[str, ...] = ()
    active: bool = True
    description: str = ""
    mcp: McpFace | None = None
    #: The upstream MCP server and tool (``adapter = "mcp"`` only).
    upstream: McpUpstream | None = None
    #: ``{"$secret": ...}`` references ("env:NAME", "file:NAME") every tenant may use;
    #: any other is refused at submit (domain/secret_refs.py, issue 19 item 11).
    secrets: tuple[str, ...] = ()
    #: References only the named tenant may use, by tenant name.
    tenant_secrets: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    #: The target is a sandbox: ``contracts conform`` may send it real requests
    #: without ``--yes-send-requests`` (issue 22, item 1).
    sandbox: bool = False
    #: How the downstream key is written to the target: ``{key}`` replaced by the key
    #: spelled in ``key_alphabet`` (issue 22, item 3: upstreams whose key is a name).
    key_template: str = "{key}"
    key_alphabet: str = "base64url"
    #: At most this many attempts at once, across every worker and every version of
    #: the contract (issue 24, item 7; domain/dispatch_limits.py); None: no limit.
    max_in_flight: int | None = None
    #: At most this many attempts per second across every worker; None: no limit.
    rate_limit: float | None = None
    #: When an effect must wait for an operator's approval before any send (issue
    #: 24; ``domain/approval.py``): None, the default, never.
    approval: ApprovalRule | None = None

    def __post_init__(self) -> None:
        # Contracts built in code get the same invariants as contracts from a file;
        # the loader re-raises these errors with the file name added.
        self._require_text("name")
        self._require_text("version")
        self._require_text("tool")
        self._require_text("adapter")
        safety = self.safety if isinstance(self.safety, str) else None
        if safety not in {item.value for item in SafetyClass}:
            self._fail("safety", f"must be one of {', '.join(SafetyClass)}")
        object.__setattr__(self, "safety", SafetyClass(safety))
        if (
            not isinstance(self.retry_limit, int)
            or isinstance(self.retry_limit, bool)
            or self.retry_limit < 0
        ):
            self._fail("retry_limit", "must be an integer >= 0")
        for name in (
            "key_retention",
            "settlement_bound",
            "backoff_initial",
            "backoff_max",
            "attempt_timeout",
            "unknown_alert_after",
        ):
            duration = getattr(self, name)
            if duration is None and name.startswith("backoff"):
                self._fail(name, "is required")
            if duration is not None and (
                not isinstance(duration, timedelta) or duration <= timedelta(0)
            ):
                self._fail(name, "must be a positive duration")
        # Guarantee vocabulary: an idempotent target must declare how long it keeps
        # keys, and a reconcilable one when a negative lookup becomes conclusive.
        if self.safety is SafetyClass.IDEMPOTENT and self.key_retention is None:
            self._fail("key_retention", "required for safety class idempotent")
        if self.safety is SafetyClass.RECONCILABLE and self.settlement_bound is None:
            self._fail("settlement_bound", "required for safety class reconcilable")
        if self.backoff_initial > self.backoff_max:
            self._fail("backoff_initial", "must not exceed backoff_max")
        if not isinstance(self.adapter_options, Mapping):
            self._fail("adapter_options", "must be a table")
        object.__setattr__(self, "adapter_options", _freeze(self.adapter_options))
        if not isinstance(self.preview_fields, list | tuple) or not all(
            isinstance(item, str) for item in self.preview_fields
        ):
            self._fail("preview_fields", "must be a list of strings")
        if any(item.startswith("$") for item in self.preview_fields):
            # "$hidden_fields" counts the arguments a preview leaves out.
            self._fail("preview_fields", "names may not start with '$'")
        object.__setattr__(self, "preview_fields", tuple(self.preview_fields))
        if not isinstance(self.active, bool):
            self._fail("active", "must be true or false")
        if not isinstance(self.description, str):
            self._fail("description", "must be a string")
        if not isinstance(self.sandbox, bool):
            self._fail("sandbox", "must be true or false")
        self._check_key_spelling()
        self._check_limits()
        if self.approval is not None and not isinstance(self.approval, ApprovalRule):
            self._fail("approval", "must be an ApprovalRule")
        if self.mcp is not None and not isinstance(self.mcp, McpFace):
            self._fail("mcp", "must be an McpFace")
        self._check_upstream()
        object.__setattr__(self, "secrets", self._ref_list("secrets", self.secrets))
        if not isinstance(self.tenant_secrets, Mapping):
            self._fail("tenant_secrets", "must be a table of tenant name = [references]")
        per_tenant = {
            tenant: self._ref_list(f"tenant_secrets.{tenant}", refs)
            for tenant, refs in self.tenant_secrets.items()
        }
        object.__setattr__(self, "tenant_secrets", MappingProxyType(per_tenant))

    def _ref_list(self, field_name: str, value: object) -> tuple[str, ...]:
        if not isinstance(value, list | tuple):
            self._fail(field_name, 'must be a list such as ["env:STRIPE_KEY"]')
        for item in value:
            try:
                parse_ref_text(item, field=field_name)
            except InvalidSecretRefError:
                self._fail(
                    field_name,
                    f"{item!r} is not a secret reference: write 'env:NAME' or "
                    "'file:NAME' (one file name, no path)",
                )
        return tuple(value)

    def _check_limits(self) -> None:
        in_flight, rate = self.max_in_flight, self.rate_limit
        if in_flight is not None and (
            not isinstance(in_flight, int) or isinstance(in_flight, bool) or in_flight < 1
        ):
            self._fail("max_in_flight", "must be an integer >= 1")
        if rate is not None:
            if (
                not isinstance(rate, int | float)
                or isinstance(rate, bool)
                or not math.isfinite(rate)
                or rate <= 0
            ):
                self._fail("rate_limit", "must be a number of attempts per second > 0")
            object.__setattr__(self, "rate_limit", float(rate))
        if (in_flight is not None or rate is not None) and (
            self.safety is SafetyClass.TRANSACTIONAL
        ):
            # Its "target" is the broker's own database, inside the attempt's
            # transaction, where no other worker can count it.
            self._fail(
                "max_in_flight" if in_flight is not None else "rate_limit",
                "limits are for remote targets; a transactional contract's attempt "
                "is a local transaction",
            )

    @property
    def limits(self) -> DispatchLimits:
        """The contract's dispatch limits (issue 24, item 7)."""
        return DispatchLimits(
            max_in_flight=self.max_in_flight, rate_limit=self.rate_limit
        )

    def declared_secrets(self, tenant_name: str) -> frozenset[str]:
        """The references ``tenant_name`` may use in this contract's arguments."""
        for_tenant = self.tenant_secrets.get(tenant_name, ())
        return frozenset(self.secrets) | frozenset(for_tenant)

    @property
    def label(self) -> str:
        """``name@version``, as errors and events name a pinned contract."""
        return f"{self.name}@{self.version}"

    def _check_key_spelling(self) -> None:
        if self.key_alphabet not in KEY_ALPHABETS:
            self._fail("key_alphabet", f"must be one of {', '.join(KEY_ALPHABETS)}")
        template = self.key_template
        if not isinstance(template, str) or template.count("{key}") != 1:
            self._fail("key_template", 'must contain "{key}" exactly once')
        rest = template.replace("{key}", "")
        if "{" in rest or "}" in rest:
            self._fail("key_template", 'may hold no braces other than "{key}"')
        if template.startswith("-"):
            # An upstream whose key is a name may read "-..." as an option.
            self._fail("key_template", "must not start with '-'")
        if len(rest) > 136:
            self._fail("key_template", "makes keys longer than 200 characters")

    def upstream_key(self, downstream_key: str) -> str:
        """The downstream key as this contract writes it to the target."""
        return self.key_template.replace(
            "{key}", spell_key(downstream_key, self.key_alphabet)
        )

    def _check_upstream(self) -> None:
        # Guarantee vocabulary for the mcp adapter: the class follows what the
        # upstream tool can prove, refused at load time rather than at an incident.
        if self.adapter != "mcp":
            if self.upstream is not None:
                self._fail("upstream", 'only for adapter = "mcp"')
            return
        upstream = self.upstream
        if not isinstance(upstream, McpUpstream):
            self._fail("upstream", 'adapter = "mcp" needs a [contract.upstream] table')
        if self.safety is SafetyClass.TRANSACTIONAL:
            self._fail(
                "safety",
                "an upstream MCP server cannot share the broker's "
                "transaction; use idempotent, reconcilable or unsafe",
            )
        if self.safety is SafetyClass.IDEMPOTENT and not upstream.key_argument:
            self._fail(
                "upstream.key_argument",
                "required for safety class idempotent: name the upstream tool's "
                "argument that carries the idempotency key (the broker fills it)",
            )
        if self.safety is SafetyClass.RECONCILABLE and not upstream.lookup_tool:
            self._fail(
                "upstream.lookup_tool",
                "required for safety class reconcilable: name the upstream tool that "
                "looks the call up",
            )

    def _require_text(self, name: str) -> None:
        value = getattr(self, name)
        if not isinstance(value, str) or not value.strip() or value != value.strip():
            self._fail(name, "must be a non-empty string without surrounding whitespace")

    def _fail(self, field_name: str, reason: str) -> NoReturn:
        name = self.name if isinstance(self.name, str) and self.name else None
        version = self.version if isinstance(self.version, str) else None
        raise ContractError(reason, contract=name, version=version, field=field_name)

    def __hash__(self) -> int:
        # adapter_options is a mapping and so unhashable; equal contracts share these.
        return hash((self.name, self.version, self.tool, self.safety))

    def backoff(self, attempt: int) -> timedelta:
        """Return the delay before retry ``attempt`` (1-based): doubling, capped."""
        if attempt < 1:
            raise ValueError(f"attempt is 1-based, got {attempt}")
        # Compare in seconds before multiplying: timedelta * 2**n overflows for a large
        # attempt count long before the cap matters.
        exponent = attempt - 1
        if exponent >= 64 or (
            self.backoff_initial.total_seconds() * 2**exponent
            >= self.backoff_max.total_seconds()
        ):
            return self.backoff_max
        return self.backoff_initial * 2**exponent

    def lookup_backoff(self, waited: timedelta, jitter: float) -> timedelta:
        """The delay before the next lookup after an inconclusive one (issue 22,
        item 4): as long as the lookups have waited already (``waited``, since the
        settlement deadline), so successive delays grow geometrically, at least
        ``backoff_initial`` and at most ``backoff_max``; then "equal jitter": half of
        it, plus ``jitter`` (in [0, 1)) times the other half, so workers that lost
        many answers at once do not look them all up in the same instant."""
        if not 0.0 <= jitter < 1.0:
            raise ValueError(f"jitter must be in [0, 1), got {jitter}")
        base = min(self.backoff_max, max(self.backoff_initial, waited))
        return base / 2 + base / 2 * jitter


class ContractRegistry:
    """The loaded contracts: the active one per tool, and every version by name."""

    def __init__(
        self,
        contracts: Iterable[EffectContract],
        *,
        source: str | None = None,
        passthroughs: Iterable[PassThroughTool] = (),
    ):
        self._contracts: list[EffectContract] = []
        self._by_key: dict[tuple[str, str], EffectContract] = {}
        self._active: dict[str, EffectContract] = {}
        for contract in contracts:
            key = (contract.name, contract.version)
            if key in self._by_key:
                raise ContractError(
                    "duplicate (name, version); each contract version is defined once",
                    file=source,
                    contract=contract.name,
                    version=contract.version,
                    field="version",
                )
            if contract.active and contract.tool in self._active:
                other = self._active[contract.tool]
                raise ContractError(
                    f"tool {contract.tool!r} already has active contract "
                    f"{other.name!r} v{other.version}; at most one active per tool",
                    file=source,
                    contract=contract.name,
                    version=contract.version,
                    field="active",
                )
            self._contracts.append(contract)
            self._by_key[key] = contract
            if contract.active:
                self._active[contract.tool] = contract
        #: Upstream tools listed with no ledger (``[[passthrough]]``), in file order.
        self.passthroughs: tuple[PassThroughTool, ...] = tuple(passthroughs)
        names: set[str] = set()
        for passthrough in self.passthroughs:
            # A contract's tool is versioned and ledgered; a pass-through under the
            # same name would make a call's guarantee depend on which one wins.
            if passthrough.tool in names or any(
                c.tool == passthrough.tool for c in self._contracts
            ):
                raise ContractError(
                    f"tool {passthrough.tool!r} is already defined; a pass-through "
                    "name must be unique and not a contract's tool",
                    file=source,
                    field="passthrough.tool",
                )
            names.add(passthrough.tool)

    def for_tool(self, tool: str) -> EffectContract:
        """Return the active contract for ``tool`` (what a new reservation pins)."""
        try:
            return self._active[tool]
        except KeyError:
            raise UnknownContractError(
                f"no active contract for tool {tool!r}", tool=tool
            ) from None

    def get(self, name: str, version: str) -> EffectContract:
        """Return the pinned contract ``name`` v``version``, active or not."""
        try:
            return self._by_key[(name, version)]
        except KeyError:
            raise UnknownContractError(
                f"unknown contract {name!r} v{version}", contract=name, version=version
            ) from None

    def tools(self) -> list[str]:
        """Return the tools that have an active contract, sorted."""
        return sorted(self._active)

    def __iter__(self) -> Iterator[EffectContract]:
        return iter(self._contracts)

    def __len__(self) -> int:
        return len(self._contracts)

    def __repr__(self) -> str:
        return f"<ContractRegistry {len(self)} contracts, tools={self.tools()}>"


# The allowed keys come from the one definition of the fields (``contract_fields``),
# which also makes the editors' JSON Schema and the docs' reference.
_FIELDS = contract_fields.names(contract_fields.CONTRACT)
_MCP_FIELDS = contract_fields.names(contract_fields.MCP)
_DURATION_FIELDS = (
    "key_retention",
    "settlement_bound",
    "backoff_initial",
    "backoff_max",
    "attempt_timeout",
    "unknown_alert_after",
)
_LINE = re.compile(r"at line (\d+)")


def _parse_one(raw: object, index: int, source: str) -> EffectContract:
    def error(
        reason: str, field_name: str, name: str | None = None, version: object = None
    ) -> ContractError:
        return ContractError(
            reason,
            file=source,
            contract=name,
            version=version if isinstance(version, str) else None,
            index=index,
            field=field_name,
        )

    if not isinstance(raw, dict):
        raise error("each [[contract]] entry must be a table", "contract")
    table: dict[str, Any] = raw
    name = table.get("name")
    label = name if isinstance(name, str) and name.strip() else None
    version = table.get("version")
    for key in table:
        if key not in _FIELDS:
            raise error(contract_fields.unknown_key(key, _FIELDS), key, label, version)
    for required in ("name", "version", "safety"):
        if required not in table:
            raise error("is required", required, label, version)
    for text_field in (
        "name",
        "version",
        "tool",
        "adapter",
        "description",
        "key_template",
        "key_alphabet",
    ):
        if text_field in table and not isinstance(table[text_field], str):
            hint = ' (write version = "1")' if text_field == "version" else ""
            raise error(f"must be a string{hint}", text_field, label, version)
    values: dict[str, Any] = {key: table[key] for key in _FIELDS if key in table}
    values.setdefault("tool", name)
    safety = table["safety"]
    if not isinstance(safety, str) or safety not in {item.value for item in SafetyClass}:
        allowed = ", ".join(SafetyClass)
        raise error(f"must be one of {allowed}, got {safety!r}", "safety", label, version)
    for duration_field in _DURATION_FIELDS:
        if duration_field in table:
            try:
                values[duration_field] = parse_duration(table[duration_field])
            except ValueError as exc:
                raise error(str(exc), duration_field, label, version) from exc
    if "adapter_options" in table and not isinstance(table["adapter_options"], dict):
        raise error(
            "must be a table ([contract.adapter_options])",
            "adapter_options",
            label,
            version,
        )
    if "preview_fields" in table and not isinstance(table["preview_fields"], list):
        raise error("must be a list of strings", "preview_fields", label, version)
    if "tenant_secrets" in table and not isinstance(table["tenant_secrets"], dict):
        raise error(
            "must be a table ([contract.tenant_secrets]) of tenant name = [references]",
            "tenant_secrets",
            label,
            version,
        )
    values.pop("approval_when", None)
    ttl = values.pop("approval_ttl", None)
    if ttl is not None:
        try:
            ttl = parse_duration(ttl)
        except ValueError as exc:
            raise error(str(exc), "approval_ttl", label, version) from exc
    try:
        values["approval"] = parse_rule(
            table.get("approval"), table.get("approval_when"), ttl
        )
    except ValueError as exc:
        field_name, _, reason = str(exc).partition(": ")
        raise error(reason, field_name, label, version) from exc
    if "mcp" in table:
        try:
            values["mcp"] = _parse_mcp(table["mcp"], source)
        except ValueError as exc:
            field_name, _, reason = str(exc).partition(": ")
            raise error(reason, field_name, label, version) from exc
    if "upstream" in table:
        try:
            values["upstream"] = parse_upstream(table["upstream"], source)
        except ValueError as exc:
            field_name, _, reason = str(exc).partition(": ")
            raise error(reason, field_name, label, version) from exc
    try:
        return EffectContract(**values)
    except ContractError as exc:
        # Same invariant, now with the file and position an operator needs.
        reason, field_name = str(exc.details["reason"]), str(exc.details["field"])
        raise error(reason, field_name, label, version) from exc


def _parse_mcp(raw: object, source: str) -> McpFace:
    """Parse ``[contract.mcp]``; raise ValueError("<field>: <reason>")."""
    if not isinstance(raw, dict):
        raise ValueError("mcp: must be a table ([contract.mcp])")
    for key in raw:
        if key not in _MCP_FIELDS:
            raise ValueError(
                f"mcp.{key}: {contract_fields.unknown_key(key, _MCP_FIELDS)}"
            )
    expose = raw.get("expose", True)
    if not isinstance(expose, bool):
        raise ValueError("mcp.expose: must be true or false")
    destructive = raw.get("destructive", True)
    if not isinstance(destructive, bool):
        raise ValueError("mcp.destructive: must be true or false")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise ValueError("mcp.description: must be a string")
    if ("input_schema" in raw) == ("input_schema_file" in raw):
        raise ValueError(
            "mcp.input_schema: give exactly one of input_schema (an inline table) "
            "or input_schema_file (a JSON file)"
        )
    if "input_schema" in raw:
        schema, where = raw["input_schema"], "mcp.input_schema"
    else:
        schema, where = _read_schema_file(raw["input_schema_file"], source)
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ValueError(f'{where}: must be a JSON Schema with type = "object"')
    if "operation_key" in schema.get("properties", {}):
        # The broker adds operation_key itself; a schema may not redefine it.
        raise ValueError(f"{where}: must not declare operation_key (the broker adds it)")
    # Imported here, not at module level: jsonschema (with referencing and attrs) is a
    # tenth of every process's start, and only a contract with an MCP face needs it.
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"{where}: not a valid JSON Schema: {exc.message}") from exc
    output_json = ""
    if "output_schema" in raw:
        output = raw["output_schema"]
        if not isinstance(output, dict) or output.get("type") != "object":
            raise ValueError(
                'mcp.output_schema: must be a JSON Schema with type = "object"'
            )
        try:
            jsonschema.validators.validator_for(output).check_schema(output)
        except jsonschema.SchemaError as exc:
            raise ValueError(
                f"mcp.output_schema: not a valid JSON Schema: {exc.message}"
            ) from exc
        output_json = json.dumps(output, sort_keys=True)
    return McpFace(
        input_schema_json=json.dumps(schema, sort_keys=True),
        expose=expose,
        description=description,
        output_schema_json=output_json,
        destructive=destructive,
    )


def _read_schema_file(value: object, source: str) -> tuple[object, str]:
    where = "mcp.input_schema_file"
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: must be a path string")
    path = Path(value)
    if not path.is_absolute() and not source.startswith("<"):
        path = Path(source).parent / path  # relative to the contracts file
    try:
        return json.loads(path.read_text(encoding="utf-8")), where
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where}: cannot read {str(path)!r}: {exc}") from exc


def parse_contracts(text: str, *, source: str = "<string>") -> ContractRegistry:
    """Parse and validate contracts from TOML text; ``source`` names it in errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = _LINE.search(str(exc))
        raise ContractError(
            f"invalid TOML: {exc}", file=source, line=int(line[1]) if line else None
        ) from exc
    for key in data:
        if key not in ("contract", "passthrough"):
            raise ContractError(
                "unknown top-level key; the file holds only [[contract]] and "
                "[[passthrough]] tables",
                file=source,
                field=key,
            )
    entries = data.get("contract", [])
    if not isinstance(entries, list):
        raise ContractError(
            "must be an array of tables: write [[contract]], not [contract]",
            file=source,
            field="contract",
        )
    contracts = [_parse_one(raw, index, source) for index, raw in enumerate(entries, 1)]
    return ContractRegistry(
        contracts, source=source, passthroughs=_parse_passthroughs(data, source)
    )


def _parse_passthroughs(data: Mapping[str, Any], source: str) -> list[PassThroughTool]:
    entries = data.get("passthrough", [])
    if not isinstance(entries, list):
        raise ContractError(
            "must be an array of tables: write [[passthrough]]",
            file=source,
            field="passthrough",
        )
    parsed = []
    for index, raw in enumerate(entries, 1):
        try:
            parsed.append(parse_passthrough(raw, source))
        except ValueError as exc:
            field_name, _, reason = str(exc).partition(": ")
            name = raw.get("tool") if isinstance(raw, dict) else None
            label = repr(name) if isinstance(name, str) else f"#{index}"
            raise ContractError(
                reason, file=source, field=f"passthrough[{label}].{field_name}"
            ) from exc
    return parsed


def check_contracts_text(
    text: str, *, source: str = "<string>"
) -> tuple[list[EffectContract], list[ContractError]]:
    """Every problem in a contracts file, not only the first (``contracts validate``),
    and the contracts that parsed.

    Each ``[[contract]]`` entry is checked on its own, then the valid ones together
    (duplicate versions, two active contracts for one tool); no errors means
    ``parse_contracts`` accepts the same text.
    """
    try:
        return list(parse_contracts(text, source=source)), []
    except ContractError as first:
        errors = [first]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return [], errors  # nothing past a syntax error can be read
    entries = data.get("contract", [])
    if not isinstance(entries, list) or any(key != "contract" for key in data):
        return [], errors
    parsed: list[EffectContract] = []
    errors = []
    for index, raw in enumerate(entries, 1):
        try:
            parsed.append(_parse_one(raw, index, source))
        except ContractError as exc:
            errors.append(exc)
    try:
        ContractRegistry(parsed, source=source)
    except ContractError as exc:
        errors.append(exc)
    return parsed, errors


def load_contracts(path: str | os.PathLike[str]) -> ContractRegistry:
    """Load and validate a contracts TOML file."""
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ContractError(f"cannot read contracts file: {exc}", file=source) from exc
    return parse_contracts(text, source=source)
