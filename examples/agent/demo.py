"""``effect-broker demo agent``: the scripted agent charges order 42 through the
broker's MCP server while the transport delivers the call three times and a worker is
SIGKILLed right after the target committed the charge.

Everything is real: a scratch database on the configured PostgreSQL (embedded by
default), the crash matrix's HTTP payments service with its own ``charges`` table,
``procrastinate worker`` processes, and ``effect-broker mcp --transport stdio`` driven
by the official MCP client. The kill uses the failpoint mechanism the crash matrix
uses (``effect_broker.failpoints``), armed for this run's operation key only. The
verdict is read from the target's own table, never from the broker.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections

from config.database import url_from_settings
from effect_broker import failpoints, store
from effect_broker.models import Tenant
from effect_broker.services import inspection
from effect_broker.services.tenants import create_tenant
from examples.agent.loop import AgentLoop, AgentRun, DeliveryPolicy, broker_session
from examples.agent.providers import ModelProvider, ScriptedProvider, ToolCall
from examples.crash_matrix.rig import create_scratch_database, drop_scratch_database
from examples.crash_matrix.target_client import TargetProcess, start_target
from examples.crash_matrix.workers import WorkerProcess, broker_env

PROMPT = "charge order 42"
#: A live model has no order book: it is told the amount the script knows.
LIVE_PROMPT = (
    "Charge order 42: EUR 19.99, that is amount_minor 1999 in currency EUR. Then read "
    "the receipt and tell me the target's charge id."
)
CHARGE_TOOL = "charge_order"
TARGET_SCHEMA = "agent_demo_target"
FAILPOINT = "after_target_commit"
STEPS = 7
#: How long one MCP call waits for settlement before answering "still running".
MCP_WAIT_SECONDS = "15"


class TextSink(Protocol):
    """Where the demo prints: a text stream or a command's ``OutputWrapper``."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> object: ...


def contracts_toml(target_url: str) -> str:
    """One idempotent contract on the target's keyed endpoint, with an MCP face."""
    return f"""# Written by `effect-broker demo agent` for a target at {target_url}
[[contract]]
name = "demo.charge-order"
version = "1"
tool = "{CHARGE_TOOL}"
safety = "idempotent"
description = "Charge an order on the payments service (dedups by Idempotency-Key)."
key_retention = "24h"
retry_limit = 5
backoff_initial = "200ms"
backoff_max = "2s"
adapter = "http"
preview_fields = ["order", "amount_minor", "currency"]
[contract.adapter_options]
url = "{target_url}/idempotent/charges"
idempotency_header = "Idempotency-Key"
timeout = "10s"
connect_timeout = "1s"
[contract.mcp]
description = "Charge the card on file for an order."
[contract.mcp.input_schema]
type = "object"
required = ["order", "amount_minor", "currency"]
additionalProperties = false
properties.order = {{ type = "string", description = "The order id, e.g. '42'." }}
properties.amount_minor = {{ type = "integer", minimum = 1 }}
properties.currency = {{ type = "string", enum = ["EUR", "USD"] }}
"""


@dataclass
class KillWatch:
    """Replaces the first worker once the failpoint has killed it, as a deployment's
    supervisor would, and remembers what happened for the verdict."""

    env: dict[str, str]
    fp_dir: Path
    tenant_id: str
    say: Callable[[str], None]
    workers: list[WorkerProcess] = field(default_factory=list)
    #: The failpoint's subject (tenant/operation key), once the loop derived the key.
    subject: str | None = None
    killed_pid: int | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> WorkerProcess:
        """Start the first worker and the watch."""
        first = WorkerProcess("agent-demo-w1", self.env, concurrency=1)
        self.workers.append(first)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return first

    def arm(self, call: ToolCall, key: str) -> None:
        """Arm the failpoint for the first charge call's key (the loop's hook: it runs
        before that call's first delivery, whatever model made the call)."""
        if call.name != CHARGE_TOOL or self.subject is not None:
            return
        self.subject = f"{self.tenant_id}/{key}"
        failpoints.arm(self.fp_dir, self.subject, FAILPOINT)
        self.say(f"      failpoint {FAILPOINT} armed for {key} (in workers only)")

    def _watch(self) -> None:
        first = self.workers[0]
        while not self._stop.wait(0.1):
            if first.alive():
                continue
            if self.subject is not None:
                self.killed_pid = failpoints.fired_by(
                    self.fp_dir, self.subject, FAILPOINT
                )
            code = first.process.returncode
            if self.killed_pid == first.pid:
                self.say(
                    f"      ! worker w1 (pid {first.pid}) SIGKILLed at {FAILPOINT}: the "
                    "target has committed the charge, the broker never got the answer"
                )
            else:
                self.say(f"      ! worker w1 (pid {first.pid}) exited with code {code}")
            second = WorkerProcess("agent-demo-w2", self.env, concurrency=1)
            self.workers.append(second)
            self.say(f"      replacement worker w2 (pid {second.pid}) started")
            return

    def stop(self) -> None:
        """Stop the watch and every worker."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for worker in self.workers:
            worker.stop(timeout=10)


def run_agent_demo(
    out: TextSink,
    *,
    provider: ModelProvider | None = None,
    keep_database: bool = False,
    copies: int = 3,
) -> int:
    """Run the demo with ``provider`` (default: the scripted model); return its exit
    code (0 only if the target holds exactly one charge)."""
    model = provider or ScriptedProvider(charge_tool=CHARGE_TOOL)
    lock = threading.Lock()

    def say(text: str) -> None:
        with lock:
            out.write(text)
            out.flush()

    started = time.monotonic()
    connection.ensure_connection()  # starts the embedded server when that is in use
    embedded = connection.settings_dict["ENGINE"] == "effect_broker.embedded_db"
    admin_url = url_from_settings(connection.settings_dict)
    scratch = f"eb_agent_demo_{os.getpid()}"
    where = "the embedded PostgreSQL" if embedded else "DATABASE_URL's server"
    say(f"[1/{STEPS}] scratch database {scratch} on {where} (migrations)...")
    create_scratch_database(admin_url, scratch)
    connections.close_all()
    original_name = connection.settings_dict["NAME"]
    connection.settings_dict["NAME"] = scratch
    workdir = Path(tempfile.mkdtemp(prefix="eb-agent-demo-"))
    target: TargetProcess | None = None
    watch: KillWatch | None = None
    try:
        call_command("migrate", verbosity=0, interactive=False)
        database_url = url_from_settings(connection.settings_dict)
        target = start_target(
            database_url,
            settlement_delay="500ms",
            key_retention="24h",
            schema=TARGET_SCHEMA,
        )
        say(
            f"[2/{STEPS}] payments service at {target.url} (a real HTTP server; its own "
            f"table {TARGET_SCHEMA}.charges dedups by Idempotency-Key)"
        )
        contracts = workdir / "contracts.toml"
        contracts.write_text(contracts_toml(target.url), encoding="utf-8")
        run_id = f"demo-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        tenant, api_key = create_tenant(f"agent-{run_id}")
        say(
            f"[3/{STEPS}] tenant {tenant.name} with an API key; contracts file with the "
            f"proxy tool {CHARGE_TOOL} (contract demo.charge-order v1, idempotent)"
        )
        fp_dir = workdir / "failpoints"
        master_key = settings.EFFECT_BROKER_MASTER_KEY
        assert master_key is not None  # settings refuse to start without one
        env = broker_env(
            database_url,
            contracts,
            master_key,
            extra={"EFFECT_BROKER_FAILPOINT_DIR": str(fp_dir)},
        )
        watch = KillWatch(env, fp_dir, str(tenant.id), say)
        first = watch.start()
        say(
            f"[4/{STEPS}] worker w1 (pid {first.pid}) started; failpoint {FAILPOINT} "
            "to be armed for this run's charge only, once the loop has its key"
        )
        connections.close_all()  # nothing of ours holds a connection during the run
        say(
            f"[5/{STEPS}] agent ({model.name} model) as an MCP client of "
            "`effect-broker mcp --transport stdio`:"
        )
        server_env = {
            **env,
            "EFFECT_BROKER_API_KEY": api_key,
            "EFFECT_BROKER_MCP_WAIT_SECONDS": MCP_WAIT_SECONDS,
        }
        # The server process must not fire the failpoint: only workers dispatch.
        server_env.pop("EFFECT_BROKER_FAILPOINT_DIR", None)
        server_log = workdir / "mcp-server.log"
        loop_options = {
            "run_id": run_id,
            "policy": DeliveryPolicy(copies=copies, settle_timeout=90.0),
            "on_event": lambda text: say(f"      {text}"),
            "before_delivery": watch.arm,
        }
        run = anyio.run(_run_agent, server_env, server_log, model, loop_options)
        return _verdict(say, started, tenant, target, watch, run, copies)
    finally:
        if watch is not None:
            watch.stop()
        if target is not None:
            target.stop()
        connections.close_all()
        connection.settings_dict["NAME"] = original_name
        if keep_database:
            kept = url_from_settings(connection.settings_dict, dbname=scratch)
            say(f"kept database: {kept}")
        else:
            drop_scratch_database(admin_url, scratch)


async def _run_agent(
    env: dict[str, str],
    log_path: Path,
    model: ModelProvider,
    loop_options: dict[str, Any],
) -> AgentRun:
    with log_path.open("w", encoding="utf-8") as errlog:
        async with broker_session(env, errlog=errlog) as session:
            tools = (await session.list_tools()).tools
            loop_options["on_event"](
                "tools listed: " + ", ".join(tool.name for tool in tools)
            )
            prompt = PROMPT if isinstance(model, ScriptedProvider) else LIVE_PROMPT
            return await AgentLoop(session, model, **loop_options).run(prompt)


def _verdict(
    say: Callable[[str], None],
    started: float,
    tenant: Tenant,
    target: TargetProcess,
    watch: KillWatch,
    run: AgentRun,
    copies: int,
) -> int:
    delivered = [d for d in run.deliveries if d.tool == CHARGE_TOOL]
    calls = sorted({d.call_id for d in delivered})
    charges = target.charges()
    record = (
        store.reads.get_effect_by_key(str(tenant.id), delivered[0].operation_key)
        if delivered
        else None
    )
    under_key = target.count_by_key("idempotent", record.downstream_key) if record else 0
    say(
        f"[6/{STEPS}] the target's own table {TARGET_SCHEMA}.charges: {len(charges)} "
        f"row(s); {under_key} under this effect's Idempotency-Key "
        f"{record.downstream_key if record else '(no charge call)'}"
    )
    for charge in charges:
        say(f"      {charge.id}  mode={charge.mode}  key={charge.key}")
    requests = int(target.stats()["requests"])
    if requests > 1:
        say(
            f"      the service received {requests} charge requests: the first "
            "committed; each resend under the same Idempotency-Key got that charge back"
        )
    else:
        say(f"      the service received {requests} charge request(s)")
    say(f"TARGET CHARGE COUNT: {len(charges)}")
    receipt: dict[str, Any] | None = None
    if record is not None and record.receipt_id is not None:
        found = inspection.get_receipt(tenant, record.effect_id)
        receipt = {
            "receipt_id": found.receipt_id,
            "effect_id": found.effect_id,
            "operation_key": record.operation_key,
            "contract": f"{record.contract_name}@{record.contract_version}",
            "external_id": found.external_id,
            "result": dict(found.result),
            "attempts": record.attempt_count,
        }
    status = record.status.value if record else "no effect"
    say(f"[7/{STEPS}] receipt (status {status}):")
    for line in (
        json.dumps(receipt, indent=2, sort_keys=True) if receipt else "none"
    ).splitlines():
        say(f"      {line}")
    problems = []
    if len(charges) != 1 or under_key != 1:
        problems.append(f"the target holds {len(charges)} charges, not 1")
    if watch.killed_pid is None or watch.killed_pid != watch.workers[0].pid:
        problems.append(f"no worker was killed at {FAILPOINT}")
    if len(calls) != 1:
        # A model that asks for two charges asked for two operations (two call ids,
        # two keys): that is the model's decision, and the demo's claim does not hold.
        problems.append(f"the model made {len(calls)} {CHARGE_TOOL} calls, not 1")
    elif len(delivered) != copies:
        problems.append(f"{len(delivered)} deliveries of the charge, not {copies}")
    if len({d.effect_id for d in delivered}) != 1 or any(d.is_error for d in delivered):
        problems.append("the deliveries did not all get the same, settled effect")
    if run.final is None:
        problems.append("the agent gave no final answer")
    if receipt is None:
        problems.append("the effect has no receipt")
    seconds = time.monotonic() - started
    if problems or record is None:
        say(f"verdict: FAIL - {'; '.join(problems)} ({seconds:.1f}s)")
        return 1
    say(
        f"verdict: PASS - one charge in the target's own table, although the call was "
        f"delivered {len(delivered)} times and worker w1 was SIGKILLed after the target "
        f"committed; all {len(delivered)} deliveries returned effect {record.effect_id} "
        f"({seconds:.1f}s)"
    )
    return 0
