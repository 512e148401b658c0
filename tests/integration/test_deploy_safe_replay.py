"""Issue 9, defect 6 "A retry after a contract deploy is told to use a new operation
key": the same key and arguments replay the existing effect under its pinned contract
version after a newer one is deployed, and no conflict ever advises a new key (the one
action that would double-charge); it says to inspect the existing effect."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.test import Client

from effect_broker.domain.contracts import parse_contracts
from effect_broker.domain.errors import (
    ERROR_CODES,
    PayloadConflictError,
    UnknownContractError,
)
from effect_broker.domain.records import EffectRequest
from effect_broker.models import EffectEvent, EffectIntent
from effect_broker.services import runtime
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant

ARGS = {"order": "42", "amount_minor": 1999, "currency": "EUR"}

V1 = """
[[contract]]
name = "payments.charge"
version = "1"
tool = "charge_card"
safety = "idempotent"
key_retention = "24h"
active = {v1_active}
"""

V2 = """
[[contract]]
name = "payments.charge"
version = "2"
tool = "charge_card"
safety = "idempotent"
key_retention = "12h"
"""

#: v2 deployed, v1 still known (pinned effects keep their semantics).
V2_DEPLOYED = parse_contracts(V1.format(v1_active="false") + V2, source="v2")
#: v2 deployed and v1 gone from the contracts file.
V1_RETIRED = parse_contracts(V2, source="v1-retired")

_NEW_KEY_ADVICE = re.compile(
    r"(new|different|fresh|another)\s+(operation[ _])?key", re.IGNORECASE
)


def charge(**changes: object) -> EffectRequest:
    return EffectRequest(
        operation_key="order:42:charge:v1",
        tool="charge_card",
        arguments={**ARGS, **changes},
    )


@pytest.mark.django_db
def test_after_a_deploy_the_same_call_replays_under_the_pinned_version(
    tenant, fresh_runtime
) -> None:
    # Given an effect pinned to payments.charge v1
    first = submit(tenant, charge())
    # When v2 is deployed and the caller retries the same call
    with runtime.override(registry=V2_DEPLOYED):
        again = submit(tenant, charge())
    # Then it is a replay of the same effect, still pinned to v1, and nothing is written
    assert (again.created, again.replayed) == (False, True)
    assert again.effect == first.effect
    row = EffectIntent.objects.get(tenant=tenant)
    assert (row.contract_name, row.contract_version, row.version) == (
        "payments.charge",
        "1",
        1,
    )
    assert EffectEvent.objects.filter(effect=row).count() == 1


@pytest.mark.django_db
def test_after_a_deploy_changed_arguments_are_a_conflict_that_says_inspect(
    tenant, fresh_runtime
) -> None:
    first = submit(tenant, charge())
    with (
        runtime.override(registry=V2_DEPLOYED),
        pytest.raises(PayloadConflictError) as err,
    ):
        submit(tenant, charge(amount_minor=2999))
    message = str(err.value)
    assert "inspect the existing effect" in message.lower()
    assert first.effect.effect_id in message
    assert not _NEW_KEY_ADVICE.search(message)
    assert err.value.details["effect_id"] == first.effect.effect_id
    assert EffectIntent.objects.get(tenant=tenant).version == 1


@pytest.mark.django_db
def test_without_a_deploy_changed_arguments_say_inspect_not_new_key(tenant) -> None:
    first = submit(tenant, charge())
    with pytest.raises(PayloadConflictError) as err:
        submit(tenant, charge(amount_minor=2999))
    assert "inspect the existing effect" in str(err.value).lower()
    assert first.effect.effect_id in str(err.value)
    assert not _NEW_KEY_ADVICE.search(str(err.value))


@pytest.mark.django_db
def test_a_replay_whose_pinned_version_is_retired_says_inspect(
    tenant, fresh_runtime
) -> None:
    # Given an effect pinned to v1, and a deploy that dropped v1 from the contracts
    first = submit(tenant, charge())
    with (
        runtime.override(registry=V1_RETIRED),
        pytest.raises(UnknownContractError) as err,
    ):
        submit(tenant, charge())
    # Then the error names the pinned contract and the effect, and says to inspect it
    message = str(err.value)
    assert "payments.charge@1" in message
    assert "inspect the existing effect" in message.lower()
    assert not _NEW_KEY_ADVICE.search(message)
    assert err.value.details["effect_id"] == first.effect.effect_id
    assert EffectIntent.objects.get(tenant=tenant).contract_version == "1"


@pytest.mark.django_db
def test_over_http_a_retry_after_a_deploy_is_a_200_replay(
    client: Client, fresh_runtime
) -> None:
    key = create_tenant("deploy-tenant")[1]
    body = {"operation_key": "order:7:charge:v1", "tool": "charge_card"}
    body["arguments"] = ARGS
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"}

    def post(payload: dict[str, object]):
        return client.post(
            "/v1/effects",
            data=json.dumps(payload),
            content_type="application/json",
            **headers,
        )

    first = post(body)
    assert first.status_code == 202
    with runtime.override(registry=V2_DEPLOYED):
        again = post(body)
        drift = post({**body, "arguments": {**ARGS, "amount_minor": 1}})
    assert again.status_code == 200, again.content
    assert again.json()["effect_id"] == first.json()["effect_id"]
    assert again.json()["replayed"] is True
    assert drift.status_code == 409
    assert "inspect the existing effect" in drift.json()["detail"].lower()
    assert not _NEW_KEY_ADVICE.search(drift.content.decode())


def test_no_error_in_the_taxonomy_advises_a_new_key() -> None:
    for code, error in ERROR_CODES.items():
        assert not _NEW_KEY_ADVICE.search(error.default_message()), code


#: Where a new operation key is the right advice: the fork, an operator's decision that
#: needs operator authority (the admin, the operator API, the fork service, the operator
#: refusals, the ``effects fork`` command and the fork's model). A caller never reaches
#: these; the test below proves the caller's paths never say it.
OPERATOR_ONLY = {
    "admin.py",
    "api/operators.py",
    "services/forking.py",
    "services/operator_steps.py",
}
#: Lines outside those modules that describe the fork itself, not advice to a caller.
FORK_DESCRIPTIONS = {
    ("management/commands/effects.py", "continue an unresolved effect as a new effect"),
    ("models.py", "business under a new operation key"),
}


#: A sentence that says not to use another key is a warning, not advice (the MCP tools
#: tell agents exactly that).
_NEGATION = re.compile(r"\b(not|never)\b|n't", re.IGNORECASE)


def advice_lines(source: str) -> list[int]:
    """Lines of ``source`` whose string literals advise a new key: the phrase, in a
    sentence (read across the string literals of the lines before it) with no negation."""
    lines = source.splitlines()
    found = []
    for n, line in enumerate(lines, 1):
        if line.lstrip().startswith("#"):
            continue
        for match in _NEW_KEY_ADVICE.finditer(line):
            before = " ".join(
                text.strip().strip('f"') for text in lines[max(0, n - 3) : n - 1]
            )
            sentence = re.split(r"[.;:!?]\s", f"{before} {line[: match.start()]}")[-1]
            if not _NEGATION.search(sentence):
                found.append(n)
    return found


def test_the_advice_scan_tells_advice_from_a_warning() -> None:
    assert advice_lines('msg = "Conflict. Use a new operation key."') == [1]
    assert advice_lines('msg = (\n    "Retry with a different key"\n)') == [2]
    assert advice_lines('msg = "Still running; do not use a new key."') == []
    assert (
        advice_lines('msg = (\n    "Do NOT retry it under "\n    "another key."\n)') == []
    )


def test_no_message_in_the_broker_source_advises_a_new_key() -> None:
    # Messages are composed where raised: scan every string literal of the package.
    root = Path(__file__).resolve().parents[2] / "effect_broker"
    offenders = [
        f"{path.relative_to(root)}:{n}"
        for path in root.rglob("*.py")
        if str(path.relative_to(root)) not in OPERATOR_ONLY
        for n in advice_lines(path.read_text())
        if not any(
            str(path.relative_to(root)) == module
            and text in path.read_text().splitlines()[n - 1]
            for module, text in FORK_DESCRIPTIONS
        )
    ]
    assert offenders == []


def test_the_operator_only_modules_are_not_reached_by_the_caller_api() -> None:
    # The exemption above holds only while the caller's router cannot fork or resolve.
    from effect_broker.api import effects

    source = Path(effects.__file__).read_text()
    for name in ("forking", "operator_steps", "operators", "admin"):
        assert f"import {name}" not in source, name
        assert f"{name}." not in source, name
