"""OpenTelemetry spans for submit, dispatch and reconcile, carried through the ledger.

Spec "Required observability": every effect carries trace context, but spans hold only
the operation-key digest, the tool, the contract version, the status and the receipt
id. So every attribute set here is one of ``ATTRIBUTES``; nothing else - no argument,
output, tenant, key or error message (a refusal's message names the operation key) -
is put on a span, and exceptions are not recorded on spans (their text would be).

How the context travels:

* the API's ``trace_context_middleware`` reads the caller's W3C ``traceparent``
  header (if any), so the submit span is the caller's child;
* submit stores its own span's ``traceparent`` on the effect (``trace_context``
  column), in the reservation statement itself: no extra write;
* a worker's dispatch and reconcile spans start as children of that stored context, in
  whatever process and however much later they run.

OpenTelemetry's API is always importable here (the ``mcp`` SDK depends on it), but
without the ``otel`` extra (its SDK) and a configured exporter every span is a no-op
and costs next to nothing. If even the API is missing, this module does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from effect_broker.domain.keys import operation_key_digest
from effect_broker.domain.records import EffectRecord

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import (
        TraceContextTextMapPropagator,
    )
except ImportError:  # pragma: no cover - opentelemetry-api comes with mcp
    trace = None  # type: ignore[assignment]

TRACER_NAME = "effect_broker"
DIGEST = "effect_broker.operation_key_digest"
TOOL = "effect_broker.tool"
CONTRACT_VERSION = "effect_broker.contract_version"
STATUS = "effect_broker.status"
RECEIPT_ID = "effect_broker.receipt_id"
# The OpenTelemetry GenAI conventions' ``execute_tool`` span (issue 21), which the
# dispatch span follows so a GenAI-aware backend shows it as the tool's execution:
# the tool's name, the call's id (the effect id: opaque, and the one id a caller,
# an operator and the ledger share), and on failure ``error.type``, the stable error
# code. Never the convention's opt-in arguments or result.
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
ERROR_TYPE = "error.type"
EXECUTE_TOOL = "execute_tool"
#: The only attributes a broker span ever carries (spec "Required observability").
ATTRIBUTES = frozenset(
    {
        DIGEST,
        TOOL,
        CONTRACT_VERSION,
        STATUS,
        RECEIPT_ID,
        GEN_AI_OPERATION,
        GEN_AI_TOOL_NAME,
        GEN_AI_TOOL_CALL_ID,
        GEN_AI_TOOL_TYPE,
        ERROR_TYPE,
    }
)

_propagator = TraceContextTextMapPropagator() if trace is not None else None
_provider: Any = None


def use_tracer_provider(provider: Any) -> None:
    """Send the broker's spans to ``provider`` (a test switch; None: the global one).

    OpenTelemetry lets the global provider be set once per process, so a test that
    needs its own exporter sets it here instead.
    """
    global _provider
    _provider = provider


def _tracer() -> Any:
    provider = _provider if _provider is not None else trace.get_tracer_provider()
    return provider.get_tracer(TRACER_NAME)


class EffectSpan:
    """The span of one submit, dispatch or reconcile; only ``ATTRIBUTES`` are set."""

    def __init__(self, span: Any) -> None:
        self._span = span

    def ended(self, record: EffectRecord) -> EffectRecord:
        """Describe the effect as this work left it; return it (for ``return``)."""
        if self._span is not None:
            self._span.set_attribute(TOOL, record.tool)
            self._span.set_attribute(CONTRACT_VERSION, record.contract_version)
            self._span.set_attribute(STATUS, record.status.value)
            if record.receipt_id:
                self._span.set_attribute(RECEIPT_ID, record.receipt_id)
        return record

    def refused(self, code: str) -> None:
        """Mark the span failed with a stable error code (never the message)."""
        if self._span is not None:
            self._span.set_status(Status(StatusCode.ERROR, code))


def attempt_failed(code: str) -> None:
    """Mark the current span (a dispatch's ``execute_tool``) failed with the stable
    code of how its attempt ended: ``error.type`` and an error status, no message."""
    if trace is None:
        return
    current = trace.get_current_span()
    if current.is_recording():
        current.set_attribute(ERROR_TYPE, code)
        current.set_status(Status(StatusCode.ERROR, code))


@contextmanager
def span(
    name: str,
    *,
    tenant_id: str,
    operation_key: str,
    parent: str | None = None,
    attributes: dict[str, str] | None = None,
) -> Iterator[EffectSpan]:
    """A current span named ``name`` for one operation; ``parent``: a traceparent;
    ``attributes``: set at the start (names from ``ATTRIBUTES`` only)."""
    if trace is None:
        yield EffectSpan(None)
        return
    context = (
        _propagator.extract({"traceparent": parent}) if parent and _propagator else None
    )
    with _tracer().start_as_current_span(
        name,
        context=context,
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        # An exception's text may hold the operation key or a target's answer.
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        if not current.is_recording():  # no exporter: skip the digest and setters
            yield EffectSpan(None)
            return
        current.set_attribute(DIGEST, operation_key_digest(tenant_id, operation_key))
        yield EffectSpan(current)


@contextmanager
def effect_span(
    name: str, record: EffectRecord, attributes: dict[str, str] | None = None
) -> Iterator[EffectSpan]:
    """A worker's span for ``record``: a child of the context stored at submit."""
    with span(
        name,
        tenant_id=record.tenant_id,
        operation_key=record.operation_key,
        parent=record.trace_context,
        attributes=attributes,
    ) as current:
        yield current


@contextmanager
def execute_tool_span(record: EffectRecord) -> Iterator[EffectSpan]:
    """The dispatch of ``record`` as the GenAI ``execute_tool`` span (its name is
    ``execute_tool {tool}``), a child of the context stored at submit."""
    with effect_span(
        f"{EXECUTE_TOOL} {record.tool}",
        record,
        {
            GEN_AI_OPERATION: EXECUTE_TOOL,
            GEN_AI_TOOL_NAME: record.tool,
            GEN_AI_TOOL_CALL_ID: record.effect_id,
            # The convention's "extension": a tool run on the agent's side that
            # calls an external API (the target), not a model-side function.
            GEN_AI_TOOL_TYPE: "extension",
        },
    ) as current:
        yield current


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, or None when there is none."""
    if _propagator is None:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def trace_context_middleware(
    get_response: Callable[[HttpRequest], Any],
) -> Callable[[HttpRequest], Any]:
    """Django middleware: make the caller's ``traceparent`` header the current context,
    so the submit span continues the caller's trace. No header: nothing happens."""

    def extracted(request: HttpRequest) -> Any:
        header = request.headers.get("traceparent")
        if not header or _propagator is None:
            return None
        return otel_context.attach(_propagator.extract({"traceparent": header}))

    if iscoroutinefunction(get_response):

        async def async_middleware(request: HttpRequest) -> HttpResponse:
            token = extracted(request)
            try:
                return await get_response(request)
            finally:
                if token is not None:
                    otel_context.detach(token)

        return markcoroutinefunction(async_middleware)

    def middleware(request: HttpRequest) -> HttpResponse:
        token = extracted(request)
        try:
            return get_response(request)
        finally:
            if token is not None:
                otel_context.detach(token)

    return middleware


trace_context_middleware.sync_capable = True  # type: ignore[attr-defined]
trace_context_middleware.async_capable = True  # type: ignore[attr-defined]


def configure_from_environment(service_name: str) -> bool:
    """Export spans over OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the traces
    endpoint) is set and the ``otel`` extra is installed; True when configured.

    A provider already installed (``opentelemetry-instrument``, the host app) is left
    alone. ``OTEL_SERVICE_NAME`` overrides ``service_name``.
    """
    if not (
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        return False
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        return False
    if trace is None or not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider
    ):
        return False
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True
