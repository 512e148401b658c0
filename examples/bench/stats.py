"""Samples and their summaries: medians, p99, throughput (pure Python, no Django)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by the nearest-rank method; NaN when empty.

    Nearest rank, not interpolation: a p99 is a latency some call really had.
    """
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class LatencyCase:
    """Per-call latencies of one case, pooled over repetitions (seconds)."""

    key: str
    label: str
    group: str
    samples: list[float] = field(default_factory=list)
    #: Median of each repetition, to show how stable the pooled median is.
    rep_medians: list[float] = field(default_factory=list)
    note: str = ""

    def add_repetition(self, samples: list[float]) -> None:
        """Pool one repetition's samples."""
        if samples:
            self.samples.extend(samples)
            self.rep_medians.append(statistics.median(samples))

    @property
    def median(self) -> float:
        """Median over every sample; NaN with none."""
        return statistics.median(self.samples) if self.samples else math.nan

    @property
    def p99(self) -> float:
        """99th percentile over every sample."""
        return percentile(self.samples, 99)

    @property
    def per_second(self) -> float:
        """Calls per second one caller achieves back to back (1 / mean latency)."""
        if not self.samples:
            return math.nan
        return len(self.samples) / sum(self.samples)

    def to_json(self) -> dict[str, Any]:
        """Summary for ``--json`` (milliseconds)."""
        return {
            "key": self.key,
            "label": self.label,
            "group": self.group,
            "n": len(self.samples),
            "median_ms": self.median * 1e3,
            "p99_ms": self.p99 * 1e3,
            "per_second_one_caller": self.per_second,
            "repetition_medians_ms": [m * 1e3 for m in self.rep_medians],
            "note": self.note,
        }


@dataclass
class ThroughputCase:
    """Items per second of one case, one figure per repetition."""

    key: str
    label: str
    group: str
    workers: int
    rates: list[float] = field(default_factory=list)
    #: First submit to last completion, per repetition (``rates`` is the steady state).
    overall_rates: list[float] = field(default_factory=list)
    #: Per-item latency (submit/defer -> done) inside the throughput runs (seconds).
    latencies: list[float] = field(default_factory=list)
    items: int = 0
    note: str = ""

    @property
    def median(self) -> float:
        """Median items per second over repetitions."""
        return statistics.median(self.rates) if self.rates else math.nan

    def to_json(self) -> dict[str, Any]:
        """Summary for ``--json``."""
        return {
            "key": self.key,
            "label": self.label,
            "group": self.group,
            "workers": self.workers,
            "items_per_repetition": self.items,
            "median_per_second": self.median,
            "repetition_rates": self.rates,
            "repetition_overall_rates": self.overall_rates,
            "latency_median_ms": (
                statistics.median(self.latencies) * 1e3 if self.latencies else None
            ),
            "latency_p99_ms": (
                percentile(self.latencies, 99) * 1e3 if self.latencies else None
            ),
            "note": self.note,
        }


def time_calls(call: Callable[[int], object], n: int, *, start: int = 0) -> list[float]:
    """Call ``call(i)`` for i in start..start+n-1 and return each duration in seconds."""
    out: list[float] = []
    clock = time.perf_counter
    for i in range(start, start + n):
        began = clock()
        call(i)
        out.append(clock() - began)
    return out


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN when either is missing or the denominator is 0."""
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return math.nan
    return numerator / denominator
