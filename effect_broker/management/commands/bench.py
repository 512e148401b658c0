"""``effect-broker bench``: the broker's overhead and scale next to its floors and
baselines, measured in one run (see docs/benchmarks.md)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from effect_broker.management.base import BrokerCommand
from examples.bench.options import add_arguments, from_cli


class Command(BrokerCommand):
    help = (
        "Measure, on one scratch PostgreSQL database and back to back: the durable "
        "INSERT and bare procrastinate floors, a hand-rolled Django idempotency table, "
        "agent-ledger (if installed), and the broker (submit, replay, claim, end to end "
        "through 1/2/4 worker processes, reconciliation after a lost response, and "
        "scale on 10k and 1M-effect ledgers). Prints markdown tables with medians, p99 "
        "and ratios; --json and a PNG chart on request. Takes a few minutes; --quick "
        "takes well under one. --soak N runs only a soak: N effects through 2 workers, "
        "one SIGKILLed on schedule, reported per window."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        opts = from_cli(options)  # bad input: InvalidRequestError, one line, exit 2
        # Imported here: measuring pulls in the example rig and worker helpers.
        from examples.bench.runner import run

        code = run(self.stdout, opts)
        if code:
            raise SystemExit(code)
