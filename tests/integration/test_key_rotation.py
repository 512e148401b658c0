"""Master-key rotation (issue 12, item 8): key ids on every ciphertext, a new current
key, old payloads still decrypt, and a re-encryption that moves them."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings

from effect_broker.domain.errors import DecryptionError
from effect_broker.domain.master_keys import MasterKeys, parse_keyring
from effect_broker.domain.payload_crypto import Keyring, decrypt, derive_payload_key
from effect_broker.domain.records import EffectRequest
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import EffectIntent, EffectReceipt
from effect_broker.services import key_rotation, runtime
from effect_broker.services.dispatch import dispatch
from effect_broker.services.payloads import load_arguments, result_aad
from effect_broker.services.submission import arguments_aad, submit
from tests.integration.engine.harness import TIMING, TOOLS, Bench

ROOT = Path(__file__).resolve().parents[2]


def charge(bench: Bench, key: str) -> EffectRequest:
    return EffectRequest(
        operation_key=key,
        tool=TOOLS[SafetyClass.IDEMPOTENT],
        arguments={"amount_minor": 100, "card": "4242"},
    )


@contextmanager
def engine_with(bench: Bench, keys: MasterKeys) -> Iterator[runtime.Runtime]:
    """The bench's engine, rebuilt as a process restarted with ``keys`` would be."""
    with override_settings(EFFECT_BROKER_MASTER_KEYS=keys):
        runtime.reset()
        with runtime.override(
            registry=bench.registry,
            clock=bench.clock,
            scheduler=bench.scheduler,
            adapter_for=lambda c: bench.adapters[c.safety],
            timing=TIMING,
        ) as rt:
            yield rt
    runtime.reset()


def test_after_a_rotation_new_payloads_use_the_new_key_and_old_ones_still_work(
    bench: Bench,
) -> None:
    rotated = settings.EFFECT_BROKER_MASTER_KEYS.rotated()
    old_id = rotated.entries[0][0]
    with engine_with(bench, MasterKeys(rotated.entries[:-1])):
        before = submit(bench.tenant, charge(bench, "order:1")).effect
    with engine_with(bench, rotated) as rt:
        assert rt.keyring.active_key_id == rotated.current_id
        after = submit(bench.tenant, charge(bench, "order:2")).effect
        stored = dict(
            EffectIntent.objects.filter(
                pk__in=[before.effect_id, after.effect_id]
            ).values_list("id", "arguments_key_id")
        )
        assert {str(k): v for k, v in stored.items()} == {
            before.effect_id: old_id,
            after.effect_id: rotated.current_id,
        }
        # The old payload still decrypts, a replay of it is a replay (the hashing
        # root did not change), and it dispatches.
        assert load_arguments(rt, before)["card"] == "4242"
        again = submit(bench.tenant, charge(bench, "order:1"))
        assert again.replayed
        assert dispatch(before.effect_id, worker="w1").status is EffectStatus.SUCCEEDED


def test_reencrypt_moves_every_argument_and_result_onto_the_current_key(
    bench: Bench,
) -> None:
    first = submit(bench.tenant, charge(bench, "order:3")).effect
    assert dispatch(first.effect_id, worker="w1").status is EffectStatus.SUCCEEDED
    keys = settings.EFFECT_BROKER_MASTER_KEYS.rotated()
    with engine_with(bench, keys) as rt:
        done = key_rotation.reencrypt(batch=1)
        assert done.arguments >= 1
        assert done.results >= 1
        assert {u.key_id for u in key_rotation.usage()} == {keys.current_id}
        assert key_rotation.reencrypt().arguments == 0  # nothing left to move
    # Only the new key's data key is needed now: the old one would not decrypt.
    only_new = Keyring(
        active_key_id=keys.current_id,
        keys={
            keys.current_id: derive_payload_key(
                keys.by_id[keys.current_id], keys.current_id
            )
        },
    )
    row = EffectIntent.objects.get(pk=first.effect_id)
    aad = arguments_aad(first.tenant_id, first.operation_key)
    assert b"4242" in decrypt(
        only_new, row.arguments_key_id, row.arguments_ciphertext, aad=aad
    )
    receipt = EffectReceipt.objects.get(effect_id=first.effect_id)
    decrypt(
        only_new,
        receipt.result_key_id,
        receipt.result_ciphertext,
        aad=result_aad(first.tenant_id, first.operation_key),
    )
    old_keyring = Keyring.from_master_key(keys.hash_root)
    with pytest.raises(DecryptionError):
        decrypt(old_keyring, row.arguments_key_id, row.arguments_ciphertext, aad=aad)
    assert rt.keyring.active_key_id == keys.current_id


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_BROKER_")}
    return subprocess.run(
        [sys.executable, "-m", "effect_broker.cli", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_keys_rotate_appends_a_current_key_to_the_file_and_keeps_the_old_one(
    tmp_path: Path,
) -> None:
    key_file = tmp_path / "master.key"
    key_file.write_text(base64.b64encode(b"x" * 32).decode())
    result = run_cli(
        "keys", "rotate", env={"EFFECT_BROKER_MASTER_KEY_FILE": str(key_file)}
    )
    assert result.returncode == 0, result.stderr
    assert "new current key k2" in result.stdout
    keys = parse_keyring(key_file.read_text(), source="test")
    assert [k for k, _ in keys.entries] == ["k1", "k2"]
    assert keys.by_id["k1"] == b"x" * 32
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_keys_rotate_refuses_an_inline_key_in_one_line() -> None:
    result = run_cli(
        "keys",
        "rotate",
        env={"EFFECT_BROKER_MASTER_KEY": base64.b64encode(b"y" * 32).decode()},
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "EFFECT_BROKER_MASTER_KEY_FILE" in lines[0]
    assert "Traceback" not in result.stderr
