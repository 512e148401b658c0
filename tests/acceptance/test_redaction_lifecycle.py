"""One redaction test over a whole lifecycle (issue 12, item 9).

A secret-looking argument (a card number, passed in clear) and a SecretRef (resolved
only by the worker) go through submit, dispatch, a lost answer (``outcome_unknown``),
an operator's resolution and the receipt. Every place a value could land is then read
back, and neither clear value may appear in any of them: this process's logs at
DEBUG (the API and the worker's dispatch run here; the stdio MCP server's own log is
not captured), /metrics, the spans, the admin's pages, every API response, event
metadata, the MCP tools' results (a real stdio client session), and a ``pg_dump``.

The test also checks that the worker really sent both clear values to the target: a
redaction test whose secret never travelled would pass for the wrong reason.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from mcp import ClientSession
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from config.database import url_from_settings
from effect_broker.adapters.simulated_adapter import Fault
from effect_broker.domain.states import EffectStatus
from effect_broker.embedded_pg import _find_install
from effect_broker.models import EffectEvent
from effect_broker.services import operators, runtime
from effect_broker.services.dispatch import dispatch
from tests.integration.conftest import make_operator
from tests.integration.mcp_support import open_world, run_session
from tests.span_recording import recording_spans

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CARD = "4111111111111111"
REFERENCED = "sk_live_REFERENCED_7f3a9c21"
TOOL = "charge_card_unsafe"

CONTRACTS = f"""
[[contract]]
name = "redaction.charge-unsafe"
version = "1"
tool = "{TOOL}"
safety = "unsafe"
preview_fields = ["order", "amount_minor"]
secrets = ["env:CARD_API_KEY"]
[contract.mcp]
description = "Charge a card"
[contract.mcp.input_schema]
type = "object"
required = ["order", "amount_minor"]
properties.order.type = "string"
properties.amount_minor.type = "integer"
"""


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with recording_spans() as exporter:
        yield exporter


def pg_dump() -> str:
    """The whole database as SQL, with the first pg_dump that can read this server."""
    with connection.cursor() as cur:
        cur.execute("SHOW server_version_num")
        major = int(cur.fetchone()[0]) // 10000
    candidates = [
        _find_install() / "bin" / "pg_dump",
        Path(f"/usr/lib/postgresql/{major}/bin/pg_dump"),
        Path(shutil.which("pg_dump") or "/nonexistent"),
    ]
    url = url_from_settings(connection.settings_dict)
    errors = []
    for binary in candidates:
        if not binary.exists():
            continue
        done = subprocess.run(
            [str(binary), "--no-owner", url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode == 0:
            return done.stdout
        errors.append(done.stderr.strip())
    raise AssertionError(f"no pg_dump could read this server: {errors}")


def test_no_clear_value_lands_anywhere_over_a_whole_lifecycle(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    spans: InMemorySpanExporter,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("EFFECT_BROKER_SECRET_CARD_API_KEY", REFERENCED)
    seen: dict[str, str] = {}  # where we looked -> what we found there
    with open_world(tmp_path, CONTRACTS) as world:
        api = Client()
        auth = {"Authorization": f"Bearer {world.api_key}"}
        arguments = {
            "order": "42",
            "amount_minor": 1999,
            "card_number": CARD,
            "api_key": {"$secret": "env:CARD_API_KEY"},
        }
        key = "order:42:charge:v1"
        body = {"operation_key": key, "tool": TOOL, "arguments": arguments}
        submitted = api.post("/v1/effects", body, "application/json", headers=auth)
        assert submitted.status_code == 202, submitted.content
        seen["API submit"] = submitted.content.decode()
        effect_id = submitted.json()["effect_id"]

        # Dispatch in this process (the worker's code path), the answer lost.
        rt = runtime.get_runtime()
        adapter = rt.adapter_for(rt.registry.for_tool(TOOL))
        sent: list[dict[str, Any]] = []
        real_dispatch = adapter.dispatch

        def spy(request):  # type: ignore[no-untyped-def]
            sent.append(dict(request.arguments))
            return real_dispatch(request)

        monkeypatch.setattr(adapter, "dispatch", spy)
        adapter.target.inject(Fault.LOSE_RESPONSE)
        unknown = dispatch(effect_id, worker="w1")
        assert unknown.status is EffectStatus.OUTCOME_UNKNOWN
        # The target really got both clear values: this is what must stay out.
        assert sent[0]["card_number"] == CARD
        assert sent[0]["api_key"] == REFERENCED

        seen["API effect"] = api.get(f"/v1/effects/{effect_id}", headers=auth).content
        seen["API list"] = api.get("/v1/effects", headers=auth).content
        operator = make_operator("ann")
        admin = Client()
        admin.force_login(User.objects.get(pk=operator.pk))
        seen["admin queue"] = admin.get(
            "/admin/effect_broker/effectintent/needs-operator/"
        ).content
        seen["admin list"] = admin.get("/admin/effect_broker/effectintent/").content

        async def while_unknown(session: ClientSession) -> list[types.CallToolResult]:
            return [
                await session.call_tool("list_unknown_effects", {}),
                await session.call_tool("get_effect", {"effect_id": effect_id}),
            ]

        seen["MCP while unknown"] = _results(run_session(world.env, while_unknown))

        token = operators.create_token("ann")[1]
        resolved = api.post(
            f"/v1/effects/{effect_id}/resolve",
            {
                "resolution": "succeeded",
                "reason": "charge visible in the dashboard",
                "external_id": "ch_42",
                "evidence": {"source": "target dashboard", "reference": "ch_42"},
            },
            "application/json",
            headers={"Authorization": f"Bearer {token}"},
        )
        assert resolved.status_code == 200, resolved.content
        seen["API resolve"] = resolved.content
        for path in ("", "/history", "/receipt"):
            response = api.get(f"/v1/effects/{effect_id}{path}", headers=auth)
            assert response.status_code == 200, (path, response.content)
            seen[f"API GET {path or 'effect'}"] = response.content
        seen["admin effect page"] = admin.get(
            f"/admin/effect_broker/effectintent/{effect_id}/change/"
        ).content

        async def after(session: ClientSession) -> list[types.CallToolResult]:
            replay = {"operation_key": key, **arguments}
            return [
                await session.call_tool("get_receipt", {"effect_id": effect_id}),
                await session.call_tool("get_effect", {"effect_id": effect_id}),
                await session.call_tool(TOOL, replay),  # a redelivery: the receipt
            ]

        seen["MCP after resolve"] = _results(run_session(world.env, after))
        seen["metrics"] = api.get("/metrics").content
        seen["event metadata"] = json.dumps(
            list(EffectEvent.objects.filter(effect_id=effect_id).values("metadata")),
            default=str,
        )
        seen["spans"] = json.dumps(
            [
                {
                    "name": s.name,
                    "attributes": dict(s.attributes or {}),
                    "events": [
                        {"name": e.name, "attributes": dict(e.attributes or {})}
                        for e in s.events
                    ],
                }
                for s in spans.get_finished_spans()
            ]
        )
        assert spans.get_finished_spans(), "no span was recorded: the check is empty"
        seen["logs"] = caplog.text
        assert "outcome_unknown" in caplog.text or effect_id in caplog.text
        seen["pg_dump"] = pg_dump()
        assert effect_id in seen["pg_dump"]

    leaks = [
        where
        for where, found in seen.items()
        for secret in (CARD, REFERENCED)
        if secret in (found if isinstance(found, str) else found.decode())
    ]
    assert leaks == []


def _results(results: list[types.CallToolResult]) -> str:
    return json.dumps([r.model_dump(mode="json") for r in results])
