"""The one error taxonomy of effect-broker (STYLE rule 3).

Every error the broker raises on purpose is an ``EffectBrokerError``. Each subclass has a
stable snake_case ``code`` (clients and logs key on it, so it never changes), an
``http_status`` used by the single API exception handler, a docstring whose first line is
the default message, and structured ``details``. Foreign exceptions are wrapped at the
boundary with ``raise ... from exc`` so the cause survives.
"""

from __future__ import annotations

from typing import Any, ClassVar


class EffectBrokerError(Exception):
    """effect-broker error."""

    code: ClassVar[str] = "effect_broker_error"
    http_status: ClassVar[int] = 400
    #: What the caller (or an operator) does about it: the "what to do" of the
    #: code's page, which a problem's ``type`` URI points at (issue 21).
    remedy: ClassVar[str] = ""

    def __init__(self, message: str | None = None, **details: object) -> None:
        self.message: str = message if message is not None else self.default_message()
        self.details: dict[str, object] = dict(details)
        super().__init__(self.message)

    @classmethod
    def default_message(cls) -> str:
        """Return the class docstring's first paragraph (its first line, if one-line)."""
        doc = (cls.__doc__ or cls.__name__).strip()
        paragraph = doc.split("\n\n", 1)[0]
        return " ".join(line.strip() for line in paragraph.splitlines())

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, object]:
        """Return the wire shape ``{"code", "message", "details"}`` for API responses."""
        return {"code": self.code, "message": self.message, "details": dict(self.details)}

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickling replays ``cls(*args)``, which would drop ``details`` and
        # re-run subclass message composition; rebuild from the stored state instead.
        return (_restore_error, (type(self), self.message, self.details))


def _restore_error(
    cls: type[EffectBrokerError], message: str, details: dict[str, object]
) -> EffectBrokerError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.message = message
    error.details = dict(details)
    return error


# --- payloads -------------------------------------------------------------------------


class InvalidJsonError(EffectBrokerError):
    """Payload is not valid JSON for the broker's canonical form."""

    code = "invalid_json"
    http_status = 400
    remedy = (
        "Send one JSON object: no duplicate keys, no NaN or Infinity, no trailing "
        "text. Fix the body and resend; nothing was recorded."
    )


class NumberOutOfRangeError(InvalidJsonError):
    """Number outside the exact JSON range ±(2**53-1); money and big numbers travel
    as strings or minor-unit integers.
    """

    code = "number_out_of_range"
    http_status = 400
    remedy = (
        "Send money and large numbers as minor-unit integers or as strings, within "
        "±(2**53-1). Fix the value and resend; nothing was recorded."
    )


class InvalidRequestError(EffectBrokerError):
    """The request is malformed."""

    code = "invalid_request"
    http_status = 400
    remedy = (
        "Read `detail` and `field`: they name what to change (a missing or "
        "malformed operation key, a refused header, evidence a resolution needs). "
        "Fix it and resend; nothing was recorded."
    )


class UnstorableTextError(EffectBrokerError):
    """A text value holds a character PostgreSQL cannot store (NUL, a lone surrogate).

    Refused before any statement runs (issue 12: these were 500s). ``field`` names
    where: a body path such as ``arguments`` or ``trace_id``, ``query.tool``, or
    ``path``.
    """

    code = "unstorable_text"
    http_status = 422
    remedy = (
        "Remove the NUL (U+0000) or lone surrogate from the field `field` names, "
        "then resend; nothing was recorded."
    )


class ArgumentsTooLargeError(EffectBrokerError):
    """The arguments exceed a cap on keys, nesting depth or string length.

    ``cap`` says which (``keys``, ``depth``, ``string_length``), ``limit`` its value.
    """

    code = "arguments_too_large"
    http_status = 422
    remedy = (
        "Shrink the arguments below the cap `cap` and `limit` name (keys, depth or "
        "string length), or pass a reference to the data instead of the data; "
        "nothing was recorded."
    )


class UnknownFieldError(EffectBrokerError):
    """The request body has a field this operation does not accept.

    Unknown fields are refused rather than ignored, so a caller who believes it set
    one (``tenant_id``, a misspelt ``requested_by``) learns that it did not.
    """

    code = "unknown_field"
    http_status = 422
    remedy = (
        "Remove the field `field` names (the tenant comes from the API key, never "
        "the body); check its spelling against the API reference; nothing was "
        "recorded."
    )


class PayloadTooLargeError(EffectBrokerError):
    """The request body is larger than this broker accepts.

    Refused before the body is read past the limit, authenticated or not.
    """

    code = "payload_too_large"
    http_status = 413
    remedy = (
        "Send a smaller body (under EFFECT_BROKER_MAX_BODY_BYTES), e.g. fewer batch "
        "items or a reference instead of inline data; nothing was read or recorded."
    )


class RequestTimeoutError(EffectBrokerError):
    """The request body did not arrive in time; nothing was done, send it again.

    A body must arrive within a deadline and at a minimum rate (api/body_limit.py):
    a trickled body would otherwise hold its connection for as long as it trickles.
    """

    code = "request_timeout"
    http_status = 408
    remedy = (
        "The request body arrived too slowly (over EFFECT_BROKER_BODY_TIMEOUT in "
        "total, or under EFFECT_BROKER_BODY_MIN_RATE); nothing was read or recorded "
        "and the connection was closed. Resend the whole request on a new connection."
    )


class UnsupportedMediaTypeError(EffectBrokerError):
    """The request body must be sent as ``Content-Type: application/json``."""

    code = "unsupported_media_type"
    http_status = 415
    remedy = "Send the body with `Content-Type: application/json`; nothing was recorded."


class RouteNotFoundError(EffectBrokerError):
    """No such route."""

    code = "route_not_found"
    http_status = 404
    remedy = (
        "Check the method and path against the API reference (the paths start with "
        "/v1/); nothing was done."
    )


class MethodNotAllowedError(EffectBrokerError):
    """This route does not accept this method; ``Allow`` lists the ones it does."""

    code = "method_not_allowed"
    http_status = 405
    remedy = "Use one of the methods the `Allow` header lists; nothing was done."


class DisallowedHostError(EffectBrokerError):
    """The Host header names a host this broker does not serve (``ALLOWED_HOSTS``)."""

    code = "disallowed_host"
    http_status = 400
    remedy = (
        "Call the broker by a host name in its ALLOWED_HOSTS (an operator sets it); "
        "nothing was done."
    )


class OriginNotAllowedError(EffectBrokerError):
    """The Origin header names a web origin this MCP endpoint does not serve
    (``EFFECT_BROKER_MCP_ALLOWED_ORIGINS``)."""

    code = "origin_not_allowed"
    http_status = 403
    remedy = (
        "A browser page from an origin the broker does not trust called /mcp. Call it "
        "from a trusted origin, or have the operator add that origin to "
        "EFFECT_BROKER_MCP_ALLOWED_ORIGINS; clients that send no Origin header are "
        "not affected."
    )


class InvalidSecretRefError(EffectBrokerError):
    """A secret reference is malformed: write {"$secret": "env:NAME"} or
    {"$secret": "file:NAME"}."""

    code = "invalid_secret_ref"
    http_status = 422
    remedy = (
        'Write a secret reference as {"$secret": "env:NAME"} or {"$secret": '
        '"file:NAME"}; nothing was recorded.'
    )


class SecretRefNotDeclaredError(EffectBrokerError):
    """A secret reference names a secret the effect's contract does not declare for
    this tenant; nothing was written."""

    code = "secret_ref_not_declared"
    http_status = 422
    remedy = (
        "The arguments name a secret reference the contract does not declare for your "
        "tenant; nothing was recorded. Use a reference the contract lists in "
        "`secrets` (or `tenant_secrets` for your tenant), or ask the operator to "
        "declare it."
    )


class SecretUnavailableError(EffectBrokerError):
    """The dispatching worker cannot find a secret an effect refers to; nothing was
    sent.

    Recorded as the effect's terminal reason before any attempt starts, never answered
    over HTTP: a submit does not look secrets up.
    """

    code = "secret_unavailable"
    http_status = 500
    remedy = (
        "An operator provides the secret to the worker (its environment or "
        "EFFECT_BROKER_SECRETS_DIR). Nothing was sent; the effect ended and its "
        "reason says which secret was missing."
    )


class PayloadConflictError(EffectBrokerError):
    """This operation_key was already used with a different payload or contract."""

    code = "payload_conflict"
    http_status = 409
    remedy = (
        "This operation key already names an effect with other arguments. Inspect "
        "that effect (`effect_id`, GET /v1/effects/{id}); if it is the operation "
        "you meant, use its outcome. Never resubmit the new arguments under a fresh "
        "key to get past this: that would be a second operation. Status 409 when "
        "the key came in the body, 422 when it came in the Idempotency-Key header "
        "(the draft's code)."
    )


# --- contracts ------------------------------------------------------------------------


class ContractError(EffectBrokerError):
    """The effect contract definition is invalid."""

    code = "invalid_contract"
    http_status = 500
    remedy = (
        "An operator fixes the contracts file at the place the message names "
        "(`effect-broker contracts validate` lists every problem), then restarts the "
        "API and the workers (a process reads the file at start); submits for that "
        "contract fail until then."
    )

    def __init__(
        self,
        message: str | None = None,
        *,
        file: str | None = None,
        contract: str | None = None,
        version: str | None = None,
        index: int | None = None,
        field: str | None = None,
        **details: object,
    ) -> None:
        # The message names where to look, "<file>: contract '<name>' v<version>:
        # field '<field>': <reason>", so an operator can fix a bad deploy from one log
        # line. ``index`` (1-based position in the file) stands in for a missing name.
        reason = message if message is not None else self.default_message()
        parts = [file] if file else []
        if contract:
            label = f"contract {contract!r}"
            if version:
                label += f" {version}" if version.startswith("v") else f" v{version}"
            parts.append(label)
        elif index is not None:
            parts.append(f"contract #{index}")
        if field:
            parts.append(f"field {field!r}")
        parts.append(reason)
        super().__init__(
            ": ".join(parts),
            file=file,
            contract=contract,
            version=version,
            index=index,
            field=field,
            reason=reason,
            **details,
        )


class ContractsUnavailableError(EffectBrokerError):
    """The broker cannot load its contracts right now; nothing was done. Try again
    later with the same operation key; the operator's log names the problem."""

    code = "contracts_unavailable"
    http_status = 503
    remedy = (
        "The broker could not load its contracts file, so it accepts no effect; "
        "nothing was recorded. Retry later. Operators: run `effect-broker contracts "
        "validate` on the file the broker reads (its log names the problem), fix it, "
        "and restart the API and the workers."
    )


class UnknownContractError(EffectBrokerError):
    """No active contract matches this tool or contract version."""

    code = "unknown_contract"
    http_status = 422
    remedy = (
        "Call a tool an active contract declares, or ask an operator to deploy (or "
        "restore) the contract version the message names; nothing was recorded."
    )


# --- ledger ---------------------------------------------------------------------------


class StaleWriteError(EffectBrokerError):
    """The effect changed since it was read; the fenced write was refused."""

    code = "stale_write"
    http_status = 409
    remedy = (
        "The effect changed while you acted on it: read it again (GET "
        "/v1/effects/{id}) and decide on its current state."
    )


class UnfencedWriteError(EffectBrokerError):
    """A ledger write tried to bypass the version fence."""

    code = "unfenced_write"
    http_status = 500
    remedy = (
        "A fault of the broker's own (a ledger write without its version fence); "
        "report it with the server log. Nothing was written."
    )


class IllegalTransitionError(EffectBrokerError):
    """The state machine does not allow this transition."""

    code = "illegal_transition"
    http_status = 409
    remedy = (
        "The effect's current state does not allow this step (e.g. reconciling an "
        "unsafe effect). Read its state; an operator resolves what the broker "
        "cannot."
    )


class AlreadyApprovedError(IllegalTransitionError):
    """This effect was already approved; an approval is given once and consumed by
    one dispatch.

    ``approved_by`` names the operator whose approval counts; nothing was written
    and nothing more was sent.
    """

    code = "already_approved"
    http_status = 409
    remedy = (
        "Nothing to do: another operator (`approved_by`) approved this effect first, "
        "and it is dispatched once under that approval. Read the effect for its "
        "outcome; a second approval never sends it again."
    )


class ApprovalNotPendingError(IllegalTransitionError):
    """This effect is not awaiting approval; nothing was written."""

    code = "approval_not_pending"
    http_status = 409
    remedy = (
        "Only an effect in `awaiting_approval` can be approved or denied. Read its "
        "status (`effect_status`): it never needed approval, or it was denied, or "
        "its approval expired - a denied or expired effect is failed_final and was "
        "never sent, and no decision changes that."
    )


class ApprovalExpiredError(IllegalTransitionError):
    """The time to approve this effect has run out; it ended failed_final
    (approval_expired) and was never sent."""

    code = "approval_expired"
    http_status = 409
    remedy = (
        "The contract's approval_ttl passed (on the database's clock) before an "
        "operator approved the effect: it is failed_final, nothing was sent and "
        "nothing will be. Whether the business operation is still wanted is the "
        "caller's decision; operators who need longer raise the contract's "
        "approval_ttl."
    )


class AppendOnlyError(EffectBrokerError):
    """Receipts and events are append-only; they cannot be changed or deleted."""

    code = "append_only"
    http_status = 500
    remedy = (
        "Receipts and events are never changed or deleted; record a correction as a "
        "new event (an operator resolution) instead."
    )


class EffectNotFoundError(EffectBrokerError):
    """No such effect for this tenant."""

    code = "effect_not_found"
    http_status = 404
    remedy = (
        "Check the effect id, and that you use the API key of the tenant that "
        "submitted it (another tenant's effect is not found). A receipt is 404 "
        "until the effect has succeeded."
    )


class EventChainBrokenError(EffectBrokerError):
    """The effect's event digest chain does not verify."""

    code = "event_chain_broken"
    http_status = 500
    remedy = (
        "The effect's stored history does not verify: stop acting on it and have an "
        "operator investigate (`effect-broker doctor`, the server log)."
    )


class DecryptionError(EffectBrokerError):
    """A stored payload could not be decrypted."""

    code = "decryption_failed"
    http_status = 500
    remedy = (
        "An operator checks the master keys (EFFECT_BROKER_MASTER_KEYS) the broker "
        "runs with: a key that encrypted stored data is missing."
    )


# --- tenants and authentication -------------------------------------------------------


class TenantNotFoundError(EffectBrokerError):
    """No such tenant."""

    code = "tenant_not_found"
    http_status = 404
    remedy = "Check the tenant's name or id (`effect-broker tenants list`)."


class TenantDisabledError(EffectBrokerError):
    """This tenant is disabled."""

    code = "tenant_disabled"
    http_status = 403
    remedy = (
        "An operator re-enables the tenant (`effect-broker tenants enable NAME`), or "
        "use an enabled tenant's key; nothing was done."
    )


class AuthenticationError(EffectBrokerError):
    """Missing or invalid credentials."""

    code = "unauthenticated"
    http_status = 401
    remedy = (
        "Send `Authorization: Bearer <key>` with a current key for this broker (a "
        "tenant's API key, or an operator token for operator routes)."
    )


class CredentialInQueryError(EffectBrokerError):
    """Credentials are never accepted in a query string; send them as
    ``Authorization: Bearer``, and rotate the one that was sent.

    Query strings are logged, cached and passed on as referrers.
    """

    code = "credential_in_query"
    http_status = 400
    remedy = (
        "Send the credential in the `Authorization` header, and rotate the one that "
        "was sent in the URL: it may be in logs already."
    )


class RateLimitedError(EffectBrokerError):
    """This tenant is submitting faster than its limit; nothing was done, retry after
    the ``Retry-After`` seconds with the same operation key.

    Refused before the body is parsed, so one tenant's flood costs the others little.
    """

    code = "rate_limited"
    http_status = 429
    remedy = (
        "Wait the `Retry-After` seconds and resend with the same operation key; ask "
        "an operator for a higher limit if this is steady load."
    )


class OperatorForbiddenError(EffectBrokerError):
    """This credential may not act as an operator.

    Resolution and forks need an active staff user holding
    ``effect_broker.resolve_effect``; a tenant's API key never is one.
    """

    code = "operator_forbidden"
    http_status = 403
    remedy = (
        "Use an operator token of an active staff user with the "
        "effect_broker.resolve_effect permission; a tenant's API key is never an "
        "operator."
    )


# --- operator controls (issue 24, item 7) ---------------------------------------------


class AlreadyPausedError(EffectBrokerError):
    """Dispatch of this scope is already paused; nothing was changed.

    ``pause_id`` names the active pause, with who paused it, when and why.
    """

    code = "already_paused"
    http_status = 409
    remedy = (
        "Read the active pause (`effect-broker tools pauses`, GET /v1/operator/pauses); "
        "resume it first if its reason should change."
    )


class PauseNotFoundError(EffectBrokerError):
    """No active pause matches; nothing was resumed."""

    code = "pause_not_found"
    http_status = 404
    remedy = (
        "List the active pauses (`effect-broker tools pauses`, GET "
        "/v1/operator/pauses) and resume one by its id or its exact scope."
    )


# --- deployment -----------------------------------------------------------------------


class ConfigurationError(EffectBrokerError):
    """The broker is misconfigured."""

    code = "configuration"
    http_status = 500
    remedy = "An operator fixes the setting the message names and restarts the broker."


class EmbeddedPostgresError(EffectBrokerError):
    """The embedded PostgreSQL server could not be started or reached."""

    code = "embedded_postgres"
    http_status = 500
    remedy = (
        "An operator checks the embedded PostgreSQL (its data directory, port and "
        "log), or sets DATABASE_URL to a server."
    )


class OverloadedError(EffectBrokerError):
    """The broker is at capacity and did not process this request; retry later.

    Answered before any work is done: an API process past its in-flight limit, or no
    database connection free in its pool within the pool timeout. The response
    carries ``Retry-After``; retrying a submit with the same operation key is safe.
    """

    code = "overloaded"
    http_status = 503
    remedy = (
        "Wait the `Retry-After` seconds and resend as it is (with the same "
        "operation key): nothing was done."
    )


class DatabaseUnavailableError(EffectBrokerError):
    """The broker's database did not answer; nothing was recorded. Retry later.

    Answered while PostgreSQL is down, restarting or failing over (connection refused
    or reset, crash recovery, a pool that cannot open a connection). The response
    carries ``Retry-After``; resending with the same operation key is safe: it either
    reserves the effect or replays the one an earlier request reserved.
    """

    code = "database_unavailable"
    http_status = 503
    remedy = (
        "Wait the `Retry-After` seconds and resend with the same operation key: "
        "nothing was recorded, and a resend either reserves the effect or replays "
        "it."
    )


class DatabaseConflictError(EffectBrokerError):
    """The database cancelled this request to settle a conflict with a concurrent one;
    nothing was recorded. Retry later.

    PostgreSQL aborts one of two transactions that wait for each other (deadlock,
    SQLSTATE 40P01) or that cannot both be serialized (40001), and rolls back all it
    wrote: every ledger write is one statement, so no part of it stays. The response
    carries ``Retry-After``; resending with the same operation key is safe: it
    reserves the effect or replays the one the concurrent request reserved. Build it
    with ``of``, which recognises the database error.
    """

    code = "database_conflict"
    http_status = 503
    remedy = (
        "PostgreSQL cancelled this write for a concurrent one (a deadlock or a "
        "serialization failure); nothing was recorded. Resend the same request, with "
        "the same operation key, after `Retry-After`: it reserves the effect or "
        "replays it."
    )

    #: The SQLSTATEs that mean "aborted for a concurrent transaction", by reason.
    SQLSTATES: ClassVar[dict[str, str]] = {
        "40P01": "deadlock",
        "40001": "serialization_failure",
    }
    #: Seconds a caller should wait: the transaction it met has finished by then.
    RETRY_AFTER_SECONDS: ClassVar[int] = 1

    @classmethod
    def of(cls, exc: BaseException) -> DatabaseConflictError | None:
        """The error for ``exc`` - a driver error with a conflict SQLSTATE, or a
        wrapper whose cause is one (Django's) - else None. Reads ``sqlstate`` only,
        so the domain imports no driver."""
        for candidate in (exc, exc.__cause__):
            sqlstate = getattr(candidate, "sqlstate", None)
            if isinstance(sqlstate, str) and sqlstate in cls.SQLSTATES:
                return cls(
                    reason=cls.SQLSTATES[sqlstate],
                    sqlstate=sqlstate,
                    retry_after_seconds=cls.RETRY_AFTER_SECONDS,
                )
        return None


# --- adapters (target truth) ----------------------------------------------------------


class AdapterError(EffectBrokerError):
    """The target adapter failed."""

    code = "adapter_error"
    http_status = 502
    remedy = (
        "The target failed; the effect's status says what the broker will do "
        "(retry, reconcile or ask an operator). Read the effect; do not resubmit "
        "under another key."
    )


class RetryableAdapterError(AdapterError):
    """The target refused the request and proved nothing was committed; retry is safe."""

    code = "adapter_retryable"
    remedy = (
        "Nothing to do: the target proved nothing was committed, and the broker "
        "retries with the same downstream key."
    )


class SendRefusedError(RetryableAdapterError):
    """The worker refused to send: it could not prove it still holds its lease.

    Raised by the send gate immediately before the request would be written, so no
    byte left this process; the attempt ends as not sent.
    """

    code = "send_refused"
    remedy = (
        "Nothing to do: no byte was sent; another worker or a later attempt "
        "dispatches the effect."
    )


class TerminalAdapterError(AdapterError):
    """The target refused the request definitively; retrying cannot succeed."""

    code = "adapter_terminal"
    remedy = (
        "The target refused the request for good and nothing happened there; read "
        "the effect's reason and fix the cause (the arguments, the account). A "
        "resend under the same key replays this refusal."
    )


class KeyReusedError(TerminalAdapterError):
    """The target holds this effect's key for a request with other parameters.

    This request was not applied and no resend under the key can succeed, but the key
    proves that something was sent under it (an earlier attempt, perhaps with other
    arguments): only an operator can tell what it holds, so the effect goes to
    manual review, never to failed_final (issue 19, item 5).
    """

    code = "key_reused"
    remedy = (
        "The target says this downstream key was already used with different "
        "parameters, which no resend can change. The effect waits in manual_review: "
        "an operator checks the target and resolves it. Do not resubmit under another "
        "operation key."
    )


class OutcomeUnknownError(AdapterError):
    """Request bytes may have reached the target and the result is unknown."""

    code = "outcome_unknown"
    remedy = (
        "Do not redo the step under another key: it may have happened. The broker "
        "reconciles with the target where it can; otherwise an operator checks the "
        "target and resolves the effect."
    )


def _all_subclasses(cls: type[EffectBrokerError]) -> list[type[EffectBrokerError]]:
    found: list[type[EffectBrokerError]] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


ERROR_CODES: dict[str, type[EffectBrokerError]] = {
    error.code: error for error in _all_subclasses(EffectBrokerError)
}
"""Stable error code -> error class, for clients and the API exception handler."""
