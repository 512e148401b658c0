"""Dispatch pauses, as data: what a pause covers and which effects it holds.

Issue 24, item 7: an operator stops a tool that misbehaves ("pause all charges now")
without failing anything. A pause names a scope - a tool, a contract (every version,
or one), a tenant, or a combination - and holds every effect the scope covers that
has not been sent yet. What a pause holds, and what it leaves alone:

* held: a first attempt and every retry (``prepared``, ``retryable``); and an
  idempotent effect's same-key resend after an unknown outcome, since a resend is a
  request that can create the charge if the first one never arrived;
* not held: an attempt already in flight (it finishes and its outcome is recorded);
  and a reconcilable effect's lookup, which only reads the target: it creates
  nothing, and it settles what was already sent, which is what an operator who
  paused a misbehaving tool needs to know.

A held effect waits, it is never failed; its key retention keeps running, so an
idempotent effect paused past its retention goes to ``manual_review`` on resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from effect_broker.domain.errors import InvalidRequestError
from effect_broker.domain.states import EffectStatus, SafetyClass

#: Longest pause or resume reason accepted, in characters.
MAX_PAUSE_REASON = 500

#: Statuses whose next step is a first send or a retry: a pause holds them.
HELD_STATUSES = frozenset({EffectStatus.PREPARED, EffectStatus.RETRYABLE})


@dataclass(frozen=True, slots=True)
class PauseScope:
    """What a pause covers: every field that is set must match (None: any)."""

    tool: str | None = None
    contract_name: str | None = None
    contract_version: str | None = None
    tenant_id: str | None = None

    def __post_init__(self) -> None:
        for name in ("tool", "contract_name", "contract_version"):
            value = getattr(self, name)
            if value is not None and (not value.strip() or value != value.strip()):
                raise InvalidRequestError(
                    f"{name} must be non-empty, without surrounding whitespace",
                    field=name,
                )
        if self.contract_version is not None and self.contract_name is None:
            raise InvalidRequestError(
                "a contract version needs its contract name (NAME@VERSION)",
                field="contract",
            )
        if self.tool is None and self.contract_name is None and self.tenant_id is None:
            raise InvalidRequestError(
                "a pause needs a scope: a tool, a contract or a tenant (or several)",
                field="tool",
            )

    def covers(
        self, *, tool: str, contract_name: str, contract_version: str, tenant_id: str
    ) -> bool:
        """True when an effect with these facts is in this scope."""
        return (
            self.tool in (None, tool)
            and self.contract_name in (None, contract_name)
            and self.contract_version in (None, contract_version)
            and self.tenant_id in (None, tenant_id)
        )

    @property
    def contract(self) -> str | None:
        """``name`` or ``name@version``, as the CLI and the API write it."""
        if self.contract_name is None:
            return None
        if self.contract_version is None:
            return self.contract_name
        return f"{self.contract_name}@{self.contract_version}"

    def describe(self, tenant_name: str | None = None) -> str:
        """The scope in words: "tool charge_card for tenant acme"."""
        parts = []
        if self.tool is not None:
            parts.append(f"tool {self.tool}")
        if self.contract is not None:
            parts.append(f"contract {self.contract}")
        if self.tenant_id is not None:
            who = f"tenant {tenant_name}" if tenant_name else "this tenant"
            parts.append(f"for {who}" if parts else who)
        return " ".join(parts)


def parse_contract_ref(text: str) -> tuple[str, str | None]:
    """``"NAME"`` or ``"NAME@VERSION"`` -> (name, version or None)."""
    name, at, version = text.partition("@")
    if not name or (at and not version):
        raise InvalidRequestError(
            f"contract must be NAME or NAME@VERSION, got {text!r}", field="contract"
        )
    return name, (version if at else None)


@dataclass(frozen=True, slots=True)
class Pause:
    """One pause: its scope, who paused it, when and why; resumed or still active."""

    pause_id: str
    scope: PauseScope
    reason: str
    paused_by: str
    paused_at: datetime
    tenant_name: str | None = None
    resumed_by: str | None = None
    resumed_at: datetime | None = None
    resume_reason: str = ""

    @property
    def active(self) -> bool:
        """True until it is resumed."""
        return self.resumed_at is None

    def describe(self) -> str:
        """Its scope in words, with the tenant's name."""
        return self.scope.describe(self.tenant_name)


def holds(status: EffectStatus, safety: SafetyClass) -> bool:
    """True when a pause covering an effect in ``status`` keeps it from being sent:
    a first send or retry, or an idempotent effect's same-key resend."""
    if status in HELD_STATUSES:
        return True
    return status is EffectStatus.OUTCOME_UNKNOWN and safety is SafetyClass.IDEMPOTENT


def require_reason(reason: str, *, required: bool = True) -> str:
    """The reason, stripped; refused when blank (if required) or too long."""
    text = (reason or "").strip()
    if required and not text:
        raise InvalidRequestError("a reason is required", field="reason")
    if len(text) > MAX_PAUSE_REASON:
        raise InvalidRequestError(
            f"reason must be at most {MAX_PAUSE_REASON} characters", field="reason"
        )
    return text
