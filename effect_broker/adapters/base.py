"""The adapter protocol: public methods hold the protocol, subclasses implement two
primitives (``_send`` and ``_lookup``).

Spec "Key interfaces and contracts": the adapter owns target-specific truth and never
owns retry policy. The base class therefore guarantees, for every adapter:

* the one downstream key is what the subclass sends (it cannot pick another);
* anything a subclass raises that is not one of the three adapter errors becomes
  ``OutcomeUnknownError`` - an unexpected failure after ``_send`` started may have
  left bytes on the wire, and only proof of non-commit may become a retry;
* a probe that fails to answer is ``UNKNOWN``, never ``NOT_COMMITTED``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar, Protocol

from effect_broker import failpoints
from effect_broker.domain.canonical import validate_json_value
from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.errors import (
    AdapterError,
    InvalidJsonError,
    OutcomeUnknownError,
    RetryableAdapterError,
    TerminalAdapterError,
)
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import ProbeStatus

JsonObject = Mapping[str, object]


class SendGate(Protocol):
    """The worker's proof, checked right before a request is written, that it still
    holds its lease (issue "correctness at the edges", defect 1: a paused worker).

    ``check`` raises ``SendRefusedError`` (nothing was sent) when the lease cannot be
    proved on a clock that cannot jump; ``remaining`` is how many seconds the attempt
    may still take (its total time limit), so an adapter bounds its I/O by it.
    """

    def check(self) -> None:
        """Raise ``SendRefusedError`` unless sending now is provably within the lease."""
        ...

    def remaining(self) -> float:
        """Seconds left in this attempt's total time limit (never negative)."""
        ...


class OpenGate:
    """A gate that always lets the request through: adapters driven outside a
    worker (the conformance kit, direct tests) have no lease to prove."""

    def check(self) -> None:
        """Never refuses."""

    def remaining(self) -> float:
        """No limit beyond the adapter's own timeouts."""
        return float("inf")


OPEN_GATE = OpenGate()


@dataclass(frozen=True, slots=True)
class DispatchRequest:
    """One attempt at an effect: what the adapter may send, and under which key."""

    effect: EffectRecord
    arguments: JsonObject
    attempt_id: str
    contract: EffectContract
    #: Checked by the base class before ``_send`` and, by adapters that can, again
    #: immediately before the first byte is written.
    gate: SendGate = OPEN_GATE

    @property
    def fencing_token(self) -> int:
        """The version this attempt was claimed at: grows with every claim of the
        effect, so a target can refuse a request from an older claim."""
        return self.effect.version

    @property
    def downstream_key(self) -> str:
        """The one idempotency key of this effect, identical on every attempt, as the
        contract writes it to the target (``key_template``, ``key_alphabet``)."""
        return self.contract.upstream_key(self.effect.downstream_key)


@dataclass(frozen=True, slots=True)
class ProbeRequest:
    """A question to the target: did this effect commit?"""

    effect: EffectRecord
    arguments: JsonObject
    contract: EffectContract

    @property
    def downstream_key(self) -> str:
        """The correlation key the target recorded, if it did (as the contract
        writes it: ``key_template``, ``key_alphabet``)."""
        return self.contract.upstream_key(self.effect.downstream_key)


@dataclass(frozen=True, slots=True)
class DispatchResult:
    """The target's authoritative answer to a dispatch that committed."""

    external_id: str | None
    output: JsonObject = field(default_factory=dict)
    committed: bool = True
    target_timestamp: datetime | None = None


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """Evidence from the target, or UNKNOWN when it cannot prove either way."""

    status: ProbeStatus
    external_id: str | None = None
    output: JsonObject | None = None
    evidence: JsonObject | None = None


def _subject(effect: EffectRecord) -> str:
    return f"{effect.tenant_id}/{effect.operation_key}"


class EffectAdapter(ABC):
    """Base class of every adapter; subclasses implement ``_send`` and ``_lookup``."""

    #: Registry name used in contract files (``adapter = "..."``).
    name: ClassVar[str] = ""
    #: True when the mutation runs on the broker's own database connection, inside
    #: the transaction that also writes the receipt (safety class ``transactional``).
    transactional: ClassVar[bool] = False

    def __init__(self, contract: EffectContract) -> None:
        self.contract = contract

    @property
    def sends_fencing_token(self) -> bool:
        """True when every attempt carries ``request.fencing_token`` to a target that
        refuses a stale one (the conformance kit then checks that it does)."""
        return False

    def dispatch(self, request: DispatchRequest) -> DispatchResult:
        """Execute the effect once with ``request.downstream_key``; never retry inside."""
        failpoints.hit("before_request_write", subject=_subject(request.effect))
        # A worker paused since its claim must not send now: the sweeper may already
        # have handed the effect to someone else (SendRefusedError: nothing left).
        request.gate.check()
        try:
            result = self._send(request)
        except AdapterError:
            raise
        except Exception as exc:  # unknown failure after the send began: not provable
            raise OutcomeUnknownError(
                f"{type(exc).__name__} during dispatch; the outcome is unknown",
                adapter=self.name,
            ) from exc
        # The target committed and answered; dying here loses the response (spec: the
        # sharp problem, step 3).
        failpoints.hit("after_target_commit", subject=_subject(request.effect))
        if not result.committed:
            raise TerminalAdapterError(
                "the adapter returned a result that is not committed", adapter=self.name
            )
        try:
            validate_json_value(dict(result.output))
        except InvalidJsonError as exc:
            raise OutcomeUnknownError(
                "the target's output cannot be stored canonically", adapter=self.name
            ) from exc
        return result

    def probe(self, request: ProbeRequest) -> ProbeResult:
        """Ask the target whether the effect committed; UNKNOWN when it cannot tell."""
        try:
            result = self._lookup(request)
        except Exception as exc:  # a failed lookup proves nothing
            return ProbeResult(
                status=ProbeStatus.UNKNOWN,
                evidence={"error": type(exc).__name__, "adapter": self.name},
            )
        return result

    @abstractmethod
    def _send(self, request: DispatchRequest) -> DispatchResult:
        """Send once. Raise ``RetryableAdapterError`` only with proof nothing committed
        (e.g. connection refused before any byte was written, or an explicit target
        rejection), ``TerminalAdapterError`` for a definitive refusal, and
        ``OutcomeUnknownError`` when bytes may have left and no answer came back."""

    def _lookup(self, request: ProbeRequest) -> ProbeResult:
        """Authoritative lookup by the downstream key; default: no lookup exists."""
        return ProbeResult(status=ProbeStatus.UNKNOWN, evidence={"reason": "no lookup"})


__all__ = [
    "OPEN_GATE",
    "DispatchRequest",
    "DispatchResult",
    "EffectAdapter",
    "OutcomeUnknownError",
    "ProbeRequest",
    "ProbeResult",
    "RetryableAdapterError",
    "SendGate",
    "TerminalAdapterError",
]
