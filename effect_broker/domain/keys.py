"""Request hashes, tenant HMAC keys and downstream idempotency keys.

Spec "Operation identity and payload binding", as amended by issue 9 (defect 10):

    request_hash = HMAC-SHA-256(request_hash_key(tenant),
        canonical_json({tool, arguments, contract_name, contract_version}))
    downstream_key = base64url(
        HMAC-SHA-256(tenant_key, tenant_id + "\\0" + operation_key))

The stored hash is keyed: an unkeyed SHA-256 of the clear arguments let anyone holding
one row of a dump brute-force a redacted field (a card number with known BIN and last
four fell in 0.3 s), and made equal payloads of two tenants collide. The key is derived
per tenant from the master key under its own HKDF label, distinct from the
downstream-key HMAC key's.

The identity of an effect is ``(tenant_id, operation_key)``, never a hash of the
arguments: two identical $10 refunds may both be legitimate. The request hash only binds
the payload to that identity so a reused key with a different payload is a conflict.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
from collections.abc import Mapping

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from effect_broker.domain.canonical import canonical_json
from effect_broker.domain.errors import ConfigurationError, InvalidRequestError

MASTER_KEY_BYTES = 32
"""Required length of the broker master key (256 bits)."""

MIN_TENANT_KEY_BYTES = 32
"""Shortest tenant HMAC key accepted: the output of ``derive_tenant_hmac_key``."""

MAX_OPERATION_KEY_LENGTH = 255
"""Longest operation_key accepted, in characters."""

TENANT_HMAC_INFO_PREFIX = b"effect-broker/tenant-hmac/v1\0"
"""HKDF ``info`` prefix for tenant HMAC keys; the hmac_key_id follows it."""

REQUEST_HASH_INFO_PREFIX = b"effect-broker/request-hash/v1\0"
"""HKDF ``info`` prefix for tenant request-hash keys; the tenant id follows it."""


def _request_document(
    tool: str, arguments: Mapping[str, object], contract_name: str, contract_version: str
) -> bytes:
    return request_document_of(
        tool=tool,
        canonical_arguments=canonical_json(dict(arguments)),
        contract_name=contract_name,
        contract_version=contract_version,
    )


def request_document_of(
    *, tool: str, canonical_arguments: bytes, contract_name: str, contract_version: str
) -> bytes:
    """The canonical request document, around arguments already canonicalised.

    RFC 8785 writes an object as its members sorted by key, each value in its own
    canonical form, so the document is assembled around the arguments' bytes instead
    of walking them a second time (a submit has them already: they are what it
    encrypts). The four keys are ASCII and sort as written; a unit test holds the
    bytes equal to ``canonical_json`` of the whole document.
    """
    return b"".join(
        (
            b'{"arguments":',
            canonical_arguments,
            b',"contract_name":',
            canonical_json(contract_name),
            b',"contract_version":',
            canonical_json(contract_version),
            b',"tool":',
            canonical_json(tool),
            b"}",
        )
    )


def request_hash(
    *,
    tool: str,
    arguments: Mapping[str, object],
    contract_name: str,
    contract_version: str,
) -> bytes:
    """Return the UNKEYED SHA-256 of the request document (synthetic records only).

    Never persist it: anyone with the stored value can brute-force low-entropy
    arguments. The ledger stores ``keyed_request_hash``.
    """
    return hashlib.sha256(
        _request_document(tool, arguments, contract_name, contract_version)
    ).digest()


def derive_request_hash_key(master_key: bytes, tenant_id: str) -> bytes:
    """Derive a tenant's 32-byte request-hash key from the master key (HKDF-SHA256)."""
    _check_master_key(master_key)
    # Keyed by tenant id, not by hmac_key_id: rotating the downstream-key HMAC key must
    # not turn every replay into a conflict. A label of its own keeps the two keys
    # independent (one never reveals the other).
    return _hkdf_sha256(master_key, REQUEST_HASH_INFO_PREFIX + tenant_id.encode("utf-8"))


def keyed_request_hash(
    request_key: bytes,
    *,
    tool: str,
    arguments: Mapping[str, object],
    contract_name: str,
    contract_version: str,
) -> bytes:
    """Return the 32-byte HMAC-SHA256 binding a payload to its tool and pinned contract
    under a tenant's request-hash key (``derive_request_hash_key``)."""
    return keyed_request_hash_of(
        request_key,
        tool=tool,
        canonical_arguments=canonical_json(dict(arguments)),
        contract_name=contract_name,
        contract_version=contract_version,
    )


def keyed_request_hash_of(
    request_key: bytes,
    *,
    tool: str,
    canonical_arguments: bytes,
    contract_name: str,
    contract_version: str,
) -> bytes:
    """``keyed_request_hash`` of arguments already canonicalised (``canonical_json``
    of the arguments object): the same 32 bytes, without walking them again."""
    if not isinstance(request_key, bytes) or len(request_key) < MIN_TENANT_KEY_BYTES:
        raise ConfigurationError(
            f"request-hash key must be at least {MIN_TENANT_KEY_BYTES} bytes",
            setting="request_key",
        )
    document = request_document_of(
        tool=tool,
        canonical_arguments=canonical_arguments,
        contract_name=contract_name,
        contract_version=contract_version,
    )
    return hmac.new(request_key, document, "sha256").digest()


def derive_tenant_hmac_key(master_key: bytes, hmac_key_id: str) -> bytes:
    """Derive a tenant's 32-byte HMAC key from the master key with HKDF-SHA256."""
    _check_master_key(master_key)
    # Deriving (rather than storing) tenant keys means a database dump alone cannot
    # forge downstream keys; the key id lets a tenant's key rotate independently.
    return _hkdf_sha256(master_key, TENANT_HMAC_INFO_PREFIX + hmac_key_id.encode("utf-8"))


@functools.lru_cache(maxsize=4096)
def _hkdf_sha256(master_key: bytes, info: bytes) -> bytes:
    """32 bytes of HKDF-SHA256 (no salt) of ``master_key`` under ``info``.

    Cached: every submit derives two keys (request hash, downstream key) and HKDF is
    the costliest of its pure-Python steps (issue 13); the output is a pure function of
    the inputs, and the process already holds the master key they derive from.
    """
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(
        master_key
    )


def _check_master_key(master_key: bytes) -> None:
    if not isinstance(master_key, bytes) or len(master_key) != MASTER_KEY_BYTES:
        raise ConfigurationError(
            f"master key must be exactly {MASTER_KEY_BYTES} bytes",
            setting="master_key",
        )


def _identity_message(tenant_id: str, operation_key: str) -> bytes:
    # NUL separates the two parts; neither may contain one, or ("a\0b", "c") and
    # ("a", "b\0c") would share a downstream key across tenants.
    if "\0" in tenant_id or "\0" in operation_key:
        raise InvalidRequestError("tenant_id and operation_key must not contain NUL")
    return f"{tenant_id}\0{operation_key}".encode()


def downstream_key(tenant_key: bytes, tenant_id: str, operation_key: str) -> str:
    """Return the idempotency key sent to the target on every attempt (base64url)."""
    if not isinstance(tenant_key, bytes) or len(tenant_key) < MIN_TENANT_KEY_BYTES:
        raise ConfigurationError(
            f"tenant HMAC key must be at least {MIN_TENANT_KEY_BYTES} bytes",
            setting="tenant_key",
        )
    mac = hmac.new(tenant_key, _identity_message(tenant_id, operation_key), "sha256")
    return base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode("ascii")


#: ``key_alphabet`` values: how the downstream key is spelled to the upstream.
KEY_ALPHABETS = ("base64url", "hex")


def spell_key(key: str, alphabet: str) -> str:
    """``key`` (base64url, as ``downstream_key`` returns it) in ``alphabet``: the same
    32 bytes as 64 lowercase hex digits for ``hex`` - an alphabet that never starts
    with ``-`` (a name an upstream parses as a command-line option) or ``_``."""
    if alphabet == "base64url":
        return key
    if alphabet == "hex":
        return base64.urlsafe_b64decode(key + "=" * (-len(key) % 4)).hex()
    raise ConfigurationError(f"unknown key alphabet {alphabet!r}", setting="key_alphabet")


def digest_hex(data: bytes) -> str:
    """Return the SHA-256 hex digest of ``data``."""
    return hashlib.sha256(data).hexdigest()


def operation_key_digest(tenant_id: str, operation_key: str) -> str:
    """Return a SHA-256 hex digest naming an operation in logs without revealing it."""
    return digest_hex(_identity_message(tenant_id, operation_key))


def validate_operation_key(key: str) -> str:
    """Return ``key`` if it is a usable operation_key, else raise InvalidRequestError."""
    if not isinstance(key, str):
        raise InvalidRequestError(
            f"operation_key must be a string, not {type(key).__name__}",
            field="operation_key",
        )
    if not 1 <= len(key) <= MAX_OPERATION_KEY_LENGTH:
        raise InvalidRequestError(
            f"operation_key must be 1 to {MAX_OPERATION_KEY_LENGTH} characters, "
            f"got {len(key)}",
            field="operation_key",
        )
    if key != key.strip():
        # "order:1" and "order:1 " would otherwise be two intents for one business
        # operation, which is exactly the duplicate the broker exists to prevent.
        raise InvalidRequestError(
            "operation_key must not start or end with whitespace", field="operation_key"
        )
    if not key.isprintable():
        # Rejects control characters (NUL would break the downstream key message),
        # invisible format characters and lone surrogates.
        raise InvalidRequestError(
            "operation_key must contain only printable characters", field="operation_key"
        )
    return key
