"""``python -m examples.bench.http_load`` as a user runs it: a tiny run, checked for
shape (both variants side by side, every case, the targets), not for speed."""

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


def run_http_bench(*args: str) -> subprocess.CompletedProcess[str]:
    # The bench makes (and drops) its own scratch database on the test server.
    env = {**os.environ, "DATABASE_URL": url_from_settings(connection.settings_dict)}
    return subprocess.run(
        [sys.executable, "-m", "examples.bench.http_load", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_tiny_run_prints_both_variants_for_every_case(tmp_path: Path) -> None:
    out = tmp_path / "http.json"
    result = run_http_bench(
        "--levels=1,4", "--seconds=0.3", "--warmup=0.2", f"--json={out}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout
    for heading in (
        "## effect-broker HTTP load",
        "### submit: POST /v1/effects",
        "### replay: POST /v1/effects",
        "### GET /healthz (200)",
        "### Targets of the HTTP path (issue 13)",
    ):
        assert heading in text
    assert "Every cell is before / pooled, measured in this run." in text
    report = json.loads(out.read_text())
    rows = {(r["variant"], r["case"], r["concurrency"]) for r in report["results"]}
    assert rows == {
        (variant, case, level)
        for variant in ("before", "pooled")
        for case in ("submit", "replay", "healthz")
        for level in (1, 4)
    }
    for row in report["results"]:
        assert row["ok"] > 0, row
        assert row["errors"] == {}, row
        assert row["api_cpu_ms_per_req"] > 0
    pooled = [r for r in report["results"] if r["variant"] == "pooled"]
    assert max(r["max_db_connections"] for r in pooled) <= 8  # the default pool


def test_bad_levels_are_refused_with_usage() -> None:
    result = run_http_bench("--levels=0")
    assert result.returncode == 2
    assert "--levels must be positive integers" in result.stderr
