"""A tenant's answers name no server path (issue 19, item 12): the secrets folder's
absolute path reached tenants through ``/history``, and a broken contracts file was a
500 carrying the file's path. The operator's log keeps both paths."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from effect_broker.domain.contracts import parse_contracts
from effect_broker.domain.states import EffectStatus
from effect_broker.models import EffectIntent
from effect_broker.services import runtime
from effect_broker.services.dispatch import dispatch
from effect_broker.services.secrets import SecretSource
from effect_broker.services.tenants import create_tenant
from tests.integration.engine.harness import CONTRACTS, Bench

#: An absolute POSIX path of two segments or more, as a leak would show one.
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/[\w.-]+/[\w.-]+")


def post(key: str, body: dict[str, Any]):  # type: ignore[no-untyped-def]
    return Client().post(
        "/v1/effects",
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


def test_history_of_a_missing_file_secret_names_no_server_path(
    bench: Bench, tmp_path: Path
) -> None:
    # Given a contract declaring file:card-token and a secrets folder without it
    declared = CONTRACTS.replace(
        "[[contract]]\n", '[[contract]]\nsecrets = ["file:card-token"]\n'
    )
    registry = parse_contracts(declared, source="paths")
    tenant, key = create_tenant("paths")
    secrets_dir = tmp_path / "secrets-folder"
    (secrets_dir / str(tenant.id)).mkdir(parents=True)
    with runtime.override(registry=registry, secrets=SecretSource(directory=secrets_dir)):
        created = post(
            key,
            {
                "operation_key": "order:1:v1",
                "tool": "unsafe_charge",
                "arguments": {"order": "1", "token": {"$secret": "file:card-token"}},
            },
        )
        assert created.status_code == 202, created.content
        effect_id = created.json()["effect_id"]
        # When the worker cannot read it and the tenant reads the effect's history
        assert dispatch(effect_id, worker="w1").status is EffectStatus.FAILED_FINAL
        history = Client().get(
            f"/v1/effects/{effect_id}/history",
            headers={"Authorization": f"Bearer {key}"},
        )
    # Then the reason names the reference and no path of the server's
    assert history.status_code == 200
    text = history.content.decode()
    assert "secret file:card-token is unavailable" in text
    assert str(secrets_dir) not in text
    assert ABSOLUTE_PATH.findall(text) == []


def test_a_broken_contracts_file_is_a_503_naming_no_path(
    db: None, settings: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a contracts file that does not load
    broken = tmp_path / "deploy" / "contracts.toml"
    broken.parent.mkdir()
    broken.write_text('[[contract]]\nname = "pay"\nversion = "1"\nsafety = "idem"\n')
    settings.EFFECT_BROKER_CONTRACTS = str(broken)
    key = create_tenant("broken-contracts")[1]
    runtime.reset()
    try:
        # When a tenant submits
        response = post(
            key, {"operation_key": "order:2:v1", "tool": "charge_card", "arguments": {}}
        )
    finally:
        runtime.reset()
    # Then it is a 503 problem that names no path, and nothing was written
    assert response.status_code == 503
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["code"] == "contracts_unavailable"
    assert body["detail"] == (
        "The broker cannot load its contracts right now; nothing was done. Try again "
        "later with the same operation key; the operator's log names the problem."
    )
    assert str(tmp_path) not in response.content.decode()
    assert ABSOLUTE_PATH.findall(response.content.decode()) == []
    assert EffectIntent.objects.count() == 0
    # And the operator's log has the file and the field
    assert any(
        str(broken) in record.getMessage() and "safety" in record.getMessage()
        for record in caplog.records
        if record.levelno >= logging.ERROR
    )
