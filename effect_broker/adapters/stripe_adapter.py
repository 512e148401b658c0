"""Optional Stripe test-mode adapter: PaymentIntent create with the downstream key.

Stripe keeps idempotency keys for 24 hours and rejects a reused key with different
parameters, so it is an ``idempotent`` target with a 24h horizon (spec "Guarantee
vocabulary"). Its search API is eventually consistent without a declared bound, so a
probe can discover success but never prove absence: absence is UNKNOWN.

Contract (the broker's retry horizon must stay inside Stripe's 24h)::

    [[contract]]
    name = "payments.stripe-charge"
    version = "1"
    tool = "stripe_charge"
    safety = "idempotent"
    key_retention = "24h"
    retry_limit = 5
    adapter = "stripe"
    preview_fields = ["amount_minor", "currency"]
    [contract.adapter_options]
    timeout = "30s"
    connect_timeout = "5s"
    # api_base = "http://127.0.0.1:12111"   # stripe-mock, for offline tests

Arguments are PaymentIntent create parameters; ``amount_minor`` is accepted for
``amount``. Needs ``pip install 'effect-broker[stripe]'`` and
``STRIPE_TEST_KEY=sk_test_...`` (live keys are refused: this adapter exists for demos
and contract tests).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from effect_broker.adapters.base import (
    DispatchRequest,
    DispatchResult,
    EffectAdapter,
    ProbeRequest,
    ProbeResult,
)
from effect_broker.domain.contracts import EffectContract, parse_duration
from effect_broker.domain.errors import (
    AdapterError,
    ConfigurationError,
    KeyReusedError,
    OutcomeUnknownError,
    RetryableAdapterError,
    TerminalAdapterError,
)
from effect_broker.domain.states import ProbeStatus

_METADATA_KEY = "effect_broker_key"


def _import_stripe() -> Any:
    try:
        import stripe
    except ImportError as exc:
        raise ConfigurationError(
            "adapter 'stripe' needs the stripe extra: pip install 'effect-broker[stripe]'"
        ) from exc
    return stripe


def _connect_failure(exc: BaseException) -> bool:
    # The SDK wraps the transport error (``raise APIConnectionError ... from e``), and
    # requests wraps urllib3's (``ConnectionError(MaxRetryError(reason=...))``). Only a
    # failure to open the connection proves that no request byte left, so walk the
    # explicit links (cause, reason, args) - never ``__context__``, which can hold an
    # unrelated earlier error - looking for one.
    import requests
    import urllib3

    connect_errors = (
        requests.exceptions.ConnectTimeout,
        urllib3.exceptions.NewConnectionError,
        urllib3.exceptions.ConnectTimeoutError,
    )
    stack: list[BaseException] = [exc]
    seen: set[int] = set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, connect_errors):
            return True
        links = (current.__cause__, getattr(current, "reason", None), *current.args)
        stack.extend(link for link in links if isinstance(link, BaseException))
    return False


def classify_stripe_error(exc: Exception) -> AdapterError:
    """Map a stripe SDK error to what it proves about the commit."""
    stripe = _import_stripe()
    status = getattr(exc, "http_status", None)
    details = {
        "adapter": "stripe",
        "http_status": status,
        "stripe_error": type(exc).__name__,
    }
    if isinstance(exc, stripe.APIConnectionError):
        if _connect_failure(exc):
            return RetryableAdapterError("could not connect to Stripe", **details)
        return OutcomeUnknownError(
            "the connection to Stripe failed mid-request", **details
        )
    if isinstance(exc, stripe.RateLimitError):
        # 429: refused before processing (Stripe documents it as safe to retry).
        return RetryableAdapterError("Stripe rate limited the request", **details)
    body = getattr(exc, "json_body", None)
    problem = body.get("error") if isinstance(body, dict) else None
    code = problem.get("code") if isinstance(problem, dict) else None
    if (
        isinstance(exc, stripe.IdempotencyError)
        and status != 409
        and code != "idempotency_key_in_use"
    ):
        # 400 idempotency_error: the key was already used with OTHER parameters.
        # Every resend under it gets the same answer, so retrying only burns the
        # budget (issue 19, item 5); and the key proves something was sent under it
        # (after an attempt in doubt, this effect's own earlier one). Not final
        # either: an operator looks (the engine's manual review, with this reason).
        return KeyReusedError(
            "Stripe answered idempotency_error: this effect's key was already used "
            "with different parameters; this request was not applied, and only an "
            "operator can tell what the key holds",
            reason="idempotency_error",
            **details,
        )
    if isinstance(exc, stripe.IdempotencyError) or status == 409:
        # Same key, and Stripe did not apply this request: another request holds the
        # key right now (409 idempotency_key_in_use, which the SDK raises as a plain
        # APIError). The key may hold a committed intent, so this is never a final
        # failure: retry later with the same key (issue 9, defect 3) and let the
        # engine settle what the key holds.
        return RetryableAdapterError(
            "Stripe is holding this idempotency key for another request; retry later",
            reason="key_in_use",
            **details,
        )
    if isinstance(
        exc,
        stripe.CardError
        | stripe.InvalidRequestError
        | stripe.AuthenticationError
        | stripe.PermissionError,
    ):
        return TerminalAdapterError("Stripe refused the request", **details)
    # APIError (5xx) and anything unknown: Stripe may have committed before failing.
    return OutcomeUnknownError("Stripe failed; the outcome is unknown", **details)


class StripeAdapter(EffectAdapter):
    """PaymentIntent create with ``idempotency_key = downstream_key``; no SDK retries."""

    name = "stripe"

    def __init__(self, contract: EffectContract) -> None:
        super().__init__(contract)
        stripe = _import_stripe()
        api_key = os.environ.get("STRIPE_TEST_KEY", "")
        if not api_key.startswith("sk_test_"):
            raise ConfigurationError(
                "STRIPE_TEST_KEY must be set to a test-mode key (sk_test_...)",
                setting="STRIPE_TEST_KEY",
            )
        options = contract.adapter_options
        try:
            timeout = parse_duration(options.get("timeout", "30s")).total_seconds()
            connect = parse_duration(options.get("connect_timeout", "5s")).total_seconds()
        except ValueError as exc:
            raise ConfigurationError(f"stripe adapter timeout: {exc}") from exc
        import requests

        # Our own session: trust_env=False so an environment proxy cannot answer for
        # Stripe (a proxy's 502 for what was a refused connection).
        self._session = requests.Session()
        self._session.trust_env = False
        self._http = stripe.RequestsClient(
            timeout=(connect, timeout), session=self._session
        )
        api_base = options.get("api_base")  # e.g. stripe-mock; default api.stripe.com
        # max_network_retries=0 per client: the SDK retries on its own otherwise,
        # which is exactly the hidden retry layer the spec forbids.
        self._client = stripe.StripeClient(
            api_key,
            max_network_retries=0,
            http_client=self._http,
            base_addresses={"api": str(api_base)} if api_base else None,
        )

    def close(self) -> None:
        """Close the HTTP session."""
        self._session.close()

    def _send(self, request: DispatchRequest) -> DispatchResult:
        """Create the PaymentIntent once under the downstream key."""
        stripe = _import_stripe()
        params = dict(request.arguments)
        if "amount_minor" in params and "amount" not in params:
            params["amount"] = params.pop("amount_minor")
        given = params.get("metadata")
        metadata: dict[str, object] = dict(given) if isinstance(given, Mapping) else {}
        # Lets the probe find the intent by the same key (search by metadata).
        metadata[_METADATA_KEY] = request.downstream_key
        params["metadata"] = metadata
        try:
            intent = self._client.v1.payment_intents.create(
                params=params, options={"idempotency_key": request.downstream_key}
            )
        except stripe.StripeError as exc:
            raise classify_stripe_error(exc) from exc
        return DispatchResult(
            external_id=intent.id,
            output={"id": intent.id, "status": intent.status, "amount": intent.amount},
        )

    def _lookup(self, request: ProbeRequest) -> ProbeResult:
        """Search by metadata; found -> COMMITTED, absent -> UNKNOWN (cannot prove)."""
        query = f"metadata['{_METADATA_KEY}']:'{request.downstream_key}'"
        found = self._client.v1.payment_intents.search(
            params={"query": query, "limit": 1}
        )
        if not found.data:
            # Stripe documents search as eventually consistent with no upper bound
            # ("up to an hour behind during outages"): absence proves nothing.
            return ProbeResult(
                status=ProbeStatus.UNKNOWN, evidence={"reason": "search_has_no_bound"}
            )
        intent = found.data[0]
        return ProbeResult(
            status=ProbeStatus.COMMITTED,
            external_id=intent.id,
            output={"id": intent.id, "status": intent.status, "amount": intent.amount},
            evidence={"source": "payment_intents.search"},
        )


__all__ = ["StripeAdapter", "classify_stripe_error"]
