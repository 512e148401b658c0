"""The effect-broker Python SDK.

``BrokerClient`` (sync) and ``AsyncBrokerClient`` speak the broker's HTTP API on
httpx; ``InProcessClient`` offers the same interface inside a Django project that
installs the app. Each has ``submit``, ``wait``, ``get``, ``receipt``, ``history``,
``perform`` (submit + wait + the receipt's result) and the ``effect`` decorator::

    broker = BrokerClient("https://broker.example", api_key)

    @broker.effect(tool="charge_card", key=lambda order, **_: f"order:{order}:charge:v1")
    def charge_card(order: str, amount_minor: int, currency: str) -> dict: ...

    charge_card("42", 1999, "EUR")  # the receipt's result, or raises OutcomeUnknown

Errors are typed, one class per code of the broker's error taxonomy
(``PayloadConflict``, ``OutcomeUnknown``, ...), all ``BrokerError``. An unknown outcome
is raised as ``OutcomeUnknown``, never returned as a result or reported as a failure.
Stable operation keys per runtime: ``effect_broker.keys``.

Importing this package needs neither Django nor a database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from effect_broker.client.base import DEFAULT_WAIT
from effect_broker.client.errors import (
    AdapterFailed,
    AdapterRetryable,
    AdapterTerminal,
    AlreadyApproved,
    AlreadyPaused,
    AppendOnly,
    ApprovalExpired,
    ApprovalNotPending,
    ArgumentsTooLarge,
    BrokerError,
    BrokerUnavailable,
    ContractsUnavailable,
    CredentialInQuery,
    DatabaseConflict,
    DatabaseUnavailable,
    DecryptionFailed,
    DisallowedHost,
    EffectCompensated,
    EffectFailed,
    EffectNotFound,
    EmbeddedPostgresUnavailable,
    EventChainBroken,
    IllegalTransition,
    InternalServerError,
    InvalidContract,
    InvalidJson,
    InvalidRequest,
    InvalidSecretRef,
    KeyReused,
    MethodNotAllowed,
    Misconfigured,
    NumberOutOfRange,
    OperatorForbidden,
    OriginNotAllowed,
    OutcomeUnknown,
    Overloaded,
    PauseNotFound,
    PayloadConflict,
    PayloadTooLarge,
    RateLimited,
    RequestTimeout,
    RouteNotFound,
    SecretRefNotDeclared,
    SecretUnavailable,
    SendRefused,
    StaleWrite,
    TenantDisabled,
    TenantNotFound,
    Unauthenticated,
    UnfencedWrite,
    UnknownContract,
    UnknownField,
    UnstorableText,
    UnsupportedMediaType,
    WaitTimeout,
)
from effect_broker.client.http_client import AsyncBrokerClient, BrokerClient
from effect_broker.client.models import (
    BatchItem,
    BatchResult,
    Effect,
    History,
    HistoryEvent,
    Paused,
    Receipt,
)
from effect_broker.client.retrying import NO_RETRY, RetryPolicy

if TYPE_CHECKING:
    from effect_broker.client.in_process import InProcessClient

__all__ = [
    "DEFAULT_WAIT",
    "NO_RETRY",
    "AdapterFailed",
    "AdapterRetryable",
    "AdapterTerminal",
    "AlreadyApproved",
    "AlreadyPaused",
    "AppendOnly",
    "ApprovalExpired",
    "ApprovalNotPending",
    "ArgumentsTooLarge",
    "AsyncBrokerClient",
    "BatchItem",
    "BatchResult",
    "BrokerClient",
    "BrokerError",
    "BrokerUnavailable",
    "ContractsUnavailable",
    "CredentialInQuery",
    "DatabaseConflict",
    "DatabaseUnavailable",
    "DecryptionFailed",
    "DisallowedHost",
    "Effect",
    "EffectCompensated",
    "EffectFailed",
    "EffectNotFound",
    "EmbeddedPostgresUnavailable",
    "EventChainBroken",
    "History",
    "HistoryEvent",
    "IllegalTransition",
    "InProcessClient",
    "InternalServerError",
    "InvalidContract",
    "InvalidJson",
    "InvalidRequest",
    "InvalidSecretRef",
    "KeyReused",
    "MethodNotAllowed",
    "Misconfigured",
    "NumberOutOfRange",
    "OperatorForbidden",
    "OriginNotAllowed",
    "OutcomeUnknown",
    "Overloaded",
    "PauseNotFound",
    "Paused",
    "PayloadConflict",
    "PayloadTooLarge",
    "RateLimited",
    "Receipt",
    "RequestTimeout",
    "RetryPolicy",
    "RouteNotFound",
    "SecretRefNotDeclared",
    "SecretUnavailable",
    "SendRefused",
    "StaleWrite",
    "TenantDisabled",
    "TenantNotFound",
    "Unauthenticated",
    "UnfencedWrite",
    "UnknownContract",
    "UnknownField",
    "UnstorableText",
    "UnsupportedMediaType",
    "WaitTimeout",
]


def __getattr__(name: str) -> Any:
    # InProcessClient imports Django and the services: load it on first use only.
    if name == "InProcessClient":
        from effect_broker.client.in_process import InProcessClient

        return InProcessClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
