"""Request hashes and downstream keys (spec "Operation identity and payload binding")."""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from effect_broker.domain.canonical import MAX_SAFE_INTEGER, canonical_json
from effect_broker.domain.errors import ConfigurationError, InvalidRequestError
from effect_broker.domain.keys import (
    REQUEST_HASH_INFO_PREFIX,
    derive_request_hash_key,
    derive_tenant_hmac_key,
    digest_hex,
    downstream_key,
    keyed_request_hash,
    keyed_request_hash_of,
    operation_key_digest,
    request_document_of,
    request_hash,
    validate_operation_key,
)

MASTER = bytes(range(32))
TENANT = "00000000-0000-4000-8000-000000000001"
OTHER_TENANT = "00000000-0000-4000-8000-000000000002"
OP_KEY = "order:ord_123:charge:v1"
ARGS = {"amount": 1000, "currency": "EUR"}

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
    | st.text(max_size=10)
)
json_args = st.dictionaries(
    st.text(max_size=8),
    st.recursive(
        json_scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner),
        max_leaves=8,
    ),
    max_size=5,
)
operation_keys = st.text(
    alphabet=st.characters(codec="utf-8", categories=["L", "N", "P", "S"]),
    min_size=1,
    max_size=200,
)


def _hash(**overrides: Any) -> bytes:
    fields: dict[str, Any] = {
        "tool": "charge_card",
        "arguments": ARGS,
        "contract_name": "payments.charge",
        "contract_version": "1",
    }
    fields.update(overrides)
    return request_hash(**fields)


# --- request_hash -----------------------------------------------------------------------


def test_given_known_request_then_hash_is_sha256_of_the_canonical_document() -> None:
    document = (
        b'{"arguments":{"amount":1000,"currency":"EUR"},"contract_name":"payments.charge",'
        b'"contract_version":"1","tool":"charge_card"}'
    )
    assert _hash() == hashlib.sha256(document).digest()
    assert _hash().hex() == (
        "1498613a729c951ad1c0820f1dfb23b5006f39fa68505033c5c615eac87af6e9"
    )
    assert len(_hash()) == 32


@pytest.mark.parametrize(
    "change",
    [
        {"tool": "refund_card"},
        {"arguments": {"amount": 1001, "currency": "EUR"}},
        {"arguments": {"amount": 1000, "currency": "EUR", "note": None}},
        {"contract_name": "payments.charge2"},
        {"contract_version": "2"},
    ],
    ids=["tool", "argument value", "extra argument", "contract name", "contract version"],
)
def test_given_any_bound_field_changes_then_request_hash_changes(
    change: dict[str, Any],
) -> None:
    assert _hash(**change) != _hash()


def test_given_reordered_argument_keys_then_request_hash_is_the_same() -> None:
    assert _hash(arguments={"currency": "EUR", "amount": 1000}) == _hash()
    assert _hash(arguments={"amount": 1000.0, "currency": "EUR"}) == _hash()


@given(first=json_args, second=json_args)
def test_given_payload_drift_then_request_hash_differs(
    first: dict[str, Any], second: dict[str, Any]
) -> None:
    assume(canonical_json(first) != canonical_json(second))
    assert _hash(arguments=first) != _hash(arguments=second)


@given(args=json_args)
def test_given_same_canonical_arguments_then_request_hash_is_stable(
    args: dict[str, Any],
) -> None:
    reordered = dict(reversed(list(args.items())))
    assert _hash(arguments=reordered) == _hash(arguments=args)


# --- keyed request hash (issue 9, defect 10) -------------------------------------------


def _keyed(tenant: str = TENANT, master: bytes = MASTER, **overrides: Any) -> bytes:
    fields: dict[str, Any] = {
        "tool": "charge_card",
        "arguments": ARGS,
        "contract_name": "payments.charge",
        "contract_version": "1",
    }
    fields.update(overrides)
    return keyed_request_hash(derive_request_hash_key(master, tenant), **fields)


def test_given_a_tenant_then_the_request_hash_key_is_hkdf_with_its_own_label() -> None:
    expected = _hkdf_sha256(MASTER, REQUEST_HASH_INFO_PREFIX + TENANT.encode())
    assert derive_request_hash_key(MASTER, TENANT) == expected
    assert REQUEST_HASH_INFO_PREFIX != b"effect-broker/tenant-hmac/v1\0"
    # Never the downstream-key HMAC key, whatever the key id is called.
    assert derive_request_hash_key(MASTER, "h1") != derive_tenant_hmac_key(MASTER, "h1")


def test_given_known_request_then_keyed_hash_is_hmac_of_the_canonical_document() -> None:
    document = (
        b'{"arguments":{"amount":1000,"currency":"EUR"},"contract_name":"payments.charge",'
        b'"contract_version":"1","tool":"charge_card"}'
    )
    key = derive_request_hash_key(MASTER, TENANT)
    assert _keyed() == hmac.new(key, document, "sha256").digest()
    assert _keyed() != hashlib.sha256(document).digest()
    assert len(_keyed()) == 32


# Floats and non-ASCII keys too: those documents are written by rfc8785, not json.dumps.
documents_args = st.dictionaries(
    st.text(max_size=8),
    st.recursive(
        json_scalars
        | st.floats(
            min_value=-MAX_SAFE_INTEGER,
            max_value=MAX_SAFE_INTEGER,
            allow_nan=False,
            allow_infinity=False,
        ),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner),
        max_leaves=8,
    ),
    max_size=5,
)


@given(documents_args, st.text(max_size=12), st.text(max_size=12), st.text(max_size=12))
def test_given_canonical_arguments_then_the_assembled_document_is_the_canonical_one(
    arguments: dict[str, Any], tool: str, name: str, version: str
) -> None:
    # A submit canonicalises its arguments once and builds the hashed document around
    # those bytes (issue 25, item 3): they must be the bytes of the whole document,
    # or every stored request hash would stop matching its replays.
    whole = canonical_json(
        {
            "tool": tool,
            "arguments": arguments,
            "contract_name": name,
            "contract_version": version,
        }
    )
    canonical_arguments = canonical_json(arguments)
    assembled = request_document_of(
        tool=tool,
        canonical_arguments=canonical_arguments,
        contract_name=name,
        contract_version=version,
    )
    assert assembled == whole
    key = derive_request_hash_key(MASTER, TENANT)
    assert (
        keyed_request_hash_of(
            key,
            tool=tool,
            canonical_arguments=canonical_arguments,
            contract_name=name,
            contract_version=version,
        )
        == hmac.new(key, whole, "sha256").digest()
    )


def test_given_the_same_payload_in_two_tenants_then_keyed_hashes_differ() -> None:
    assert _keyed(TENANT) != _keyed(OTHER_TENANT)


def test_given_another_master_key_then_the_keyed_hash_differs() -> None:
    assert _keyed(master=bytes(32)) != _keyed()


@pytest.mark.parametrize(
    "change",
    [
        {"tool": "refund_card"},
        {"arguments": {"amount": 1001, "currency": "EUR"}},
        {"contract_name": "payments.charge2"},
        {"contract_version": "2"},
    ],
    ids=["tool", "argument value", "contract name", "contract version"],
)
def test_given_any_bound_field_changes_then_keyed_hash_changes(
    change: dict[str, Any],
) -> None:
    assert _keyed(**change) != _keyed()
    assert _keyed(arguments={"currency": "EUR", "amount": 1000}) == _keyed()


@pytest.mark.parametrize("key", [b"", b"short", "a" * 32], ids=["empty", "short", "str"])
def test_given_a_bad_request_hash_key_then_configuration_error(key: Any) -> None:
    with pytest.raises(ConfigurationError):
        keyed_request_hash(
            key, tool="t", arguments={}, contract_name="c", contract_version="1"
        )


# --- tenant keys ------------------------------------------------------------------------


def _hkdf_sha256(master: bytes, info: bytes, length: int = 32) -> bytes:
    """RFC 5869 written out with hmac, as an independent check of the derivation."""
    prk = hmac.new(bytes(32), master, "sha256").digest()  # salt None = HashLen zeros
    okm, block = b"", b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([counter]), "sha256").digest()
        okm += block
    return okm[:length]


def test_given_master_key_then_tenant_key_is_hkdf_with_the_versioned_info() -> None:
    derived = derive_tenant_hmac_key(MASTER, "h1")
    assert derived == _hkdf_sha256(MASTER, b"effect-broker/tenant-hmac/v1\0h1")
    assert len(derived) == 32


def test_given_different_hmac_key_ids_then_tenant_keys_differ() -> None:
    assert derive_tenant_hmac_key(MASTER, "h1") != derive_tenant_hmac_key(MASTER, "h2")


@pytest.mark.parametrize("master", [b"", bytes(31), bytes(33), "0" * 32])
def test_given_master_key_not_32_bytes_then_configuration_error(master: Any) -> None:
    with pytest.raises(ConfigurationError) as caught:
        derive_tenant_hmac_key(master, "h1")
    assert str(caught.value) == "master key must be exactly 32 bytes"


# --- downstream_key ---------------------------------------------------------------------


def test_given_known_inputs_then_downstream_key_matches_the_vector() -> None:
    assert downstream_key(MASTER, TENANT, OP_KEY) == (
        "_foHbhNsP0qS1NHkvtJLBP78ospQ1YqJmqKLNjSUisE"
    )
    tenant_key = derive_tenant_hmac_key(MASTER, "h1")
    assert downstream_key(tenant_key, TENANT, OP_KEY) == (
        "NDxviRtNefGDAwDRh0A8-uZVv59K9vGucT_P2d_Pc6c"
    )


@given(tenant_id=st.uuids().map(str), op_key=operation_keys)
def test_given_any_operation_then_downstream_key_is_stable_urlsafe_and_unpadded(
    tenant_id: str, op_key: str
) -> None:
    key = downstream_key(MASTER, tenant_id, op_key)
    assert key == downstream_key(MASTER, tenant_id, op_key)
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", key)


@given(op_key=operation_keys)
def test_given_same_operation_key_in_two_tenants_then_downstream_keys_differ(
    op_key: str,
) -> None:
    assert downstream_key(MASTER, TENANT, op_key) != downstream_key(
        MASTER, OTHER_TENANT, op_key
    )


@given(first=operation_keys, second=operation_keys)
def test_given_two_operation_keys_then_downstream_keys_differ(
    first: str, second: str
) -> None:
    assume(first != second)
    assert downstream_key(MASTER, TENANT, first) != downstream_key(MASTER, TENANT, second)


def test_given_rotated_hmac_key_id_then_downstream_key_differs() -> None:
    first = downstream_key(derive_tenant_hmac_key(MASTER, "h1"), TENANT, OP_KEY)
    second = downstream_key(derive_tenant_hmac_key(MASTER, "h2"), TENANT, OP_KEY)
    assert first != second


def test_given_nul_in_identity_then_downstream_key_is_refused() -> None:
    # ("a\0b", "c") and ("a", "b\0c") would otherwise hash the same message.
    with pytest.raises(InvalidRequestError):
        downstream_key(MASTER, "a\0b", "c")
    with pytest.raises(InvalidRequestError):
        downstream_key(MASTER, "a", "b\0c")


@pytest.mark.parametrize("tenant_key", [b"", b"short", bytes(31)])
def test_given_short_tenant_key_then_configuration_error(tenant_key: bytes) -> None:
    with pytest.raises(ConfigurationError) as caught:
        downstream_key(tenant_key, TENANT, OP_KEY)
    assert str(caught.value) == "tenant HMAC key must be at least 32 bytes"


# --- digests ----------------------------------------------------------------------------


def test_given_data_then_digest_hex_is_sha256_hex() -> None:
    assert digest_hex(b"abc") == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )


def test_given_operation_then_log_digest_hides_the_key_but_is_stable() -> None:
    digest = operation_key_digest(TENANT, OP_KEY)
    assert digest == hashlib.sha256(f"{TENANT}\0{OP_KEY}".encode()).hexdigest()
    assert OP_KEY not in digest
    assert digest != operation_key_digest(OTHER_TENANT, OP_KEY)


# --- operation_key validation -----------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "order:ord_123:charge:v1",
        "ticket:t_456:send-resolution-email:v1",
        "agent-run:run_789:step:refund_03",
        "x",
        "k" * 255,  # the Idempotency-Key draft's bound (issue 21)
        "bestellung:Zoë:1 2",
    ],
)
def test_given_good_operation_key_then_it_is_returned(key: str) -> None:
    assert validate_operation_key(key) == key


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "operation_key must be 1 to 255 characters, got 0"),
        ("k" * 256, "operation_key must be 1 to 255 characters, got 256"),
        (" order:1", "operation_key must not start or end with whitespace"),
        ("order:1 ", "operation_key must not start or end with whitespace"),
        ("order:1\n", "operation_key must not start or end with whitespace"),
        ("order\n1", "operation_key must contain only printable characters"),
        ("order\x001", "operation_key must contain only printable characters"),
        ("order\x7f1", "operation_key must contain only printable characters"),
        ("order\u200b1", "operation_key must contain only printable characters"),
        ("order\ud8001", "operation_key must contain only printable characters"),
        (123, "operation_key must be a string, not int"),
        (None, "operation_key must be a string, not NoneType"),
    ],
)
def test_given_bad_operation_key_then_invalid_request(key: Any, message: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        validate_operation_key(key)
    assert str(caught.value) == message
    assert caught.value.details == {"field": "operation_key"}
