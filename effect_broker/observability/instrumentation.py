"""The hooks the services call: a span and the matching metrics for one unit of work.

Each service adds one or two lines (a decorator, a ``with``): the rules of what is
counted and what a span may carry live here and in ``metrics``/``tracing``, not
spread over the use cases.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from effect_broker.domain.errors import (
    EffectBrokerError,
    OutcomeUnknownError,
    PayloadConflictError,
    RetryableAdapterError,
    TerminalAdapterError,
    UnknownContractError,
)
from effect_broker.domain.records import EffectRecord, EffectRequest, Reservation
from effect_broker.observability import metrics, tracing

if TYPE_CHECKING:
    from effect_broker.models import Tenant
    from effect_broker.services.runtime import Runtime

SubmitFn = TypeVar("SubmitFn", bound=Callable[..., Reservation])


def observed_submit(submit: SubmitFn) -> SubmitFn:
    """Wrap the submit use case in its span and count what it did.

    Counted after the reservation statement returned, in memory: no extra round trip.
    A refusal for a key that names another effect counts as a conflict under the
    contract the caller asked for (its tool is known: the contract was found first).
    """

    @functools.wraps(submit)
    def observed(
        tenant: Tenant, request: EffectRequest, *, runtime: Runtime | None = None
    ) -> Reservation:
        started = time.perf_counter()
        with tracing.span(
            "effect_broker.submit",
            tenant_id=str(tenant.id),
            operation_key=str(request.operation_key),
        ) as span:
            try:
                reservation = submit(tenant, request, runtime=runtime)
            except PayloadConflictError as exc:
                _conflicted(request, runtime, "payload_drift")
                span.refused(exc.code)
                raise
            except UnknownContractError as exc:
                if "pinned_contract" in exc.details:
                    _conflicted(request, runtime, "pinned_contract_missing")
                span.refused(exc.code)
                raise
            except EffectBrokerError as exc:
                span.refused(exc.code)
                raise
            span.ended(reservation.effect)
        metrics.submitted(
            reservation.effect,
            created=reservation.created,
            seconds=time.perf_counter() - started,
        )
        return reservation

    return observed  # type: ignore[return-value]


def _conflicted(request: EffectRequest, runtime: Runtime | None, reason: str) -> None:
    from effect_broker.services.runtime import get_runtime

    contract = (runtime or get_runtime()).registry.for_tool(request.tool)
    metrics.conflicted(contract, reason=reason)


def submit_trace_context() -> str | None:
    """The traceparent to store on a new effect: the current (submit) span's."""
    return tracing.current_traceparent()


@contextmanager
def dispatch_span(record: EffectRecord) -> Iterator[tracing.EffectSpan]:
    """A worker's dispatch of ``record``: a child span of its submit."""
    # The GenAI conventions' execute_tool span (issue 21).
    with tracing.execute_tool_span(record) as span:
        yield span


class _Reconciliation:
    """``ended(record)`` closes the span's description and counts the outcome."""

    def __init__(self, span: tracing.EffectSpan) -> None:
        self._span = span
        self._started = time.perf_counter()

    def ended(self, record: EffectRecord) -> EffectRecord:
        metrics.reconciled(record, seconds=time.perf_counter() - self._started)
        return self._span.ended(record)


@contextmanager
def reconcile_span(record: EffectRecord) -> Iterator[_Reconciliation]:
    """A worker's reconciliation of ``record``: a child span of its submit, and the
    reconciliation's outcome and duration once ``ended`` is called."""
    with tracing.effect_span("effect_broker.reconcile", record) as span:
        yield _Reconciliation(span)


@contextmanager
def timed_attempt(
    record: EffectRecord, *, rolled_back: bool = False
) -> Iterator[dict[str, Any]]:
    """Time one call to the target and count how it ended.

    The caller may set ``["outcome"]`` (and ``["error_code"]``, the stable code of
    an adapter error it caught, for the span's ``error.type``); otherwise a normal
    exit is ``succeeded`` and an adapter error that escapes is classified here:
    retryable -> ``not_committed``,
    terminal -> ``refused``, unknown -> ``unknown``, or ``refused`` when the call ran
    in a savepoint that was rolled back (``rolled_back``: a transactional target,
    where nothing of a failed call survives). Anything else is ``error``.
    """
    started = time.perf_counter()
    attempt: dict[str, Any] = {"outcome": None, "error_code": None}
    try:
        yield attempt
        if attempt["error_code"]:
            # A failure the caller caught and classified (``error_code``: its stable
            # code) is still the execute_tool span's error.type.
            tracing.attempt_failed(attempt["error_code"])
    except RetryableAdapterError as exc:
        attempt["outcome"] = "not_committed"
        tracing.attempt_failed(exc.code)
        raise
    except TerminalAdapterError as exc:
        attempt["outcome"] = "refused"
        tracing.attempt_failed(exc.code)
        raise
    except OutcomeUnknownError as exc:
        attempt["outcome"] = "refused" if rolled_back else "unknown"
        # Rolled back: nothing of the call survived, so it was refused, not unknown.
        tracing.attempt_failed(TerminalAdapterError.code if rolled_back else exc.code)
        raise
    except BaseException:
        attempt["outcome"] = "error"
        tracing.attempt_failed("internal_error")
        raise
    finally:
        metrics.attempt_ended(
            record,
            outcome=attempt["outcome"] or "succeeded",
            seconds=time.perf_counter() - started,
        )
