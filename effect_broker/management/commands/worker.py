"""``effect-broker worker``: run the broker's jobs, and keep running through database
outages (issue 11; ``effect_broker.workers.supervision``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser

from effect_broker.management.base import BrokerCommand
from effect_broker.workers.supervision import (
    BROKER_QUEUES,
    EXIT_GAVE_UP,
    Backoff,
    WorkerPlan,
)


def _positive_int(raw: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {raw!r}")
    return int(raw)


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {raw!r}")
    return value


def _worker_name(raw: str) -> str:
    # Lease owners are "<name>:<pid>:job<id>"; a colon would garble them.
    if not raw or ":" in raw or not raw.isprintable():
        raise argparse.ArgumentTypeError(
            f"must be printable and free of ':', got {raw!r}"
        )
    return raw


def database_label() -> str:
    """Where this process's database is, without credentials: ``host:port/name``."""
    entry = settings.DATABASES["default"]
    host = entry.get("HOST") or "localhost"
    port = f":{entry['PORT']}" if entry.get("PORT") else ""
    return f"{host}{port}/{entry.get('NAME', '')}"


class Command(BrokerCommand):
    help = (
        "Run a broker worker: dispatch, reconciliation and the periodic sweep "
        f"(queues {', '.join(BROKER_QUEUES)}). It survives database outages and "
        "failovers: when the database goes away it waits, logging each retry, and runs "
        "again in the same process once the database answers. SIGTERM or Ctrl-C stop "
        "it gracefully (running jobs get 30 s to finish, then are aborted and retried "
        "later); a second signal stops it at once. Exit codes: 0 after a requested "
        f"stop, {EXIT_GAVE_UP} when --max-outage ran out, 2 on bad configuration."
    )

    #: The queues this command runs; the reconciler narrows them.
    queues: tuple[str, ...] = BROKER_QUEUES
    default_name = "worker"
    default_concurrency = 4

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "-c",
            "--concurrency",
            type=_positive_int,
            default=self.default_concurrency,
            help="jobs run at once (each holds a database connection and its lease "
            "heartbeat another: keep EFFECT_BROKER_WORKER_DB_POOL_MAX_SIZE >= "
            "2 x concurrency + 2; default %(default)s)",
        )
        parser.add_argument(
            "-n",
            "--name",
            type=_worker_name,
            default=self.default_name,
            help="worker name, shown in logs and in each effect's lease owner "
            "(default %(default)s)",
        )
        parser.add_argument(
            "--max-outage",
            type=_seconds,
            default=None,
            metavar="SECONDS",
            help="exit (code 3) when the database has not answered for this long; by "
            "default wait for ever, as a worker under a restart policy should",
        )
        parser.add_argument(
            "--max-backoff",
            type=_seconds,
            default=Backoff.cap,
            metavar="SECONDS",
            help="longest wait between two checks of an unavailable database "
            "(default %(default)ss)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        from procrastinate.contrib.django import app
        from procrastinate.contrib.django.utils import connector_params

        from config.capacity import POOL_RECONNECT_SECONDS
        from effect_broker.services.conformance_runs import warn_unproved_at_start
        from effect_broker.store.pool_checks import (
            procrastinate_connector,
            use_on_django_pool,
        )
        from effect_broker.workers.supervision import WorkerSupervisor, database_probe

        plan = WorkerPlan(
            queues=self.queues,
            concurrency=options["concurrency"],
            name=name,
            max_outage=options["max_outage"],
            backoff=Backoff(cap=options["max_backoff"]),
        )
        self.stdout.write(
            f"effect-broker {self.default_name}: pid {os.getpid()}, name {name}, "
            f"queues {', '.join(plan.queues)}, concurrency {plan.concurrency}, "
            f"database {database_label()}"
        )
        self.stdout.flush()
        # A contract that claims idempotent or reconcilable with no passing
        # `contracts conform` run: the retries below trust an unproved promise.
        warn_unproved_at_start(self.default_name)
        app.perform_import_paths()
        # procrastinate's Django connector cannot LISTEN; a worker needs its own pool,
        # as DjangoConnector.get_worker_connector builds it - plus the short reconnect
        # backoff our Django pools have (config.capacity.POOL_RECONNECT_SECONDS), so
        # the heartbeat and fetches come back as soon as the database does.
        # Both pools test a connection only when in doubt, not on every checkout
        # (effect_broker.store.pool_checks: three commits per effect, issue 13).
        params = connector_params()
        worker_connector = procrastinate_connector(
            params, reconnect_timeout=POOL_RECONNECT_SECONDS
        )
        use_on_django_pool()
        with app.replace_connector(worker_connector) as worker_app:
            supervisor = WorkerSupervisor(worker_app, plan, probe=database_probe(params))
            code = asyncio.run(supervisor.run())
        if code:
            sys.stderr.write(
                f"effect-broker {self.default_name}: gave up: the database did not "
                f"answer for --max-outage {plan.max_outage:g}s\n"
            )
            raise SystemExit(code)
