"""Spec "Required observability": every effect carries trace context, and spans hold
only the operation-key digest, tool, contract version, status and receipt id.

The caller's ``traceparent`` reaches the API, the submit span is its child, the
context is stored on the effect, and the worker's dispatch span is a child of the
submit span - read back from OpenTelemetry's in-memory exporter.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from django.test import Client
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode

from effect_broker.adapters.simulated_adapter import Fault
from effect_broker.domain.keys import operation_key_digest
from effect_broker.domain.states import SafetyClass
from effect_broker.models import EffectIntent
from effect_broker.observability import tracing
from effect_broker.services.dispatch import dispatch
from effect_broker.services.reconcile import reconcile
from effect_broker.services.tenants import create_tenant
from tests.integration.engine.harness import TOOLS, Bench, engine_bench
from tests.span_recording import recording_spans

pytestmark = pytest.mark.django_db(transaction=True)

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
SECRET_AMOUNT = 918273645
SECRET_NOTE = "card-holder Ada Lovelace"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with recording_spans() as exporter:
        yield exporter


@pytest.fixture
def bench() -> Iterator[Bench]:
    with engine_bench() as bench:
        yield bench


def post_effect(key: str, api_key: str, tool: str, **extra: object) -> dict:
    response = Client().post(
        "/v1/effects",
        data=json.dumps(
            {
                "operation_key": key,
                "tool": tool,
                "arguments": {
                    "amount_minor": SECRET_AMOUNT,
                    "note": SECRET_NOTE,
                    **extra,
                },
            }
        ),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api_key}",
        HTTP_TRACEPARENT=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
    )
    return {**response.json(), "http_status": response.status_code}


def by_name(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def assert_only_allowed(span: ReadableSpan, *forbidden: str) -> None:
    assert set(span.attributes or {}) <= tracing.ATTRIBUTES
    text = repr(
        (
            span.name,
            dict(span.attributes or {}),
            span.status.description,
            [(e.name, dict(e.attributes or {})) for e in span.events],
            [dict(link.attributes or {}) for link in span.links],
        )
    )
    for value in forbidden:
        assert value not in text


def test_the_worker_span_continues_the_callers_trace_through_the_ledger(bench, spans):
    # Given a caller with a trace, submitting over HTTP
    tenant, api_key = create_tenant(f"traced-{uuid.uuid4().hex[:6]}")
    key = f"order:{uuid.uuid4().hex[:8]}:charge"
    answer = post_effect(key, api_key, TOOLS[SafetyClass.IDEMPOTENT])
    assert answer["http_status"] == 202
    (submitted,) = by_name(spans, "effect_broker.submit")
    # Then the submit span is the caller's child, and its context is on the effect
    assert submitted.parent is not None
    assert format(submitted.parent.span_id, "016x") == CALLER_SPAN
    assert format(submitted.context.trace_id, "032x") == CALLER_TRACE
    stored = EffectIntent.objects.get(id=answer["effect_id"]).trace_context
    assert stored == (f"00-{CALLER_TRACE}-{format(submitted.context.span_id, '016x')}-01")
    # When a worker dispatches it (later, from the ledger alone)
    done = dispatch(answer["effect_id"], worker="w1")
    (dispatched,) = by_name(spans, f"execute_tool {TOOLS[SafetyClass.IDEMPOTENT]}")
    # Then its span is the submit span's child in the same trace
    assert dispatched.parent is not None
    assert dispatched.parent.span_id == submitted.context.span_id
    assert dispatched.context.trace_id == submitted.context.trace_id
    # ... and carries exactly the allowed attributes, with the effect's facts: the
    # GenAI execute_tool convention's (issue 21), then the broker's own
    assert dispatched.kind is SpanKind.INTERNAL
    assert dispatched.status.status_code is StatusCode.UNSET
    assert dict(dispatched.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": TOOLS[SafetyClass.IDEMPOTENT],
        "gen_ai.tool.call.id": answer["effect_id"],
        "gen_ai.tool.type": "extension",
        tracing.DIGEST: operation_key_digest(str(tenant.id), key),
        tracing.TOOL: TOOLS[SafetyClass.IDEMPOTENT],
        tracing.CONTRACT_VERSION: "1",
        tracing.STATUS: "succeeded",
        tracing.RECEIPT_ID: done.receipt_id,
    }
    for span in (submitted, dispatched):
        assert_only_allowed(
            span, key, str(SECRET_AMOUNT), SECRET_NOTE, str(tenant.id), api_key
        )


def test_a_refused_submit_span_says_its_code_and_not_its_message(bench, spans):
    tenant, api_key = create_tenant(f"traced-{uuid.uuid4().hex[:6]}")
    key = f"order:{uuid.uuid4().hex[:8]}:charge"
    assert post_effect(key, api_key, TOOLS[SafetyClass.UNSAFE])["http_status"] == 202
    # The same key with other arguments: 409, whose message names the key
    drift = post_effect(key, api_key, TOOLS[SafetyClass.UNSAFE], extra="other")
    assert drift["http_status"] == 409
    refused = by_name(spans, "effect_broker.submit")[-1]
    assert refused.status.status_code is StatusCode.ERROR
    assert refused.status.description == "payload_conflict"
    assert_only_allowed(refused, key, str(SECRET_AMOUNT), SECRET_NOTE, str(tenant.id))


def test_a_reconciliation_span_is_a_child_of_the_submit_too(bench, spans):
    record = bench.unknown_outcome(SafetyClass.IDEMPOTENT)
    (submitted,) = by_name(spans, "effect_broker.submit")
    assert submitted.parent is None  # no caller trace: the submit starts one
    reconcile(record.effect_id, worker="w2")
    (reconciled,) = by_name(spans, "effect_broker.reconcile")
    assert reconciled.parent is not None
    assert reconciled.parent.span_id == submitted.context.span_id
    assert reconciled.attributes[tracing.STATUS] == "succeeded"
    # The resend inside it is a dispatch attempt, not a second dispatch span
    assert len(by_name(spans, f"execute_tool {TOOLS[SafetyClass.IDEMPOTENT]}")) == 1


def test_a_lost_answer_is_an_execute_tool_span_with_its_stable_error_type(bench, spans):
    # Given an unsafe target that commits and loses its answer
    bench.targets[SafetyClass.UNSAFE].inject(Fault.LOSE_RESPONSE)
    record = bench.submit(SafetyClass.UNSAFE)
    # When a worker dispatches it
    assert dispatch(record.effect_id, worker="w1").status.value == "outcome_unknown"
    # Then the execute_tool span says how it ended by the stable code, and no more
    (span,) = by_name(spans, f"execute_tool {TOOLS[SafetyClass.UNSAFE]}")
    assert span.attributes["error.type"] == "outcome_unknown"
    assert span.attributes["gen_ai.tool.call.id"] == record.effect_id
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "outcome_unknown"
    assert_only_allowed(span, record.operation_key, str(SECRET_AMOUNT), SECRET_NOTE)


def test_without_a_configured_provider_nothing_is_stored_or_exported(bench):
    # OpenTelemetry's API alone (no SDK provider installed): no span, no context
    bench.targets[SafetyClass.UNSAFE].inject(Fault.LOSE_RESPONSE)
    record = bench.submit(SafetyClass.UNSAFE)
    assert EffectIntent.objects.get(id=record.effect_id).trace_context is None
    assert dispatch(record.effect_id, worker="w1").status.value == "outcome_unknown"
