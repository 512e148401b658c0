"""The documented integration examples, used as written (issue 10, item 9 and its
acceptance line "an MCP client set up from the README alone lists the proxy tools";
since issue 20 the examples live on the docs site's pages).

Each tested block in the docs is marked ``<!-- snippet: NAME ... -->``. The MCP
client configurations are started exactly as the docs writes them - only the
placeholders (the key, the contracts path, the database, the master key, a free port)
are filled in. The SDK examples run against a live broker (uvicorn serving the API and
a real worker process). The gate's broker example runs with ``stripe_charge`` bound to
the crash-matrix payments service instead of Stripe (no Stripe account in the suite):
the caller code is what is checked; the Stripe adapter has its own contract tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from django.conf import settings
from django.db import connection
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from config.database import url_from_settings
from effect_broker.domain.contracts import parse_contracts
from effect_broker.management.commands.mcp import Command as McpCommand
from effect_broker.models import EffectIntent
from effect_broker.services.tenants import create_tenant
from examples.crash_matrix.target_client import TargetProcess, start_target
from examples.crash_matrix.workers import WorkerProcess, broker_env
from tests import docs_pages
from tests.integration.mcp_support import MANAGEMENT, World
from tests.job_tables import forget_old_jobs
from tests.served import wait_healthy

ROOT = Path(__file__).resolve().parents[2]
#: Every documentation file (README.md and the docs site's pages), one text.
DOCS = docs_pages.all_text()
PROXY_TOOLS = {"charge_unsafe", "charge_idempotent"}  # tests/integration/mcp_support.py

pytestmark = [pytest.mark.django_db(transaction=True)]


def snippet(name: str) -> str:
    """The fenced block after ``<!-- snippet: NAME ... -->`` in the documentation."""
    return docs_pages.snippet(name)


def code_lines(code: str) -> int:
    return sum(
        1
        for line in code.splitlines()
        if line.strip() and not line.strip().startswith("#")
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def list_tools(session_factory: Any) -> set[str]:
    async def main() -> set[str]:
        async with session_factory() as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            return {tool.name for tool in (await s.list_tools()).tools}

    return anyio.run(main)


# --- MCP clients ------------------------------------------------------------------


def test_an_mcp_client_set_up_from_the_readme_alone_lists_the_proxy_tools(
    mcp_world: World, tmp_path: Path
) -> None:
    # Given the docs' stdio configuration, its placeholders filled in
    server = json.loads(snippet("mcp-stdio"))["mcpServers"]["effect-broker"]
    assert server["command"] == "effect-broker"
    assert server["args"] == ["mcp", "--transport", "stdio"]
    real = {
        "EFFECT_BROKER_API_KEY": mcp_world.api_key,
        "EFFECT_BROKER_CONTRACTS": mcp_world.env["EFFECT_BROKER_CONTRACTS"],
        "DATABASE_URL": mcp_world.env["DATABASE_URL"],
        "EFFECT_BROKER_MASTER_KEY": mcp_world.env["EFFECT_BROKER_MASTER_KEY"],
    }
    # (the docs names exactly what the server needs: no more, no less)
    assert set(server["env"]) == set(real)
    # the client resolves the command on its PATH (here: this environment's scripts)
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    command = shutil.which(server["command"], path=path)
    assert command is not None
    params = StdioServerParameters(
        command=command,
        args=server["args"],
        env={name: real[name] for name in server["env"]},
        cwd=tmp_path,  # wherever the client happens to run
    )

    # When a client starts it and lists the tools
    names = list_tools(lambda: stdio_client(params))

    # Then it sees the management tools and the contracts' proxy tools
    assert names == MANAGEMENT | PROXY_TOOLS


def test_the_readme_http_url_and_header_list_the_proxy_tools(mcp_world: World) -> None:
    # Given the server started as the docs says (on a free port instead of 8765,
    # which may be taken on a shared machine) - and 8765 is the command's default
    command = McpCommand().create_parser("effect-broker", "mcp")
    assert (command.get_default("host"), command.get_default("port")) == (
        "127.0.0.1",
        8765,
    )
    assert "effect-broker mcp --transport http --host 127.0.0.1 --port 8765" in DOCS
    port = free_port()
    process = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("effect-broker")),
            *["mcp", "--transport", "http", "--host", "127.0.0.1", "--port", str(port)],
        ],
        env=mcp_world.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(process, f"http://127.0.0.1:{port}", "the MCP HTTP server")
        # And the docs' client configuration, the key filled in
        server = json.loads(snippet("mcp-http"))["mcpServers"]["effect-broker"]
        assert server["type"] == "http"
        url = server["url"].replace(":8765/", f":{port}/")
        headers = {
            name: value.replace("eb_...", mcp_world.api_key)
            for name, value in server["headers"].items()
        }

        # When a streamable HTTP client connects with them and lists the tools
        @asynccontextmanager
        async def session() -> AsyncIterator[Any]:
            async with (
                httpx2.AsyncClient(headers=headers, timeout=30) as client,
                streamable_http_client(url, http_client=client) as streams,
            ):
                yield streams

        names = list_tools(session)
    finally:
        process.terminate()
        process.wait(timeout=15)

    # Then it sees the management tools and the contracts' proxy tools
    assert names == MANAGEMENT | PROXY_TOOLS


# --- the SDK against a live broker ----------------------------------------------

STRIPE_STAND_IN = """
# The gate example's tool, bound to the payments service instead of Stripe.
[[contract]]
name = "payments.stripe-charge"
version = "1"
tool = "stripe_charge"
safety = "idempotent"
key_retention = "24h"
retry_limit = 5
adapter = "http"
[contract.adapter_options]
url = "{target_url}/idempotent/charges"
idempotency_header = "Idempotency-Key"
"""


@dataclass
class LiveBroker:
    url: str
    target: TargetProcess


@pytest.fixture(scope="module")
def live(django_db_setup: None, django_db_blocker: Any) -> Iterator[LiveBroker]:
    """uvicorn serving the API and one worker, on the docs' example contracts plus
    the gate's ``stripe_charge`` (on the payments service)."""
    with django_db_blocker.unblock():
        connection.ensure_connection()
        forget_old_jobs()
        database_url = url_from_settings(connection.settings_dict)
    workdir = tempfile.TemporaryDirectory(prefix="eb-readme-")
    schema = f"readme_{uuid.uuid4().hex[:8]}"
    target = start_target(database_url, settlement_delay="500ms", schema=schema)
    contracts = Path(workdir.name) / "contracts.toml"
    contracts.write_text(
        (ROOT / "examples" / "contracts.toml").read_text()
        + STRIPE_STAND_IN.format(target_url=target.url)
    )
    master_key = settings.EFFECT_BROKER_MASTER_KEY
    assert master_key is not None
    env = broker_env(database_url, contracts, master_key)
    port = free_port()
    server = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("uvicorn")),
            *["config.asgi:application", "--port", str(port), "--log-level", "warning"],
        ],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    worker = WorkerProcess("readme", env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz", trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, "uvicorn exited"
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.1)
        yield LiveBroker(url, target)
    finally:
        worker.stop()
        server.terminate()
        server.wait(15)
        target.stop()
        workdir.cleanup()


@pytest.mark.slow
def test_the_readme_sdk_decorator_example_runs_and_replays_against_a_live_broker(
    live: LiveBroker, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a tenant's key where the docs' example reads it
    tenant, api_key = create_tenant(f"shop-{uuid.uuid4().hex[:6]}")
    monkeypatch.setenv("EFFECT_BROKER_API_KEY", api_key)
    code = snippet("sdk-decorator")
    assert '"http://127.0.0.1:8000"' in code  # the port the docs' uvicorn line uses
    assert "uvicorn config.asgi:application --port 8000" in DOCS

    # When the example runs as written (against this broker's address)
    scope: dict[str, Any] = {}
    runnable = compile(code.replace("http://127.0.0.1:8000", live.url), "docs", "exec")
    try:
        exec(runnable, scope)  # noqa: S102
    finally:
        scope["broker"].close()  # a script's exit would; this process lives on

    # Then it prints True and the receipt's result, and there is one effect
    printed = capsys.readouterr().out.strip()
    assert printed.startswith("True {'charge_id': 'ch_sim_"), printed
    assert printed.endswith("'status': 'succeeded'}")
    assert EffectIntent.objects.filter(tenant_id=tenant.id).count() == 1


@pytest.mark.slow
def test_the_first_sdk_example_runs_as_printed(
    live: LiveBroker, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 20: the first SDK block raised NameError (api_key). Given a tenant's key
    # where the example reads it
    tenant, api_key = create_tenant(f"first-{uuid.uuid4().hex[:6]}")
    monkeypatch.setenv("EFFECT_BROKER_API_KEY", api_key)
    code = snippet("sdk-first")
    # When it runs as written (against this broker's address)
    scope: dict[str, Any] = {}
    runnable = compile(code.replace("http://127.0.0.1:8000", live.url), "docs", "exec")
    try:
        exec(runnable, scope)  # noqa: S102
    finally:
        scope["broker"].close()
    # Then it charged once and printed the receipt's result
    printed = capsys.readouterr().out.strip()
    assert printed.startswith("charged: {'charge_id': 'ch_sim_"), printed
    assert EffectIntent.objects.filter(tenant_id=tenant.id).count() == 1


@pytest.mark.slow
def test_the_readme_gate_caller_charges_once_however_often_it_is_called(
    live: LiveBroker,
) -> None:
    # Given the gate's broker-side caller code, as written
    live.target.reset()
    tenant, api_key = create_tenant(f"gate-{uuid.uuid4().hex[:6]}")
    scope: dict[str, Any] = {"BROKER_URL": live.url, "API_KEY": api_key}
    exec(compile(snippet("gate-broker"), "docs", "exec"), scope)  # noqa: S102

    # When the charge is called three times (a retrying caller)
    try:
        results = [
            scope["charge_order"]("42", 1999, "eur", "pm_card_visa") for _ in range(3)
        ]
    finally:
        scope["broker"].close()

    # Then every call returns the same charge, and the target holds exactly one
    assert len({r["id"] for r in results}) == 1
    assert live.target.count_charges() == 1
    assert EffectIntent.objects.filter(tenant_id=tenant.id).count() == 1
    effect = EffectIntent.objects.get(tenant_id=tenant.id)
    assert effect.operation_key == "order:42:charge:v1"


def test_the_gate_by_hand_compiles_and_the_readme_counts_the_lines_truly() -> None:
    # The hand-written version needs Stripe and a table: it is compiled, not run
    by_hand = snippet("gate-by-hand")
    compile(by_hand, "docs", "exec")
    broker = snippet("gate-broker")
    contract = re.search(
        r"```toml\n(\[\[contract\]\]\nname = \"payments.stripe-charge\".*?)```",
        DOCS,
        flags=re.DOTALL,
    )
    assert contract is not None
    # the contract is one the broker loads as written
    stripe = parse_contracts(contract.group(1), source="docs").for_tool("stripe_charge")
    assert (stripe.safety.value, stripe.adapter) == ("idempotent", "stripe")
    assert stripe.key_retention == timedelta(hours=24)
    row = (
        f"| caller code (lines that are not blank or comments) | {code_lines(broker)} "
        f"(+ {code_lines(contract.group(1))} lines of contract) | "
        f"{code_lines(by_hand)} (+ the table) |"
    )
    assert row in DOCS
    assert f"The {code_lines(by_hand)} lines are the minimum" in DOCS
