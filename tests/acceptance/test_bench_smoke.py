"""``effect-broker bench`` as a user runs it: a tiny run, checked for shape, not speed.

Benchmarks print figures; they are not timed tests. These tests only prove that one
run measures every case, prints the tables with the server's durability settings,
and writes a JSON document (and a chart when matplotlib is installed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from config.database import url_from_settings

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.django_db]

LATENCY_KEYS = {
    "floor_insert",
    "floor_defer",
    "floor_job",
    "handrolled_new",
    "handrolled_replay",
    "broker_submit",
    "broker_replay",
    "broker_inline",
    "broker_claim",
    "broker_e2e",
    "reconcile_idempotent",
    "reconcile_reconcilable",
}


#: The rows of the HTTP path (issues 13 and 25), in the Targets table of every run.
HTTP_TARGETS = (
    "HTTP submit p50, concurrency 1, vs service-level submit + /healthz",
    "HTTP submits/s, 1 API process, 4 callers, vs the API before issue 25",
    "PostgreSQL CPU per HTTP submit",
    "open DB connections at concurrency 4, and errors",
    "end-to-end effects/s, API + 2 workers, one box",
)


#: A hang guard, not a speed bound (speed is the bench's to print, not a test's to
#: assert): the smoke run takes about 100 s alone and twice that on a loaded machine.
HANG_GUARD_SECONDS = 600


def run_bench(
    *args: str, timeout: float = HANG_GUARD_SECONDS
) -> subprocess.CompletedProcess[str]:
    # The bench makes (and drops) its own scratch database on the test server.
    env = {**os.environ, "DATABASE_URL": url_from_settings(connection.settings_dict)}
    return subprocess.run(
        [sys.executable, "-m", "effect_broker.cli", "bench", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_quick_run_prints_every_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = run_bench(
        "--quick",
        "--repetitions=1",
        "--samples=3",
        "--items=5",
        "--workers=1",
        "--scale=1k",
        "--http-levels=1,4",
        "--http-seconds=0.3",
        # Every phase and then a soak: one run whose Targets table has every row.
        "--with-soak=40",
        "--soak-window=20",
        "--soak-rate=60",
        "--soak-kill-seconds=0",
        f"--json={out}",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout
    for heading in (
        "## effect-broker bench",
        "### Per call",
        "### End to end throughput",
        "### HTTP path",
        "Serving modes, one process each, 4 callers",
        "### Scale",
        "### Profile",
        "### Soak",
        "### Targets",
        "Plans on the 1k",
    ):
        assert heading in text
    assert "| floor | INSERT … ON CONFLICT, 1 row, commit (psycopg) | 3 |" in text
    assert text.count("fsync=") >= 4  # with the header and every table
    report = json.loads(out.read_text())
    assert {case["key"] for case in report["latency"]} >= LATENCY_KEYS
    assert {case["key"] for case in report["throughput"]} == {"jobs_1w", "broker_1w"}
    assert report["server"]["fsync"] in {"on", "off"}
    assert report["server"]["synchronous_commit"]
    assert [s["label"] for s in report["scale"]] == ["1k"]
    assert report["plans"]
    assert all(isinstance(p["seq_scan_on_effect_intents"], bool) for p in report["plans"])
    # 12 of issue 5 and the HTTP path, 2 of commits/WAL, 3 of issue 13's submit rows,
    # 2 of issue 13's one-at-a-time end-to-end rows, 1 of CPU per item, 1 of
    # procrastinate's fetch plan, 4 of the soak (measured in this run: --with-soak),
    # and issue 25's new rows: submit vs bare defer + 0.35 ms (which replaces the
    # 1.25x ratio) and PostgreSQL CPU per dispatched effect
    assert len(report["targets"]) == 26
    names = [t["target"] for t in report["targets"]]
    soak_rows = [t for t in report["targets"] if t["target"].startswith("soak")]
    assert len(soak_rows) == 4
    assert all(t["met"] is not None for t in soak_rows), soak_rows  # all measured
    assert report["soak"]["lost"] == 0
    assert report["soak"]["statuses"] == {"succeeded": 40}
    one_at_a_time = "end to end, 1 worker: submit → receipt"
    assert f"{one_at_a_time} vs bare job" in names
    assert f"{one_at_a_time}: p99 / p50 (no lost-NOTIFY stall)" in names
    assert all(name in names for name in HTTP_TARGETS), names
    for name in (
        "submit, new key, vs bare procrastinate defer + 0.35 ms",
        "PostgreSQL CPU per dispatched effect vs bare job",
        "submits/s with 2 client processes vs 1",
    ):
        assert any(n.startswith(name) for n in names), (name, names)
    assert report["parallel_submit"]["submits_per_second"].keys() == {"1", "2"}
    http = report["http"]
    shipped = {
        (r["case"], r["concurrency"]) for r in http["results"] if r["variant"] == "pooled"
    }
    assert shipped == {
        (case, level) for case in ("healthz", "submit") for level in (1, 4)
    } | {("bare", 4)}
    # Every serving mode at the top level, side by side with the shipped one
    # (httptools only where it is installed: it is not a dependency)
    modes = set(http["serving_modes"])
    assert {"pooled", "hops", "wsgi"} <= modes <= {"pooled", "hops", "wsgi", "httptools"}
    for mode in modes - {"pooled"}:
        cases = {r["case"] for r in http["results"] if r["variant"] == mode}
        assert cases == {"healthz", "bare", "submit"}, (mode, cases)
    # End to end with 1 and 2 API processes against the one PostgreSQL
    assert [(e["api_processes"], e["workers"]) for e in http["scale_out"]] == [
        (1, 2),
        (2, 2),
    ]
    assert all(e["submits_per_s"] > 0 for e in http["scale_out"]), http["scale_out"]
    for row in http["results"]:
        assert row["ok"] > 0, row
        assert row["errors"] == {}, row
        assert row["max_db_connections"] <= http["pool_size"], row
    e2e = http["end_to_end"]
    assert e2e["workers"] == 2
    assert e2e["submits_per_s"] > 0, e2e
    assert e2e["submit_errors"] == {}, e2e
    assert set(report["fetch_plan"]) == {
        "stale_alone",
        "fresh_alone",
        "stale_broker",
        "fresh_broker",
    }
    assert "procrastinate fetch, 10,000 queued" in text
    chart = out.with_suffix(".png")
    assert chart.exists() or "No chart written: matplotlib is not installed" in text


def test_bad_http_levels_are_one_line_and_exit_2() -> None:
    result = run_bench("--http-levels=0,8", timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "effect-broker: error [invalid_request]: --http-levels values must be between "
        "1 and 1024"
    ]


def test_bad_input_is_one_line_and_exit_2() -> None:
    result = run_bench("--repetitions=0", timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "effect-broker: error [invalid_request]: --repetitions must be between 1 and "
        "100, got 0"
    ]
