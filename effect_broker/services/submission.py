"""Submit: bind a business intent to its payload and pinned contract, exactly once.

Spec "Operation identity and payload binding": the (tenant, operation_key) pair is the
identity. The same key with the same request hash is a replay of the existing effect;
the same key with a different hash or a different pinned contract is a conflict, and
nothing is written or dispatched.
"""

from __future__ import annotations

from collections.abc import Mapping

from effect_broker import failpoints, store
from effect_broker.domain.canonical import canonical_json
from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.errors import (
    InvalidRequestError,
    PayloadConflictError,
    TenantDisabledError,
)
from effect_broker.domain.keys import downstream_key, request_hash, validate_operation_key
from effect_broker.domain.payload_crypto import encrypt, redacted_preview
from effect_broker.domain.records import EffectRecord, EffectRequest, Reservation
from effect_broker.models import Tenant
from effect_broker.services.runtime import Runtime, get_runtime


def arguments_aad(tenant_id: str, operation_key: str) -> bytes:
    """AES-GCM associated data: a ciphertext only decrypts on its own row."""
    return f"{tenant_id}\0{operation_key}\0arguments".encode()


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
    operation_key = validate_operation_key(request.operation_key)
    if not isinstance(request.arguments, Mapping):
        raise InvalidRequestError("arguments must be a JSON object")
    contract = rt.registry.for_tool(request.tool)
    tenant_id = str(tenant.id)
    canonical_args = canonical_json(dict(request.arguments))
    digest = request_hash(
        tool=request.tool,
        arguments=request.arguments,
        contract_name=contract.name,
        contract_version=contract.version,
    )
    key_id, ciphertext = encrypt(
        rt.keyring, canonical_args, aad=arguments_aad(tenant_id, operation_key)
    )
    intent = store.NewIntent(
        tenant_id=tenant_id,
        operation_key=operation_key,
        tool=request.tool,
        request_hash=digest,
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
    )
    actor = request.requested_by or "caller"
    subject = f"{tenant_id}/{operation_key}"
    # The dispatch job commits with the intent or not at all (STYLE rule 5): it rides
    # in the reservation statement, which is about to be sent.
    job = rt.scheduler.reservation_job(intent.effect_id)
    failpoints.hit("before_reservation_commit", subject=subject)
    record, created = store.reserve(intent, now=rt.clock.now(), actor=actor, job=job)
    if created:
        if job is None:
            rt.scheduler.dispatch(record.effect_id)
        failpoints.hit("after_reservation_commit", subject=subject)
        return Reservation(effect=record, created=True, replayed=False)
    _refuse_drift(record, contract, digest)
    return Reservation(effect=record, created=False, replayed=True)


def _refuse_drift(record: EffectRecord, contract: EffectContract, digest: bytes) -> None:
    if (record.contract_name, record.contract_version) != (
        contract.name,
        contract.version,
    ):
        raise PayloadConflictError(
            f"operation key {record.operation_key!r} is pinned to contract "
            f"{record.contract_name}@{record.contract_version}; this request resolves to "
            f"{contract.name}@{contract.version}. Use a new operation key.",
            effect_id=record.effect_id,
            pinned_contract=f"{record.contract_name}@{record.contract_version}",
        )
    if record.request_hash != digest:
        raise PayloadConflictError(
            f"operation key {record.operation_key!r} was reserved with a different "
            "payload; an operation key cannot be reused with changed arguments",
            effect_id=record.effect_id,
        )
