"""``effect-broker effects ...`` run as a subprocess against a scratch database.

The effects are put into outcome_unknown by a setup script run through the same console
script (``shell -c``), with the example contracts and their simulated targets: the
unsafe contract there has ``retry_limit = 0``, so it can never be requeued. The setup
also creates the staff user ``olga`` holding ``effect_broker.resolve_effect`` (an
operator) and the staff user ``clerk`` without it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.acceptance.test_cli import ROOT, drop, run, scratch_db_env

pytestmark = pytest.mark.django_db

SETUP = """
import json
from django.core.management import call_command
call_command("migrate", verbosity=0, interactive=False)
from effect_broker.adapters.simulated_adapter import Fault, get_target
from effect_broker.domain.records import EffectRequest
from effect_broker.services.dispatch import dispatch
from effect_broker.services.runtime import get_runtime
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant

registry = get_runtime().registry
ops, other = create_tenant("cli-ops")[0], create_tenant("cli-other")[0]

from django.contrib.auth.models import Permission, User
olga = User.objects.create_user("olga", is_staff=True)
olga.user_permissions.add(Permission.objects.get(codename="resolve_effect"))
User.objects.create_user("clerk", is_staff=True)

def unknown(tenant, tool, key, fault):
    args = {"order": key, "amount_minor": 100, "currency": "EUR"}
    effect = submit(tenant, EffectRequest(key, tool, args)).effect
    get_target(registry.for_tool(tool)).inject(fault)
    after = dispatch(effect.effect_id, worker="setup")
    assert after.status.value == "outcome_unknown", after.status
    return after.effect_id

print(json.dumps({
    "lost": unknown(ops, "charge_card_unsafe", "order:1:charge", Fault.LOSE_RESPONSE),
    "never": unknown(
        ops, "charge_card_unsafe", "order:2:charge", Fault.TIMEOUT_BEFORE_COMMIT
    ),
    "idem": unknown(ops, "charge_card", "order:3:charge", Fault.LOSE_RESPONSE),
    "other": unknown(other, "charge_card_unsafe", "order:4:charge", Fault.LOSE_RESPONSE),
    "fork": unknown(
        ops, "charge_card_unsafe", "order:5:charge", Fault.TIMEOUT_BEFORE_COMMIT
    ),
}))
"""


@pytest.fixture(scope="module")
def scratch(
    django_db_setup: None,
    django_db_blocker: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """A migrated scratch database with five unknown effects; dropped afterwards."""
    env = scratch_db_env()
    # The example contracts, except that the unsafe charge allows no retry at all:
    # the retry-limit refusal below depends on it, so the test states it itself.
    contracts = (ROOT / "examples" / "contracts.toml").read_text()
    unsafe = contracts.index('name = "payments.charge-unsafe"')
    start = contracts.index("retry_limit = ", unsafe)
    end = contracts.index("\n", start)
    path = tmp_path_factory.mktemp("contracts") / "contracts.toml"
    path.write_text(contracts[:start] + "retry_limit = 0" + contracts[end:])
    env["EFFECT_BROKER_CONTRACTS"] = str(path)
    with django_db_blocker.unblock():
        if "DATABASE_URL" in env:
            from django.db import connection

            with connection._nodb_cursor() as cur:
                cur.execute(f'CREATE DATABASE "{env["EB_SCRATCH"]}"')
        try:
            setup = run("shell", "-c", SETUP, env=env)
            assert setup.returncode == 0, setup.stderr
            ids = json.loads(setup.stdout.strip().splitlines()[-1])
            yield env, ids
        finally:
            drop(env["EB_SCRATCH"])


def effects(env: dict[str, str], *args: str) -> Any:
    return run("effects", *args, env=env)


def one_line_error(result: Any, code: str) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"effect-broker: error [{code}]: "), lines[0]
    return lines[0]


def test_list_crosses_tenants_and_marks_what_needs_an_operator(scratch) -> None:
    env, ids = scratch
    result = effects(env, "list", "--status", "outcome_unknown")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "ID",
        "TENANT",
        "OPERATION",
        "KEY",
        "TOOL",
        "SAFETY",
        "STATUS",
        "AGE",
    ]
    rows = {line.split()[0]: line.split() for line in lines[1:-1]}
    assert set(rows) == set(ids.values())
    assert rows[ids["lost"]][1:6] == [
        "cli-ops",
        "order:1:charge",
        "charge_card_unsafe",
        "unsafe",
        "outcome_unknown",
    ]
    assert rows[ids["lost"]][6] == "*"
    # idempotent: reconciled automatically, so no "*" before the age column
    assert rows[ids["idem"]][5:6] == ["outcome_unknown"]
    assert len(rows[ids["idem"]]) == len(rows[ids["lost"]]) - 1
    assert rows[ids["other"]][1] == "cli-other"
    assert lines[-1].startswith("* needs an operator")

    mine = effects(env, "list", "--tenant", "cli-ops", "--tool", "charge_card")
    assert [line.split()[0] for line in mine.stdout.splitlines()[1:]] == [ids["idem"]]
    one_line_error(effects(env, "list", "--tenant", "nobody"), "tenant_not_found")


def test_inspect_folds_the_verified_history(scratch) -> None:
    env, ids = scratch
    now = effects(env, "inspect", ids["never"])
    assert now.returncode == 0, now.stderr
    out = now.stdout
    assert "tenant     cli-ops" in out
    assert "status     outcome_unknown (version 3, now)" in out
    assert "chain      verified (3 events)" in out
    assert "needs      an operator" in out
    events = [line.split()[2] for line in out.splitlines() if line[:4].strip().isdigit()]
    assert events == ["reserved", "dispatch_started", "outcome_unknown"]

    past = effects(env, "inspect", ids["never"], "--at-sequence", "1")
    assert "status     prepared (version 1, as of event 1 of 3)" in past.stdout
    one_line_error(
        effects(env, "inspect", ids["never"], "--at-sequence", "9"), "invalid_request"
    )
    one_line_error(effects(env, "inspect", "not-an-id"), "effect_not_found")


def test_reconcile_defers_for_idempotent_and_never_for_unsafe(scratch) -> None:
    env, ids = scratch
    deferred = effects(env, "reconcile", ids["idem"])
    assert deferred.returncode == 0, deferred.stderr
    assert deferred.stdout.strip() == (
        f"reconcile requested for {ids['idem']} (status outcome_unknown)"
    )
    refused = one_line_error(
        effects(env, "reconcile", ids["other"]), "illegal_transition"
    )
    assert "an operator must resolve it" in refused


def test_resolve_needs_proof_respects_the_contract_and_settles_once(scratch) -> None:
    env, ids = scratch
    never = ids["never"]
    # Non-commit without evidence: refused.
    one_line_error(
        effects(
            env, "resolve", never, "--not-committed", "--reason", "r", "--as", "olga"
        ),
        "invalid_request",
    )
    # With evidence, an unsafe effect is still never resent under its key.
    no_resend = one_line_error(
        effects(
            env,
            "resolve",
            never,
            "--not-committed",
            "--reason",
            "not in the export",
            "--evidence",
            '{"source": "export", "checked_at": "2026-12-03T21:00:00Z"}',
            "--as",
            "olga",
        ),
        "illegal_transition",
    )
    assert "never resent under the same operation key" in no_resend
    assert "fork it" in no_resend
    failed = effects(
        env, "resolve", never, "--failed", "--reason", "gave up", "--as", "olga"
    )
    assert failed.returncode == 0, failed.stderr
    assert failed.stdout.strip() == (f"resolved {never}: outcome_unknown -> failed_final")

    lost = ids["lost"]
    done = effects(
        env,
        "resolve",
        lost,
        "--succeeded",
        "--reason",
        "charge in the dashboard",
        "--evidence",
        '{"source": "dashboard", "reference": "ch_1", "charge_id": "ch_1"}',
        "--external-id",
        "ch_1",
        "--as",
        "olga",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"resolved {lost}: outcome_unknown -> succeeded (")
    history = effects(env, "inspect", lost).stdout
    assert "status     succeeded (version 5, now)" in history
    assert "operator_review_started" in history
    assert "resolved_succeeded" in history
    assert "olga" in history
    assert "ch_1" in history  # the external id; the evidence only by digest
    assert '"charge_id"' not in history
    again = one_line_error(
        effects(env, "resolve", lost, "--failed", "--reason", "oops", "--as", "olga"),
        "illegal_transition",
    )
    assert "already settled as succeeded" in again


def test_help_explains_the_three_choices(scratch) -> None:
    env, _ = scratch
    result = effects(env, "resolve", "--help")
    assert result.returncode == 0
    for flag in ("--succeeded", "--not-committed", "--failed", "--as"):
        assert flag in result.stdout
    assert "retry anyway" in result.stdout
    assert "privileged" in effects(env, "--help").stdout

    assert "--operator" not in result.stdout


@pytest.mark.parametrize("who", ["clerk", "nobody"])
def test_resolve_and_fork_act_only_as_a_staff_user_with_the_permission(
    scratch, who
) -> None:
    env, ids = scratch
    target = ids["idem"]
    before = effects(env, "inspect", target).stdout
    refused = one_line_error(
        effects(env, "resolve", target, "--failed", "--reason", "x", "--as", who),
        "operator_forbidden",
    )
    assert who in refused
    one_line_error(
        effects(
            env,
            "fork",
            target,
            "--new-operation-key",
            "order:3:charge:v2",
            "--reason",
            "x",
            "--evidence",
            '{"source": "export", "checked_at": "2026-12-03T21:00:00Z"}',
            "--as",
            who,
        ),
        "operator_forbidden",
    )
    assert effects(env, "inspect", target).stdout == before


def test_operator_tokens_are_created_for_operators_only(scratch) -> None:
    env, _ = scratch
    made = run("operators", "create-token", "--user", "olga", env=env)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1].split(": ", 1)[1]
    assert token.startswith("ebop_")
    listed = run("operators", "list-tokens", env=env)
    assert "olga" in listed.stdout
    assert token not in listed.stdout
    one_line_error(
        run("operators", "create-token", "--user", "clerk", env=env),
        "operator_forbidden",
    )


def test_fork_settles_the_old_effect_and_reserves_a_new_one(scratch) -> None:
    env, ids = scratch
    old = ids["fork"]
    evidence = '{"source": "stripe export", "checked_at": "2026-12-03T21:00:00Z"}'
    args = ["fork", old, "--reason", "no charge", "--evidence", evidence, "--as", "olga"]
    same = one_line_error(
        effects(env, *args, "--new-operation-key", "order:5:charge"), "invalid_request"
    )
    assert "NEW operation key" in same
    done = effects(env, *args, "--new-operation-key", "order:5:charge:v2")
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith(f"forked {old} (failed_final) -> ")
    assert line.endswith("order:5:charge:v2 (prepared, queued for dispatch)")
    new = line.split(" -> ")[1].split()[0]
    history = effects(env, "inspect", old).stdout
    assert f"forked     to {new}" in history
    assert "resolved_forked" in history
    assert "olga" in history
    assert f"forked     from {old}" in effects(env, "inspect", new).stdout
    again = one_line_error(
        effects(env, *args, "--new-operation-key", "order:5:charge:v3"),
        "illegal_transition",
    )
    assert "already settled" in again
