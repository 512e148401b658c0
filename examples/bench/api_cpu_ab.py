"""API CPU per request, A/B: one uvicorn API process per source tree, interleaved.

The bench's target "HTTP submits/s, 1 API process, vs /healthz on the same server"
compares the best new-key submit rate with the best ``/healthz`` rate of one API
process. This script starts one real API process (``config.asgi`` as shipped, the
bench's environment) per source tree on one scratch database, and in each round runs,
for each tree in a shuffled order, ``/healthz`` at ``--healthz-level`` callers and a
new-key submit at ``--submit-level`` callers. Only one process is loaded at a time,
so each arm sees the machine the other saw a few seconds before or after. It prints,
per arm, the ranges over rounds of submits/s, /healthz/s, their ratio and the API
process's CPU per request: what a submit costs on top of ``/healthz``, and the ratio
the rates would have if the API process's CPU were the only limit (on a shared
machine the rates swing with everyone else's load; CPU per request much less).
Usage::

    python -m examples.bench.api_cpu_ab --arm main=/work/main --arm new=. --rounds 6

Each arm's process runs with ``cwd`` and ``PYTHONPATH`` at its tree, under this
interpreter (the trees must share dependencies and migrations). Without
``DATABASE_URL`` the bench's own embedded server is used, as the bench does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from examples.bench.http_client import ARGUMENTS

if TYPE_CHECKING:
    from examples.bench.http_servers import ApiServer


@dataclass
class Arm:
    """One source tree's API process and what its rounds measured."""

    label: str
    root: Path
    rounds: list[dict[str, float]] = field(default_factory=list)
    server: ApiServer | None = None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.bench.api_cpu_ab",
        description="Interleaved A/B of one API process per source tree: submits/s "
        "vs /healthz/s and API CPU per request.",
    )
    parser.add_argument(
        "--arm",
        action="append",
        metavar="LABEL=PATH",
        help="a source tree to run (repeat; default: this tree only)",
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0, help="window per case")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--submit-level", type=int, default=8)
    parser.add_argument("--healthz-level", type=int, default=32)
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also run, at the submit level, three submits that stop early: a "
        "malformed key (401 before any database work), an unknown key (401 after the key "
        "lookup), an unknown tool (422 after parsing and the lookup, before the "
        "reservation); the differences apportion a submit's extra CPU",
    )
    parser.add_argument(
        "--profile",
        choices=("submit", "healthz"),
        help="run only this case, once per round (attach a profiler to the printed "
        "pid); no ratio is printed",
    )
    args = parser.parse_args(argv)
    arms = args.arm or [f"this={Path(__file__).resolve().parents[2]}"]
    args.arms = []
    for spec in arms:
        label, sep, path = spec.partition("=")
        if not sep or not Path(path, "config", "asgi.py").is_file():
            parser.error(f"--arm {spec!r}: want LABEL=PATH to a source tree")
        args.arms.append(Arm(label, Path(path).resolve()))
    return args


def _start(arm: Arm, env: dict[str, str], workdir: Path) -> ApiServer:
    """The bench's own API process (``http_servers.ApiServer``), serving ``arm.root``."""
    from examples.bench.http_servers import ApiServer, Variant

    variant = Variant(f"ab-{arm.label}", arm.label, ("config.asgi:application",))
    arm.server = ApiServer(variant, env, workdir, root=arm.root)
    return arm.server


#: --breakdown's cases, in the order they run.
BREAKDOWN = ("no_key", "bad_key", "bad_tool")


def _breakdown_cases(tool: str) -> dict[str, tuple[Any, str | None]]:
    """Submits that stop early, each with the API key it sends (None: the tenant's)."""
    from examples.bench.http_client import Case

    def body(tool_name: str) -> Any:
        def make(client: int, n: int) -> bytes:
            return json.dumps(
                {
                    "operation_key": f"ab:{uuid.uuid4().hex}",
                    "tool": tool_name,
                    "arguments": ARGUMENTS,
                }
            ).encode()

        return make

    post = ("POST", "/v1/effects")
    return {
        # Not an API key at all: refused before any database work.
        "no_key": (Case("no_key", "malformed key", *post, 401, body(tool)), "none"),
        "bad_key": (
            Case("bad_key", "unknown key", *post, 401, body(tool)),
            "eb_" + "x" * 43,
        ),
        "bad_tool": (
            Case("bad_tool", "unknown tool", *post, 422, body("no_such_tool")),
            None,
        ),
    }


def _measure(
    arm: Arm, api_key: str, case: Any, level: int, args: argparse.Namespace
) -> tuple[float, float, int]:
    """(requests/s, API CPU ms per request, errors) of one window."""
    from examples.bench.http_client import LevelResult, run_level
    from examples.bench.http_servers import process_cpu

    assert arm.server is not None
    pid = arm.server.process.pid
    result = LevelResult(arm.label, case.key, level, args.seconds)
    marks: dict[str, float] = {}

    def start() -> None:
        marks["cpu"] = process_cpu(pid)

    def end() -> None:
        result.api_cpu = process_cpu(pid) - marks["cpu"]

    asyncio.run(
        run_level(
            base_url=arm.server.url,
            api_key=api_key,
            case=case,
            concurrency=level,
            warmup=args.warmup,
            window=args.seconds,
            on_window_start=start,
            on_window_end=end,
            result=result,
        )
    )
    return result.rate, result.per_request(result.api_cpu) or 0.0, result.error_count


def _line(row: dict[str, float]) -> str:
    parts = [
        f"{key} {row[key]:6.1f}/s ({row[f'{key}_cpu']:.2f} ms CPU)"
        for key in ("submit", "healthz", *BREAKDOWN)
        if key in row
    ]
    if "submit" in row and "healthz" in row:
        parts.append(f"ratio {row['submit'] / row['healthz']:.3f}x")
    return "  ".join([*parts, f"errors {row['errors']:.0f}"])


def _span(values: list[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:{fmt}} - {hi:{fmt}}" if len(values) > 1 else f"{lo:{fmt}}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the rounds; print the ranges."""
    args = parse_args(argv)
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
    from examples.bench.http_client import cases
    from examples.bench.http_load import server_env

    workdir = Path(tempfile.mkdtemp(prefix="eb-api-ab-"))
    contracts = workdir / "contracts.toml"
    contracts.write_text(SIMULATED_CONTRACT, encoding="utf-8")
    with scratch_database() as db:
        _, api_key = create_tenant(f"ab-{uuid.uuid4().hex[:8]}")
        env = server_env(db.url, contracts, get_runtime().master_key)
        all_cases = cases(SIMULATED_TOOL, [])
        extra = _breakdown_cases(SIMULATED_TOOL)
        try:
            for arm in args.arms:
                _start(arm, env, workdir)
            for arm in args.arms:
                server = arm.server
                assert server is not None
                server.wait_ready()
                print(f"{arm.label}: pid {server.process.pid} ({arm.root})", flush=True)
            for n in range(args.rounds):
                order = list(args.arms)
                random.shuffle(order)
                for arm in order:
                    row: dict[str, float] = {"errors": 0}
                    if args.breakdown:
                        for key, (case, sent_key) in extra.items():
                            rate, cpu, errors = _measure(
                                arm,
                                api_key if sent_key is None else sent_key,
                                case,
                                args.submit_level,
                                args,
                            )
                            row.update({key: rate, f"{key}_cpu": cpu})
                            row["errors"] += errors
                    for key in ("healthz", "submit"):
                        if args.profile not in (None, key):
                            continue
                        level = (
                            args.healthz_level if key == "healthz" else args.submit_level
                        )
                        rate, cpu, errors = _measure(
                            arm, api_key, all_cases[key], level, args
                        )
                        row.update({key: rate, f"{key}_cpu": cpu})
                        row["errors"] += errors
                    arm.rounds.append(row)
                    print(f"round {n + 1} {arm.label:>8}: {_line(row)}", flush=True)
        finally:
            for arm in args.arms:
                if arm.server is not None:
                    arm.server.stop()
    print()
    print(
        "| arm | submits/s | /healthz/s | ratio | API CPU ms: submit | /healthz "
        "| submit - /healthz | /healthz / submit |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for arm in args.arms:
        rows = arm.rounds
        if args.profile or not rows:
            continue
        print(
            f"| {arm.label} | {_span([r['submit'] for r in rows], '.1f')} "
            f"| {_span([r['healthz'] for r in rows], '.1f')} "
            f"| {_span([r['submit'] / r['healthz'] for r in rows], '.3f')} "
            f"| {_span([r['submit_cpu'] for r in rows], '.2f')} "
            f"| {_span([r['healthz_cpu'] for r in rows], '.2f')} "
            f"| {_span([r['submit_cpu'] - r['healthz_cpu'] for r in rows], '.2f')} "
            f"| {_span([r['healthz_cpu'] / r['submit_cpu'] for r in rows], '.3f')} |"
        )
    if args.breakdown:
        _print_breakdown(args.arms)
    return 0


def _print_breakdown(arms: list[Arm]) -> None:
    """API CPU ms per request of each stage, as differences of the cases' costs."""
    stages = (
        ("POST, malformed key (401) - /healthz", "no_key", "healthz"),
        ("key lookup: unknown key - malformed key", "bad_key", "no_key"),
        ("parse, validate, seal: unknown tool - unknown key", "bad_tool", "bad_key"),
        ("reservation and 202: submit - unknown tool", "submit", "bad_tool"),
    )
    print()
    print("| stage | " + " | ".join(arm.label for arm in arms) + " |")
    print("|---|" + "---|" * len(arms))
    for label, a, b in stages:
        cells = []
        for arm in arms:
            diffs = [r[f"{a}_cpu"] - r[f"{b}_cpu"] for r in arm.rounds]
            cells.append(f"{statistics.median(diffs):.2f} ({_span(diffs, '.2f')})")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
