"""What the observability hooks cost per call, in CPU time (docs/observability.md).

    python -m examples.observability.instrumentation_cost

Measures, in this process and without a database, each piece the submit and dispatch
paths gained: the submit counters, a no-op span (the ``otel`` extra absent or no
exporter configured), a recording span (SDK installed, spans kept in memory), the HTTP
metrics middleware around one request, and the traceparent read for the ledger.
Figures are microseconds per call, the median of several rounds; compare them with
the API's few milliseconds of CPU per submit (docs/benchmarks.md).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django

django.setup()

from django.http import HttpResponse  # noqa: E402
from django.test import RequestFactory  # noqa: E402

from effect_broker.domain.records import EffectRecord  # noqa: E402
from effect_broker.domain.states import EffectStatus, SafetyClass  # noqa: E402
from effect_broker.observability import metrics, tracing  # noqa: E402
from effect_broker.observability.http_metrics import (  # noqa: E402
    http_metrics_middleware,
)

NOW = datetime.now(UTC)
RECORD = EffectRecord(
    effect_id="00000000-0000-0000-0000-000000000001",
    tenant_id="00000000-0000-0000-0000-000000000002",
    operation_key="order:42:charge",
    tool="charge_card",
    request_hash=b"h",
    downstream_key="k",
    contract_name="payments.charge",
    contract_version="1",
    safety=SafetyClass.IDEMPOTENT,
    status=EffectStatus.PREPARED,
    version=1,
    attempt_count=0,
    arguments_preview={},
    next_action_at=None,
    lease_owner=None,
    lease_expires_at=None,
    first_dispatch_at=None,
    retention_deadline=None,
    settlement_deadline=None,
    outcome_in_doubt=False,
    receipt_id=None,
    trace_id=None,
    requested_by="",
    created_at=NOW,
    updated_at=NOW,
)


def per_call_us(fn: Callable[[], object], calls: int = 20_000, rounds: int = 5) -> float:
    """Median over ``rounds`` of the CPU microseconds one call takes."""
    results = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(calls):
            fn()
        results.append((time.process_time() - started) / calls * 1e6)
    return statistics.median(results)


def submit_hooks() -> None:
    with tracing.span(
        "effect_broker.submit", tenant_id=RECORD.tenant_id, operation_key="order:42"
    ) as span:
        tracing.current_traceparent()
        span.ended(RECORD)
    metrics.submitted(RECORD, created=True, seconds=0.004)


def main() -> None:
    request = RequestFactory().post("/v1/effects", data=b"{}", content_type="x/y")
    respond = http_metrics_middleware(lambda r: HttpResponse(b"{}", status=202))
    rows = [
        (
            "submit counters + latency",
            lambda: metrics.submitted(RECORD, created=True, seconds=0.004),
        ),
        (
            "dispatch attempt counters",
            lambda: metrics.attempt_ended(RECORD, outcome="succeeded", seconds=0.01),
        ),
        ("HTTP metrics middleware, one request", lambda: respond(request)),
        ("submit hooks, no span exporter (no-op spans)", submit_hooks),
    ]
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )

    print(f"{'hook':<52} {'us/call':>8}")
    for name, fn in rows:
        print(f"{name:<52} {per_call_us(fn):>8.1f}")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)

    def recording() -> None:
        submit_hooks()
        exporter.clear()

    print(
        f"{'submit hooks, SDK recording spans (in memory)':<52} "
        f"{per_call_us(recording, calls=5_000):>8.1f}"
    )


if __name__ == "__main__":
    main()
