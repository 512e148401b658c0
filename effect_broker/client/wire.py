"""The HTTP API as the two HTTP clients speak it: paths, bodies, and answers turned
into models or typed errors. Written once so the sync and async clients cannot drift.

Paths and JSON are the broker's own (``effect_broker/api/effects.py``); an error is
``application/problem+json`` with a stable ``code`` (``effect_broker/api/problems.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx

from effect_broker import __version__
from effect_broker.client.errors import (
    BrokerError,
    BrokerUnavailable,
    from_domain,
    from_problem,
)
from effect_broker.client.models import BatchItem, BatchResult
from effect_broker.domain.canonical import canonical_json
from effect_broker.domain.errors import EffectBrokerError, InvalidRequestError
from effect_broker.domain.keys import validate_operation_key
from effect_broker.domain.waits import MAX_WAIT_SECONDS, Until

EFFECTS = "/v1/effects"
EFFECTS_BATCH = "/v1/effects/batch"
#: ``/v1/effects/{id}/wait``: the long-poll (``effect_broker/api/effect_wait.py``).
WAIT = "wait"
USER_AGENT = f"effect-broker-python/{__version__}"


def headers(api_key: str) -> dict[str, str]:
    """Request headers: the tenant's key, and what answers the SDK reads."""
    return {
        "Authorization": f"Bearer {api_key}",
        "Accept": "application/json, application/problem+json",
        "User-Agent": USER_AGENT,
    }


IDEMPOTENCY_KEY = "Idempotency-Key"


def idempotency_key_header(operation_key: str) -> dict[str, str]:
    """The operation key as the draft's ``Idempotency-Key`` header (an RFC 9651
    String), sent with the same key in the body: a broker that reads the header
    answers drift with the draft's 422, an older one reads the body. A key outside
    printable ASCII cannot be a String and travels in the body only."""
    if not all(" " <= char <= "~" for char in operation_key):
        return {}
    quoted = operation_key.replace("\\", "\\\\").replace('"', '\\"')
    return {IDEMPOTENCY_KEY: f'"{quoted}"'}


def effect_path(effect_id: str, *rest: str) -> str:
    """``/v1/effects/{id}[/rest]``, the id escaped so it cannot name another path."""
    return "/".join((EFFECTS, quote(str(effect_id), safe=""), *rest))


def wait_params(seconds: float, until: Until) -> dict[str, str]:
    """The long-poll's query: wait ``seconds`` (capped at the broker's
    ``MAX_WAIT_SECONDS``, never below 0) for a state ``until`` stops at."""
    bounded = min(max(seconds, 0.0), MAX_WAIT_SECONDS)
    return {"timeout": f"{bounded:.3f}", "until": until.value}


def long_poll_timeout(client: httpx.Timeout, seconds: float) -> httpx.Timeout:
    """The client's timeouts with room for the broker to wait ``seconds`` before it
    answers: a read may take that long on top of the usual bound."""
    read = None if client.read is None else client.read + min(seconds, MAX_WAIT_SECONDS)
    return httpx.Timeout(
        connect=client.connect, read=read, write=client.write, pool=client.pool
    )


def _submit_fields(
    operation_key: str,
    tool: str,
    arguments: Mapping[str, Any],
    *,
    trace_id: str | None,
    requested_by: str,
) -> dict[str, Any]:
    validate_operation_key(operation_key)
    if not isinstance(arguments, Mapping):
        # The service's own refusal, so both clients raise the same InvalidRequest.
        raise InvalidRequestError("arguments must be a JSON object")
    return {
        "operation_key": operation_key,
        "tool": tool,
        "arguments": dict(arguments),
        "trace_id": trace_id,
        "requested_by": requested_by,
    }


def batch_body(items: Sequence[BatchItem]) -> bytes:
    """The canonical JSON body of a batch submit, every item checked locally as
    ``submit_body`` checks one (the error names the item by index, as the broker's)."""
    fields = []
    for index, item in enumerate(items):
        try:
            fields.append(
                _submit_fields(
                    item.operation_key,
                    item.tool,
                    item.arguments,
                    trace_id=item.trace_id,
                    requested_by=item.requested_by,
                )
            )
        except EffectBrokerError as exc:
            exc.details.setdefault("item", index)
            raise from_domain(exc) from exc
    try:
        return canonical_json({"items": fields})
    except EffectBrokerError as exc:
        raise from_domain(exc) from exc


def batch_results(body: Mapping[str, Any]) -> list[BatchResult]:
    """The results of a batch answer, in the order the items were sent."""
    return [BatchResult.from_wire(item) for item in body.get("items") or ()]


def submit_body(
    operation_key: str,
    tool: str,
    arguments: Mapping[str, Any],
    *,
    trace_id: str | None,
    requested_by: str,
) -> bytes:
    """The canonical JSON body of a submit, checked locally first.

    The same bytes go out on every resend, and what the broker would refuse anyway (a
    blank or padded key, NaN, an integer beyond 2**53) is refused here, before any
    request, with the broker's own error and code.
    """
    try:
        return canonical_json(
            _submit_fields(
                operation_key,
                tool,
                arguments,
                trace_id=trace_id,
                requested_by=requested_by,
            )
        )
    except EffectBrokerError as exc:
        raise from_domain(exc) from exc


def answer(response: httpx.Response) -> Any:
    """The JSON of a 2xx answer; the typed error of any other."""
    if response.is_success:
        return response.json()
    raise error_of(response)


def error_of(response: httpx.Response) -> BrokerError:
    """The typed error for a non-2xx answer (a problem's own code when it has one)."""
    status = response.status_code
    body: object = None
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        return from_problem(status, body)
    # No problem document: a proxy, a load balancer or a crashed worker answered.
    if status >= 500:
        return BrokerUnavailable(
            f"HTTP {status} from {response.request.url} (not the broker's answer)",
            status=status,
        )
    return BrokerError(
        f"HTTP {status} from {response.request.url}", code=f"http_{status}", status=status
    )


def transport_error(request: str, exc: httpx.TransportError) -> BrokerUnavailable:
    """``BrokerUnavailable`` for a request no answer came back to."""
    return BrokerUnavailable(f"{request}: {type(exc).__name__}: {exc}")
