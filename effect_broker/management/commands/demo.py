"""``effect-broker demo <name>``: runnable demonstrations on a real Postgres."""

from __future__ import annotations

import time
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from effect_broker.domain.errors import PayloadConflictError
from effect_broker.domain.records import EffectRequest
from effect_broker.management.crash_matrix_options import (
    add_crash_matrix_arguments,
    run_crash_matrix,
)
from effect_broker.models import Tenant
from effect_broker.services import inspection
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant


class Command(BaseCommand):
    help = (
        "Run a demonstration against the configured Postgres (embedded by default). "
        "'crash-matrix' kills real worker processes at every boundary and counts charges "
        "in the target's own table; 'reservation' reserves, replays and refuses drift."
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

    def handle(self, *args: Any, **options: Any) -> None:
        if options["demo"] == "reservation":
            self._reservation()
        elif options["demo"] == "crash-matrix":
            code = run_crash_matrix(self.stdout, options)
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
