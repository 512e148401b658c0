"""Noisy neighbour: what one tenant's flood of maximal submits does to everyone else.

Issue 12 measured four clients of one tenant sending 240 KB submits with 15,500
argument keys: ``/healthz`` went from 6 ms to a p50 of 390 ms. This bench repeats the
flood against one real uvicorn API process, with submits as large as the argument
caps now allow (1,000 keys, just under the 256 KiB body limit), and measures a quiet
caller alongside: ``/healthz`` and a small submit of another tenant, one at a time.

Each phase runs its own API process: no flood (baseline), then the flood with the
per-tenant submit limit off, at its default, and at a tight setting. Figures from one
run are comparable with each other, not across machines.

    python -m examples.bench.noisy_neighbour [--seconds 8] [--clients 4]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

PHASES: list[tuple[str, str | None]] = [
    ("no flood (baseline)", None),
    ("flood, limit off", "0"),
    ("flood, limit 100/s (default)", "100"),
    ("flood, limit 10/s", "10"),
]


@dataclass
class PhaseResult:
    label: str
    healthz: list[float] = field(default_factory=list)
    quiet_submit: list[float] = field(default_factory=list)
    quiet_errors: int = 0
    flood_accepted: int = 0
    flood_refused: int = 0
    flood_other: int = 0
    seconds: float = 0.0


def big_arguments() -> dict[str, Any]:
    """1,000 keys (the default cap) of 200 characters each: about 220 KB of JSON."""
    return {f"field_{i:04d}": "x" * 200 for i in range(1000)}


async def flood(
    url: str, key: str, tool: str, stop: asyncio.Event, result: PhaseResult
) -> None:
    # Serialised once: the flood shares this machine's CPUs with the server, so it
    # must not spend them re-encoding 220 KB per request.
    template = json.dumps(
        {"operation_key": "KEY", "tool": tool, "arguments": big_arguments()}
    ).encode()
    head, tail = template.split(b'"KEY"', 1)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
        while not stop.is_set():
            body = head + f'"flood:{uuid.uuid4().hex}"'.encode() + tail
            try:
                response = await client.post("/v1/effects", content=body)
            except httpx.HTTPError:
                result.flood_other += 1
                continue
            if response.status_code == 202:
                result.flood_accepted += 1
            elif response.status_code == 429:
                # A well-behaved client honours Retry-After; a hostile one does not,
                # and neither does this flood: the harder case.
                result.flood_refused += 1
            else:
                result.flood_other += 1


async def quiet(
    url: str, key: str, tool: str, stop: asyncio.Event, result: PhaseResult
) -> None:
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as client:
        while not stop.is_set():
            started = time.perf_counter()
            health = await client.get("/healthz")
            result.healthz.append(time.perf_counter() - started)
            started = time.perf_counter()
            response = await client.post(
                "/v1/effects",
                json={
                    "operation_key": f"quiet:{uuid.uuid4().hex}",
                    "tool": tool,
                    "arguments": {"order": "1", "amount_minor": 100, "currency": "EUR"},
                },
            )
            result.quiet_submit.append(time.perf_counter() - started)
            if health.status_code != 200 or response.status_code != 202:
                result.quiet_errors += 1
            await asyncio.sleep(0.05)


async def run_phase(
    url: str,
    keys: tuple[str, str],
    tool: str,
    flooding: bool,
    clients: int,
    seconds: float,
    result: PhaseResult,
) -> None:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(quiet(url, keys[1], tool, stop, result))]
    if flooding:
        tasks += [
            asyncio.create_task(flood(url, keys[0], tool, stop, result))
            for _ in range(clients)
        ]
    started = time.monotonic()
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*tasks)
    result.seconds = time.monotonic() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.bench.noisy_neighbour",
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="per phase (8)")
    parser.add_argument("--clients", type=int, default=4, help="flooding clients (4)")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from effect_broker.services.runtime import get_runtime
    from effect_broker.services.tenants import create_tenant
    from examples.bench.environment import (
        SIMULATED_CONTRACT,
        SIMULATED_TOOL,
        scratch_database,
    )
    from examples.bench.http_servers import VARIANTS, ApiServer
    from examples.bench.stats import percentile

    results: list[PhaseResult] = []
    with scratch_database() as db, tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        contracts = workdir / "contracts.toml"
        contracts.write_text(SIMULATED_CONTRACT, encoding="utf-8")
        keys = (create_tenant("noisy")[1], create_tenant("quiet")[1])
        base_env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("EFFECT_BROKER_", "DJANGO_SETTINGS"))
        }
        base_env.update(
            DATABASE_URL=db.url,
            EFFECT_BROKER_CONTRACTS=str(contracts),
            EFFECT_BROKER_MASTER_KEY=base64.b64encode(get_runtime().master_key).decode(),
            DEBUG="0",
        )
        for label, rate in PHASES:
            env = {**base_env, "EFFECT_BROKER_TENANT_SUBMIT_RATE": rate or "0"}
            server = ApiServer(VARIANTS["pooled"], env, workdir)
            try:
                server.wait_ready()
                result = PhaseResult(label)
                asyncio.run(
                    run_phase(
                        server.url,
                        keys,
                        SIMULATED_TOOL,
                        rate is not None,
                        args.clients,
                        args.seconds,
                        result,
                    )
                )
                results.append(result)
                print(f"  {label}: done", file=sys.stderr, flush=True)
            finally:
                server.stop()

    def ms(values: list[float], q: float) -> str:
        return f"{percentile(values, q) * 1000:.1f}" if values else "-"

    print(
        f"\nNoisy neighbour: {args.clients} clients of one tenant flood maximal submits "
        f"(1,000 keys, ~220 KB); a quiet tenant probes alongside. {args.seconds:g} s "
        "per phase, one uvicorn process, this machine.\n"
    )
    print(
        "| phase | /healthz p50 / p99 ms | quiet submit p50 / p99 ms | quiet errors "
        "| flood accepted/s | flood 429/s |"
    )
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.label} | {ms(r.healthz, 50)} / {ms(r.healthz, 99)} "
            f"| {ms(r.quiet_submit, 50)} / {ms(r.quiet_submit, 99)} | {r.quiet_errors} "
            f"| {r.flood_accepted / r.seconds:.1f} | {r.flood_refused / r.seconds:.1f} |"
        )
    print(
        "\nThe limit is per API process; the flood ignores Retry-After (a hostile "
        "client would), so its refused requests still cost their authentication."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
