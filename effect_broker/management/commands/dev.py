"""``effect-broker dev``: try the broker in one command (spec: "one command that
starts Postgres, the broker, workers, and the simulated target").

It starts the embedded PostgreSQL server (or uses ``DATABASE_URL``), applies the
migrations, makes a ``dev`` tenant (its API key is printed once, when it is made),
starts the simulated payment target, the API (uvicorn on ``config.asgi``) and one
``effect-broker worker``, and prints a curl command that submits a charge.

Ctrl-C or SIGTERM stops every child gracefully and exits 0. If a child exits on its
own, dev says which and how, stops the others and exits 1: a stack with a dead part
would only mislead, and restarting hides the failure.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError, CommandParser
from django.db import connection

from effect_broker import embedded_pg
from effect_broker.management.base import BrokerCommand
from effect_broker.store.database_url import url_from_settings
from effect_broker.workers.process_group import ProcessGroup

TENANT = "dev"
#: The child stop deadline: the worker's graceful shutdown (30 s) plus a margin.
STOP_SECONDS = 40.0


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def curl_submit(api_url: str, api_key: str) -> str:
    """A curl command that submits one charge, runnable as printed."""
    body = {
        "operation_key": "order:1001:charge:v1",
        "tool": "charge_idempotent",
        "arguments": {"order": "1001", "amount_minor": 1999, "currency": "EUR"},
    }
    command = shlex.join(
        [
            "curl",
            "-sS",
            "-X",
            "POST",
            f"{api_url}/v1/effects",
            "-H",
            f"Authorization: Bearer {api_key}",
            "-H",
            "Content-Type: application/json",
            "-d",
            json.dumps(body, separators=(",", ":")),
        ]
    )
    # A shell variable in place of the key must expand: double quotes, not single.
    header = shlex.quote(f"Authorization: Bearer {api_key}")
    if api_key.startswith("$"):
        command = command.replace(header, f'"Authorization: Bearer {api_key}"')
    return command


class Command(BrokerCommand):
    help = (
        "Run everything locally in one supervised process group: the embedded "
        "PostgreSQL server (or DATABASE_URL), migrations, a 'dev' tenant (its API key "
        "is printed once), the simulated payment target, the API and one worker; then "
        "print a curl command to try. Ctrl-C stops it all. If any part exits on its "
        "own, dev stops the rest and exits 1."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--port", type=int, default=8000, help="the API's port (default 8000)"
        )
        parser.add_argument(
            "--target-port",
            type=int,
            default=0,
            help="the simulated target's port (default: a free one)",
        )

    def _say(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def handle(self, *args: Any, **options: Any) -> None:
        port = options["port"]
        if _port_in_use(port):
            raise CommandError(f"port {port} is in use; pass --port with a free one")
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
        # STATE_DIR: an installed package's BASE_DIR is site-packages.
        workdir = Path(settings.STATE_DIR) / ".effect-broker" / "dev"
        workdir.mkdir(parents=True, exist_ok=True)
        we_started_postgres = self._database()
        group = ProcessGroup(self.stdout)
        failed = None
        try:
            api_key = self._tenant()
            env = self._child_env()
            target_url = self._target(group, env, workdir, options["target_port"])
            from examples.crash_matrix.contracts import write_contracts

            contracts = write_contracts(workdir / "contracts.toml", target_url)
            env["EFFECT_BROKER_CONTRACTS"] = str(contracts)
            api_url = self._api(group, env, port, stop)
            worker = group.start(
                "worker",
                [
                    sys.executable,
                    "-m",
                    "effect_broker.cli",
                    "worker",
                    "-n",
                    "dev",
                    "-c",
                    "2",
                ],
                env,
                str(settings.BASE_DIR),
            )
            self._banner(api_url, target_url, contracts, api_key, worker.pid)
            failed = group.watch(stop)
        finally:
            if failed is not None:
                self._say(
                    f"effect-broker dev: the {failed.name} exited on its own (exit code "
                    f"{failed.process.returncode}); stopping everything"
                )
            else:
                self._say("effect-broker dev: stopping (this waits for running jobs)")
            group.stop_all(STOP_SECONDS, report=self._say)
            if we_started_postgres:
                embedded_pg.stop()
                self._say("effect-broker dev: stopped the embedded PostgreSQL server")
        if failed is not None:
            raise SystemExit(1)
        self._say("effect-broker dev: stopped")

    def _database(self) -> bool:
        """Start the database if it is ours to start; return whether we did."""
        embedded = connection.settings_dict["ENGINE"] == "effect_broker.embedded_db"
        was_running = embedded_pg.status() is not None if embedded else True
        self._say("[1/5] database: " + ("starting" if not was_running else "connecting"))
        connection.ensure_connection()  # the embedded backend starts its server here
        call_command("migrate", verbosity=0, interactive=False)
        where = "embedded PostgreSQL" if embedded else "DATABASE_URL"
        self._say(f"[2/5] database ready ({where}), migrations applied")
        return embedded and not was_running

    def _tenant(self) -> str | None:
        """The dev tenant's API key when it was made now; None when it existed."""
        from effect_broker.models import Tenant
        from effect_broker.services.tenants import create_tenant

        if Tenant.objects.filter(name=TENANT).exists():
            self._say(
                f"[3/5] tenant '{TENANT}' exists; its API key was printed when it was "
                f"made. Lost it? effect-broker tenants rotate-key {TENANT}"
            )
            return None
        _, api_key = create_tenant(TENANT)
        self._say(f"[3/5] tenant '{TENANT}' created; API key (shown once): {api_key}")
        return api_key

    def _child_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "EFFECT_BROKER_PROCESS_ROLE"}
        env["DATABASE_URL"] = url_from_settings(connection.settings_dict)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _target(
        self, group: ProcessGroup, env: dict[str, str], workdir: Path, port: int
    ) -> str:
        port_file = workdir / "target.port"
        port_file.unlink(missing_ok=True)
        group.start(
            "target",
            [
                sys.executable,
                "-m",
                "examples.crash_matrix.target_service",
                "--database-url",
                env["DATABASE_URL"],
                "--port",
                str(port),
                "--schema",
                "dev_target",
                "--settlement-delay",
                "500ms",
                "--port-file",
                str(port_file),
            ],
            env,
            str(settings.BASE_DIR),
        )
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            if (
                time.monotonic() > deadline
                or group.children[-1].process.poll() is not None
            ):
                raise CommandError("the simulated target did not start (see its output)")
            time.sleep(0.1)
        return f"http://127.0.0.1:{int(port_file.read_text())}"

    def _api(
        self, group: ProcessGroup, env: dict[str, str], port: int, stop: threading.Event
    ) -> str:
        api_url = f"http://127.0.0.1:{port}"
        api = group.start(
            "api",
            [
                sys.executable,
                "-m",
                "uvicorn",
                "config.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            env,
            str(settings.BASE_DIR),
        )
        deadline = time.monotonic() + 60
        while not stop.is_set():
            if api.process.poll() is not None or time.monotonic() > deadline:
                raise CommandError("the API did not start (see its output above)")
            try:
                if httpx.get(f"{api_url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        self._say(f"[4/5] API up at {api_url}")
        return api_url

    def _banner(
        self,
        api_url: str,
        target_url: str,
        contracts: Path,
        api_key: str | None,
        worker_pid: int,
    ) -> None:
        key = api_key or "$EB_API_KEY"
        lines = [
            f"[5/5] worker started (pid {worker_pid}); simulated target at {target_url}",
            "",
            f"effect-broker dev: ready. API {api_url} (docs {api_url}/docs, admin "
            f"{api_url}/admin/), contracts {contracts}",
        ]
        if api_key is None:
            lines.append(f"Put the '{TENANT}' tenant's API key in EB_API_KEY, then:")
        else:
            lines.append("Submit a charge:")
        lines += [
            "  " + curl_submit(api_url, key),
            "then read it back with GET /v1/effects/<effect_id> (same header). "
            "Ctrl-C stops everything.",
            "",
        ]
        self._say("\n".join(lines))
