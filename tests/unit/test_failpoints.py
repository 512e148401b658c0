"""Failpoints armed from outside record which process fired them (crash-matrix drivers
freeze that process; a transactional claim names no owner in the ledger)."""

from __future__ import annotations

import os
from pathlib import Path

from effect_broker import failpoints


def test_a_paused_failpoint_records_the_pid_that_fired_it(
    tmp_path: Path, monkeypatch
) -> None:
    # given a failpoint armed with a pause for one subject
    monkeypatch.setenv("EFFECT_BROKER_FAILPOINT_DIR", str(tmp_path))
    failpoints.arm(tmp_path, "t/op", "before_request_write", pause=0)
    assert failpoints.fired_by(tmp_path, "t/op", "before_request_write") is None

    # when this process passes it twice
    failpoints.hit("before_request_write", subject="t/op")
    failpoints.hit("before_request_write", subject="t/op")

    # then it fired once, and says it was this process
    assert failpoints.fired(tmp_path, "t/op", "before_request_write")
    assert failpoints.fired_by(tmp_path, "t/op", "before_request_write") == os.getpid()
    assert failpoints.fired_by(tmp_path, "other/op", "before_request_write") is None
