"""Submit: bind a business intent to its payload and pinned contract, exactly once.

Spec "Operation identity and payload binding": the (tenant, operation_key) pair is the
identity. The same key with the same request hash - computed under the contract the
effect is pinned to, even after a newer version is deployed - is a replay of the
existing effect; the same key with a different hash is a conflict, and nothing is
written or dispatched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from effect_broker import failpoints, store
from effect_broker.domain.argument_limits import check_arguments
from effect_broker.domain.canonical import canonical_json
from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.errors import (
    InvalidRequestError,
    PayloadConflictError,
    TenantDisabledError,
    UnknownContractError,
)
from effect_broker.domain.keys import (
    derive_request_hash_key,
    downstream_key,
    keyed_request_hash,
    keyed_request_hash_of,
    validate_operation_key,
)
from effect_broker.domain.payload_crypto import encrypt, redacted_preview
from effect_broker.domain.records import (
    MAX_REQUESTED_BY_LENGTH,
    MAX_TRACE_ID_LENGTH,
    EffectRecord,
    EffectRequest,
    Reservation,
)
from effect_broker.domain.secret_refs import find_refs, refuse_undeclared
from effect_broker.domain.states import EffectStatus
from effect_broker.models import Tenant
from effect_broker.observability.instrumentation import (
    observed_submit,
    submit_trace_context,
)
from effect_broker.services import approval_notices
from effect_broker.services.runtime import Runtime, get_runtime


def arguments_aad(tenant_id: str, operation_key: str) -> bytes:
    """AES-GCM associated data: a ciphertext only decrypts on its own row."""
    return f"{tenant_id}\0{operation_key}\0arguments".encode()


def request_hash_for(
    master_key: bytes,
    tenant_id: str,
    *,
    tool: str,
    arguments: Mapping[str, object],
    contract_name: str,
    contract_version: str,
) -> bytes:
    """The stored request hash: HMAC under the tenant's key derived from the master key
    (issue 9, defect 10: an unkeyed hash of the clear arguments leaked them)."""
    return keyed_request_hash(
        derive_request_hash_key(master_key, tenant_id),
        tool=tool,
        arguments=arguments,
        contract_name=contract_name,
        contract_version=contract_version,
    )


def _request_hash(
    rt: Runtime,
    tenant_id: str,
    tool: str,
    canonical_args: bytes,
    contract: EffectContract,
) -> bytes:
    """``request_hash_for`` of arguments canonicalised once per submit (they are also
    what a new intent encrypts)."""
    return keyed_request_hash_of(
        derive_request_hash_key(rt.master_key, tenant_id),
        tool=tool,
        canonical_arguments=canonical_args,
        contract_name=contract.name,
        contract_version=contract.version,
    )


def _require_length(field: str, value: str, cap: int) -> None:
    if len(value) > cap:
        raise InvalidRequestError(
            f"{field} must be at most {cap} characters, got {len(value)}", field=field
        )


@dataclass(frozen=True, slots=True)
class CheckedRequest:
    """A request checked and hashed: everything a replay needs, nothing sealed yet."""

    request: EffectRequest
    operation_key: str
    contract: EffectContract
    #: The arguments' canonical JSON, which a new intent encrypts.
    canonical_args: bytes
    digest: bytes


@dataclass(frozen=True, slots=True)
class PreparedIntent:
    """A request checked and sealed for the ledger, not yet written."""

    checked: CheckedRequest
    intent: store.NewIntent

    @property
    def contract(self) -> EffectContract:
        """The contract active for the request's tool."""
        return self.checked.contract


def check_request(rt: Runtime, tenant: Tenant, request: EffectRequest) -> CheckedRequest:
    """Check ``request`` and compute its request hash: the one way a single submit and
    a batch item are checked (in this order) before anything is read or written."""
    operation_key = validate_operation_key(request.operation_key)
    _require_length("requested_by", request.requested_by, MAX_REQUESTED_BY_LENGTH)
    _require_length("trace_id", request.trace_id or "", MAX_TRACE_ID_LENGTH)
    if not isinstance(request.arguments, Mapping):
        raise InvalidRequestError("arguments must be a JSON object")
    # Before canonicalising, hashing or previewing: the caps bound that work.
    check_arguments(request.arguments, rt.argument_limits)
    # A malformed {"$secret": ...} is refused now, not found missing at dispatch.
    refs = find_refs(request.arguments)
    contract = rt.registry.for_tool(request.tool)
    # So is one the contract does not declare for this tenant, before any lookup.
    declared = contract.declared_secrets(tenant.name)
    refuse_undeclared(refs, declared, contract=contract.label)
    canonical_args = canonical_json(dict(request.arguments))
    digest = _request_hash(rt, str(tenant.id), request.tool, canonical_args, contract)
    return CheckedRequest(request, operation_key, contract, canonical_args, digest)


def seal_intent(rt: Runtime, tenant: Tenant, checked: CheckedRequest) -> store.NewIntent:
    """The new intent of a checked request: its arguments encrypted, their redacted
    preview, its downstream key, its approval rule. Only a key the ledger does not
    hold yet is sealed: a replay never pays for it."""
    request, contract = checked.request, checked.contract
    operation_key, tenant_id = checked.operation_key, str(tenant.id)
    key_id, ciphertext = encrypt(
        rt.keyring, checked.canonical_args, aad=arguments_aad(tenant_id, operation_key)
    )
    # Issue 24: a contract may ask for an operator's approval before anything is
    # sent; such an effect is reserved awaiting it, with its deadline on the
    # database's clock, and no dispatch job.
    rule = contract.approval
    awaiting = rule is not None and rule.applies_to(request.arguments)
    return store.NewIntent(
        tenant_id=tenant_id,
        operation_key=operation_key,
        tool=request.tool,
        request_hash=checked.digest,
        arguments_ciphertext=ciphertext,
        arguments_key_id=key_id,
        arguments_preview=redacted_preview(request.arguments, contract.preview_fields),
        contract_name=contract.name,
        contract_version=contract.version,
        safety_class=contract.safety.value,
        downstream_key=downstream_key(
            rt.tenant_hmac_key(tenant.hmac_key_id), tenant_id, operation_key
        ),
        requested_by=request.requested_by,
        trace_id=request.trace_id,
        trace_context=submit_trace_context(),
        status=EffectStatus.AWAITING_APPROVAL if awaiting else EffectStatus.PREPARED,
        due_in=rule.ttl if rule is not None and awaiting else timedelta(0),
        approval_rule=rule.describe() if rule is not None and awaiting else "",
    )


def prepare_intent(rt: Runtime, tenant: Tenant, request: EffectRequest) -> PreparedIntent:
    """Check ``request`` and seal its intent up front: a batch item, whose one
    reservation statement answers an unseen key and a replay alike."""
    checked = check_request(rt, tenant, request)
    return PreparedIntent(checked, seal_intent(rt, tenant, checked))


def reservation_job(rt: Runtime, intent: store.NewIntent) -> store.QueuedJob | None:
    """The job that commits with a new intent, in its reservation statement: its
    dispatch, or for an intent that waits for approval the operators' notice (None
    without a webhook); None too when the scheduler cannot hand one over
    (``after_reservation`` then asks for it)."""
    if intent.status is EffectStatus.AWAITING_APPROVAL:
        if not approval_notices.configured():
            return None
        return rt.scheduler.approval_notice_job(intent.effect_id)
    return rt.scheduler.reservation_job(intent.effect_id)


def after_reservation(
    rt: Runtime, record: EffectRecord, job: store.QueuedJob | None
) -> None:
    """Ask for the new effect's job when it did not ride in the reservation."""
    if job is not None:
        return
    if record.status is EffectStatus.AWAITING_APPROVAL:
        # Nothing is dispatched: an operator's approval queues the dispatch job.
        if approval_notices.configured():
            rt.scheduler.notify_approval(record.effect_id)
        return
    rt.scheduler.dispatch(record.effect_id)


@observed_submit  # its span, and counts of created, replayed and conflicting submits
def submit(
    tenant: Tenant,
    request: EffectRequest,
    *,
    runtime: Runtime | None = None,
) -> Reservation:
    """Reserve ``request`` for ``tenant``, or return the existing effect on replay."""
    rt = runtime or get_runtime()
    if tenant.disabled:
        raise TenantDisabledError(f"tenant {tenant.name!r} is disabled")
    checked = check_request(rt, tenant, request)
    tenant_id, operation_key = str(tenant.id), checked.operation_key
    subject = f"{tenant_id}/{operation_key}"
    # Before the submit's first statement: nothing of it is written yet.
    failpoints.hit("before_reservation_commit", subject=subject)
    # Issue 25, item 3: a replay is one indexed read (prepared, on the unique key) and
    # the hash comparison; nothing is sealed, encrypted or sent to be inserted. A new
    # key costs this read (a miss on the same index) before its reservation.
    existing = store.find_effect_by_key(tenant_id, operation_key)
    if existing is not None:
        _refuse_drift(rt, existing, checked)
        return Reservation(effect=existing, created=False, replayed=True)
    intent = seal_intent(rt, tenant, checked)
    actor = request.requested_by or "caller"
    # The dispatch job commits with the intent or not at all (STYLE rule 5): it rides
    # in the reservation statement, which is about to be sent.
    job = reservation_job(rt, intent)
    record, created = store.reserve(
        intent,
        now=rt.clock.now(),
        actor=actor,
        job=job,
        # The first due time is the database's clock, not this host's (issue 19).
        database_offset=rt.clock.database_offset(),
    )
    if created:
        after_reservation(rt, record, job)
        failpoints.hit("after_reservation_commit", subject=subject)
        return Reservation(effect=record, created=True, replayed=False)
    # Inserted by a concurrent submit of the same key since the read above: the
    # reservation statement answered with that row, checked as any replay.
    _refuse_drift(rt, record, checked)
    return Reservation(effect=record, created=False, replayed=True)


def _refuse_drift(rt: Runtime, record: EffectRecord, checked: CheckedRequest) -> None:
    """Raise unless ``request`` is a replay of ``record``.

    The hash is compared under the contract the effect is PINNED to, not the one
    active now: after a deploy of a newer version, the caller's retry of the same call
    is still the same call (issue 9, defect 6). These messages advise inspecting the
    existing effect and never re-submitting it under another identity: that would be a
    second business operation, the duplicate the broker exists to prevent.
    """
    inspect = (
        f"Inspect the existing effect {record.effect_id} "
        f"(GET /v1/effects/{record.effect_id}) before acting again."
    )
    pinned = f"{record.contract_name}@{record.contract_version}"
    active, digest = checked.contract, checked.digest
    if (record.contract_name, record.contract_version) != (active.name, active.version):
        try:
            contract = rt.registry.get(record.contract_name, record.contract_version)
        except UnknownContractError:
            raise UnknownContractError(
                f"operation key {record.operation_key!r} is effect {record.effect_id}, "
                f"pinned to contract {pinned}, which this deployment no longer knows, "
                f"so a retry cannot be checked against it. Nothing was written. "
                f"{inspect} Restoring {pinned} to the contracts file lets the same "
                "call replay.",
                effect_id=record.effect_id,
                pinned_contract=pinned,
            ) from None
        digest = _request_hash(
            rt, record.tenant_id, checked.request.tool, checked.canonical_args, contract
        )
    if record.request_hash != digest:
        raise PayloadConflictError(
            f"operation key {record.operation_key!r} is effect {record.effect_id}, "
            f"reserved with a different payload (contract {pinned}); the arguments of "
            f"an operation cannot change and nothing was written or dispatched. "
            f"{inspect}",
            effect_id=record.effect_id,
            pinned_contract=pinned,
        )
