"""Batch submit figures (issue 13): effects per second by batch size, and their table.

Pure Python, so the report imports it without Django; ``batch_submit`` measures.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

#: The sizes the issue asks for; 1 shows the batch path's own overhead.
BATCH_SIZES = (1, 10, 100)
#: One-by-one ``submit``: the reference each batch size is compared with.
SINGLE = 0


@dataclass
class BatchCase:
    """Effects per second of one batch size, one figure per repetition."""

    size: int
    effects: int = 0
    rates: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        """How the table names it."""
        return "submit, one by one" if self.size == SINGLE else f"batch of {self.size}"

    @property
    def median(self) -> float:
        """Median effects per second over the repetitions; NaN with none."""
        return statistics.median(self.rates) if self.rates else math.nan

    def to_json(self) -> dict[str, Any]:
        """For the report's JSON."""
        return {
            "batch_size": self.size or 1,
            "one_by_one": self.size == SINGLE,
            "effects_per_repetition": self.effects,
            "effects_per_second": self.rates,
            "median": self.median,
        }


def batch_table(batches: list[BatchCase]) -> str:
    """The markdown table of effects per second by batch size."""
    single = next((b.median for b in batches if b.size == SINGLE), math.nan)
    rows = [
        "| how | effects/s (median) | per repetition | per effect "
        "| throughput vs one by one |",
        "|---|---:|---|---:|---:|",
    ]
    for case in batches:
        per_effect = 1e3 / case.median if case.median else math.nan
        reps = ", ".join(f"{r:,.0f}" for r in case.rates)
        rows.append(
            f"| {case.label} | {case.median:,.0f} | {reps} | {per_effect:.2f} ms | "
            f"{case.median / single:.2f}x |"
        )
    return "\n".join(rows)
