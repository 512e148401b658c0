"""Batch submit (issue 13): N effects in one statement and one commit, a result each.

Every item keeps the semantics of a single ``submit``: an unused key is reserved
(``created``), the same key with the same payload is a replay (``replayed``), the same
key with another payload is a ``conflict`` that writes nothing for that item. A key
repeated inside one batch behaves as if the items had been sent one after another:
the later item replays the earlier one, or conflicts with it.

Validation is all or nothing: every item is checked (key, lengths, argument caps,
secret references, known tool) before anything is written, and the first invalid item
refuses the whole batch with that item's own error, its index in the ``item`` member.
A caller fixes the item and resends the batch; since nothing was written, the resend
cannot half-duplicate it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings

from effect_broker import store
from effect_broker.domain.errors import (
    EffectBrokerError,
    InvalidRequestError,
    PayloadConflictError,
    TenantDisabledError,
    UnknownContractError,
)
from effect_broker.domain.records import (
    EffectRecord,
    EffectRequest,
)
from effect_broker.models import Tenant
from effect_broker.observability import metrics
from effect_broker.services.runtime import Runtime, get_runtime

# The single submit's own checks and drift rule, reused so that an item and a single
# submit cannot disagree about what is valid, a replay or a conflict.
from effect_broker.services.submission import (
    PreparedIntent,
    _refuse_drift,
    after_reservation,
    prepare_intent,
    reservation_job,
)
from effect_broker.store.batch_reserve import reserve_many

#: The default cap on items per batch (``EFFECT_BROKER_MAX_BATCH_ITEMS``).
DEFAULT_MAX_BATCH_ITEMS = 100

CREATED = "created"
REPLAYED = "replayed"
CONFLICT = "conflict"


@dataclass(frozen=True, slots=True)
class BatchItemResult:
    """One item's answer: ``created`` or ``replayed`` with its effect, or ``conflict``
    with the error a single submit of it would have raised (nothing written for it)."""

    index: int
    outcome: str
    effect: EffectRecord | None = None
    error: EffectBrokerError | None = None


def max_batch_items() -> int:
    """The most items one batch may carry (settings, else the default)."""
    return int(
        getattr(settings, "EFFECT_BROKER_MAX_BATCH_ITEMS", DEFAULT_MAX_BATCH_ITEMS)
    )


def _check_size(count: int) -> None:
    cap = max_batch_items()
    if count < 1:
        raise InvalidRequestError("a batch needs at least one item", field="items")
    if count > cap:
        raise InvalidRequestError(
            f"a batch may carry at most {cap} items, got {count}; split it",
            field="items",
            limit=cap,
        )


def submit_many(
    tenant: Tenant,
    requests: Sequence[EffectRequest],
    *,
    runtime: Runtime | None = None,
) -> list[BatchItemResult]:
    """Reserve every request of ``requests`` for ``tenant`` in one commit; a result
    per item, in order. Raises (writing nothing) when the tenant is disabled, the batch
    is empty or over the cap, or any item is invalid (``item`` names it)."""
    started = time.perf_counter()
    rt = runtime or get_runtime()
    if tenant.disabled:
        raise TenantDisabledError(f"tenant {tenant.name!r} is disabled")
    _check_size(len(requests))
    prepared: list[PreparedIntent] = []
    for index, request in enumerate(requests):
        try:
            prepared.append(prepare_intent(rt, tenant, request))
        except EffectBrokerError as exc:
            exc.details.setdefault("item", index)
            raise
    # A key repeated in the batch is reserved once, by its first item; the later ones
    # are judged against that row below, as if sent after it.
    first: dict[str, int] = {}
    for index, item in enumerate(prepared):
        first.setdefault(item.intent.operation_key, index)
    unique = [prepared[i] for i in sorted(first.values())]
    jobs = [reservation_job(rt, p.intent) for p in unique]
    actors = [p.checked.request.requested_by or "caller" for p in unique]
    now = rt.clock.now()
    # The first due time is the database's clock, not this host's (issue 19).
    offset = rt.clock.database_offset()
    if len(unique) == 1:
        # One key: the single submit's statement does the same writes (intent, event,
        # job; one commit) and costs the server less than the batch statement's
        # JSON input, sort and joins, so a batch of one is not slower than a submit.
        rows = [
            store.reserve(
                unique[0].intent,
                now=now,
                actor=actors[0],
                job=jobs[0],
                database_offset=offset,
            )
        ]
    else:
        rows = reserve_many(
            [p.intent for p in unique],
            now=now,
            actors=actors,
            # The jobs commit with the intents (STYLE rule 5), in the same statement.
            jobs=jobs if any(job is not None for job in jobs) else None,
            database_offset=offset,
        )
    by_key = {p.intent.operation_key: row for p, row in zip(unique, rows, strict=True)}
    job_of = {p.intent.operation_key: job for p, job in zip(unique, jobs, strict=True)}
    results: list[BatchItemResult] = []
    seconds = time.perf_counter() - started
    for index, item in enumerate(prepared):
        record, created = by_key[item.intent.operation_key]
        if created and first[item.intent.operation_key] == index:
            after_reservation(rt, record, job_of[item.intent.operation_key])
            metrics.submitted(record, created=True, seconds=seconds)
            results.append(BatchItemResult(index, CREATED, effect=record))
            continue
        try:
            _refuse_drift(rt, record, item.checked)
        except (PayloadConflictError, UnknownContractError) as exc:
            reason = (
                "payload_drift"
                if isinstance(exc, PayloadConflictError)
                else "pinned_contract_missing"
            )
            metrics.conflicted(item.contract, reason=reason)
            exc.details["item"] = index
            results.append(BatchItemResult(index, CONFLICT, error=exc))
            continue
        metrics.submitted(record, created=False, seconds=seconds)
        results.append(BatchItemResult(index, REPLAYED, effect=record))
    return results
