"""doctor's checks that need a ledger: the master key against stored payloads, key
retention against the retry horizon, and the operation-key lint."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from effect_broker.domain.master_keys import MasterKeys
from effect_broker.domain.records import EffectRequest
from effect_broker.services import diagnosis
from effect_broker.services.key_lint import (
    check_key_retention,
    check_operation_keys,
    key_shape,
    looks_random,
    names_an_operation,
)
from effect_broker.services.submission import submit

ARGS = {"order": "42", "amount_minor": 1999, "currency": "EUR"}


def put(tenant: Any, key: str, tool: str = "charge_card", **arguments: object) -> None:
    submit(
        tenant, EffectRequest(operation_key=key, tool=tool, arguments=arguments or ARGS)
    )


@pytest.mark.django_db
def test_master_key_check_fails_when_the_ledger_was_written_with_another_key(
    tenant: Any, settings: Any
) -> None:
    assert diagnosis.check_master_key().summary.startswith("configured; no effect")
    put(tenant, "order:42:charge")
    same = diagnosis.check_master_key()
    assert (same.status, same.summary) == (
        "ok",
        "matches the ledger (1 stored payload(s) decrypt)",
    )
    # Another key under the same id: the stored ciphertext does not authenticate.
    other_key = os.urandom(32)
    settings.EFFECT_BROKER_MASTER_KEY = other_key
    settings.EFFECT_BROKER_MASTER_KEYS = MasterKeys(entries=(("k1", other_key),))
    other = diagnosis.check_master_key()
    assert other.status == "fail"
    assert "written with a different master key" in other.summary
    assert other.details[0]["key_id"] == "k1"
    assert "failed authentication" in other.details[0]["error"]
    # A keyring that lost the key the ledger was written with names the missing id.
    settings.EFFECT_BROKER_MASTER_KEYS = MasterKeys(entries=(("k2", other_key),))
    lost = diagnosis.check_master_key()
    assert lost.status == "fail"
    assert "unknown payload key id 'k1'" in lost.details[0]["error"]
    settings.EFFECT_BROKER_MASTER_KEY = None
    assert diagnosis.check_master_key().status == "fail"


def _contracts(tmp_path: Path, retention: str) -> str:
    path = tmp_path / "contracts.toml"
    path.write_text(
        f"""
[[contract]]
name = "pay"
version = "1"
safety = "idempotent"
key_retention = "{retention}"
retry_limit = 10
backoff_initial = "1s"
backoff_max = "1m"
attempt_timeout = "10s"
""",
        encoding="utf-8",
    )
    return str(path)


def test_key_retention_warns_when_retries_could_outlive_the_key(
    tmp_path: Path, settings: Any
) -> None:
    # 10 attempts of up to 10s + backoffs 1+2+4+8+16+32+60*4 = 303s, plus recovery
    # (30+5+30+10) and the 60s margin: 548s with default timing.
    settings.EFFECT_BROKER_CONTRACTS = _contracts(tmp_path, "5m")
    short = check_key_retention()
    assert short.status == "warn"
    assert short.details[0]["retry_horizon_seconds"] == 548.0
    assert "pay@1: retries and recovery can take 548s" in short.summary
    assert "keeps keys for 300s" in short.summary
    settings.EFFECT_BROKER_CONTRACTS = _contracts(tmp_path, "10m")
    assert check_key_retention().status == "ok"


def test_random_key_and_key_shape_heuristics() -> None:
    assert looks_random(str(uuid.uuid4()))
    assert looks_random(f"charge:{uuid.uuid4().hex}")
    assert looks_random("k_Zt8fQ2mXvB7pL9sRw4yNcD")
    assert not looks_random("order:42:charge")
    # A business id next to a uuid is not noise-only.
    assert not looks_random(f"order:42:refund:{uuid.uuid4()}")
    assert not looks_random("invoice-2026-000123")
    assert key_shape("order:42:charge") == "order:#:charge"
    assert key_shape(f"order:{uuid.uuid4()}") == "order:<random>"
    assert names_an_operation("order:#:charge")
    assert not names_an_operation("order:#")
    assert not names_an_operation("#")


@pytest.mark.django_db
def test_operation_key_lint_finds_noise_repeats_and_keys_shared_by_tools(
    tenant: Any,
) -> None:
    put(tenant, "order:41:charge")
    put(tenant, "order:42:charge", order="42b")
    # Keys of two tools with one shape that names the operation are fine.
    put(tenant, "order:40:charge", tool="charge_card_unsafe", order="40")
    assert check_operation_keys(100).status == "ok"
    # A fresh uuid4 per call, twice for the same arguments ...
    put(tenant, str(uuid.uuid4()), order="7")
    put(tenant, str(uuid.uuid4()), order="7")
    # ... and keys that do not name their operation, for two tools.
    put(tenant, "order:43", order="43")
    put(tenant, "order:44", tool="charge_card_unsafe", order="44")
    found = check_operation_keys(100)
    assert found.status == "warn"
    by_kind = {f["finding"]: f for f in found.details}
    assert set(by_kind) == {
        "random_keys",
        "same_arguments_many_keys",
        "keys_shared_by_tools",
    }
    assert by_kind["random_keys"]["count"] == 2
    assert by_kind["same_arguments_many_keys"]["count"] == 2
    assert by_kind["keys_shared_by_tools"]["shapes"] == [
        {"shape": "order:#", "tools": ["charge_card", "charge_card_unsafe"]}
    ]
    # Only the newest effects are read.
    assert check_operation_keys(1).status == "ok"


def test_an_operators_fork_is_one_intent_continued_not_a_repeat(bench: Any) -> None:
    # Given an unsafe effect whose outcome is unknown, forked by an operator: the fork
    # carries the same arguments to a new key on purpose (issue 20: doctor warned)
    from effect_broker.domain.states import SafetyClass
    from effect_broker.services import forking
    from tests.integration.conftest import make_operator

    record = bench.unknown_outcome(SafetyClass.UNSAFE)
    forking.fork(
        bench.tenant,
        record.effect_id,
        operator=make_operator("olga"),
        new_operation_key=f"{record.operation_key}:v2",
        reason="absent from the target's export",
        evidence={"source": "target export", "checked_at": "2026-06-01T12:05:00+00:00"},
    )
    # When doctor lints the keys, then the fork is not "same arguments, many keys"
    # (the harness's keys are "op:<uuid4>", which the random-key finding rightly flags)
    findings = {f["finding"]: f for f in check_operation_keys(100).details}
    assert "same_arguments_many_keys" not in findings
    # But the same arguments under a third, unrelated key still are
    arguments = {"amount_minor": 100, "ref": record.operation_key}
    submit(
        bench.tenant,
        EffectRequest(
            operation_key="order:9:charge", tool=record.tool, arguments=arguments
        ),
    )
    findings = {f["finding"]: f for f in check_operation_keys(100).details}
    assert findings["same_arguments_many_keys"]["count"] == 3
