"""The master keyring file (domain/master_keys.py)."""

from __future__ import annotations

import base64

import pytest

from effect_broker.domain.errors import ConfigurationError
from effect_broker.domain.master_keys import MasterKeys, parse_keyring

A = base64.b64encode(b"a" * 32).decode()
B = base64.b64encode(b"b" * 32).decode()


def test_one_bare_key_is_the_keyring_k1_as_before_rotation_existed() -> None:
    keys = parse_keyring(A + "\n", source="f")
    assert keys.entries == (("k1", b"a" * 32),)
    assert keys.current_id == "k1"


def test_the_last_key_is_current_and_the_first_is_the_hashing_root() -> None:
    keys = parse_keyring(f"# comment\nk1 {A}\n\nk2 {B}\n", source="f")
    assert keys.current_id == "k2"
    assert keys.hash_root == b"a" * 32
    assert keys.by_id == {"k1": b"a" * 32, "k2": b"b" * 32}


def test_rotating_appends_a_fresh_current_key_and_keeps_the_others() -> None:
    keys = parse_keyring(f"k1 {A}\nk2 {B}", source="f").rotated()
    assert [key_id for key_id, _ in keys.entries] == ["k1", "k2", "k3"]
    assert keys.entries[:2] == ((("k1", b"a" * 32)), ("k2", b"b" * 32))
    assert len(keys.by_id["k3"]) == 32
    assert keys.by_id["k3"] not in (b"a" * 32, b"b" * 32)
    assert parse_keyring(keys.to_text(), source="f") == keys


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"key1 {A}", "an id like k1"),
        (f"k1 {A}\nk1 {B}", "twice"),
        ("k1 not-base64!", "not valid base64"),
        (f"k1 {base64.b64encode(b'short').decode()}", "32 bytes"),
        ("# only a comment", "at least one key"),
    ],
)
def test_a_bad_keyring_is_refused_with_a_line_to_fix(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_keyring(text, source="keys.txt")


def test_an_empty_keyring_cannot_be_built() -> None:
    with pytest.raises(ConfigurationError):
        MasterKeys(())
