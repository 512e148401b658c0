"""A closed-loop HTTP load generator in Python (httpx, asyncio): ``concurrency``
clients, each sending its next request as soon as the previous answer arrived.

Closed loop means the offered load adapts to the server: latency then reads as
"how long a caller waits with N callers in flight", and throughput as what the server
sustains. Each level runs a warm-up (connections opened, pools grown, caches warm),
then a measurement window: a request counts when its answer arrives inside the
window, and CPU is read at the window's edges.
"""

from __future__ import annotations

import asyncio
import json
import resource
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from examples.bench.stats import percentile

#: Longest warm-up and measurement window of one level (seconds).
MAX_WARMUP = 60.0
MAX_WINDOW = 30.0

ARGUMENTS: dict[str, Any] = {"order": "42", "amount_minor": 1999, "currency": "EUR"}


@dataclass(frozen=True)
class Case:
    """One kind of request: its method, path, body and the status that means success."""

    key: str
    label: str
    method: str
    path: str
    expected_status: int
    body: Callable[[int, int], bytes] | None = None


def cases(tool: str, replay_keys: list[str]) -> dict[str, Case]:
    """submit (a new key each time), replay (an existing key, same payload), healthz,
    and bare (a plain Django view: only on servers run with the bench's settings,
    ``examples.bench.served_settings``)."""
    run = uuid.uuid4().hex[:8]

    def new_key(client: int, n: int) -> bytes:
        return json.dumps(
            {
                "operation_key": f"http:{run}:{uuid.uuid4().hex}",
                "tool": tool,
                "arguments": ARGUMENTS,
            }
        ).encode()

    def replay(client: int, n: int) -> bytes:
        key = replay_keys[client % len(replay_keys)]
        return json.dumps(
            {"operation_key": key, "tool": tool, "arguments": ARGUMENTS}
        ).encode()

    return {
        "submit": Case(
            "submit", "POST /v1/effects, new key", "POST", "/v1/effects", 202, new_key
        ),
        "replay": Case(
            "replay", "POST /v1/effects, existing key", "POST", "/v1/effects", 200, replay
        ),
        "healthz": Case("healthz", "GET /healthz", "GET", "/healthz", 200),
        "bare": Case("bare", "GET a bare Django view", "GET", "/v1/bench/bare", 200),
    }


@dataclass
class LevelResult:
    """What one (variant, case, concurrency) measurement saw."""

    variant: str
    case: str
    concurrency: int
    window: float
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    api_cpu: float = 0.0
    pg_cpu: float | None = None
    client_cpu: float = 0.0
    max_connections: int = 0
    other_active_backends: int = 0

    @property
    def completed(self) -> int:
        """Answers (or failures) that arrived inside the window."""
        return len(self.latencies) + sum(self.errors.values())

    @property
    def error_count(self) -> int:
        """Failed requests inside the window."""
        return sum(self.errors.values())

    @property
    def rate(self) -> float:
        """Successful requests per second."""
        return len(self.latencies) / self.window

    def p(self, q: float) -> float:
        """Latency percentile of the successful requests (seconds)."""
        return percentile(self.latencies, q)

    def per_request(self, seconds: float | None) -> float | None:
        """CPU milliseconds per completed request."""
        if seconds is None or not self.completed:
            return None
        return seconds * 1000 / self.completed

    def to_json(self) -> dict[str, Any]:
        """The summary written to --json."""
        return {
            "variant": self.variant,
            "case": self.case,
            "concurrency": self.concurrency,
            "window_s": self.window,
            "ok": len(self.latencies),
            "errors": self.errors,
            "req_per_s": self.rate,
            "p50_ms": self.p(50) * 1000 if self.latencies else None,
            "p99_ms": self.p(99) * 1000 if self.latencies else None,
            "api_cpu_ms_per_req": self.per_request(self.api_cpu),
            "pg_cpu_ms_per_req": self.per_request(self.pg_cpu),
            "client_cpu_ms_per_req": self.per_request(self.client_cpu),
            "max_db_connections": self.max_connections,
            "other_active_backends_max": self.other_active_backends,
        }


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_level(
    *,
    base_url: str,
    api_key: str,
    case: Case,
    concurrency: int,
    warmup: float,
    window: float,
    on_window_start: Callable[[], None],
    on_window_end: Callable[[], None],
    result: LevelResult,
) -> None:
    """Drive ``concurrency`` closed-loop clients; fill ``result`` for the window.

    ``on_window_start``/``on_window_end`` read the server-side counters (CPU,
    connections) at the window's edges; they run in a thread so the clients keep
    going while they read /proc.
    """
    state = {"recording": False, "stop": False}
    completed = [0] * concurrency
    warm_latencies: list[float] = []
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}

    async def loop(index: int) -> None:
        # One client (one keep-alive connection) per virtual caller: a shared
        # httpx pool does per-request work that grows with its connection count
        # (measured here: ~1.3 ms of client CPU per request at 8 callers, ~8 ms
        # at 64), which would make the load generator the bottleneck.
        async with httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            timeout=60.0,
        ) as client:
            n = 0
            while not state["stop"]:
                body = case.body(index, n) if case.body else None
                n += 1
                started = time.perf_counter()
                try:
                    response = await client.request(case.method, case.path, content=body)
                    outcome = (
                        "ok"
                        if response.status_code == case.expected_status
                        else _status_label(response)
                    )
                except httpx.HTTPError as exc:
                    outcome = type(exc).__name__
                completed[index] += 1
                if not state["recording"]:
                    warm_latencies.append(time.perf_counter() - started)
                    continue
                if outcome == "ok":
                    result.latencies.append(time.perf_counter() - started)
                else:
                    result.errors[outcome] = result.errors.get(outcome, 0) + 1

    tasks = [asyncio.create_task(loop(i)) for i in range(concurrency)]
    try:
        # Warm up for at least ``warmup`` and until every caller has had an answer:
        # with many callers the first round (connections opened, threads started,
        # the pool grown) takes seconds, and is not the steady state.
        await asyncio.sleep(warmup)
        deadline = time.perf_counter() + MAX_WARMUP
        while min(completed) < 1 and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
        # A window of at least a few round trips of one caller, so that each
        # caller's requests, not only the fastest, are in it.
        typical = (
            statistics.median(warm_latencies[-concurrency:]) if warm_latencies else 0
        )
        window = min(max(window, 3 * typical), MAX_WINDOW)
        await asyncio.to_thread(on_window_start)
        client_cpu = _self_cpu()
        started = time.perf_counter()
        state["recording"] = True
        await asyncio.sleep(window)
        state["recording"] = False
        result.window = time.perf_counter() - started
        result.client_cpu = _self_cpu() - client_cpu
        await asyncio.to_thread(on_window_end)
    finally:
        state["stop"] = True
        await asyncio.gather(*tasks, return_exceptions=True)


def _status_label(response: httpx.Response) -> str:
    code = ""
    if response.headers.get("content-type", "").startswith("application/problem+json"):
        try:
            code = f" {response.json().get('code', '')}"
        except ValueError:
            code = ""
    return f"{response.status_code}{code}"
