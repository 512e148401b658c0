"""Where a call's time goes: each SQL statement's round trips (grouped by statement),
the commits, and what remains - Python - for a new-key submit and for the body of a
dispatch job. This is the profile printed next to the targets it explains."""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection

from effect_broker.services import dispatch as dispatch_service
from examples.bench.broker_cases import BrokerCases
from examples.bench.options import BenchOptions
from examples.bench.report import BenchResult
from examples.bench.stats import time_calls

#: Profiled calls use keys of their own.
PROFILE_BASE = 60_000_000


@contextmanager
def _timed_commits(totals: dict[str, float]) -> Iterator[None]:
    # Profiling only: Django's commit does not pass through execute wrappers, so time
    # the wrapper's private _commit on this connection object while the block runs.
    original = connection._commit  # type: ignore[attr-defined]

    def timed() -> None:
        began = time.perf_counter()
        try:
            original()
        finally:
            totals["COMMIT (WAL flush to disk: fsync)"] += time.perf_counter() - began

    connection._commit = timed  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del connection._commit  # type: ignore[attr-defined]


_TABLE = re.compile(r"\b(?:INTO|UPDATE|FROM)\s+(\w+)")


def _part(sql: str) -> str:
    text = " ".join(sql.split())
    if text.startswith("WITH intent"):
        return "reservation: intent + event + job, one statement (its commit included)"
    if text.startswith("WITH cas"):
        return "fenced transition: CAS + event + riders, one statement (commit included)"
    if "procrastinate_defer_jobs" in text:
        return "job: procrastinate_defer_jobs_v1 (row, events trigger, NOTIFY)"
    if text.startswith(("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO")):
        return "SAVEPOINT / RELEASE (a job defer nests one)"
    if text.startswith("SELECT") and "arguments_ciphertext" in text:
        return "SELECT effect_intents: row, head event digest, sealed arguments"
    if text.startswith("SELECT") and " FROM effect_intents" in text:
        return "SELECT effect_intents (+ head event digest)"
    verb = text.split(" ", 1)[0]
    match = _TABLE.search(text)
    return f"{verb} {match[1] if match else '?'}"


def _profile(
    call: Callable[[int], object], n: int, *, start: int
) -> list[tuple[str, float]]:
    """Each statement's round trips, the commits, and what remains (Python), in mean
    milliseconds per call of ``call``."""
    totals: dict[str, float] = defaultdict(float)

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        began = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            totals[_part(sql)] += time.perf_counter() - began

    with connection.execute_wrapper(wrapper), _timed_commits(totals):
        wall = sum(time_calls(call, n, start=start))
    parts = sorted(totals.items(), key=lambda kv: -kv[1])
    python = wall - sum(totals.values())
    return [(what, seconds / n * 1e3) for what, seconds in parts] + [
        ("Python (everything outside the database round trips)", python / n * 1e3)
    ]


def profiles(result: BenchResult, opts: BenchOptions, cases: BrokerCases) -> None:
    """Where a new-key submit and a dispatch (claim → simulated call → receipt)
    spend their time."""
    time_calls(cases.submit_new, opts.warmup, start=PROFILE_BASE)
    result.profiles["broker submit, new key"] = _profile(
        cases.submit_new, opts.samples, start=PROFILE_BASE + 1_000_000
    )
    ready = [cases.prepare("profile-dispatch", i) for i in range(opts.samples)]

    def dispatch(i: int) -> object:
        return dispatch_service.dispatch(ready[i].effect_id, worker="bench-profile")

    result.profiles["broker dispatch job body: claim → call → receipt"] = _profile(
        dispatch, opts.samples, start=0
    )
