"""When an effect needs an operator's approval, and what an approval is bound to.

Issue 24: a person in front of a risky call is where money is lost twice - approve,
crash, resume, pay again - and approvals in front of MCP servers approve "this tool
for 30 minutes", not this payload. Here an approval is a fact about ONE effect: the
``approved`` event carries a binding (``approval_binding``) over the effect id, its
request hash and the contract it is pinned to, as the approving process loaded it.
The worker recomputes the binding before the first send and sends nothing unless it
matches; a redeploy that changed the pinned contract's terms makes it not match.

The rule language (``[[contract]]`` fields, all optional):

* ``approval = "required"``: every effect of the contract waits for an operator;
* ``approval_when = { pointer = "/amount_minor", above = 50000 }``: an effect waits
  when the value the JSON pointer (RFC 6901) names in its arguments is a number
  greater than ``above``, or is not a number at all (missing, a string, a boolean,
  null: "when in doubt, ask a person" - an amount sent as "60000" or left out cannot
  slip past the rule);
* ``approval_ttl = "1h"``: how long an effect waits before it ends ``failed_final``
  (reason ``approval_expired``), counted on the database's clock. Default 1 h.

At most one of ``approval`` and ``approval_when``; ``approval_ttl`` only with one of
them. Anything else is refused when the contracts file is loaded.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from datetime import timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any

from effect_broker.domain.canonical import canonical_json

if TYPE_CHECKING:
    from effect_broker.domain.contracts import EffectContract

DEFAULT_TTL = timedelta(hours=1)
"""How long an effect waits for approval when its contract names no ``approval_ttl``."""

#: The only value ``approval`` takes.
REQUIRED = "required"
#: The keys of an ``approval_when`` table, and the comparisons it may hold.
RULE_KEYS = ("pointer", "above")

#: The contract fields an approval is given under: who is called and how, with which
#: secrets, under which guarantee. A change to any of them after the approval (a
#: redeploy that edits the pinned version in place) makes the approval unusable.
#: Left out on purpose: ``active`` (deploying v2 deactivates the v1 an effect is
#: pinned to, which changes nothing it does), descriptions, the MCP face, alert
#: thresholds, backoff timing and the approval rule itself.
BOUND_FIELDS = (
    "name",
    "version",
    "tool",
    "safety",
    "adapter",
    "adapter_options",
    "upstream",
    "key_template",
    "key_alphabet",
    "secrets",
    "tenant_secrets",
    "retry_limit",
    "key_retention",
    "settlement_bound",
)


class _Missing:
    """What a pointer that names nothing resolves to."""


MISSING = _Missing()


@dataclass(frozen=True, slots=True)
class ApprovalRule:
    """When an effect of a contract must wait for an operator (module docstring)."""

    #: ``approval = "required"``: always.
    always: bool = False
    #: ``approval_when``: the JSON pointer into the arguments, and the threshold.
    pointer: str = ""
    above: float = 0.0
    #: How long an effect waits before it expires (database clock).
    ttl: timedelta = DEFAULT_TTL

    def applies_to(self, arguments: Mapping[str, Any]) -> bool:
        """Whether an effect with these arguments must wait for an operator."""
        if self.always:
            return True
        value = resolve_pointer(arguments, self.pointer)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return True  # missing, text, null, a table: a person decides
        return not math.isfinite(value) or value > self.above

    def describe(self) -> str:
        """The rule in words, for events and pages (never an argument's value)."""
        if self.always:
            return "every effect"
        return f"{self.pointer} above {format_number(self.above)} (or not a number)"

    @property
    def amount_pointer(self) -> str:
        """The pointer whose value the operator decides on ("" for ``required``)."""
        return self.pointer


def format_number(value: float) -> str:
    """``50000`` rather than ``50000.0``."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def parse_pointer(pointer: object) -> tuple[str, ...]:
    """The reference tokens of an RFC 6901 JSON pointer into an object; ValueError
    for anything else (the whole document "" is refused: arguments are an object)."""
    if not isinstance(pointer, str) or not pointer.startswith("/"):
        raise ValueError('must be a JSON pointer such as "/amount_minor"')
    tokens = pointer[1:].split("/")
    for token in tokens:
        rest = token.replace("~0", "").replace("~1", "")
        if "~" in rest:
            raise ValueError(f"{pointer!r}: '~' must be written ~0, '/' ~1 (RFC 6901)")
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in tokens)


def resolve_pointer(document: object, pointer: str) -> object:
    """The value ``pointer`` names in ``document``, or ``MISSING``."""
    value = document
    for part in parse_pointer(pointer):
        if isinstance(value, Mapping):
            if part not in value:
                return MISSING
            value = value[part]
        elif isinstance(value, list):
            if not part.isdigit() or (part != "0" and part.startswith("0")):
                return MISSING
            index = int(part)
            if index >= len(value):
                return MISSING
            value = value[index]
        else:
            return MISSING
    return value


def parse_rule(
    approval: object, approval_when: object, approval_ttl: timedelta | None
) -> ApprovalRule | None:
    """The rule a contract's three fields describe, or None when it asks for none.

    Raises ``ValueError("<field>: <reason>")`` for a rule this module refuses.
    """
    if approval is not None and approval_when is not None:
        raise ValueError(
            'approval: give approval = "required" or approval_when, not both'
        )
    if approval is None and approval_when is None:
        if approval_ttl is not None:
            raise ValueError(
                'approval_ttl: only with approval = "required" or approval_when'
            )
        return None
    ttl = DEFAULT_TTL if approval_ttl is None else approval_ttl
    if not isinstance(ttl, timedelta) or ttl <= timedelta(0):
        raise ValueError("approval_ttl: must be a positive duration")
    if approval is not None:
        if approval != REQUIRED:
            raise ValueError(f'approval: the only value is "required", got {approval!r}')
        return ApprovalRule(always=True, ttl=ttl)
    if not isinstance(approval_when, Mapping):
        raise ValueError(
            'approval_when: must be a table such as { pointer = "/amount_minor", '
            "above = 50000 }"
        )
    for key in approval_when:
        if key not in RULE_KEYS:
            raise ValueError(
                f"approval_when.{key}: unknown key (allowed: {', '.join(RULE_KEYS)})"
            )
    for key in RULE_KEYS:
        if key not in approval_when:
            raise ValueError(f"approval_when.{key}: is required")
    try:
        parse_pointer(approval_when["pointer"])
    except ValueError as exc:
        raise ValueError(f"approval_when.pointer: {exc}") from None
    above = approval_when["above"]
    if isinstance(above, bool) or not isinstance(above, int | float):
        raise ValueError("approval_when.above: must be a number")
    if not math.isfinite(above):
        raise ValueError("approval_when.above: must be a finite number")
    return ApprovalRule(pointer=approval_when["pointer"], above=float(above), ttl=ttl)


# --- what an approval is bound to ------------------------------------------------------


def _plain(value: object) -> object:
    """A contract field as plain JSON (durations in microseconds)."""
    if isinstance(value, timedelta):
        return value // timedelta(microseconds=1)
    if isinstance(value, Enum):
        return value.value
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | frozenset | set):
        items = [_plain(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, frozenset | set) else items
    return value


def contract_fingerprint(contract: EffectContract) -> str:
    """SHA-256 hex of the pinned contract's ``BOUND_FIELDS``, as this process loaded
    them: two processes that loaded the same terms agree on it."""
    terms = {name: _plain(getattr(contract, name)) for name in BOUND_FIELDS}
    return hashlib.sha256(canonical_json(terms)).hexdigest()


def approval_binding(
    effect_id: str, request_hash: bytes, contract: EffectContract
) -> str:
    """What an ``approved`` event binds: SHA-256 hex over the effect id, its request
    hash (itself keyed: it reveals nothing of the arguments) and the pinned
    contract's label and fingerprint. Equal only for the same effect, payload and
    contract terms."""
    digest = hashlib.sha256()
    for part in (
        effect_id.encode(),
        request_hash,
        contract.label.encode(),
        contract_fingerprint(contract).encode(),
    ):
        digest.update(len(part).to_bytes(4, "big"))
        digest.update(part)
    return digest.hexdigest()
