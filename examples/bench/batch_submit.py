"""Batch submit throughput (issue 13): effects per second through ``submit_many`` at
batch sizes 1, 10 and 100, new keys every time, beside one-by-one ``submit`` of the
same number of effects - measured in the same run, interleaved per repetition, so the
ratios hold on a noisy machine.

The figure is service-level (the bench process calls the services as the API does;
no HTTP): what one caller gets for its batches, each one statement and one commit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from effect_broker.services.batch_submission import submit_many
from examples.bench.batch_figures import BATCH_SIZES, SINGLE, BatchCase
from examples.bench.broker_cases import BrokerCases


def effects_per_repetition(samples: int) -> int:
    """Effects each size submits per repetition: a whole number of the largest batch,
    at least two of them (``--quick``'s 20 samples give 200)."""
    largest = max(BATCH_SIZES)
    return max(2, math.ceil(samples * 10 / largest)) * largest


def _submit_in_batches(cases: BrokerCases, size: int, prefix: str, total: int) -> None:
    for first in range(0, total, size):
        requests = [
            cases.request(cases.key(prefix, i)) for i in range(first, first + size)
        ]
        results = submit_many(cases.tenant, requests)
        assert all(r.outcome == "created" for r in results)


def _submit_one_by_one(cases: BrokerCases, prefix: str, total: int) -> None:
    for i in range(total):
        cases.submit_new_as(cases.key(prefix, i))


def measure(
    cases: BrokerCases, *, repetitions: int, samples: int, say: Callable[[str], None]
) -> list[BatchCase]:
    """Effects/s of one-by-one submit and of each batch size, interleaved."""
    total = effects_per_repetition(samples)
    found = {size: BatchCase(size, total) for size in (SINGLE, *BATCH_SIZES)}

    def run(size: int, prefix: str, effects: int = total) -> float:
        started = time.perf_counter()
        if size == SINGLE:
            _submit_one_by_one(cases, prefix, effects)
        else:
            _submit_in_batches(cases, size, prefix, effects)
        return effects / (time.perf_counter() - started)

    for size in found:  # warm up each path (statements, plans, connection)
        run(size, f"batch-warm-{size}", max(BATCH_SIZES))
    for rep in range(repetitions):
        say(f"      repetition {rep + 1}/{repetitions}: {total} effects per size")
        for size, case in found.items():
            case.rates.append(run(size, f"batch-{rep}-{size}"))
    return list(found.values())
