"""Generic HTTP adapter: one request per dispatch, classified by what it proves.

Spec "Key interfaces and contracts": the adapter owns target truth and never retries.
The client therefore has no hidden retry layer (``retries=0``, no redirects, no
environment proxies), and every failure is sorted by the one question that matters
(spec "State machine", rules 2-3): could the target have committed?

Classification (each row is tested with real sockets in tests/contract):

* The send gate refuses (checked again on entry to the transport, as the headers are
  composed, and immediately before the one write that sends headers and body
  together), or the attempt's time limit is already spent -> ``SendRefusedError``
  (a ``RetryableAdapterError``): nothing was sent.
* ``ConnectError``, ``ConnectTimeout``, ``PoolTimeout`` -> ``RetryableAdapterError``:
  raised while opening the connection, so no byte of the request left this process.
* The attempt's total time limit (``request.gate.remaining()``) spent while writing
  or waiting for the answer -> ``OutcomeUnknownError(reason="attempt_time_limit")``:
  every timeout is capped by it and a watchdog ends a trickling answer
  (http_attempt.py).
* ``WriteError``, ``WriteTimeout`` -> ``OutcomeUnknownError``: part of the request
  may have reached the target.
* ``ReadTimeout``, ``ReadError``, ``RemoteProtocolError`` (reset or close after the
  send) -> ``OutcomeUnknownError``.
* 2xx with a JSON object -> ``DispatchResult``; 2xx with anything else ->
  ``OutcomeUnknownError`` (committed, but we cannot read what).
* ``retryable_statuses`` (default only 429: the one answer that proves non-commit;
  anything else, e.g. a target's own 503, must be declared by the contract) ->
  ``RetryableAdapterError``.
* ``in_progress_statuses`` (default 409, 423 when an ``idempotency_header`` is set,
  else none; "a request with this key is in progress") ->
  ``RetryableAdapterError(reason="key_in_use")``: this request was not applied, the
  earlier one may still commit, retry later with the same key.
* ``terminal_statuses`` (default every other 4xx) -> ``TerminalAdapterError``.
* 5xx unless declared retryable (a proxy's 503 can follow a backend commit), 3xx
  (redirects are never followed) and anything else -> ``OutcomeUnknownError``.
* A URL template field that is missing, or a URL httpx refuses -> ``TerminalAdapterError``
  (nothing was sent, and no retry can fix the configuration).

Options (``[contract.adapter_options]``)::

    url = "http://127.0.0.1:8081/idempotent/charges"  # may use {effect_id},
              # {operation_key_digest}, {downstream_key} and top-level argument names
    method = "POST"
    idempotency_header = "Idempotency-Key"   # idempotent targets
    correlation_header = "X-Correlation-Key" # reconcilable targets
    probe_url = "http://127.0.0.1:8081/reconcilable/charges?correlation_key={downstream_key}"
    external_id_field = "id"                 # dotted path into the JSON response
    status_field = "status"                  # optional dotted path
    failed_status_values = ["failed"]        # status values meaning a committed failure
    timeout = "10s"                          # read/write
    connect_timeout = "2s"
    retryable_statuses = [429]               # add e.g. 503 only if the target
                                             # documents it as "not committed"
    in_progress_statuses = [409, 423]        # default with an idempotency_header
    terminal_statuses = [400, 402, 404, 422]   # default: every other 4xx; a
              # status also listed as retryable or in progress is not terminal
    keep_alive = false                       # a reused connection has the capped
              # timeouts but no watchdog on the attempt's time limit (http_attempt.py)
    fencing_header = "X-Fencing-Token"      # optional: send the claim version (and
              # the attempt id in X-Attempt-Id); a 4xx {"error": "stale_fencing_token"}
              # is TerminalAdapterError(reason="stale_fencing_token")
"""

from __future__ import annotations

import logging
import string
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx

from effect_broker.adapters.base import (
    DispatchRequest,
    DispatchResult,
    EffectAdapter,
    ProbeRequest,
    ProbeResult,
)
from effect_broker.adapters.http_attempt import (
    EXTENSION,
    AttemptGuard,
    AttemptTimeLimitError,
    GatedTransport,
    WireTransport,
)
from effect_broker.domain.canonical import canonical_json, parse_json_strict
from effect_broker.domain.contracts import EffectContract, parse_duration
from effect_broker.domain.errors import (
    ConfigurationError,
    InvalidJsonError,
    OutcomeUnknownError,
    RetryableAdapterError,
    SendRefusedError,
    TerminalAdapterError,
)
from effect_broker.domain.keys import operation_key_digest
from effect_broker.domain.states import ProbeStatus, SafetyClass

logger = logging.getLogger(__name__)

_OPTIONS = frozenset(
    {
        "url",
        "method",
        "idempotency_header",
        "correlation_header",
        "probe_url",
        "external_id_field",
        "status_field",
        "failed_status_values",
        "timeout",
        "connect_timeout",
        "retryable_statuses",
        "in_progress_statuses",
        "terminal_statuses",
        "keep_alive",
        "fencing_header",
    }
)
#: The error a fencing target answers to a stale token (examples/crash_matrix).
STALE_FENCING_ERROR = "stale_fencing_token"
#: Sent with the fencing token, for tracing an attempt at the target.
ATTEMPT_ID_HEADER = "X-Attempt-Id"


def _template_fields(template: str, option: str) -> frozenset[str]:
    """Names a URL template uses; only bare names (no ``a.b``/``a[0]``, no spec)."""
    names = set()
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigurationError(f"adapter_options.{option}: {exc}") from exc
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        # Attribute and index access would let a template reach into nested
        # arguments or Python objects; the URL may only name plain values.
        if not name.isidentifier() or spec or conversion:
            raise ConfigurationError(
                f"adapter_options.{option}: field {{{name}}} must be a bare name"
            )
        names.add(name)
    return frozenset(names)


def _json_path(document: Mapping[str, Any], path: str) -> object:
    value: object = document
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _external_id(document: Mapping[str, Any], path: str) -> str | None:
    value = _json_path(document, path)
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return str(value)


class HttpAdapter(EffectAdapter):
    """POST canonical JSON once with the downstream key; probe by GET."""

    name = "http"

    def __init__(
        self, contract: EffectContract, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        super().__init__(contract)
        options = dict(contract.adapter_options)
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise ConfigurationError(
                f"unknown http adapter options {unknown}", contract=contract.name
            )
        self.url = self._text(options, "url", required=True)
        self.method = self._text(options, "method", default="POST").upper()
        self.idempotency_header = self._text(options, "idempotency_header")
        self.correlation_header = self._text(options, "correlation_header")
        self.fencing_header = self._text(options, "fencing_header")
        if self.fencing_header and not (
            self.idempotency_header or self.correlation_header
        ):
            raise ConfigurationError(
                "adapter_options.fencing_header: the target fences per key, so it "
                "needs an idempotency_header or a correlation_header",
                contract=contract.name,
            )
        self.probe_url = self._text(options, "probe_url")
        self.external_id_field = self._text(options, "external_id_field", default="id")
        self.status_field = self._text(options, "status_field")
        self.failed_status_values = frozenset(
            str(v) for v in self._list(options, "failed_status_values", [])
        )
        # Only an answer that proves non-commit may be retryable by default: 429 is
        # refused before processing, but a proxy's 503 can arrive after the backend
        # committed (issue 9, defect 4). Anything else must be declared per contract.
        self.retryable_statuses = frozenset(
            self._statuses(options, "retryable_statuses", [429])
        )
        # "Key in use / in progress" to a same-key resend: this request was not
        # applied and the earlier one may still commit, so retry later with the same
        # key - never a final failure (issue 9, defect 3). Only with a deduplicating
        # key: without one, a later resend would be a second charge.
        if "in_progress_statuses" in options and not self.idempotency_header:
            raise ConfigurationError(
                "adapter_options.in_progress_statuses needs an idempotency_header",
                contract=contract.name,
            )
        self.in_progress_statuses = frozenset(
            self._statuses(
                options,
                "in_progress_statuses",
                [409, 423] if self.idempotency_header else [],
            )
        )
        explicit_terminal = "terminal_statuses" in options
        self.terminal_statuses = frozenset(
            self._statuses(options, "terminal_statuses", [])
            if explicit_terminal
            else (
                s
                for s in range(400, 500)
                if s not in self.retryable_statuses | self.in_progress_statuses
            )
        )
        self._url_fields = _template_fields(self.url, "url")
        self._probe_fields = (
            _template_fields(self.probe_url, "probe_url") if self.probe_url else None
        )
        self._check_safety_class()
        try:
            timeout = parse_duration(options.get("timeout", "10s")).total_seconds()
            connect = parse_duration(options.get("connect_timeout", "2s")).total_seconds()
        except ValueError as exc:
            raise ConfigurationError(f"http adapter timeout: {exc}") from exc
        keep_alive = options.get("keep_alive", False)
        if not isinstance(keep_alive, bool):
            raise ConfigurationError("adapter_options.keep_alive must be true or false")
        # No keep-alive by default: a pooled connection the server already closed
        # turns a request it never read into an ambiguous failure (the stale
        # keep-alive race), which for an unsafe target means manual review.
        limits = httpx.Limits(max_keepalive_connections=10 if keep_alive else 0)
        self._timeout = httpx.Timeout(timeout, connect=connect, pool=connect)
        self._client = httpx.Client(
            # retries=0: httpx's only retry is on connect, but "no hidden retry
            # layers" (spec MVP scope) is a rule, not a default we rely on. The gate
            # wraps whatever transport is used, so the check at the wire is never
            # skipped; the default one writes headers and body in one write, checked
            # immediately before it (http_attempt.py).
            transport=GatedTransport(transport or WireTransport(limits=limits)),
            timeout=self._timeout,
            follow_redirects=False,
            # An environment proxy would answer for the target (a 502 for what was a
            # refused connection) and silently change every classification below.
            trust_env=False,
            headers={"User-Agent": "effect-broker", "Accept": "application/json"},
        )

    def _text(
        self,
        options: Mapping[str, object],
        key: str,
        *,
        required: bool = False,
        default: str | None = None,
    ) -> Any:
        value = options.get(key, default)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value:
            raise ConfigurationError(
                f"adapter_options.{key} must be a non-empty string",
                contract=self.contract.name,
            )
        return value

    def _list(self, options: Mapping[str, object], key: str, default: list[Any]) -> Any:
        value = options.get(key, default)
        if not isinstance(value, list | tuple):
            raise ConfigurationError(f"adapter_options.{key} must be a list")
        return list(value)

    def _statuses(
        self, options: Mapping[str, object], key: str, default: list[int]
    ) -> list[int]:
        values = self._list(options, key, default)
        for value in values:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigurationError(f"adapter_options.{key} must list integers")
            if not 400 <= value <= 599:
                # 2xx is success and 3xx is never followed: neither can be declared.
                raise ConfigurationError(f"adapter_options.{key}: {value} is not 4xx/5xx")
        return values

    def _check_safety_class(self) -> None:
        # A contract must not claim a guarantee this configuration cannot deliver
        # (guarantee vocabulary): refuse it at load time, not at the first incident.
        safety = self.contract.safety
        if safety is SafetyClass.TRANSACTIONAL:
            raise ConfigurationError(
                "an HTTP target cannot share the broker's transaction",
                contract=self.contract.name,
            )
        if safety is SafetyClass.IDEMPOTENT and not self.idempotency_header:
            raise ConfigurationError(
                "safety idempotent needs adapter_options.idempotency_header",
                contract=self.contract.name,
            )
        if safety is SafetyClass.RECONCILABLE and not (
            self.probe_url and (self.correlation_header or self.idempotency_header)
        ):
            raise ConfigurationError(
                "safety reconcilable needs probe_url and a correlation_header",
                contract=self.contract.name,
            )

    def close(self) -> None:
        """Close the HTTP client and its connections."""
        self._client.close()

    def __enter__(self) -> HttpAdapter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _render(
        self,
        template: str,
        fields: frozenset[str],
        request: DispatchRequest | ProbeRequest,
    ) -> str:
        effect = request.effect
        values: dict[str, str] = {}
        for name in fields:
            if name == "effect_id":
                value: object = effect.effect_id
            elif name == "operation_key_digest":
                value = operation_key_digest(effect.tenant_id, effect.operation_key)
            elif name == "downstream_key":
                value = request.downstream_key
            elif name in request.arguments:
                value = request.arguments[name]
            else:
                value = None
            if isinstance(value, bool) or not isinstance(value, str | int):
                # Raised before any byte is sent, and no retry can fix the template.
                raise TerminalAdapterError(
                    f"URL field {{{name}}} is missing or not a string/integer",
                    adapter=self.name,
                    reason="bad_url_field",
                )
            values[name] = quote(str(value), safe="")
        return template.format_map(values)

    def _send(self, request: DispatchRequest) -> DispatchResult:
        """One request; classify the outcome by what it proves (module table)."""
        url = self._render(self.url, self._url_fields, request)
        headers = {"Content-Type": "application/json"}
        if self.idempotency_header:
            headers[self.idempotency_header] = request.downstream_key
        if self.correlation_header:
            headers[self.correlation_header] = request.downstream_key
        if self.fencing_header:
            # The claim version grows with every claim of the effect: a target that
            # remembers the highest per key refuses a worker from an older claim.
            headers[self.fencing_header] = str(request.fencing_token)
            headers[ATTEMPT_ID_HEADER] = request.attempt_id
        body = canonical_json(dict(request.arguments))
        effect = request.effect
        guard = AttemptGuard(
            request.gate, subject=f"{effect.tenant_id}/{effect.operation_key}"
        )
        if guard.spent():
            raise SendRefusedError(
                "the attempt's time limit was spent before anything was sent",
                adapter=self.name,
            )
        outgoing = self._client.build_request(
            self.method,
            url,
            content=body,
            headers=headers,
            timeout=guard.cap(self._timeout),
            extensions={EXTENSION: guard},
        )
        try:
            response = self._client.send(outgoing, stream=True)
            try:
                content = guard.read(response)
            finally:
                response.close()
        except AttemptTimeLimitError as exc:
            self._log(request, "time_limit", None)
            raise self._time_limit() from exc
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            # Raised while opening the connection (httpcore maps the socket's
            # OSError/timeout in connect_tcp to these): the request was never written.
            self._log(request, "connect_failed", None)
            raise RetryableAdapterError(
                f"{type(exc).__name__}: the connection was never established",
                adapter=self.name,
                reason="connect_failed",
            ) from exc
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise TerminalAdapterError(
                "the configured URL cannot be requested",
                adapter=self.name,
                reason="bad_url",
            ) from exc
        except httpx.HTTPError as exc:
            # WriteError/WriteTimeout, ReadError/ReadTimeout, RemoteProtocolError:
            # bytes may have reached the target (spec rule 3).
            # The watchdog ended it, or a timeout capped by the limit did: the
            # limit, not the target.
            if guard.expired or guard.spent():
                self._log(request, "time_limit", None)
                raise self._time_limit() from exc
            self._log(request, "no_answer", None)
            raise OutcomeUnknownError(
                f"{type(exc).__name__} after the request began; the outcome is unknown",
                adapter=self.name,
                reason=type(exc).__name__,
            ) from exc
        finally:
            guard.finish()
        return self._classify(request, response, content)

    def _time_limit(self) -> OutcomeUnknownError:
        # The request may have been written (or half written): never retryable.
        return OutcomeUnknownError(
            "the attempt's time limit was spent before the answer arrived; the outcome "
            "is unknown",
            adapter=self.name,
            reason="attempt_time_limit",
        )

    def _classify(
        self, request: DispatchRequest, response: httpx.Response, content: bytes
    ) -> DispatchResult:
        status = response.status_code
        self._log(request, "answered", status)
        if 200 <= status <= 299:
            document = self._json_object(content)
            if document is None:
                raise OutcomeUnknownError(
                    f"HTTP {status} without a JSON object; cannot read the outcome",
                    adapter=self.name,
                    http_status=status,
                )
            external_id = _external_id(document, self.external_id_field)
            if self.status_field:
                value = _json_path(document, self.status_field)
                if value is None:
                    raise OutcomeUnknownError(
                        f"HTTP {status} without the status field",
                        adapter=self.name,
                        http_status=status,
                    )
                if str(value) in self.failed_status_values:
                    raise TerminalAdapterError(
                        "the target recorded the effect as failed",
                        adapter=self.name,
                        http_status=status,
                        external_id=external_id,
                    )
            return DispatchResult(external_id=external_id, output=document)
        if self._stale_fencing(status, content):
            # A newer claim of this effect reached the target first; this worker's
            # attempt is over (the engine fences its ledger write as well).
            raise TerminalAdapterError(
                f"HTTP {status}: the target saw a newer claim of this effect",
                adapter=self.name,
                http_status=status,
                reason=STALE_FENCING_ERROR,
            )
        if status in self.retryable_statuses:
            raise RetryableAdapterError(
                f"HTTP {status}: the target documents this as not committed",
                adapter=self.name,
                http_status=status,
            )
        if status in self.in_progress_statuses:
            raise RetryableAdapterError(
                f"HTTP {status}: a request with this key is in progress; this one "
                "was not applied, retry later with the same key",
                adapter=self.name,
                http_status=status,
                reason="key_in_use",
            )
        if status in self.terminal_statuses:
            raise TerminalAdapterError(
                f"HTTP {status}: the target refused the request",
                adapter=self.name,
                http_status=status,
            )
        # 5xx may fail after the commit; 3xx and others are not an answer we read.
        raise OutcomeUnknownError(
            f"HTTP {status}: the outcome is unknown",
            adapter=self.name,
            http_status=status,
        )

    @property
    def sends_fencing_token(self) -> bool:
        """True when the contract names a ``fencing_header``."""
        return bool(self.fencing_header)

    def _stale_fencing(self, status: int, content: bytes) -> bool:
        if not self.fencing_header or not 400 <= status <= 499:
            return False
        document = self._json_object(content)
        return document is not None and document.get("error") == STALE_FENCING_ERROR

    @staticmethod
    def _json_object(content: bytes) -> Mapping[str, Any] | None:
        try:
            document = parse_json_strict(content)
        except InvalidJsonError:
            return None
        return document if isinstance(document, dict) else None

    def _lookup(self, request: ProbeRequest) -> ProbeResult:
        """GET probe_url: 200 object -> COMMITTED, 404 -> NOT_COMMITTED, else UNKNOWN."""
        if not self.probe_url or self._probe_fields is None:
            return ProbeResult(
                status=ProbeStatus.UNKNOWN, evidence={"reason": "no lookup"}
            )
        url = self._render(self.probe_url, self._probe_fields, request)
        checked_at = datetime.now(UTC)
        response = self._client.get(url)  # transport errors -> UNKNOWN (base class)
        evidence: dict[str, object] = {
            "checked_at": checked_at.isoformat(),
            "http_status": response.status_code,
        }
        if response.status_code == 404:
            # Absence as of checked_at; the broker decides whether it is conclusive
            # by comparing with the settlement deadline (spec rule 5). A wrong
            # probe_url would also 404, which is why the conformance suite demands a
            # COMMITTED probe for a settled commit before this adapter is trusted.
            return ProbeResult(status=ProbeStatus.NOT_COMMITTED, evidence=evidence)
        document = (
            self._json_object(response.content) if response.status_code == 200 else None
        )
        if document is None:
            return ProbeResult(status=ProbeStatus.UNKNOWN, evidence=evidence)
        return ProbeResult(
            status=ProbeStatus.COMMITTED,
            external_id=_external_id(document, self.external_id_field),
            output=document,
            evidence=evidence,
        )

    def _log(self, request: DispatchRequest, outcome: str, status: int | None) -> None:
        # Never the URL, body or key: the URL may carry argument values (STYLE rule 8).
        logger.info(
            "http dispatch %s",
            outcome,
            extra={
                "action": "http_dispatch",
                "effect_id": request.effect.effect_id,
                "attempt_id": request.attempt_id,
                "outcome": outcome,
                "http_status": status,
            },
        )


__all__ = ["HttpAdapter"]
