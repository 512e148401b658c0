"""What the HTTP phase of ``effect-broker bench`` measured, and the targets of the
HTTP path read from it (issues 13 and 25; pure Python, no Django, no server).

The phase itself (``http_phase``) starts the processes; this module only holds the
figures, so the report can import it without starting anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from examples.bench.http_client import LevelResult

#: (name, measured, limit, met, detail): the shape of report.Target.
TargetRow = tuple[str, str, str, bool | None, str]

P50_MAX_RATIO = 1.5
#: Issue 25: submits/s of one API process at the top level, served as shipped, vs the
#: API process as it was served before issue 25 (``VARIANTS["hops"]``), same run.
RATE_MIN_RATIO = 2.0
#: Issue 25's "today": ~200 submits/s at 256 callers; the reference when the run did
#: not measure the earlier serving path (``--serving-modes none``).
EARLIER_SUBMITS_PER_S = 200.0
PG_CPU_MAX_MS = 3.0
E2E_MIN_RATE = 100.0
#: The served process whose figures are the targets' (``http_servers.VARIANTS``).
SHIPPED = "pooled"
#: The ASGI path before issue 25 (a thread hop per middleware hook).
EARLIER = "hops"


@dataclass
class EndToEnd:
    """API + worker processes: closed-loop HTTP submits while the workers drain."""

    workers: int
    #: The HTTP callers' window (submits, errors, API and PostgreSQL CPU).
    http: LevelResult
    #: API processes serving the callers (``serve --workers``).
    api_processes: int = 1
    #: Receipts written inside the window, by their database timestamps.
    receipts: int = 0
    #: The window as the database's clock saw it (seconds).
    db_window: float = math.nan
    worker_cpu: float = 0.0

    @property
    def rate(self) -> float:
        """Receipts per second in the steady state (database timestamps)."""
        if not self.db_window or math.isnan(self.db_window):
            return math.nan
        return self.receipts / self.db_window

    def per_effect(self, seconds: float | None) -> float | None:
        """CPU milliseconds per receipt."""
        if seconds is None or not self.receipts:
            return None
        return seconds * 1000 / self.receipts

    def busy(self, seconds: float | None) -> float | None:
        """Share of one core the process used during the window."""
        if seconds is None or not self.http.window:
            return None
        return seconds / self.http.window

    def to_json(self) -> dict[str, Any]:
        """For ``--json``."""
        h = self.http
        return {
            "api_processes": self.api_processes,
            "workers": self.workers,
            "callers": h.concurrency,
            "submits_per_s": h.rate,
            "submit_errors": h.errors,
            "submit_p50_ms": h.p(50) * 1000 if h.latencies else None,
            "receipts": self.receipts,
            "window_s": self.db_window,
            "effects_per_s": self.rate,
            "api_cpu_ms_per_submit": h.per_request(h.api_cpu),
            "api_cpu_ms_per_effect": self.per_effect(h.api_cpu),
            "worker_cpu_ms_per_effect": self.per_effect(self.worker_cpu),
            "pg_cpu_ms_per_effect": self.per_effect(h.pg_cpu),
            "load_generator_cpu_ms_per_effect": self.per_effect(h.client_cpu),
            "cores_busy": {
                "api": self.busy(h.api_cpu),
                "workers": self.busy(self.worker_cpu),
                "postgresql": self.busy(h.pg_cpu),
                "load_generator": self.busy(h.client_cpu),
            },
        }


@dataclass
class HttpFigures:
    """One pooled uvicorn API process under closed-loop load, and end to end."""

    levels: tuple[int, ...]
    #: The API's connection pool (None: no pool).
    pool_size: int | None
    results: list[LevelResult] = field(default_factory=list)
    e2e: EndToEnd | None = None
    #: End to end with more API processes and workers against the one PostgreSQL
    #: (issue 25 item 4), ``e2e`` (1 API process) among them.
    scale_out: list[EndToEnd] = field(default_factory=list)
    #: Serving modes measured at the top level beside the shipped one: key -> label.
    modes: dict[str, str] = field(default_factory=dict)

    @property
    def top(self) -> int:
        """The highest concurrency level."""
        return max(self.levels, default=256)

    def get(self, case: str, level: int, variant: str = SHIPPED) -> LevelResult | None:
        """The result of ``case`` at concurrency ``level``, if measured."""
        for r in self.results:
            if r.case == case and r.concurrency == level and r.variant == variant:
                return r
        return None

    def of_case(self, case: str) -> list[LevelResult]:
        """Every level measured for ``case`` on the shipped server."""
        return [r for r in self.results if r.case == case and r.variant == SHIPPED]

    def to_json(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "levels": list(self.levels),
            "pool_size": self.pool_size,
            "results": [r.to_json() for r in self.results],
            "end_to_end": self.e2e.to_json() if self.e2e else None,
            "scale_out": [e.to_json() for e in self.scale_out],
            "serving_modes": self.modes,
        }


def _x(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}x"


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else value


def _met(value: float, ok: bool) -> bool | None:
    return None if math.isnan(value) else ok


def target_rows(http: HttpFigures | None, service_submit: float) -> list[TargetRow]:
    """Issue 13's HTTP-path rows; 'not measured' (met None) where the phase did not
    run. ``service_submit``: the in-process submit median of this run (seconds)."""
    h = http or HttpFigures(levels=(), pool_size=None)
    rows: list[TargetRow] = []

    sub1, hz1 = h.get("submit", 1), h.get("healthz", 1)
    value, detail = math.nan, ""
    if sub1 and hz1 and sub1.latencies and hz1.latencies:
        base = service_submit + hz1.p(50)
        value = sub1.p(50) / base if base > 0 else math.nan
        detail = (
            f"{sub1.p(50) * 1e3:.2f} ms vs {service_submit * 1e3:.2f} + "
            f"{hz1.p(50) * 1e3:.2f} ms"
        )
    rows.append(
        (
            "HTTP submit p50, concurrency 1, vs service-level submit + /healthz",
            _x(value),
            f"≤ {P50_MAX_RATIO:g}x",
            _met(value, value <= P50_MAX_RATIO),
            detail,
        )
    )

    rows.append(_rate_row(h))

    pg = [
        (r.concurrency, _nan_if_none(r.per_request(r.pg_cpu)))
        for r in h.of_case("submit")
        if r.pg_cpu is not None
    ]
    value, detail = math.nan, ""
    if pg:
        value = max(ms for _, ms in pg)
        detail = "max over levels; " + ", ".join(f"{ms:.2f} at {n}" for n, ms in pg)
    rows.append(
        (
            "PostgreSQL CPU per HTTP submit",
            "-" if math.isnan(value) else f"{value:.2f} ms",
            f"≤ {PG_CPU_MAX_MS:g} ms",
            _met(value, value <= PG_CPU_MAX_MS),
            detail,
        )
    )

    top = h.top
    at_top = [
        r for r in h.of_case("submit") + h.of_case("healthz") if r.concurrency == top
    ]
    measured, met, detail = "-", None, ""
    if at_top:
        conns = max(r.max_connections for r in at_top)
        errors = sum(r.error_count for r in at_top)
        pool = h.pool_size
        measured = f"{conns} connections, {errors} errors"
        met = errors == 0 and (pool is None or conns <= pool)
        detail = f"pool size {pool if pool is not None else 'none'}; submit and /healthz"
        if errors:
            kinds: dict[str, int] = {}
            for r in at_top:
                for kind, n in r.errors.items():
                    kinds[kind] = kinds.get(kind, 0) + n
            detail += "; " + ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items()))
    rows.append(
        (
            f"open DB connections at concurrency {top}, and errors",
            measured,
            "≤ pool size, 0 errors",
            met,
            detail,
        )
    )

    e2e = h.e2e
    value, detail = math.nan, ""
    if e2e is not None:
        value = e2e.rate
        detail = _e2e_detail(e2e)
    rows.append(
        (
            f"end-to-end effects/s, API + {e2e.workers if e2e else 2} workers, one box",
            "-" if math.isnan(value) else f"{value:,.0f} effects/s",
            f"≥ {E2E_MIN_RATE:g}",
            _met(value, value >= E2E_MIN_RATE),
            detail,
        )
    )
    return rows


def _rate_row(h: HttpFigures) -> TargetRow:
    """Issue 25: submits/s of one API process at the top level, 2x the earlier path."""
    top = h.top
    sub = h.get("submit", top)
    earlier = h.get("submit", top, EARLIER)
    value, detail = math.nan, ""
    if sub is not None and sub.latencies:
        reference = earlier.rate if earlier is not None else EARLIER_SUBMITS_PER_S
        value = sub.rate / reference if reference > 0 else math.nan
        detail = f"{sub.rate:,.0f} submits/s vs {reference:,.0f} " + (
            "on the ASGI path before issue 25, same run"
            if earlier is not None
            else "(issue 25's figure; the earlier path was not run)"
        )
        for case, what in (("healthz", "/healthz"), ("bare", "a bare Django view")):
            other = h.get(case, top)
            if other is not None and other.rate > 0:
                detail += f"; {sub.rate / other.rate:.2f}x {what} ({other.rate:,.0f}/s)"
        # The other serving modes' submits, against the same earlier figure.
        for mode, label in h.modes.items():
            other = h.get("submit", top, mode)
            if mode not in (SHIPPED, EARLIER) and other is not None and reference > 0:
                detail += (
                    f"; {label} {other.rate:,.0f} submits/s "
                    f"({other.rate / reference:.2f}x)"
                )
    return (
        f"HTTP submits/s, 1 API process, {top} callers, vs the API before issue 25",
        _x(value),
        f"≥ {RATE_MIN_RATIO:g}x",
        _met(value, value >= RATE_MIN_RATIO),
        detail,
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _cores(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _e2e_detail(e2e: EndToEnd) -> str:
    h = e2e.http
    return (
        f"{h.concurrency} callers, {h.rate:,.0f} submits/s; CPU ms per effect: API "
        f"{_ms(e2e.per_effect(h.api_cpu))}, workers {_ms(e2e.per_effect(e2e.worker_cpu))}"
        f", PostgreSQL {_ms(e2e.per_effect(h.pg_cpu))}"
    )


def _num(value: float | None, digits: int = 1) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def _row(r: LevelResult, first: str) -> str:
    errors = str(r.error_count)
    if r.errors:
        errors += " (" + ", ".join(f"{k} x{n}" for k, n in sorted(r.errors.items()))
        errors += ")"
    return (
        f"| {first} | {r.concurrency} | {r.rate:,.0f} "
        f"| {_num(r.p(50) * 1e3 if r.latencies else None)} "
        f"| {_num(r.p(99) * 1e3 if r.latencies else None)} | {errors} "
        f"| {_num(r.per_request(r.api_cpu), 2)} "
        f"| {_num(r.per_request(r.pg_cpu), 2)} "
        f"| {_num(r.per_request(r.client_cpu), 2)} | {r.max_connections} |"
    )


_HEADER = (
    "| callers | req/s | p50 ms | p99 ms | errors | API CPU ms/req "
    "| PostgreSQL CPU ms/req | load generator CPU ms/req | max DB connections |"
)
_RULE = "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"


def table(http: HttpFigures) -> str:
    """The HTTP phase's markdown: one row per (case, level), the serving modes at the
    top level, then end to end with 1 and more API processes."""
    pool = http.pool_size if http.pool_size is not None else "none"
    lines = [
        f"One API process as `effect-broker serve` runs it (connection pool {pool}); "
        "closed-loop Python callers (one keep-alive connection each). CPU is per "
        "completed request; connections are the most the API held at once. `bare` "
        "is a plain Django view on the same server (no ninja, no key, no database).",
        "",
        "| case " + _HEADER,
        _RULE,
    ]
    lines += [_row(r, r.case) for r in http.of_case("healthz") + http.of_case("bare")]
    lines += [_row(r, r.case) for r in http.of_case("submit")]
    if http.modes:
        lines += [
            "",
            f"Serving modes, one process each, {http.top} callers, one after the "
            "other on this machine (ratios within this run are what count):",
            "",
            "| mode: case " + _HEADER,
            _RULE,
        ]
        for key, label in http.modes.items():
            for case in ("healthz", "bare", "submit"):
                r = http.get(case, http.top, key)
                if r is not None:
                    lines.append(_row(r, f"{label}: {case}"))
    runs = http.scale_out or ([http.e2e] if http.e2e else [])
    if runs:
        lines += [
            "",
            f"End to end: {runs[0].http.concurrency} closed-loop callers per API "
            "process submit through the API while worker processes drain to the "
            "simulated target, all against the one PostgreSQL; effects/s counts "
            "receipts written in the window (database timestamps). CPU per effect is "
            "per receipt; cores busy is CPU seconds per second of the window (the "
            "box has the vCPUs in the header, shared by all). When submits/s exceeds "
            "effects/s the queue grew: the workers were the slower stage.",
            "",
            "| API processes | workers | submits/s | effects/s | API CPU ms/effect "
            "| workers CPU ms/effect | PostgreSQL CPU ms/effect "
            "| load generator CPU ms/effect "
            "| cores busy: API / workers / PostgreSQL / load generator |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for e2e in runs:
            h = e2e.http
            lines.append(
                f"| {e2e.api_processes} | {e2e.workers} | {h.rate:,.0f} "
                f"| {_num(e2e.rate, 0)} "
                f"| {_ms(e2e.per_effect(h.api_cpu))} "
                f"| {_ms(e2e.per_effect(e2e.worker_cpu))} "
                f"| {_ms(e2e.per_effect(h.pg_cpu))} "
                f"| {_ms(e2e.per_effect(h.client_cpu))} "
                f"| {_cores(e2e.busy(h.api_cpu))} / "
                f"{_cores(e2e.busy(e2e.worker_cpu))} / "
                f"{_cores(e2e.busy(h.pg_cpu))} / {_cores(e2e.busy(h.client_cpu))} |"
            )
    return "\n".join(lines)
