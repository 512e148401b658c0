"""The SDK's exceptions: one per code of the broker's error taxonomy, plus the few
outcomes only a caller meets (a wait that ran out, an effect that ended failed).

Each taxonomy exception names the domain error it mirrors (``mirrors``) and takes its
``code`` from it, so the wire code and the class cannot drift apart; a unit test holds
one exception per code of ``effect_broker.domain.errors.ERROR_CODES`` and the same
parent/child shape (``NumberOutOfRange`` is an ``InvalidJson``, ``OutcomeUnknown`` an
``AdapterFailed``). A code this SDK does not know yet (a newer broker) still arrives
as a ``BrokerError`` carrying that code.

Nothing here imports Django: an agent process imports the SDK without a settings
module (STYLE "Layering", the caller's side).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from effect_broker.domain import errors as domain

if TYPE_CHECKING:
    from effect_broker.client.models import Effect

#: Problem code -> exception class, for codes that arrive on the wire (filled as the
#: classes below are defined).
_BY_CODE: dict[str, type[BrokerError]] = {}
#: Every code in use, the caller-side outcomes' included: no two classes share one.
_CODES: set[str] = set()


class BrokerError(Exception):
    """The broker refused or could not answer a request.

    ``code`` is the stable problem code (``payload_conflict``, ``outcome_unknown``, ...),
    ``status`` the HTTP status (None when no answer came back), ``detail`` the broker's
    message, ``extras`` the problem's other members (``effect_id``, ...).
    """

    code: str = domain.EffectBrokerError.code
    #: The domain error this exception mirrors (None: a caller-side outcome).
    mirrors: ClassVar[type[domain.EffectBrokerError] | None] = domain.EffectBrokerError

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "mirrors" in cls.__dict__ and cls.mirrors is not None:
            cls.code = cls.mirrors.code
        if "code" not in cls.__dict__ and "mirrors" not in cls.__dict__:
            raise TypeError(f"{cls.__name__} must declare `mirrors` or its own `code`")
        if cls.code in _CODES:
            raise TypeError(f"{cls.__name__} reuses the code {cls.code}")
        _CODES.add(cls.code)
        if cls.mirrors is not None or cls.__dict__.get("_on_the_wire", False):
            _BY_CODE[cls.code] = cls

    def __init__(
        self,
        detail: str | None = None,
        *,
        code: str | None = None,
        status: int | None = None,
        extras: Mapping[str, object] | None = None,
    ) -> None:
        self.detail: str = detail if detail is not None else _first_line(type(self))
        if code is not None:
            self.code = code
        self.status = status
        self.extras: dict[str, object] = dict(extras or {})
        super().__init__(self.detail)

    @property
    def effect_id(self) -> str | None:
        """The effect the problem is about, when the broker named one."""
        value = self.extras.get("effect_id")
        return value if isinstance(value, str) else None

    def __str__(self) -> str:
        return self.detail


_BY_CODE[BrokerError.code] = BrokerError
_CODES.add(BrokerError.code)


def _first_line(cls: type) -> str:
    return (cls.__doc__ or cls.__name__).strip().split("\n\n", 1)[0].replace("\n", " ")


# --- the taxonomy, mirrored -----------------------------------------------------------


class InvalidJson(BrokerError):
    """The payload is not JSON the broker can canonicalise."""

    mirrors = domain.InvalidJsonError


class NumberOutOfRange(InvalidJson):
    """A number is outside ±(2**53-1); send money as minor units or strings."""

    mirrors = domain.NumberOutOfRangeError


class InvalidRequest(BrokerError):
    """The request is malformed."""

    mirrors = domain.InvalidRequestError


class UnstorableText(BrokerError):
    """A text value holds NUL or a lone surrogate; ``field`` names where."""

    mirrors = domain.UnstorableTextError


class ArgumentsTooLarge(BrokerError):
    """The arguments exceed a cap on keys, depth or string length (``cap``)."""

    mirrors = domain.ArgumentsTooLargeError


class UnknownField(BrokerError):
    """The body has a field the operation does not accept."""

    mirrors = domain.UnknownFieldError


class PayloadTooLarge(BrokerError):
    """The request body is larger than the broker accepts."""

    mirrors = domain.PayloadTooLargeError


class RequestTimeout(BrokerError):
    """The request body did not reach the broker in time; nothing was done."""

    mirrors = domain.RequestTimeoutError


class UnsupportedMediaType(BrokerError):
    """The body was not sent as ``application/json``."""

    mirrors = domain.UnsupportedMediaTypeError


class RouteNotFound(BrokerError):
    """No such route on the broker (a wrong base URL or API version)."""

    mirrors = domain.RouteNotFoundError


class MethodNotAllowed(BrokerError):
    """The route does not accept this method."""

    mirrors = domain.MethodNotAllowedError


class DisallowedHost(BrokerError):
    """The broker does not serve the host this request named."""

    mirrors = domain.DisallowedHostError


class PayloadConflict(BrokerError):
    """This operation key is an existing effect reserved with other arguments.

    Nothing was written or dispatched. Inspect the existing effect (``effect_id``)
    before acting again.
    """

    mirrors = domain.PayloadConflictError


class InvalidContract(BrokerError):
    """The broker's contract file is invalid."""

    mirrors = domain.ContractError


class UnknownContract(BrokerError):
    """No active contract matches this tool (or the effect's pinned version)."""

    mirrors = domain.UnknownContractError


class StaleWrite(BrokerError):
    """The effect changed while the broker wrote it; the write was refused."""

    mirrors = domain.StaleWriteError


class UnfencedWrite(BrokerError):
    """A ledger write tried to bypass the version fence."""

    mirrors = domain.UnfencedWriteError


class IllegalTransition(BrokerError):
    """The state machine does not allow this transition."""

    mirrors = domain.IllegalTransitionError


class AlreadyApproved(IllegalTransition):
    """The effect was already approved; a second approval sends nothing."""

    mirrors = domain.AlreadyApprovedError


class ApprovalNotPending(IllegalTransition):
    """The effect is not awaiting approval."""

    mirrors = domain.ApprovalNotPendingError


class ApprovalExpired(IllegalTransition):
    """The time to approve the effect ran out; it was never sent."""

    mirrors = domain.ApprovalExpiredError


class AppendOnly(BrokerError):
    """Receipts and events cannot be changed or deleted."""

    mirrors = domain.AppendOnlyError


class EffectNotFound(BrokerError):
    """No such effect for this tenant (or it has no receipt yet)."""

    mirrors = domain.EffectNotFoundError


class EventChainBroken(BrokerError):
    """The effect's event digest chain does not verify."""

    mirrors = domain.EventChainBrokenError


class DecryptionFailed(BrokerError):
    """A stored payload could not be decrypted."""

    mirrors = domain.DecryptionError


class TenantNotFound(BrokerError):
    """No such tenant."""

    mirrors = domain.TenantNotFoundError


class TenantDisabled(BrokerError):
    """This tenant is disabled."""

    mirrors = domain.TenantDisabledError


class Unauthenticated(BrokerError):
    """Missing or invalid API key."""

    mirrors = domain.AuthenticationError


class CredentialInQuery(BrokerError):
    """A credential was sent in a query string; rotate it."""

    mirrors = domain.CredentialInQueryError


class OperatorForbidden(BrokerError):
    """This credential may not act as an operator."""

    mirrors = domain.OperatorForbiddenError


class AlreadyPaused(BrokerError):
    """Dispatch of this scope is already paused; nothing was changed (operator API)."""

    mirrors = domain.AlreadyPausedError


class PauseNotFound(BrokerError):
    """No active pause matches; nothing was resumed (operator API)."""

    mirrors = domain.PauseNotFoundError


class Misconfigured(BrokerError):
    """The broker is misconfigured."""

    mirrors = domain.ConfigurationError


class EmbeddedPostgresUnavailable(BrokerError):
    """The broker's embedded PostgreSQL server could not be started or reached."""

    mirrors = domain.EmbeddedPostgresError


class OriginNotAllowed(BrokerError):
    """The request's Origin is not one the MCP endpoint serves (403)."""

    mirrors = domain.OriginNotAllowedError


class InvalidSecretRef(BrokerError):
    """A ``{"$secret": ...}`` argument is malformed (422); nothing was stored."""

    mirrors = domain.InvalidSecretRefError


class ContractsUnavailable(BrokerError):
    """The broker cannot load its contracts (503); nothing was done. Retry later with
    the same operation key."""

    mirrors = domain.ContractsUnavailableError


class SecretRefNotDeclared(BrokerError):
    """A ``{"$secret": ...}`` argument names a secret the contract does not declare
    for this tenant (422); nothing was stored."""

    mirrors = domain.SecretRefNotDeclaredError


class SecretUnavailable(BrokerError):
    """A worker could not find a referenced secret; the effect failed before any
    send. Seen as an effect's reason, not as an HTTP answer."""

    mirrors = domain.SecretUnavailableError


class RateLimited(BrokerError):
    """The tenant submitted faster than its limit and the broker did nothing (429 with
    ``Retry-After``). The client waits and resends with the same operation key."""

    mirrors = domain.RateLimitedError


class Overloaded(BrokerError):
    """The broker was at capacity and did no work for this request (503 with
    ``Retry-After``). The client resends it like any 5xx: with the same operation key
    a resend is a replay."""

    mirrors = domain.OverloadedError


class DatabaseUnavailable(BrokerError):
    """The broker's database did not answer (503 ``database_unavailable`` with
    ``Retry-After``): nothing was recorded. The client resends it like any 5xx: with
    the same operation key a resend reserves the effect or replays it."""

    mirrors = domain.DatabaseUnavailableError


class DatabaseConflict(BrokerError):
    """The broker's database cancelled the request for a concurrent one (503
    ``database_conflict`` with ``Retry-After``: a deadlock or serialization failure);
    nothing was recorded. The client resends it like any 5xx: with the same operation
    key a resend reserves the effect or replays it."""

    mirrors = domain.DatabaseConflictError


class AdapterFailed(BrokerError):
    """The target adapter failed."""

    mirrors = domain.AdapterError


class AdapterRetryable(AdapterFailed):
    """The target refused and proved nothing was committed."""

    mirrors = domain.RetryableAdapterError


class SendRefused(AdapterRetryable):
    """A worker refused to send because it could not prove its lease."""

    mirrors = domain.SendRefusedError


class AdapterTerminal(AdapterFailed):
    """The target refused the request definitively."""

    mirrors = domain.TerminalAdapterError


class KeyReused(AdapterTerminal):
    """The target holds this effect's key for a request with other parameters; an
    operator must tell what the key holds. Seen as an effect's reason, not as an HTTP
    answer."""

    mirrors = domain.KeyReusedError


class OutcomeUnknown(AdapterFailed):
    """Nobody knows yet whether this effect happened.

    The request may have reached the target and no answer proves either way. It is
    neither a failure nor a success: ``needs_operator`` says whether only an operator
    can settle it now (``manual_review``, or an unsafe effect), or whether the broker
    is still reconciling it with the target. Any retry must reuse this operation key,
    which replays the same effect and never sends a second request.
    """

    mirrors = domain.OutcomeUnknownError

    def __init__(
        self,
        detail: str | None = None,
        *,
        code: str | None = None,
        status: int | None = None,
        extras: Mapping[str, object] | None = None,
        effect: Effect | None = None,
    ) -> None:
        super().__init__(detail, code=code, status=status, extras=extras)
        #: The effect as last read (None when the broker answered with a problem).
        self.effect = effect

    @property
    def effect_id(self) -> str | None:
        """The effect whose outcome is unknown."""
        return self.effect.effect_id if self.effect else super().effect_id

    @property
    def needs_operator(self) -> bool:
        """True when nothing automatic will settle the effect: an operator must."""
        return self.effect.needs_operator if self.effect else True


# --- outcomes only a caller meets -----------------------------------------------------


class InternalServerError(BrokerError):
    """The broker failed unexpectedly (see its logs)."""

    mirrors = None
    code = "internal_error"
    # Not in the taxonomy, but the API's catch-all answers with it.
    _on_the_wire = True


class BrokerUnavailable(BrokerError):
    """The broker could not be reached or kept answering 5xx, after every retry."""

    mirrors = None
    code = "broker_unavailable"


class _EffectOutcome(BrokerError):
    """Base of the caller-side outcomes that carry the effect they are about."""

    mirrors = None
    code = "effect_outcome"

    def __init__(self, detail: str | None = None, *, effect: Effect) -> None:
        super().__init__(detail, extras={"effect_id": effect.effect_id})
        #: The effect as last read.
        self.effect = effect


class WaitTimeout(_EffectOutcome):
    """The effect is still in progress; wait for it again (or resubmit the same call).

    Resubmitting the same operation key and arguments replays this effect.
    """

    code = "wait_timeout"


class EffectFailed(_EffectOutcome):
    """The effect ended ``failed_final``; it will not be sent again.

    The message says what the broker knows: normally no attempt was left unanswered
    (each was refused or never sent, or a check proved it absent), which is proof it
    did not take effect; but when ``effect.outcome_in_doubt`` is true, an operator
    marked it failed while an attempt may have reached the target, and nothing proved
    that it did not take effect.
    """

    code = "effect_failed"


class EffectCompensated(_EffectOutcome):
    """The effect succeeded and was then compensated."""

    code = "effect_compensated"


def error_for_code(code: str) -> type[BrokerError]:
    """The exception class for a problem ``code`` (``BrokerError`` if unknown)."""
    return _BY_CODE.get(code, BrokerError)


def taxonomy() -> Mapping[str, type[BrokerError]]:
    """Every problem code this SDK knows, with its exception class."""
    return dict(_BY_CODE)


_PROBLEM_MEMBERS = frozenset({"type", "title", "status", "code", "detail"})


def from_problem(status: int, problem: Mapping[str, Any]) -> BrokerError:
    """Build the typed exception for an ``application/problem+json`` body."""
    code = problem.get("code")
    code = code if isinstance(code, str) and code else f"http_{status}"
    detail = problem.get("detail")
    extras = {k: v for k, v in problem.items() if k not in _PROBLEM_MEMBERS}
    cls = error_for_code(code)
    return cls(
        detail if isinstance(detail, str) else f"HTTP {status} ({code})",
        code=code,
        status=status,
        extras=extras,
    )


def from_domain(exc: domain.EffectBrokerError) -> BrokerError:
    """The SDK exception for a domain error raised in-process (same code and fields
    as the HTTP surface's problem for it)."""
    # The members effect_broker.api.problems.domain_error puts on the wire.
    extras = {
        k: v
        for k, v in exc.details.items()
        if isinstance(v, str | int | bool) and k not in _PROBLEM_MEMBERS
    }
    return error_for_code(exc.code)(
        str(exc), code=exc.code, status=exc.http_status, extras=extras
    )
