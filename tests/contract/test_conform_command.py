"""Issue 22, item 1: ``effect-broker contracts conform`` as a user runs it.

Against the crash-matrix target (a real process with Postgres behind it): the plan is
said before anything is sent, nothing is sent unless the contract marks a sandbox or
``--yes-send-requests`` is given, the table has one row per check, ``--json`` is one
document, a FAIL exits 1, and the run is stored per contract version where ``doctor``
and the start of ``worker`` / ``serve`` read it. One test runs the real CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings

from effect_broker.domain.contracts import load_contracts
from effect_broker.models import ConformanceRun
from effect_broker.services.conformance_runs import proofs, warn_unproved_at_start
from effect_broker.services.diagnosis import check_conformance
from examples.crash_matrix.target_client import TargetProcess

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]
ARGUMENTS = '{"order": "42", "amount_minor": 1999, "currency": "EUR"}'


def contracts_file(
    tmp_path: Path, target: TargetProcess, *, path: str, sandbox: bool = True
) -> Path:
    file = tmp_path / "contracts.toml"
    file.write_text(
        f"""
[[contract]]
name = "payments.charge"
version = "3"
tool = "charge"
safety = "idempotent"
key_retention = "24h"
adapter = "http"
sandbox = {"true" if sandbox else "false"}
[contract.adapter_options]
url = "{target.url}{path}"
idempotency_header = "Idempotency-Key"
timeout = "5s"
""",
        encoding="utf-8",
    )
    return file


def conform(file: Path, *extra: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    code = 0
    try:
        call_command(
            "contracts",
            "conform",
            "payments.charge",
            "--file",
            str(file),
            "--arguments",
            ARGUMENTS,
            "--attempt-limit",
            "1",
            *extra,
            stdout=out,
            stderr=err,
        )
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_conform_passes_the_crash_matrix_target_and_stores_the_run(
    target: TargetProcess, tmp_path: Path
) -> None:
    # Given a sandbox contract for the target's idempotent endpoint
    file = contracts_file(tmp_path, target, path="/idempotent/charges")
    with override_settings(EFFECT_BROKER_CONTRACTS=str(file)):
        # and doctor, before any run, warning that the promise is unproved
        before = check_conformance()
        assert before.status == "warn"
        assert before.details == (
            {
                "message": "contract payments.charge@3 claims idempotent but has no "
                "passing conformance run (never run); prove it: effect-broker "
                "contracts conform payments.charge@3"
            },
        )
        # When the user runs conform
        code, out, err = conform(file)
        # Then it says first what it will send, then one row per check
        lines = out.splitlines()
        assert lines[0] == (
            "conform payments.charge@3 (idempotent): will send at most 11 effect "
            f"request(s) and 0 lookup(s) to {target.url}, through a local fault proxy"
        )
        assert lines[1].split() == ["CHECK", "RESULT", "EVIDENCE"]
        rows = {line.split()[0]: line.split()[1] for line in lines[2:8]}
        assert rows == {
            "answers": "pass",
            "same_key_one_effect": "pass",
            "lost_answer": "pass",
            "slow_answer": "pass",
            "never_arrived": "n/a",
            "drift_refused": "pass",
        }
        assert "3 requests under one key made 1 effect (ch_" in out
        assert lines[-1] == (
            "payments.charge@3: every check that applies passed (11 effect request(s) "
            "sent)"
        )
        assert code == 0, err
        assert target.stats()["requests"] == 11
        # And the run is stored for this contract version, which doctor now shows
        run = ConformanceRun.objects.get()
        assert (run.contract_name, run.contract_version, run.passed) == (
            "payments.charge",
            "3",
            True,
        )
        assert run.target == target.url
        assert run.effect_requests == 11
        after = check_conformance()
        assert after.status == "ok"
        assert after.details[0]["message"].startswith(
            "contract payments.charge@3 (idempotent): passed "
        )
        assert warn_unproved_at_start("worker") == []


def test_conform_fails_a_key_ignoring_target_with_evidence_and_exit_1(
    target: TargetProcess, tmp_path: Path
) -> None:
    # Given a contract that claims idempotent for an endpoint that ignores the key
    file = contracts_file(tmp_path, target, path="/unsafe/charges")
    # When conform runs with --json
    code, out, err = conform(file, "--json")
    # Then it exits 1, the plan went to stderr, and the JSON names the evidence
    assert code == 1
    assert err.startswith("conform payments.charge@3 (idempotent): will send at most 11")
    document = json.loads(out)
    assert document["passed"] is False
    outcomes = {row["check"]: row["outcome"] for row in document["checks"]}
    assert outcomes["same_key_one_effect"] == "FAIL"
    same = next(r for r in document["checks"] if r["check"] == "same_key_one_effect")
    assert same["evidence"].startswith("3 requests under one key made 3 effects (ch_")
    assert document["sent"]["effect_requests"] == target.stats()["requests"]
    # And the stored failing run keeps the worker warning on
    with override_settings(EFFECT_BROKER_CONTRACTS=str(file)):
        [proof] = proofs(load_contracts(file))
        assert proof.proved is False
        assert proof.why.endswith(
            "failed: same_key_one_effect, lost_answer, slow_answer, drift_refused"
        )
        lines = warn_unproved_at_start("worker")
        assert len(lines) == 1
        assert lines[0].startswith(
            "contract payments.charge@3 claims idempotent but has no passing "
            "conformance run (last run "
        )


def test_conform_refuses_a_target_not_marked_sandbox(
    target: TargetProcess, tmp_path: Path
) -> None:
    # Given a contract that does not mark its target as a sandbox
    file = contracts_file(tmp_path, target, path="/idempotent/charges", sandbox=False)
    # When conform runs without --yes-send-requests
    code, out, err = conform(file)
    # Then it says what it would send, refuses, and sends nothing
    assert code == 2
    assert "will send at most 11 effect request(s)" in out
    assert "refused: contract payments.charge@3 does not mark its target" in err
    assert target.stats()["requests"] == 0
    assert not ConformanceRun.objects.exists()
    # And with --yes-send-requests it runs
    code, out, _ = conform(file, "--yes-send-requests")
    assert code == 0
    assert target.stats()["requests"] == 11


@pytest.mark.django_db(transaction=True)
def test_the_real_cli_exits_non_zero_against_a_key_ignoring_target(
    target: TargetProcess, tmp_path: Path, target_database_url: str
) -> None:
    # Given the installed command, the test database and a key-ignoring target
    file = contracts_file(tmp_path, target, path="/unsafe/charges")
    env = {**os.environ, "DATABASE_URL": target_database_url}
    # When a user runs it as documented
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "effect_broker.cli",
            "contracts",
            "conform",
            "payments.charge@3",
            "--file",
            str(file),
            "--arguments",
            ARGUMENTS,
            "--attempt-limit",
            "1",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # Then the table FAILs idempotency with the target's evidence, and exits 1
    assert result.returncode == 1, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("same_key"))
    assert row.split()[1] == "FAIL"
    assert "3 requests under one key made 3 effects (ch_" in row
    assert "Traceback" not in result.stderr
