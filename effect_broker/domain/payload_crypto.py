"""AES-GCM encryption of stored payloads, and redacted previews.

Spec "Durability and consistency mechanics": encrypted payloads use AES-GCM with a key
ID; the master key comes from the environment or a mounted secret (KMS envelope
encryption is later work). Spec "Data model": an intent stores encrypted canonical
arguments plus a non-sensitive redacted preview.

A blob is ``nonce (12 bytes) || ciphertext+tag``. Callers bind a blob to its row by
passing that row's identity as ``aad`` (for example ``b"effect_intents/<effect_id>"``),
so a ciphertext copied onto another row does not decrypt.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from effect_broker.domain.canonical import MAX_SAFE_INTEGER
from effect_broker.domain.errors import ConfigurationError, DecryptionError
from effect_broker.domain.keys import MASTER_KEY_BYTES
from effect_broker.domain.secret_refs import is_well_formed_ref

NONCE_BYTES = 12
"""AES-GCM nonce length (96 bits, random per encryption)."""

DATA_KEY_BYTES = 32
"""AES-256 data-encryption key length."""

PAYLOAD_KEY_INFO_PREFIX = b"effect-broker/payload/v1\0"
"""HKDF ``info`` prefix for payload data-encryption keys; the key id follows it."""

REDACTED = "<redacted>"
"""Placeholder for every preview value that is not explicitly allowed."""

MAX_PREVIEW_STRING = 64
"""Longest string value a preview keeps, in characters."""

_TAG_BYTES = 16


def derive_payload_key(master_key: bytes, key_id: str) -> bytes:
    """Derive the 32-byte data-encryption key ``key_id`` from the master key (HKDF)."""
    if not isinstance(master_key, bytes) or len(master_key) != MASTER_KEY_BYTES:
        raise ConfigurationError(
            f"master key must be exactly {MASTER_KEY_BYTES} bytes", setting="master_key"
        )
    return HKDF(
        algorithm=hashes.SHA256(),
        length=DATA_KEY_BYTES,
        salt=None,
        info=PAYLOAD_KEY_INFO_PREFIX + key_id.encode("utf-8"),
    ).derive(master_key)


@dataclass(frozen=True)
class Keyring:
    """Data keys by id: new blobs use ``active_key_id``; older ids still decrypt."""

    active_key_id: str
    # repr=False: a keyring in a traceback or log line must not print key bytes.
    keys: Mapping[str, bytes] = field(repr=False)

    def __post_init__(self) -> None:
        keys = MappingProxyType(dict(self.keys))
        if self.active_key_id not in keys:
            raise ConfigurationError(
                f"active payload key {self.active_key_id!r} is not in the keyring",
                setting="payload_keys",
            )
        for key_id, key in keys.items():
            if not isinstance(key, bytes) or len(key) != DATA_KEY_BYTES:
                raise ConfigurationError(
                    f"payload key {key_id!r} must be exactly {DATA_KEY_BYTES} bytes",
                    setting="payload_keys",
                )
        object.__setattr__(self, "keys", keys)

    @classmethod
    def from_master_key(cls, master_key: bytes, key_id: str = "k1") -> Keyring:
        """Build a one-key keyring whose key is derived from the master key."""
        return cls(
            active_key_id=key_id, keys={key_id: derive_payload_key(master_key, key_id)}
        )


def encrypt(keyring: Keyring, plaintext: bytes, *, aad: bytes) -> tuple[str, bytes]:
    """Encrypt with the active key; return ``(key_id, nonce + ciphertext)``."""
    # A random 96-bit nonce per blob: keys are never used for 2**32 messages in the
    # MVP, so the birthday bound on nonce reuse is not a practical concern.
    nonce = os.urandom(NONCE_BYTES)
    key = keyring.keys[keyring.active_key_id]
    return keyring.active_key_id, nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def decrypt(
    keyring: Keyring, key_id: str, blob: bytes | bytearray | memoryview, *, aad: bytes
) -> bytes:
    """Decrypt a blob from ``encrypt``; raise DecryptionError if it cannot be trusted."""
    key = keyring.keys.get(key_id)
    if key is None:
        raise DecryptionError(f"unknown payload key id {key_id!r}", key_id=key_id)
    data = bytes(blob)  # the database driver may hand back a memoryview
    if len(data) < NONCE_BYTES + _TAG_BYTES:
        raise DecryptionError("encrypted payload is truncated", key_id=key_id)
    try:
        return AESGCM(key).decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], aad)
    except InvalidTag as exc:
        raise DecryptionError(
            "encrypted payload failed authentication (tampered, or wrong key or aad)",
            key_id=key_id,
        ) from exc


def _is_previewable(value: object) -> bool:
    if is_well_formed_ref(value):
        return True  # a reference names a secret and holds none (domain/secret_refs)
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return abs(value) <= MAX_SAFE_INTEGER
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return len(value) <= MAX_PREVIEW_STRING
    return False


#: The preview member that counts the arguments it does not show. ``$`` cannot start
#: a contract's preview field (domain/contracts.py), so it never collides with one.
HIDDEN_FIELDS = "$hidden_fields"


def redacted_preview(
    arguments: Mapping[str, object], allowed_fields: Collection[str]
) -> dict[str, object]:
    """Return the contract-allowed top-level arguments, each value shown only if it is
    a short scalar, and the number of other arguments under ``HIDDEN_FIELDS``.

    Allow-list, not deny-list: a new argument added by a caller is hidden until a
    contract names it (spec "Data model": the preview must be non-sensitive). Names
    are hidden too, not only values: a key can itself be the secret (issue 12 found
    ``{"4111111111111111": "x"}`` in a preview). Only the count is shown, so the
    preview's size is bounded by the contract, not by the caller.
    """
    allowed = frozenset(allowed_fields)
    preview: dict[str, object] = {}
    hidden = 0
    for key, value in arguments.items():
        if key in allowed:
            preview[str(key)] = value if _is_previewable(value) else REDACTED
        else:
            hidden += 1
    if hidden:
        preview[HIDDEN_FIELDS] = hidden
    return preview
