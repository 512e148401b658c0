"""The PNG: latency distribution per case (box plots, log scale) and end-to-end
throughput per worker count. matplotlib is optional (the ``bench`` extra)."""

from __future__ import annotations

from pathlib import Path

from examples.bench.stats import LatencyCase, ThroughputCase


def matplotlib_missing() -> str | None:
    """Why no chart can be drawn, or None when matplotlib is importable."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    return None


def write_chart(
    path: Path,
    latencies: list[LatencyCase],
    throughput: list[ThroughputCase],
    *,
    title: str,
) -> None:
    """Draw the chart to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    cases = [case for case in latencies if case.samples]
    fig, (left, right) = plt.subplots(
        1,
        2,
        figsize=(15, max(5.0, 0.42 * len(cases) + 1.5)),
        gridspec_kw={"width_ratios": [3, 2]},
    )
    data = [[s * 1e3 for s in case.samples] for case in reversed(cases)]
    labels = [
        case.label if case.label.startswith(case.group) else f"{case.group}: {case.label}"
        for case in reversed(cases)
    ]
    left.boxplot(
        data,
        vert=False,
        whis=(1, 99),
        showfliers=True,
        flierprops={"markersize": 2, "alpha": 0.4},
        medianprops={"color": "black"},
    )
    left.set_yticks(range(1, len(labels) + 1), labels, fontsize=8)
    left.set_xscale("log")
    left.set_xlabel("latency per call, ms (log; box = quartiles, whiskers = p1-p99)")
    left.grid(axis="x", which="both", alpha=0.3)

    counts = sorted({case.workers for case in throughput})
    width = 0.38
    by_key = {case.key: case for case in throughput}
    for offset, group, prefix in (
        (-width / 2, "bare procrastinate", "jobs"),
        (width / 2, "broker", "broker"),
    ):
        rates = []
        for workers in counts:
            match = by_key.get(f"{prefix}_{workers}w")
            rates.append(match.median if match else 0.0)
        bars = right.bar([i + offset for i in range(len(counts))], rates, width)
        bars.set_label(group)
        right.bar_label(bars, fmt="%.0f", fontsize=8)
    right.set_xticks(range(len(counts)), [f"{n} worker(s)" for n in counts])
    right.set_ylabel("items per second (median of repetitions)")
    right.set_title("end to end throughput", fontsize=10)
    right.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
