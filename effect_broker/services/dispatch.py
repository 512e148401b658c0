"""Dispatch: claim an effect, commit the attempt, call the target once, record the truth.

Spec "State machine" rule 1: DISPATCHING and the attempt row commit before any network
I/O, so a worker that dies mid-call leaves evidence that bytes may have left. The
outcome is written with the version the worker holds; a worker whose lease was taken
away is refused by the fence and its late write is recorded, never applied. A worker
that stalled after its claim does not send at all: the send gate (``services.lease``)
refuses unless the lease is provably still held.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

from django.db import transaction

from effect_broker import failpoints, store
from effect_broker.adapters.base import DispatchRequest, EffectAdapter
from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.errors import (
    KeyReusedError,
    OutcomeUnknownError,
    RetryableAdapterError,
    SecretRefNotDeclaredError,
    SecretUnavailableError,
    StaleWriteError,
    TerminalAdapterError,
)
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.secret_refs import find_refs, refuse_undeclared, resolve_refs
from effect_broker.domain.states import EffectStatus
from effect_broker.models import Tenant
from effect_broker.observability import metrics
from effect_broker.observability.instrumentation import dispatch_span, timed_attempt
from effect_broker.services import admission, approval_gate, deadlines, outcomes
from effect_broker.services.lease import LeaseKeeper
from effect_broker.services.outcomes import to_manual_review
from effect_broker.services.payloads import load_arguments
from effect_broker.services.running_jobs import RunningJob
from effect_broker.services.runtime import Runtime, get_runtime

logger = logging.getLogger(__name__)

#: States from which a dispatch job may start an attempt.
DISPATCHABLE = frozenset({EffectStatus.PREPARED, EffectStatus.RETRYABLE})
#: How an attempt ended, as ``effect_broker_dispatch_attempts_total`` names it.
_ATTEMPT_OUTCOME = {
    "ok": "succeeded",
    "retryable": "not_committed",
    "terminal": "refused",
    "key_reused": "refused",
    "unknown": "unknown",
}


def note_stale_write(rt: Runtime, error: StaleWriteError, *, actor: str) -> None:
    """Persist and log a fenced-out write (outside the refused transaction)."""
    store.record_stale_write(error, actor=actor, now=rt.clock.now())
    metrics.stale_write()
    logger.warning(
        "stale write refused",
        extra={
            "action": "stale_write",
            "effect_id": error.details.get("effect_id"),
            "expected_version": error.details.get("expected_version"),
        },
    )


def dispatch(
    effect_id: str,
    *,
    worker: str,
    runtime: Runtime | None = None,
    job: RunningJob | None = None,
) -> EffectRecord:
    """Dispatch ``effect_id`` if due; safe to call any number of times. ``job``: the
    procrastinate job this runs in, finished by a success's statement when given
    (``services.running_jobs``)."""
    rt = runtime or get_runtime()
    read = store.load_for_dispatch(effect_id, offset=rt.clock.database_offset())
    record = read.record
    if record.status not in DISPATCHABLE:
        if record.status is EffectStatus.AWAITING_APPROVAL:
            # Issue 24: no job is queued for an effect awaiting approval; one that
            # runs anyway (a stray or forged job) sends nothing.
            logger.warning(
                "dispatch refused: the effect awaits an operator's approval",
                extra={"action": "dispatch_refused", "effect_id": effect_id},
            )
        return record
    # Due or not is decided on the database's clock (it also scheduled the job).
    if record.next_action_at is not None and record.next_action_at > read.database_now:
        rt.scheduler.dispatch(effect_id, at=record.next_action_at)
        return record
    if read.pause_id is not None:
        # An operator's pause holds it (issue 24; read with the row). The job ends
        # here and schedules nothing: no polling while paused, and resuming the
        # pause defers this effect's job again (services.pauses).
        metrics.deferred(record, reason="paused")
        logger.info(
            "dispatch held by a pause",
            extra={
                "action": "dispatch_paused",
                "effect_id": effect_id,
                "pause_id": read.pause_id,
            },
        )
        return record
    contract = rt.registry.get(record.contract_name, record.contract_version)
    with dispatch_span(record) as span:  # a child of the submit's span
        try:
            return span.ended(_dispatch_due(rt, read, contract, worker=worker, job=job))
        except StaleWriteError as exc:
            note_stale_write(rt, exc, actor=worker)
            return span.ended(store.load_effect_for_worker(effect_id))


def _dispatch_due(
    rt: Runtime,
    read: store.DispatchRead,
    contract: EffectContract,
    *,
    worker: str,
    job: RunningJob | None = None,
) -> EffectRecord:
    record = read.record
    if record.attempt_count > contract.retry_limit:
        return outcomes.record_failed(
            rt,
            record,
            actor=worker,
            attempt_id=None,
            reason="retry limit reached",
            event_type="retries_exhausted",
        )
    if record.status is EffectStatus.RETRYABLE and not deadlines.within_key_retention(
        rt, record, read.database_now
    ):
        metrics.retry_blocked(record)
        return to_manual_review(rt, record, actor=worker, reason="key retention expired")
    if record.status is EffectStatus.RETRYABLE:
        metrics.retry_retention(record, read.database_now)
    # Issue 24: the first send of an effect whose contract asks for approvals needs
    # an approval bound to it and to the contract this worker holds.
    gate = approval_gate.check_first_send(rt, read, contract, worker=worker)
    if gate.held is not None:
        return gate.held
    claim = {"approval": gate.binding} if gate.binding else None
    adapter = rt.adapter_for(contract)
    if adapter.transactional:
        return _dispatch_transactional(
            rt,
            record,
            contract,
            adapter,
            worker=worker,
            sealed=read.sealed,
            claim_metadata=claim,
        )
    return send_attempt(
        rt,
        record,
        contract,
        adapter,
        worker=worker,
        sealed=read.sealed,
        claim_metadata=claim,
        job=job,
    )


def send_attempt(
    rt: Runtime,
    record: EffectRecord,
    contract: EffectContract,
    adapter: EffectAdapter,
    *,
    worker: str,
    sealed: store.SealedArguments | None = None,
    claim_metadata: Mapping[str, object] | None = None,
    job: RunningJob | None = None,
) -> EffectRecord:
    """Commit DISPATCHING + attempt, call the adapter once behind the send gate, and
    record what happened (``claim_metadata``: more facts for ``dispatch_started``,
    e.g. the approval this attempt consumes; ``job``: the job a success finishes)."""
    arguments = load_arguments(rt, record, sealed)
    try:
        arguments = _with_secrets(rt, record, contract, arguments)
    except SecretUnavailableError as exc:
        return _refuse_unavailable_secret(rt, record, exc, worker=worker)
    # Read BEFORE the claim is sent: the lease the database starts is no older than
    # this, so "claimed_at + lease - margin" is a moment the lease provably holds.
    claimed_at = rt.clock.monotonic()
    claimed = admission.claim(
        rt, record, contract, worker=worker, metadata=claim_metadata
    )
    if isinstance(claimed, admission.Waiting):
        return _wait_for_limit(rt, record, claimed, worker=worker)
    record, attempt_id = claimed
    with LeaseKeeper(
        rt,
        record,
        worker=worker,
        claimed_at=claimed_at,
        attempt_limit=deadlines.attempt_limit(rt, contract),
    ) as keeper:
        request = DispatchRequest(
            effect=record,
            arguments=arguments,
            attempt_id=attempt_id,
            contract=contract,
            gate=keeper,
        )
        with timed_attempt(record) as attempt:
            try:
                result = adapter.dispatch(request)
            except RetryableAdapterError as exc:
                # Includes SendRefusedError: the gate refused, nothing left the
                # process. If the lease was taken over meanwhile, the fence refuses
                # this write too.
                failure: tuple[str, str] | None = ("retryable", str(exc))
                attempt["error_code"] = exc.code
            except KeyReusedError as exc:
                # Refused, but the key holds another request: an operator decides.
                failure = ("key_reused", str(exc))
                attempt["error_code"] = exc.code
            except TerminalAdapterError as exc:
                failure = ("terminal", str(exc))
                attempt["error_code"] = exc.code
            except OutcomeUnknownError as exc:
                failure = ("unknown", str(exc))
                attempt["error_code"] = exc.code
            else:
                failure = None
            attempt["outcome"] = _ATTEMPT_OUTCOME[failure[0] if failure else "ok"]
    held = keeper.current()
    if failure is None:
        return outcomes.record_success(
            rt,
            held,
            contract,
            result,
            actor=worker,
            attempt_id=attempt_id,
            event_type="dispatch_succeeded",
            job=job,
        )
    kind, reason = failure
    if kind == "retryable":
        return outcomes.record_retryable(
            rt, held, contract, actor=worker, attempt_id=attempt_id, reason=reason
        )
    if kind == "terminal":
        return outcomes.record_failed(
            rt, held, actor=worker, attempt_id=attempt_id, reason=reason
        )
    if kind == "key_reused":
        return outcomes.record_key_reused(
            rt, held, actor=worker, attempt_id=attempt_id, reason=reason
        )
    return outcomes.record_unknown(
        rt, held, actor=worker, attempt_id=attempt_id, reason=reason
    )


def _wait_for_limit(
    rt: Runtime, record: EffectRecord, waiting: admission.Waiting, *, worker: str
) -> EffectRecord:
    """Over the contract's limit: nothing was claimed or sent. A dispatch job was
    deferred to the wake time with the decision; a same-key resend (the effect is
    RECONCILING) goes back to waiting as an unknown outcome, due at that time."""
    logger.info(
        "send waits for the contract's limit",
        extra={
            "action": "dispatch_waits",
            "effect_id": record.effect_id,
            "reason": waiting.reason,
        },
    )
    if record.status is not EffectStatus.RECONCILING:
        return record
    with transaction.atomic():
        waited = store.transition(
            record,
            EffectStatus.OUTCOME_UNKNOWN,
            event_type="resend_deferred",
            actor=worker,
            now=rt.clock.now(),
            metadata={"waiting_on": waiting.reason},
            changes={
                "lease_owner": None,
                "lease_expires_at": None,
                "next_action_at": waiting.wake_at,
            },
        )
        rt.scheduler.reconcile(record.effect_id, at=waiting.wake_at)
    return waited


def _with_secrets(
    rt: Runtime,
    record: EffectRecord,
    contract: EffectContract,
    arguments: Mapping[str, Any],
) -> Mapping[str, Any]:
    """The arguments with every ``{"$secret": ...}`` replaced by its value, looked up
    here, in the dispatching worker, and kept only in memory for this attempt."""
    refs = find_refs(arguments)
    if not refs:
        return arguments
    # Submit refused undeclared references already; checked again against the pinned
    # contract so that no other way into the ledger (an effect stored before the
    # declaration existed, a renamed tenant) can make this worker resolve one.
    try:
        refuse_undeclared(
            refs, contract.declared_secrets(_tenant_name(record)), contract=contract.label
        )
    except SecretRefNotDeclaredError as exc:
        raise SecretUnavailableError(f"{exc.code}: {exc}") from None
    return cast(
        Mapping[str, Any],
        resolve_refs(arguments, lambda ref: rt.secrets.lookup(record.tenant_id, ref)),
    )


def _tenant_name(record: EffectRecord) -> str:
    name: str = Tenant.objects.values_list("name", flat=True).get(id=record.tenant_id)
    return name


def _refuse_unavailable_secret(
    rt: Runtime, record: EffectRecord, exc: SecretUnavailableError, *, worker: str
) -> EffectRecord:
    """A missing secret is refused before any attempt starts: nothing was sent, so
    this attempt proves nothing committed. An earlier attempt in doubt still goes to
    reconciliation or an operator, never to failed_final (outcomes.record_failed)."""
    return outcomes.record_failed(
        rt,
        record,
        actor=worker,
        attempt_id=None,
        reason=f"{exc.code}: {exc}",
        event_type="secret_unavailable",
    )


def _dispatch_transactional(
    rt: Runtime,
    record: EffectRecord,
    contract: EffectContract,
    adapter: EffectAdapter,
    *,
    worker: str,
    sealed: store.SealedArguments,
    claim_metadata: Mapping[str, object] | None = None,
) -> EffectRecord:
    """Safety class ``transactional``: mutation, receipt and event in ONE transaction.

    A crash anywhere inside rolls everything back, including the attempt row, so the
    effect is still PREPARED and the next job applies it exactly once.
    """
    arguments = load_arguments(rt, record, sealed)
    try:
        arguments = _with_secrets(rt, record, contract, arguments)
    except SecretUnavailableError as exc:
        return _refuse_unavailable_secret(rt, record, exc, worker=worker)
    with transaction.atomic():
        started, attempt_id = store.start_attempt(
            record,
            worker=worker,
            now=rt.clock.now(),
            changes=deadlines.claim_changes(rt, record, contract, worker=worker),
            metadata=claim_metadata,
        )
        request = DispatchRequest(
            effect=started, arguments=arguments, attempt_id=attempt_id, contract=contract
        )
        try:
            # The mutation alone, in its savepoint, so a refusal can be recorded.
            with timed_attempt(started, rolled_back=True), transaction.atomic():
                result = adapter.dispatch(request)
        except RetryableAdapterError as exc:
            return outcomes.record_retryable(
                rt,
                started,
                contract,
                actor=worker,
                attempt_id=attempt_id,
                reason=str(exc),
            )
        except (TerminalAdapterError, OutcomeUnknownError) as exc:
            # Nothing of the mutation survived its savepoint: this is a proved refusal.
            return outcomes.record_failed(
                rt, started, actor=worker, attempt_id=attempt_id, reason=str(exc)
            )
        done = outcomes.record_success(
            rt,
            started,
            contract,
            result,
            actor=worker,
            attempt_id=attempt_id,
            event_type="dispatch_succeeded",
        )
    failpoints.hit(
        "after_receipt_commit", subject=f"{record.tenant_id}/{record.operation_key}"
    )
    return done
