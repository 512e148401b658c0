"""What a soak measured: one row per window of effects, the final counts, its targets
and its markdown table (pure Python, no Django)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from examples.bench.stats import percentile, ratio

#: Last window / first window, submit and claim medians: at most this.
SOAK_MAX_RATIO = 1.2
#: "Bounded" job tables hold a backlog and a retention period, not every job ever
#: run: their rows at the last window are within SOAK_MAX_RATIO of the first window's.
JOB_TABLES = ("procrastinate_jobs", "procrastinate_events")
#: Job-table rows a soak may gain per effect and still count as bounded.
MAX_JOB_ROWS_PER_EFFECT = 0.01
#: Tables whose rows and on-disk size a soak samples at every window.
TABLES = ("effect_intents", "effect_events", "procrastinate_jobs", "procrastinate_events")


@dataclass
class SoakWindow:
    """One window of effects, measured once every effect in it was final."""

    index: int
    effects: int
    #: Seconds since the soak started, when the window's last effect was submitted.
    submitted_at: float
    submit_median: float
    submit_p99: float
    #: Intent created -> first attempt started (database timestamps).
    claim_median: float
    claim_p99: float
    #: Intent created -> receipt created (database timestamps).
    receipt_median: float
    receipt_p99: float
    #: Worker kills so far.
    kills: int
    #: table -> (rows, bytes incl. indexes and TOAST) when the window was reported.
    tables: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: worker name -> (RSS in MB, seconds it had been running).
    rss_mb: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: Jobs todo or doing when the window was reported.
    queue: int = 0
    #: Seconds since the soak started, when the window was found final and measured.
    reported_at: float = 0.0


@dataclass
class SoakResult:
    """The whole soak: its windows, kills and the final ledger."""

    options: dict[str, Any]
    contract: str
    windows: list[SoakWindow] = field(default_factory=list)
    kills: int = 0
    submitted: int = 0
    seconds: float = 0.0
    #: status -> effects of this soak in it at the end.
    statuses: dict[str, int] = field(default_factory=dict)
    #: Effects that passed through outcome_unknown (shown, never hidden).
    passed_outcome_unknown: int = 0
    #: Submitted effects with no final receipt at the end (must be 0).
    lost: int = 0
    #: Rows at the target, and distinct keys among them (duplicates = rows - keys).
    target_rows: int = 0
    target_keys: int = 0
    #: Largest procrastinate_jobs row count sampled during the run.
    jobs_max: int = 0
    jobs_end: int = 0
    #: EFFECT_BROKER_JOB_* settings (job retention among them) handed to the workers.
    retention_env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def succeeded(self) -> int:
        """Effects that succeeded."""
        return self.statuses.get("succeeded", 0)

    def to_json(self) -> dict[str, Any]:
        """For ``--json``."""
        data = asdict(self)
        data["succeeded"] = self.succeeded
        return data


def _ms(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    ms = seconds * 1e3
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.2f}"


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:,.1f} MB"


def summarize(samples: list[float]) -> tuple[float, float]:
    """(median, p99) of ``samples``; NaN with none."""
    return percentile(samples, 50), percentile(samples, 99)


def soak_targets(soak: SoakResult) -> list[tuple[str, str, str, bool | None, str]]:
    """(name, measured, limit, met, detail) for report.evaluate's Target rows."""
    rows: list[tuple[str, str, str, bool | None, str]] = []
    first = soak.windows[0] if soak.windows else None
    last = soak.windows[-1] if len(soak.windows) >= 2 else None
    size = soak.options.get("window", 0)
    for what in ("submit", "claim"):
        value = math.nan
        if first is not None and last is not None:
            value = ratio(
                getattr(last, f"{what}_median"), getattr(first, f"{what}_median")
            )
        rows.append(
            (
                f"soak: last {size:,} vs first {size:,} effects, {what} median",
                "-" if math.isnan(value) else f"{value:.2f}x",
                f"≤ {SOAK_MAX_RATIO:g}x",
                None if math.isnan(value) else value <= SOAK_MAX_RATIO,
                "",
            )
        )
    # Rows the job tables gained per effect processed between the first and the last
    # window: a table that keeps a row per job gains about 1 (procrastinate_events,
    # about 3) whatever N is; a bounded one gains about 0. (A ratio of last to first
    # row counts read 0 -> 3 rows in a 100k run as "3x": counts near zero have no
    # meaningful ratio.)
    growth = math.nan
    if first is not None and last is not None:
        between = sum(w.effects for w in soak.windows[1:])
        growth = max(
            (last.tables[t][0] - first.tables[t][0]) / max(1, between)
            for t in JOB_TABLES
            if t in first.tables and t in last.tables
        )
    rows.append(
        (
            "soak: job tables bounded (procrastinate_jobs and _events rows gained per "
            "effect, first to last window)",
            "-" if math.isnan(growth) else f"{growth:.4f}",
            f"≤ {MAX_JOB_ROWS_PER_EFFECT:g} (unbounded: about 1 per effect or more)",
            None if math.isnan(growth) else growth <= MAX_JOB_ROWS_PER_EFFECT,
            f"{soak.jobs_end:,} job rows at the end for {soak.submitted:,} effects",
        )
    )
    rows.append(
        (
            "soak: effects lost (no final receipt) or duplicated at the target",
            f"{soak.lost} lost, {soak.target_rows - soak.target_keys} duplicated, "
            f"{soak.target_rows:,} target rows for {soak.succeeded:,} succeeded",
            "0, 0, equal",
            soak.lost == 0 and soak.target_rows == soak.target_keys == soak.succeeded,
            "",
        )
    )
    return rows


def unmeasured_soak_targets() -> list[tuple[str, str, str, bool | None, str]]:
    """The soak's rows in a run without a soak: named, marked not measured.

    100k effects take about twenty minutes, so a soak runs only when asked for
    (``--with-soak`` after every other phase, ``--soak`` alone); a run without one
    says where those rows are measured instead of leaving them out.
    """
    how = (
        "measured by `effect-broker bench --with-soak` (every phase, then a 100k soak) "
        "or `--soak 100000`, not in this run"
    )
    return [
        (
            "soak: last 10,000 vs first 10,000 effects, submit median",
            "-",
            f"≤ {SOAK_MAX_RATIO:g}x",
            None,
            how,
        ),
        (
            "soak: last 10,000 vs first 10,000 effects, claim median",
            "-",
            f"≤ {SOAK_MAX_RATIO:g}x",
            None,
            how,
        ),
        (
            "soak: job tables bounded (procrastinate_jobs and _events rows gained per "
            "effect, first to last window)",
            "-",
            f"≤ {MAX_JOB_ROWS_PER_EFFECT:g} (unbounded: about 1 per effect or more)",
            None,
            how,
        ),
    ]


def window_line(w: SoakWindow) -> str:
    """The progress line printed when a window is complete."""
    jobs = w.tables.get("procrastinate_jobs", (0, 0))[0]
    rss = ", ".join(f"{name} {mb:.0f} MB" for name, (mb, _) in sorted(w.rss_mb.items()))
    return (
        f"      window {w.index + 1}: {w.effects} effects submitted by "
        f"{w.submitted_at:.0f}s, final by {w.reported_at:.0f}s; "
        f"submit {_ms(w.submit_median)}/{_ms(w.submit_p99)} ms, "
        f"claim {_ms(w.claim_median)} ms, receipt {_ms(w.receipt_median)}/"
        f"{_ms(w.receipt_p99)} ms; {w.kills} kills; procrastinate_jobs {jobs:,} rows; "
        f"RSS {rss}"
    )


def soak_table(soak: SoakResult) -> str:
    """Latency, table sizes and RSS per window; then the final counts."""
    o = soak.options
    lines = [
        f"{soak.submitted:,} effects ({soak.contract}) submitted at up to "
        f"{o['rate']:g}/s in {soak.seconds:.0f} s through 2 worker processes; "
        f"{soak.kills} SIGKILLs (about every {o['kill_seconds']:g} s, seed {o['seed']}), "
        "each followed by a restart. Submit: the service call in this process; claim "
        "and receipt: from the intent's created_at, database timestamps. Times in ms "
        "(median / p99). Table sizes: rows / on-disk size with indexes when the window "
        "was final.",
        "",
        "| window | submitted / final by | submit | claim | submit → receipt | kills "
        "| queue | " + " | ".join(TABLES) + " | worker RSS (uptime) |",
        "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(TABLES) + "---|",
    ]
    for w in soak.windows:
        sizes = " | ".join(
            f"{w.tables[t][0]:,} / {_size(w.tables[t][1])}" if t in w.tables else "-"
            for t in TABLES
        )
        rss = ", ".join(
            f"{name} {mb:.0f} MB ({age:.0f} s)"
            for name, (mb, age) in sorted(w.rss_mb.items())
        )
        lines.append(
            f"| {w.index + 1} ({w.effects:,}) | {w.submitted_at:.0f} / "
            f"{w.reported_at:.0f} s "
            f"| {_ms(w.submit_median)} / {_ms(w.submit_p99)} "
            f"| {_ms(w.claim_median)} / {_ms(w.claim_p99)} "
            f"| {_ms(w.receipt_median)} / {_ms(w.receipt_p99)} | {w.kills} | {w.queue:,} "
            f"| {sizes} | {rss} |"
        )
    statuses = ", ".join(f"{s} {n:,}" for s, n in sorted(soak.statuses.items()))
    lines += [
        "",
        f"At the end: {statuses or 'no effects'}; {soak.lost} lost (no final receipt); "
        f"{soak.passed_outcome_unknown:,} effects passed through outcome_unknown "
        "(a kill mid-send) and were settled by the contract; target rows "
        f"{soak.target_rows:,} with {soak.target_keys:,} distinct keys for "
        f"{soak.succeeded:,} succeeded effects; procrastinate_jobs {soak.jobs_end:,} "
        f"rows (largest during the run {soak.jobs_max:,}); job settings passed to the "
        "workers: "
        + (
            ", ".join(f"{k}={v}" for k, v in sorted(soak.retention_env.items()))
            or "none (the broker's defaults)"
        )
        + ".",
    ]
    lines += [f"- {note}" for note in soak.notes]
    return "\n".join(lines)
