"""AES-GCM payload encryption and redacted previews (spec "Data model", "Durability")."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from effect_broker.domain.errors import ConfigurationError, DecryptionError
from effect_broker.domain.payload_crypto import (
    HIDDEN_FIELDS,
    REDACTED,
    Keyring,
    decrypt,
    derive_payload_key,
    encrypt,
    redacted_preview,
)

MASTER = bytes(range(32))
AAD = b"effect_intents/4b0f6f0e-0000-4000-8000-000000000001"
KEYRING = Keyring.from_master_key(MASTER)


@given(plaintext=st.binary(max_size=512), aad=st.binary(max_size=64))
def test_given_plaintext_when_encrypted_then_it_decrypts_back(
    plaintext: bytes, aad: bytes
) -> None:
    key_id, blob = encrypt(KEYRING, plaintext, aad=aad)
    assert key_id == "k1"
    assert len(blob) == 12 + len(plaintext) + 16
    assert decrypt(KEYRING, key_id, blob, aad=aad) == plaintext


def test_given_same_plaintext_twice_then_nonces_and_blobs_differ() -> None:
    _, first = encrypt(KEYRING, b"same", aad=AAD)
    _, second = encrypt(KEYRING, b"same", aad=AAD)
    assert first[:12] != second[:12]
    assert first != second


def test_given_plaintext_then_it_does_not_appear_in_the_blob() -> None:
    secret = b'{"card":"4111111111111111"}'
    _, blob = encrypt(KEYRING, secret, aad=AAD)
    assert secret not in blob
    assert b"4111111111111111" not in blob


@given(data=st.data())
def test_given_any_byte_flipped_then_decryption_error(data: st.DataObject) -> None:
    key_id, blob = encrypt(KEYRING, b'{"amount":1000}', aad=AAD)
    index = data.draw(st.integers(min_value=0, max_value=len(blob) - 1))
    flip = data.draw(st.integers(min_value=1, max_value=255))
    tampered = blob[:index] + bytes([blob[index] ^ flip]) + blob[index + 1 :]
    with pytest.raises(DecryptionError) as caught:
        decrypt(KEYRING, key_id, tampered, aad=AAD)
    assert str(caught.value) == (
        "encrypted payload failed authentication (tampered, or wrong key or aad)"
    )


def test_given_blob_moved_to_another_row_then_wrong_aad_fails() -> None:
    key_id, blob = encrypt(KEYRING, b"payload", aad=AAD)
    with pytest.raises(DecryptionError):
        decrypt(KEYRING, key_id, blob, aad=b"effect_intents/another-effect")


def test_given_unknown_key_id_then_decryption_error_names_it() -> None:
    _, blob = encrypt(KEYRING, b"payload", aad=AAD)
    with pytest.raises(DecryptionError) as caught:
        decrypt(KEYRING, "k9", blob, aad=AAD)
    assert str(caught.value) == "unknown payload key id 'k9'"
    assert caught.value.details == {"key_id": "k9"}


@pytest.mark.parametrize("blob", [b"", bytes(12), bytes(27)])
def test_given_truncated_blob_then_decryption_error(blob: bytes) -> None:
    with pytest.raises(DecryptionError) as caught:
        decrypt(KEYRING, "k1", blob, aad=AAD)
    assert str(caught.value) == "encrypted payload is truncated"


def test_given_memoryview_from_the_driver_then_it_decrypts() -> None:
    key_id, blob = encrypt(KEYRING, b"payload", aad=AAD)
    assert decrypt(KEYRING, key_id, memoryview(blob), aad=AAD) == b"payload"


def test_given_rotated_keyring_then_old_blobs_decrypt_and_new_blobs_use_new_key() -> None:
    old_id, old_blob = encrypt(KEYRING, b"old", aad=AAD)
    rotated = Keyring(
        active_key_id="k2",
        keys={
            "k1": derive_payload_key(MASTER, "k1"),
            "k2": derive_payload_key(MASTER, "k2"),
        },
    )
    assert decrypt(rotated, old_id, old_blob, aad=AAD) == b"old"
    new_id, new_blob = encrypt(rotated, b"new", aad=AAD)
    assert new_id == "k2"
    with pytest.raises(DecryptionError):
        decrypt(KEYRING, new_id, new_blob, aad=AAD)


def test_given_master_key_then_payload_keys_are_deterministic_and_per_id() -> None:
    assert Keyring.from_master_key(MASTER).keys == KEYRING.keys
    assert derive_payload_key(MASTER, "k1") != derive_payload_key(MASTER, "k2")
    assert derive_payload_key(MASTER, "k1") != derive_payload_key(bytes(32), "k1")


def test_given_keyring_then_repr_never_shows_key_bytes() -> None:
    key = KEYRING.keys["k1"]
    assert repr(KEYRING) == "Keyring(active_key_id='k1')"
    assert key.hex() not in repr(KEYRING)
    assert repr(key) not in repr(KEYRING)


def test_given_keyring_then_keys_cannot_be_mutated() -> None:
    with pytest.raises(TypeError):
        KEYRING.keys["k2"] = bytes(32)  # type: ignore[index]


@pytest.mark.parametrize(
    ("active", "keys", "message"),
    [
        ("k2", {"k1": bytes(32)}, "active payload key 'k2' is not in the keyring"),
        ("k1", {"k1": bytes(16)}, "payload key 'k1' must be exactly 32 bytes"),
    ],
)
def test_given_bad_keyring_then_configuration_error(
    active: str, keys: dict[str, bytes], message: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Keyring(active_key_id=active, keys=keys)
    assert str(caught.value) == message


def test_given_short_master_key_then_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        Keyring.from_master_key(bytes(16))


# --- redacted preview -------------------------------------------------------------------


def test_given_allowed_scalars_then_they_are_kept_and_the_rest_only_counted() -> None:
    arguments = {
        "amount": 1000,
        "currency": "EUR",
        "card_number": "4111111111111111",
        "metadata": {"amount": 5},
        "captured": True,
        "note": None,
    }
    preview = redacted_preview(arguments, ["amount", "currency", "metadata", "note"])
    assert preview == {
        "amount": 1000,
        "currency": "EUR",
        "metadata": REDACTED,  # nested objects are never shown, even when listed
        "note": None,
        HIDDEN_FIELDS: 2,  # card_number and captured: not even their names
    }


def test_given_a_secret_as_a_key_name_then_the_name_is_not_shown() -> None:
    # Issue 12: {"4111111111111111": "x"} appeared in the preview by name.
    preview = redacted_preview({"4111111111111111": "x", "order": "42"}, ["order"])
    assert preview == {"order": "42", HIDDEN_FIELDS: 1}
    assert "4111111111111111" not in repr(preview)


def test_given_nothing_hidden_then_there_is_no_count() -> None:
    assert redacted_preview({"order": "42"}, ["order"]) == {"order": "42"}


@pytest.mark.parametrize(
    "value",
    ["x" * 65, [1, 2], {"a": 1}, float("nan"), 2**60, b"raw"],
    ids=["long string", "list", "object", "nan", "big int", "bytes"],
)
def test_given_allowed_field_with_non_previewable_value_then_redacted(value: Any) -> None:
    assert redacted_preview({"field": value}, ["field"]) == {"field": REDACTED}


def test_given_64_character_string_then_it_is_still_shown() -> None:
    assert redacted_preview({"memo": "m" * 64}, {"memo"}) == {"memo": "m" * 64}


json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner),
    max_leaves=6,
)


@given(
    arguments=st.dictionaries(st.text(max_size=6), json_value, max_size=8),
    allowed=st.frozensets(st.text(max_size=6), max_size=4),
)
def test_given_any_arguments_then_preview_never_leaks_unlisted_values(
    arguments: dict[str, Any], allowed: frozenset[str]
) -> None:
    preview = redacted_preview(arguments, allowed)
    shown_keys = set(preview) - {HIDDEN_FIELDS}
    assert shown_keys == set(arguments) & allowed
    assert preview.get(HIDDEN_FIELDS, 0) == len(set(arguments) - allowed)
    for key in shown_keys:
        shown = preview[key]
        if shown != REDACTED:
            assert shown is arguments[key]
            assert not isinstance(shown, dict | list)
