"""Decrypting stored arguments and sealing results, bound to their row by AAD."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from effect_broker import store
from effect_broker.domain.canonical import canonical_json, parse_json_strict
from effect_broker.domain.payload_crypto import decrypt, encrypt, redacted_preview
from effect_broker.domain.records import EffectRecord
from effect_broker.services.runtime import Runtime
from effect_broker.services.submission import arguments_aad


def result_aad(tenant_id: str, operation_key: str) -> bytes:
    """AES-GCM associated data of a receipt's result."""
    return f"{tenant_id}\0{operation_key}\0result".encode()


def load_arguments(
    rt: Runtime, record: EffectRecord, sealed: store.SealedArguments | None = None
) -> Mapping[str, Any]:
    """Decrypt an effect's canonical arguments (only a dispatching worker needs them);
    ``sealed`` when they were read with the row, else they are read now."""
    if sealed is None:
        blob, key_id, tenant_id, operation_key = store.load_arguments(record.effect_id)
    else:
        blob, key_id = sealed.ciphertext, sealed.key_id
        tenant_id, operation_key = record.tenant_id, record.operation_key
    plaintext = decrypt(
        rt.keyring, key_id, blob, aad=arguments_aad(tenant_id, operation_key)
    )
    value = parse_json_strict(plaintext)
    assert isinstance(value, dict)  # submit only stores JSON objects
    return value


def seal_result(
    rt: Runtime,
    record: EffectRecord,
    output: Mapping[str, object],
    preview_fields: tuple[str, ...],
    *,
    canonical: bytes | None = None,
) -> tuple[str, bytes, dict[str, object]]:
    """Encrypt a target's output for the receipt; return (key id, blob, preview).
    ``canonical``: the output's canonical JSON when the caller already has it."""
    key_id, blob = encrypt(
        rt.keyring,
        canonical if canonical is not None else canonical_json(dict(output)),
        aad=result_aad(record.tenant_id, record.operation_key),
    )
    return key_id, blob, redacted_preview(output, preview_fields)
