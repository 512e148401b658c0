"""Issue 22, item 1: the conformance kit proves a target through its own answers.

The kit runs the real HTTP adapter through its own fault proxy against the crash-matrix
target process (a real Postgres behind it): every class passes. Pointed at targets that
break a promise, it FAILs with the target's own evidence: (a) a target that ignores the
idempotency key, (b) a lookup that answers "not found" for a committed request, (c) a
target that commits and then answers an error.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from effect_broker.adapters.conformance_kit import ConformanceKit, KitRow, rows_passed
from effect_broker.domain.contracts import EffectContract, parse_contracts
from effect_broker.domain.states import SafetyClass
from examples.crash_matrix.target_client import TargetProcess
from examples.mcp_upstream.contracts import MCP_TOOLS, mcp_contracts_toml

pytestmark = pytest.mark.django_db
ARGUMENTS = {"order": "42", "amount_minor": 1999, "currency": "EUR"}
ROOT = Path(__file__).resolve().parents[2]
#: Seconds: a stdio server (and the kit's wrapper) starts inside each attempt.
STDIO_LIMIT = 5.0


def http_contract(
    target: TargetProcess,
    safety: SafetyClass,
    *,
    path: str | None = None,
    probe: str = "/reconcilable/charges?correlation_key={downstream_key}",
) -> EffectContract:
    options: dict[str, object] = {
        "url": f"{target.url}{path or f'/{safety.value}/charges'}",
        "timeout": "5s",
        "connect_timeout": "1s",
    }
    if safety is SafetyClass.IDEMPOTENT:
        options["idempotency_header"] = "Idempotency-Key"
    if safety is SafetyClass.RECONCILABLE:
        options["correlation_header"] = "X-Correlation-Key"
        options["probe_url"] = f"{target.url}{probe}"
    return EffectContract(
        name=f"kit.{safety.value}",
        version="1",
        tool=f"kit_{safety.value}",
        safety=safety,
        key_retention=timedelta(hours=24) if safety is SafetyClass.IDEMPOTENT else None,
        settlement_bound=timedelta(seconds=1)
        if safety is SafetyClass.RECONCILABLE
        else None,
        adapter="http",
        adapter_options=options,
    )


def kit(contract: EffectContract, attempt_limit: float = 1.0) -> ConformanceKit:
    return ConformanceKit(contract, arguments=ARGUMENTS, attempt_limit=attempt_limit)


def by_check(rows: list[KitRow]) -> dict[str, KitRow]:
    return {row.check: row for row in rows}


EXPECTED = {
    SafetyClass.IDEMPOTENT: {
        "answers": "pass",
        "same_key_one_effect": "pass",
        "lost_answer": "pass",
        "slow_answer": "pass",
        "never_arrived": "n/a",
        "drift_refused": "pass",
    },
    SafetyClass.RECONCILABLE: {
        "answers": "pass",
        "same_key_one_effect": "n/a",
        "lost_answer": "pass",
        "slow_answer": "pass",
        "never_arrived": "pass",
        "drift_refused": "n/a",
    },
    SafetyClass.UNSAFE: {
        "answers": "pass",
        "same_key_one_effect": "n/a",
        "lost_answer": "pass",
        "slow_answer": "pass",
        "never_arrived": "n/a",
        "drift_refused": "n/a",
    },
}


@pytest.mark.parametrize("safety", list(EXPECTED), ids=lambda s: s.value)
def test_the_crash_matrix_target_passes_every_class(
    target: TargetProcess, safety: SafetyClass
) -> None:
    # Given the crash-matrix target and a truthful contract of each class
    run = kit(http_contract(target, safety))
    plan = run.plan()
    # When the kit runs
    rows = run.run()
    # Then every check that applies passes, with the target's evidence
    assert {r.check: r.outcome for r in rows} == EXPECTED[safety], rows
    assert rows_passed(rows)
    # And it sent exactly the effect requests it announced, to the target
    assert run.effect_requests_forwarded() == plan.effect_requests
    assert target.stats()["requests"] == plan.effect_requests
    assert run.lookups_forwarded() <= plan.lookups
    if safety is SafetyClass.IDEMPOTENT:
        evidence = by_check(rows)["same_key_one_effect"].evidence
        assert evidence.startswith("3 requests under one key made 1 effect (ch_")
        # The kit's own effects, in the target's own table: 1 + 1 + 1 + 1 + 1
        assert target.count_charges("idempotent") == 5


def test_a_target_that_ignores_the_key_fails_idempotency(target: TargetProcess) -> None:
    # Given a contract that claims idempotent for an endpoint that ignores the key
    contract = http_contract(target, SafetyClass.IDEMPOTENT, path="/unsafe/charges")
    # When the kit runs
    rows = by_check(kit(contract).run())
    # Then the key promise FAILs with the count of charges the target made
    same = rows["same_key_one_effect"]
    assert same.outcome == "FAIL"
    assert same.evidence.startswith("3 requests under one key made 3 effects (ch_")
    lost = rows["lost_answer"]
    assert lost.outcome == "FAIL"
    assert "2 requests under one key made 2 effects" in lost.evidence
    assert rows["drift_refused"].outcome == "FAIL"
    assert "not refused" in rows["drift_refused"].evidence
    assert not rows_passed(list(rows.values()))


def test_a_lookup_that_never_finds_a_commit_fails(target: TargetProcess) -> None:
    # Given a lookup that answers 404 whatever the target committed
    contract = http_contract(
        target,
        SafetyClass.RECONCILABLE,
        probe="/reconcilable/charges?correlation_key=elsewhere-{downstream_key}",
    )
    # When the kit runs
    rows = by_check(kit(contract).run())
    # Then finding a committed request FAILs, naming the charge and the bound
    for check in ("lost_answer", "slow_answer"):
        assert rows[check].outcome == "FAIL"
        assert "but its lookup answered not_committed for" in rows[check].evidence
        assert "(settlement_bound 1s)" in rows[check].evidence
    # And the absence of a request that never arrived is (vacuously) confirmed
    assert rows["never_arrived"].outcome == "pass"
    assert target.count_charges("reconcilable") == 3


def test_a_target_that_commits_then_answers_an_error_fails(
    target: TargetProcess,
) -> None:
    # Given a target that charges and then answers 500 to every create
    target.inject("error_after_commit", times=100)
    contract = http_contract(target, SafetyClass.RECONCILABLE)
    # When the kit runs
    rows = by_check(kit(contract).run())
    # Then a plain request FAILs: the broker could never read a commit
    assert rows["answers"].outcome == "FAIL"
    assert "HTTP 500" in rows["answers"].evidence
    assert "hold every effect of this contract as unknown" in rows["answers"].evidence
    assert rows["lost_answer"].outcome == "FAIL"
    assert (
        "the target's answer named no effect (HTTP 500)" in rows["lost_answer"].evidence
    )
    # And the charges were made all the same: the error came after the commit
    assert target.count_charges("reconcilable") == 3


# --- an MCP server over streamable HTTP -------------------------------------------------


@pytest.mark.parametrize("safety", list(EXPECTED), ids=lambda s: s.value)
def test_an_mcp_server_over_http_passes_every_class(
    target: TargetProcess, http_payments: str, safety: SafetyClass
) -> None:
    # Given the payments MCP server over streamable HTTP and its example contracts
    registry = parse_contracts(
        mcp_contracts_toml(target.url, settlement_bound="1s", url=http_payments)
    )
    contract = registry.for_tool(MCP_TOOLS[safety.value])
    run = kit(contract)
    plan = run.plan()
    # When the kit runs, its proxy in front of the MCP endpoint
    rows = run.run()
    # Then every check that applies passes, read in the tools' answers
    assert {r.check: r.outcome for r in rows} == EXPECTED[safety], rows
    assert run.effect_requests_forwarded() == plan.effect_requests
    assert target.stats()["requests"] == plan.effect_requests
    assert run.lookups_forwarded() <= plan.lookups
    if safety is SafetyClass.IDEMPOTENT:
        evidence = by_check(rows)["same_key_one_effect"].evidence
        assert evidence.startswith("3 requests under one key made 1 effect (ch_")


# Two classes only: each attempt starts the server (~1s here); the unsafe class and a
# key-ignoring tool add nothing the HTTP cases above do not show.
@pytest.mark.parametrize(
    "safety", [SafetyClass.IDEMPOTENT, SafetyClass.RECONCILABLE], ids=lambda s: s.value
)
def test_a_stdio_mcp_server_passes_behind_the_wrapper(
    target: TargetProcess, safety: SafetyClass
) -> None:
    # Given the payments MCP server over stdio (started through the kit's wrapper)
    registry = parse_contracts(mcp_contracts_toml(target.url, settlement_bound="1s"))
    contract = registry.for_tool(MCP_TOOLS[safety.value])
    # (the attempt's limit covers starting the server: it starts inside the attempt)
    run = kit(contract, attempt_limit=STDIO_LIMIT)
    plan = run.plan()
    assert plan.target.startswith("the stdio server ")
    # When the kit runs
    rows = run.run()
    # Then every check that applies passes, read in the tools' answers
    assert {r.check: r.outcome for r in rows} == EXPECTED[safety], rows
    assert run.effect_requests_forwarded() == plan.effect_requests
    assert target.stats()["requests"] == plan.effect_requests
    assert run.lookups_forwarded() <= plan.lookups
