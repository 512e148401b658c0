"""``effect-broker bench --soak`` as a user runs it: a tiny soak, checked for shape and
for zero lost effects, not for speed (benchmarks print figures; they are not timed
tests)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.acceptance.test_bench_smoke import run_bench

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

EFFECTS = 120
WINDOW = 40


def test_a_small_soak_with_kills_loses_nothing_and_reports_every_window(
    tmp_path: Path,
) -> None:
    out = tmp_path / "soak.json"
    result = run_bench(
        f"--soak={EFFECTS}",
        f"--soak-window={WINDOW}",
        "--soak-rate=60",
        "--soak-kill-seconds=1",
        f"--json={out}",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = result.stdout
    for heading in ("## effect-broker bench --soak", "### Soak", "### Targets"):
        assert heading in text
    assert text.count("      window ") == EFFECTS // WINDOW  # a progress line each
    soak = json.loads(out.read_text())["soak"]
    assert soak["submitted"] == EFFECTS
    assert [w["effects"] for w in soak["windows"]] == [WINDOW] * (EFFECTS // WINDOW)
    assert soak["kills"] >= 1  # 2 s of submitting at 60/s, a kill every ~1 s
    assert soak["lost"] == 0
    assert soak["statuses"] == {"succeeded": EFFECTS}
    # No duplicate at the target: one row per effect, one per key.
    assert soak["target_rows"] == soak["target_keys"] == EFFECTS
    for w in soak["windows"]:
        assert set(w["tables"]) == {
            "effect_intents",
            "effect_events",
            "procrastinate_jobs",
            "procrastinate_events",
        }
        assert all(size > 0 for _, size in w["tables"].values())
        # The ledger keeps every effect; the job tables may be empty: the soak's
        # workers delete a job as it succeeds unless told otherwise (retention 0).
        assert w["tables"]["effect_intents"][0] >= WINDOW * (w["index"] + 1)
        assert w["tables"]["effect_events"][0] > w["tables"]["effect_intents"][0]
        assert set(w["rss_mb"]) <= {"steady", "restarted"}
        assert "steady" in w["rss_mb"]
        for key in ("submit_median", "claim_median", "receipt_median"):
            assert w[key] > 0
    retention = json.loads(out.read_text())["soak"]["retention_env"]
    assert retention["EFFECT_BROKER_JOB_RETENTION_HOURS"] == os.environ.get(
        "EFFECT_BROKER_JOB_RETENTION_HOURS", "0"
    )
    targets = {t["target"]: t for t in json.loads(out.read_text())["targets"]}
    assert len(targets) == 4
    lost = next(t for name, t in targets.items() if "lost" in name)
    assert lost["met"] is True
    assert all(t["met"] is not None for t in targets.values())  # all measured
