"""``effect-broker db up|down|status|url``: manage the embedded PostgreSQL server;
``effect-broker db grant --role NAME``: grant a serving role its privileges."""

from __future__ import annotations

import os
import time
from typing import Any

from django.core.management.base import CommandParser

from effect_broker import embedded_pg
from effect_broker.management.base import BrokerCommand


class Command(BrokerCommand):
    help = (
        "Manage the embedded PostgreSQL server used when DATABASE_URL is unset. "
        "'up' starts it (or reuses a running one), 'down' stops it, 'status' reports it "
        "(exit 1 when stopped), 'url' starts it if needed and prints a connection URL. "
        "'grant --role NAME' (any server, run as the tables' owner after migrate) grants "
        "the role the API and workers serve with: no TRUNCATE, no ownership, no DELETE "
        "on the ledger (docs/fencing.md)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["up", "down", "status", "url", "grant"])
        parser.add_argument(
            "--role", help="for 'grant': the role the API and workers connect as"
        )
        parser.add_argument(
            "--dbname", default="effect_broker", help="database name for 'url' and 'up'"
        )
        parser.add_argument(
            "--tcp",
            action="store_true",
            help="listen on a free 127.0.0.1 port instead of a unix socket",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "grant":
            self._grant(options["role"])
            return
        if os.environ.get("DATABASE_URL") and action != "status":
            self.stderr.write(
                "note: DATABASE_URL is set, so the broker uses that server; "
                "this command only manages the embedded one."
            )
        if action == "down":
            was_running = embedded_pg.stop()
            self.stdout.write("stopped" if was_running else "not running")
            return
        if action == "status":
            server = embedded_pg.status()
            if server is None:
                self.stdout.write("stopped")
                raise SystemExit(1)
            self.stdout.write(f"running pid={server.pid} url={server.url()}")
            return
        started = time.monotonic()
        server = embedded_pg.ensure_running(tcp=options["tcp"])
        embedded_pg.ensure_database(server, options["dbname"])
        if action == "url":
            self.stdout.write(server.url(options["dbname"]))
            return
        self.stdout.write(
            f"up pid={server.pid} in {time.monotonic() - started:.2f}s "
            f"url={server.url(options['dbname'])}"
        )

    def _grant(self, role: str | None) -> None:
        from effect_broker.domain.errors import InvalidRequestError
        from effect_broker.store.roles import grant_serving_role

        if not role or not role.strip():
            raise InvalidRequestError("db grant needs --role NAME (the serving role)")
        statements = grant_serving_role(role.strip())
        self.stdout.write(
            f"granted {role.strip()} serving privileges ({len(statements)} statements)"
        )
