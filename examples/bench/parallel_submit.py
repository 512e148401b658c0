"""Submits per second from 1 client process and from 2 (issue 25: "2 client processes
≥ 1.7x one", restating issue 13's "8 client processes vs 1 ≥ 3x", which 2 vCPUs
cannot show: one process and its PostgreSQL backend keep about one of them busy).

Each client is its own OS process (multiprocessing ``spawn``: its own interpreter,
Django setup and database connection), calling the service-level submit with keys never
seen before, as the API would. The clients are started once and kept: each round tells
1 or all of them to submit for the same fixed wall-clock window, starting together, and
counts the submits that completed inside it. Rounds alternate 1 and 2 clients so both
see the same machine. What is measured is the broker's contention (the unique index,
the job table, commits), not the cost of starting processes.

This module imports nothing from Django at the top: a spawned child imports it before
it has set Django up.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Client processes of the parallel rounds (the single-process round uses one of them).
CLIENTS = 2
#: Parallel / single submits per second: at least this.
MIN_RATIO = 1.7
#: Submits each client makes before the first round (connection, caches, plans).
WARMUP = 5
#: How long before a round's start its command is sent, so every client is waiting.
START_DELAY = 0.5


@dataclass
class ParallelSubmits:
    """Submits per second of each round, by number of client processes."""

    window_seconds: float
    rates: dict[int, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def median(self, clients: int) -> float:
        """Median submits/s over the rounds with ``clients`` processes (NaN if none)."""
        values = self.rates.get(clients)
        return statistics.median(values) if values else float("nan")

    def ratio(self) -> float:
        """Median submits/s with CLIENTS processes / with 1 (NaN when not measured)."""
        single, parallel = self.median(1), self.median(CLIENTS)
        if single != single or parallel != parallel or single == 0:
            return float("nan")
        return parallel / single

    def detail(self) -> str:
        """The two rates the ratio is made of, for the Targets table."""
        return (
            f"1 process {self.median(1):,.0f}/s, {CLIENTS} processes "
            f"{self.median(CLIENTS):,.0f}/s; {len(self.rates.get(1, []))} rounds of "
            f"{self.window_seconds:g} s, new keys, service-level submit"
        )

    def to_json(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "clients": CLIENTS,
            "window_seconds": self.window_seconds,
            "submits_per_second": {str(k): v for k, v in self.rates.items()},
            "ratio": self.ratio(),
            "errors": self.errors,
        }


def _client(
    env: Mapping[str, str],
    tenant_id: str,
    tool: str,
    arguments: Mapping[str, object],
    commands: Any,
    results: Any,
) -> None:
    """One client process: set Django up, warm up, then run the rounds it is sent."""
    os.environ.update(env)
    import django

    django.setup()
    from effect_broker.domain.records import EffectRequest
    from effect_broker.models import Tenant
    from effect_broker.services.submission import submit

    tenant = Tenant.objects.get(id=tenant_id)
    prefix = f"parallel:{uuid.uuid4().hex[:12]}"
    n = 0

    def one() -> None:
        nonlocal n
        n += 1
        request = EffectRequest(
            operation_key=f"{prefix}:{n}", tool=tool, arguments=dict(arguments)
        )
        if not submit(tenant, request).created:
            raise RuntimeError(f"{request.operation_key} was not new")

    try:
        for _ in range(WARMUP):
            one()
    except Exception as exc:  # reported by the parent; the round counts nothing
        results.put(("error", f"{type(exc).__name__}: {exc}"))
        return
    results.put(("ready", 0))
    while True:
        command = commands.get()
        if command is None:
            return
        start_at, window = command
        time.sleep(max(0.0, start_at - time.time()))
        started = time.monotonic()
        done = 0
        try:
            while time.monotonic() - started < window:
                one()
                done += 1
            results.put(("done", done / (time.monotonic() - started)))
        except Exception as exc:
            results.put(("error", f"{type(exc).__name__}: {exc}"))


def measure(
    env: Mapping[str, str],
    tenant_id: str,
    tool: str,
    arguments: Mapping[str, object],
    *,
    rounds: int,
    window: float,
    say: Callable[[str], None],
) -> ParallelSubmits:
    """Alternate ``rounds`` rounds of 1 and of CLIENTS client processes."""
    ctx = multiprocessing.get_context("spawn")
    results: Any = ctx.Queue()
    commands = [ctx.Queue() for _ in range(CLIENTS)]
    clients = [
        ctx.Process(
            target=_client,
            args=(dict(env), tenant_id, tool, dict(arguments), commands[i], results),
            daemon=True,
        )
        for i in range(CLIENTS)
    ]
    out = ParallelSubmits(window_seconds=window)
    for process in clients:
        process.start()
    try:
        for _ in range(CLIENTS):
            kind, value = results.get(timeout=180)
            if kind == "error":
                out.errors.append(value)
        if out.errors:
            return out
        for _ in range(rounds):
            for count in (1, CLIENTS):
                start_at = time.time() + START_DELAY
                for queue in commands[:count]:
                    queue.put((start_at, window))
                rates = []
                for _ in range(count):
                    kind, value = results.get(timeout=window + 120)
                    if kind == "error":
                        out.errors.append(value)
                    else:
                        rates.append(value)
                if len(rates) == count:
                    out.rates.setdefault(count, []).append(sum(rates))
                say(f"      {count} client process(es): {sum(rates):,.0f} submits/s")
        return out
    finally:
        for queue in commands:
            queue.put(None)
        for process in clients:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
