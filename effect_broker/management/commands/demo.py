"""``effect-broker demo <name>``: runnable demonstrations on a real Postgres."""

from __future__ import annotations

import time
from typing import Any

from django.core.management import call_command
from django.core.management.base import CommandParser

from effect_broker.domain.errors import InvalidRequestError, PayloadConflictError
from effect_broker.domain.records import EffectRequest
from effect_broker.management.base import BrokerCommand
from effect_broker.management.crash_matrix_options import (
    add_crash_matrix_arguments,
    run_crash_matrix,
)
from effect_broker.models import Tenant
from effect_broker.services import inspection
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant


class Command(BrokerCommand):
    help = (
        "Run a demonstration against the configured Postgres (embedded by default). "
        "'crash-matrix' kills real worker processes at every boundary and counts charges "
        "in the target's own table; 'reservation' reserves, replays and refuses drift; "
        "'agent' runs a scripted agent over MCP whose charge is delivered three times "
        "while a worker dies after the target committed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="demo", required=True)
        sub.add_parser(
            "reservation",
            help="reserve order:42:charge:v1, replay it, and show drift being refused",
        )
        add_crash_matrix_arguments(
            sub.add_parser(
                "crash-matrix",
                help="SIGKILL broker processes at every failpoint; count target charges",
            )
        )

        agent = sub.add_parser(
            "agent",
            help="a scripted agent charges order 42 over MCP: 3 deliveries, a worker "
            "SIGKILLed after the target commits; counts the target's charges",
            description=(
                "Run the demo agent (scripted model by default) as a real MCP client of "
                "`effect-broker mcp --transport stdio` on a scratch database: it is "
                "asked to 'charge order 42', "
                "the transport delivers the tool call three times with the same "
                "operation key, and the worker dispatching it is SIGKILLed right after "
                "the payments service commits the charge (a failpoint). A replacement "
                "worker finishes the effect. Prints the target's own charge count and "
                "the receipt; exits 1 unless the target holds exactly one charge."
            ),
        )
        agent.add_argument(
            "--provider",
            choices=["scripted", "openai", "grok"],
            default="scripted",
            help="the model: scripted (default, deterministic, offline), openai "
            "(OPENAI_API_KEY) or grok (XAI_API_KEY, via https://api.x.ai/v1); the "
            "live ones need pip install 'effect-broker[demo-agent]'",
        )
        agent.add_argument(
            "--model",
            help="the live provider's model (default $OPENAI_MODEL / $XAI_MODEL, else "
            "gpt-4.1-mini / grok-3-mini)",
        )
        agent.add_argument(
            "--deliveries",
            type=int,
            default=3,
            help="times the transport delivers the tool call (default 3)",
        )
        agent.add_argument(
            "--keep-database",
            action="store_true",
            help="keep the scratch database afterwards and print its URL",
        )

        target = sub.add_parser(
            "target",
            help="serve the demo payment target (its own charges table; the crash "
            "matrix's target) until SIGTERM or Ctrl-C",
        )
        target.add_argument(
            "--database-url",
            help="where the target keeps its charges (default: the broker's database)",
        )
        target.add_argument("--host", default="127.0.0.1", help="(127.0.0.1)")
        target.add_argument("--port", type=int, default=8081, help="(8081)")
        target.add_argument(
            "--schema", default="crash_target", help="its schema (crash_target)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["demo"] == "target":
            self._target(options)
        elif options["demo"] == "agent":
            self._agent(options)
        elif options["demo"] == "reservation":
            self._reservation()
        elif options["demo"] == "crash-matrix":
            code = run_crash_matrix(self.stdout, options)
            if code:
                raise SystemExit(code)

    def _target(self, options: dict[str, Any]) -> None:
        from django.db import connection

        from effect_broker.store.database_url import url_from_settings
        from examples.crash_matrix import target_service

        url = options["database_url"] or url_from_settings(connection.settings_dict)
        argv = ["--database-url", url, "--host", options["host"]]
        argv += ["--port", str(options["port"]), "--schema", options["schema"]]
        code = target_service.main(argv)
        if code:
            raise SystemExit(code)

    def _agent(self, options: dict[str, Any]) -> None:
        if not 1 <= options["deliveries"] <= 10:
            raise InvalidRequestError("--deliveries must be between 1 and 10")
        # Imported here: the demo lives in examples/ and needs the dev install.
        from examples.agent.demo import run_agent_demo
        from examples.agent.providers import GrokProvider, OpenAIProvider

        provider = None
        if options["provider"] != "scripted":
            live = OpenAIProvider if options["provider"] == "openai" else GrokProvider
            try:
                # Before anything starts: a missing key is one line, nothing to undo.
                provider = live(model=options["model"])
            except ValueError as exc:
                raise InvalidRequestError(str(exc)) from exc
        elif options["model"]:
            raise InvalidRequestError("--model applies to --provider openai or grok")
        code = run_agent_demo(
            self.stdout,
            provider=provider,
            keep_database=options["keep_database"],
            copies=options["deliveries"],
        )
        if code:
            raise SystemExit(code)

    def _say(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def _reservation(self) -> None:
        started = time.monotonic()
        self._say("[1/4] preparing the database (migrations)...")
        call_command("migrate", verbosity=0, interactive=False)
        tenant = Tenant.objects.filter(name="demo").first() or create_tenant("demo")[0]
        run_id = time.strftime("%Y%m%dT%H%M%S")
        key = f"order:42:charge:v1:{run_id}"
        request = EffectRequest(
            operation_key=key,
            tool="charge_card",
            arguments={"order": "42", "amount_minor": 1999, "currency": "EUR"},
            requested_by="demo",
        )
        self._say(f"[2/4] submit {key}")
        first = submit(tenant, request)
        self._say(
            f"      created={first.created} status={first.effect.status} "
            f"effect={first.effect.effect_id}"
        )
        self._say(
            f"      downstream key (same on every attempt): {first.effect.downstream_key}"
        )
        self._say("[3/4] submit the same request again (a retrying agent)")
        again = submit(tenant, request)
        self._say(
            f"      created={again.created} replayed={again.replayed} "
            f"same effect={again.effect.effect_id == first.effect.effect_id}"
        )
        self._say("[4/4] submit the same key with a different amount (payload drift)")
        drifted = EffectRequest(
            operation_key=key,
            tool="charge_card",
            arguments={"order": "42", "amount_minor": 2999, "currency": "EUR"},
            requested_by="demo",
        )
        try:
            submit(tenant, drifted)
        except PayloadConflictError as exc:
            self._say(f"      refused [{exc.code}]: {exc}")
        else:  # pragma: no cover - would be a correctness bug
            raise SystemExit("BUG: payload drift was accepted")
        intents = sum(
            1
            for r in inspection.list_effects(tenant, operation_prefix=key)
            if r.operation_key == key
        )
        events = inspection.count_events(first.effect.effect_id)
        chain = inspection.verify_chain(first.effect.effect_id)
        self._say(
            f"result: {intents} intent, {events} event, event chain verified ({chain}), "
            f"{time.monotonic() - started:.2f}s"
        )
