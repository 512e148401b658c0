"""The HTTP path's rows of the bench's Targets table, read from figures made up here
(the arithmetic and the met/missed marks; the smoke runs the real phase)."""

from __future__ import annotations

import math

import pytest

from examples.bench.http_client import LevelResult
from examples.bench.http_figures import EndToEnd, HttpFigures, target_rows

RATE = "HTTP submits/s, 1 API process, 256 callers, vs the API before issue 25"


def level(
    case: str,
    n: int,
    *,
    rate: float,
    p50: float,
    variant: str = "pooled",
    **extra: object,
) -> LevelResult:
    """A window of 1 s with ``rate`` answers, each taking ``p50`` seconds."""
    result = LevelResult(variant, case, n, 1.0, latencies=[p50] * int(rate))
    for name, value in extra.items():
        setattr(result, name, value)
    return result


def figures(**overrides: object) -> HttpFigures:
    http = HttpFigures(levels=(1, 256), pool_size=8)
    http.results = [
        level("healthz", 1, rate=200, p50=0.004, pg_cpu=0.0),
        level("submit", 1, rate=100, p50=0.009, pg_cpu=0.2, max_connections=2),
        level("healthz", 256, rate=400, p50=0.5, max_connections=3, pg_cpu=0.0),
        level("submit", 256, rate=300, p50=0.8, pg_cpu=0.6, max_connections=8),
        level("bare", 256, rate=600, p50=0.4),
        # the API as served before issue 25, and serve --wsgi, at the top level
        level("submit", 256, rate=140, p50=1.6, variant="hops", max_connections=8),
        level("submit", 256, rate=350, p50=0.7, variant="wsgi", max_connections=8),
    ]
    http.modes = {"pooled": "ASGI as served", "hops": "before", "wsgi": "WSGI"}
    e2e = EndToEnd(2, level("e2e", 16, rate=150, p50=0.1), receipts=240, db_window=2.0)
    http.e2e = e2e
    for name, value in overrides.items():
        setattr(http, name, value)
    return http


def test_every_row_is_computed_from_the_figures() -> None:
    rows = {
        name: (measured, met)
        for name, measured, _, met, _ in target_rows(figures(), service_submit=0.002)
    }
    # 9 ms vs 2 + 4 ms
    assert rows["HTTP submit p50, concurrency 1, vs service-level submit + /healthz"] == (
        "1.50x",
        True,
    )
    # 300 submits/s at 256 callers vs 140 on the path before issue 25: >= 2x
    assert rows[RATE] == ("2.14x", True)
    # max of 200 ms / 100 and 600 ms / 300
    assert rows["PostgreSQL CPU per HTTP submit"] == ("2.00 ms", True)
    assert rows["open DB connections at concurrency 256, and errors"] == (
        "8 connections, 0 errors",
        True,
    )
    assert rows["end-to-end effects/s, API + 2 workers, one box"] == (
        "120 effects/s",
        True,
    )


def test_a_miss_is_marked_missed() -> None:
    http = figures()
    http.results[3].errors = {"503 overloaded": 2}
    http.results[3].max_connections = 9
    http.results[3].pg_cpu = 1.2  # 4 ms per submit
    assert http.e2e is not None
    http.e2e.receipts = 100
    rows = {row[0]: row for row in target_rows(http, service_submit=0.001)}
    assert (
        rows["HTTP submit p50, concurrency 1, vs service-level submit + /healthz"][3]
        is False
    )
    conns = rows["open DB connections at concurrency 256, and errors"]
    assert conns[1:4] == ("9 connections, 2 errors", "≤ pool size, 0 errors", False)
    assert "503 overloaded x2" in conns[4]
    assert rows["PostgreSQL CPU per HTTP submit"][3] is False
    assert rows["end-to-end effects/s, API + 2 workers, one box"][1:4] == (
        "50 effects/s",
        "≥ 100",
        False,
    )


def test_the_rate_row_names_healthz_the_bare_view_and_the_other_modes() -> None:
    detail = {row[0]: row[4] for row in target_rows(figures(), service_submit=0.002)}[
        RATE
    ]
    assert detail == (
        "300 submits/s vs 140 on the ASGI path before issue 25, same run; "
        "0.75x /healthz (400/s); 0.50x a bare Django view (600/s); "
        "WSGI 350 submits/s (2.50x)"
    )


def test_without_the_earlier_path_the_rate_is_read_against_issue_25s_figure() -> None:
    http = figures()
    http.results = [r for r in http.results if r.variant == "pooled"]
    row = {row[0]: row for row in target_rows(http, service_submit=0.002)}[RATE]
    assert row[1:4] == ("1.50x", "≥ 2x", False)  # 300 vs 200/s
    assert "(issue 25's figure; the earlier path was not run)" in row[4]


@pytest.mark.parametrize("http", [None, HttpFigures(levels=(), pool_size=8)])
def test_without_the_phase_every_row_is_not_measured(http: HttpFigures | None) -> None:
    rows = target_rows(http, service_submit=math.nan)
    assert len(rows) == 5
    assert all(met is None and measured == "-" for _, measured, _, met, _ in rows)
