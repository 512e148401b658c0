"""The HTTP bench's markdown report: one table per case with both variants in every
cell ("before / pooled"), then the issue-13 targets of the HTTP path."""

from __future__ import annotations

import math
from typing import Any

CASE_TITLES = {
    "submit": "submit: POST /v1/effects, a new operation key each time (202)",
    "replay": "replay: POST /v1/effects, an existing key and the same payload (200)",
    "healthz": "GET /healthz (200)",
}


def _num(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _errors(row: dict[str, Any]) -> str:
    errors = row["errors"]
    if not errors:
        return "0"
    total = sum(errors.values())
    detail = ", ".join(f"{k} x{v}" for k, v in sorted(errors.items()))
    return f"{total} ({detail})"


def _pair(rows: list[dict[str, Any] | None], render: Any) -> str:
    return " / ".join(render(r) if r is not None else "-" for r in rows)


def _index(report: dict[str, Any]) -> dict[tuple[str, str, int], dict[str, Any]]:
    return {(r["variant"], r["case"], r["concurrency"]): r for r in report["results"]}


def render(report: dict[str, Any]) -> str:
    """The whole report as markdown."""
    variants = list(report["variants"])
    opts = report["options"]
    m, s = report["machine"], report["server"]
    index = _index(report)
    lines = [
        "## effect-broker HTTP load (closed loop, one uvicorn process per variant)",
        "",
        f"Machine: {m['nproc']} vCPU {m['cpu']}, {m['ram_gb']} GB RAM, {m['os']}, "
        f"Python {m['python']}; load average at start "
        f"{'/'.join(f'{x:.2f}' for x in m['load_average_at_start'])}, at end "
        f"{'/'.join(f'{x:.2f}' for x in report['load_average_at_end'])}",
        f"PostgreSQL {s['server_version']} ({s['where']}): fsync={s['fsync']}, "
        f"synchronous_commit={s['synchronous_commit']}, "
        f"max_connections={s['max_connections']}; its CPU: {report['postgres_cpu']}",
        f"Run {report['started_at']}: levels {','.join(map(str, opts['levels']))}, "
        f"per level and variant a warm-up of {opts['warmup_s']:g} s and until every "
        f"client had an answer, then at least {opts['window_s']:g} s (and 3 round trips "
        "of one client) measured; the variants back to back at each level; "
        f"{report['elapsed_s']:g} s in all",
    ]
    for key in variants:
        lines.append(f"- **{key}**: {report['variants'][key]}")
    if opts["pooled_env"]:
        tuned = ", ".join(f"{k}={v}" for k, v in sorted(opts["pooled_env"].items()))
        lines.append(f"- settings given to the API processes: {tuned}")
    others = max((r["other_active_backends_max"] for r in report["results"]), default=0)
    if others:
        lines.append(
            f"- the database server was shared: up to {others} active backends of "
            "other databases were seen during the measurements; PostgreSQL CPU "
            "includes their work"
        )
    lines += [
        "",
        "Every cell is " + " / ".join(variants) + ", measured in this run. CPU is per "
        "completed request (errors included); p50/p99 are of successful requests; "
        "connections are the most the API process held at once (sampled every 50 ms).",
    ]
    for case in opts["cases"]:
        lines += [
            "",
            f"### {CASE_TITLES[case]}",
            "",
            "| clients | req/s | p50 ms | p99 ms | errors | API CPU ms/req "
            "| PostgreSQL CPU ms/req | load generator CPU ms/req | max DB connections |",
            "|---:|---|---|---|---|---|---|---|---|",
        ]
        for level in opts["levels"]:
            rows = [index.get((v, case, level)) for v in variants]
            lines.append(
                f"| {level} "
                f"| {_pair(rows, lambda r: _num(r['req_per_s'], 0))} "
                f"| {_pair(rows, lambda r: _num(r['p50_ms']))} "
                f"| {_pair(rows, lambda r: _num(r['p99_ms']))} "
                f"| {_pair(rows, _errors)} "
                f"| {_pair(rows, lambda r: _num(r['api_cpu_ms_per_req'], 2))} "
                f"| {_pair(rows, lambda r: _num(r['pg_cpu_ms_per_req'], 2))} "
                f"| {_pair(rows, lambda r: _num(r['client_cpu_ms_per_req'], 2))} "
                f"| {_pair(rows, lambda r: str(r['max_db_connections']))} |"
            )
    lines += ["", *_targets(report, variants, index)]
    idle = report.get("idle_connections")
    if idle:
        lines.append(
            "Connections held at the end, idle: "
            + ", ".join(f"{k} {v}" for k, v in idle.items())
        )
    return "\n".join(lines)


def _targets(
    report: dict[str, Any],
    variants: list[str],
    index: dict[tuple[str, str, int], dict[str, Any]],
) -> list[str]:
    """Issue 13's HTTP-path targets, as ratios measured in this run."""
    opts = report["options"]
    levels = opts["levels"]
    service = report["service_submit_ms"]
    lines = [
        "### Targets of the HTTP path (issue 13)",
        "",
        f"Service-level submit in the bench process (no HTTP): p50 "
        f"{service['p50']:.2f} ms, p99 {service['p99']:.2f} ms (n={service['n']}).",
        "",
        "| target | goal | " + " | ".join(variants) + " |",
        "|---|---|" + "---|" * len(variants),
    ]

    def cells(fn: Any) -> str:
        return " | ".join(fn(v) for v in variants)

    def p50_ratio(v: str) -> str:
        sub, hz = index.get((v, "submit", 1)), index.get((v, "healthz", 1))
        if not sub or not hz or sub["p50_ms"] is None or hz["p50_ms"] is None:
            return "-"
        base = service["p50"] + hz["p50_ms"]
        return f"{sub['p50_ms'] / base:.2f}x ({sub['p50_ms']:.1f} vs {base:.1f} ms)"

    def rate_ratio(v: str) -> str:
        subs = [
            index[(v, "submit", n)]["req_per_s"]
            for n in levels
            if (v, "submit", n) in index
        ]
        hzs = [
            index[(v, "healthz", n)]["req_per_s"]
            for n in levels
            if (v, "healthz", n) in index
        ]
        if not subs or not hzs or not max(hzs):
            return "-"
        return f"{max(subs) / max(hzs):.2f}x ({max(subs):,.0f} vs {max(hzs):,.0f})"

    def pg_cpu(v: str) -> str:
        values = [
            index[(v, "submit", n)]["pg_cpu_ms_per_req"]
            for n in levels
            if (v, "submit", n) in index and index[(v, "submit", n)]["pg_cpu_ms_per_req"]
        ]
        if not values:
            return "-"
        return f"{min(values):.2f}-{max(values):.2f} ms"

    top = max(levels)

    def connections(v: str) -> str:
        rows = [index[(v, c, top)] for c in opts["cases"] if (v, c, top) in index]
        if not rows:
            return "-"
        conns = max(r["max_db_connections"] for r in rows)
        errors = sum(sum(r["errors"].values()) for r in rows)
        return f"{conns} connections, {errors} errors"

    if "submit" in opts["cases"] and "healthz" in opts["cases"] and 1 in levels:
        lines.append(
            "| HTTP submit p50 at 1 client vs service-level submit + /healthz p50 "
            f"| ≤ 1.5x | {cells(p50_ratio)} |"
        )
    if "submit" in opts["cases"] and "healthz" in opts["cases"]:
        lines.append(
            "| HTTP submits/s vs /healthz req/s, same process (best level of each) "
            f"| ≥ 0.6x | {cells(rate_ratio)} |"
        )
    if "submit" in opts["cases"]:
        lines.append(
            "| PostgreSQL CPU per HTTP submit (range over the levels) "
            f"| ≤ 3 ms | {cells(pg_cpu)} |"
        )
    lines.append(
        f"| open DB connections at {top} clients (every case), and errors "
        f"| ≤ pool size, 0 errors | {cells(connections)} |"
    )
    lines.append("")
    return lines
