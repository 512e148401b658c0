"""``effect-broker worker`` / ``reconciler`` / ``dev`` on the command line: help that
says what they run and how they exit, and bad arguments refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from examples.crash_matrix.workers import ROOT


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_BROKER_")}
    return subprocess.run(
        [sys.executable, "-m", "effect_broker.cli", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_worker_help_names_its_queues_its_outage_behaviour_and_exit_codes() -> None:
    done = cli("worker", "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "(queues dispatch, reconcile, maintenance)" in text
    assert "It survives database outages and failovers" in text
    assert "Exit codes: 0 after a requested stop, 3 when --max-outage ran out" in text
    for option in ("--concurrency", "--name", "--max-outage", "--max-backoff"):
        assert option in text


def test_reconciler_help_names_only_reconcile_and_maintenance() -> None:
    done = cli("reconciler", "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "(reconcile, maintenance)" in text
    assert "dispatch," not in text


def test_dev_help_says_what_it_starts_and_what_a_dead_child_does() -> None:
    done = cli("dev", "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "the simulated payment target, the API and one worker" in text
    assert "If any part exits on its own, dev stops the rest and exits 1." in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-n", "a:b"], "argument -n/--name: must be printable and free of ':'"),
        (["-c", "0"], "argument -c/--concurrency: must be a whole number >= 1"),
        (["--max-outage", "-1"], "argument --max-outage: must be a number of seconds"),
    ],
)
def test_a_bad_argument_is_exit_2_and_one_error_line(
    args: list[str], message: str
) -> None:
    done = cli("worker", *args)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1
    assert message in errors[0]
    assert "Traceback" not in done.stderr
