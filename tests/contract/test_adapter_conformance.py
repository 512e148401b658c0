"""Spec "Key interfaces and contracts": ONE conformance suite, parametrised over every
adapter x safety class - the simulated adapter (in-process, ManualClock), the HTTP
adapter against the real target service process on loopback with a real Postgres, and
the mcp adapter in front of the example payments MCP server (a stdio subprocess) that
charges through that same target.

Below it: the suite's own teeth (it fails adapters that break the protocol) and the
simulated target's semantics that the property tests and benchmarks rely on."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from effect_broker.adapters.base import (
    DispatchRequest,
    DispatchResult,
    ProbeRequest,
    ProbeResult,
)
from effect_broker.adapters.conformance import (
    CHECKS,
    AdapterConformance,
    ConformanceSkip,
    SimulatedHarness,
)
from effect_broker.adapters.http_adapter import HttpAdapter
from effect_broker.adapters.mcp_adapter import McpAdapter
from effect_broker.adapters.simulated_adapter import (
    Fault,
    SimulatedAdapter,
    SimulatedTarget,
    TargetFailure,
    get_target,
    reset_targets,
    simulated_targets,
)
from effect_broker.domain.clock import ManualClock
from effect_broker.domain.contracts import EffectContract, parse_contracts
from effect_broker.domain.errors import (
    ConfigurationError,
    OutcomeUnknownError,
    RetryableAdapterError,
    TerminalAdapterError,
)
from effect_broker.domain.states import ProbeStatus, SafetyClass
from effect_broker.domain.upstream import McpUpstream
from examples.crash_matrix.target_client import TargetProcess
from examples.mcp_upstream.contracts import MCP_TOOLS, mcp_contracts_toml

MODES = (SafetyClass.IDEMPOTENT, SafetyClass.RECONCILABLE, SafetyClass.UNSAFE)
SIM_DELAY = timedelta(milliseconds=300)


def contract(
    safety: SafetyClass,
    adapter: str = "simulated",
    settlement_bound: timedelta = timedelta(seconds=1),
    **options: object,
) -> EffectContract:
    """A contract of ``safety`` that declares truthful bounds for the targets here."""
    return EffectContract(
        name=f"conformance.{adapter}.{safety.value}",
        version="1",
        tool=f"charge_{safety.value}",
        safety=safety,
        key_retention=timedelta(hours=24) if safety is SafetyClass.IDEMPOTENT else None,
        settlement_bound=settlement_bound if safety is SafetyClass.RECONCILABLE else None,
        adapter=adapter,
        adapter_options=options,
    )


def simulated_suite(
    safety: SafetyClass, adapter_class: type[SimulatedAdapter] = SimulatedAdapter
) -> AdapterConformance:
    target = SimulatedTarget(
        safety,
        clock=ManualClock(),
        key_retention=timedelta(hours=24),
        settlement_delay=SIM_DELAY
        if safety is SafetyClass.RECONCILABLE
        else timedelta(0),
    )
    adapter = adapter_class(contract(safety), target=target)
    return AdapterConformance(adapter, SimulatedHarness(target))


def http_contract(
    target: TargetProcess, safety: SafetyClass, fencing_header: str = "X-Fencing-Token"
) -> EffectContract:
    options: dict[str, object] = {
        "url": f"{target.url}/{safety.value}/charges",
        "timeout": "5s",
        "connect_timeout": "1s",
    }
    if safety is SafetyClass.IDEMPOTENT:
        options["idempotency_header"] = "Idempotency-Key"
    if safety is SafetyClass.RECONCILABLE:
        options["correlation_header"] = "X-Correlation-Key"
        options["probe_url"] = (
            f"{target.url}/reconcilable/charges?correlation_key={{downstream_key}}"
        )
    if safety is not SafetyClass.UNSAFE:
        # The target fences per key; an unsafe target takes none.
        options["fencing_header"] = fencing_header
    return contract(safety, "http", timedelta(seconds=1), **options)


@dataclass
class Subject:
    kind: str
    safety: SafetyClass


SUBJECTS = [
    *(pytest.param(Subject("simulated", m), id=f"simulated-{m.value}") for m in MODES),
    *(
        pytest.param(
            Subject("http", m), id=f"http-{m.value}", marks=pytest.mark.django_db
        )
        for m in MODES
    ),
    *(
        pytest.param(Subject("mcp", m), id=f"mcp-{m.value}", marks=pytest.mark.django_db)
        for m in MODES
    ),
]


def mcp_contract(target: TargetProcess, safety: SafetyClass) -> EffectContract:
    """The example contract of ``safety`` behind the payments MCP server."""
    registry = parse_contracts(mcp_contracts_toml(target.url, settlement_bound="1s"))
    return registry.for_tool(MCP_TOOLS[safety.value])


@pytest.fixture(params=SUBJECTS)
def suite(request: pytest.FixtureRequest) -> Iterator[AdapterConformance]:
    subject: Subject = request.param
    if subject.kind == "simulated":
        yield simulated_suite(subject.safety)
        return
    target: TargetProcess = request.getfixturevalue("target")
    if subject.kind == "mcp":
        yield AdapterConformance(
            McpAdapter(mcp_contract(target, subject.safety)), target.harness()
        )
        return
    with HttpAdapter(http_contract(target, subject.safety)) as adapter:
        yield AdapterConformance(adapter, target.harness())


@pytest.mark.parametrize("check", CHECKS)
def test_adapter_keeps_the_protocol(suite: AdapterConformance, check: str) -> None:
    # Given a reset target, when the check drives adapter and target, then it holds
    suite.harness.reset()
    try:
        getattr(suite, check)()
    except ConformanceSkip as skip:
        pytest.skip(str(skip))


def test_run_all_reports_each_check_once() -> None:
    results = simulated_suite(SafetyClass.RECONCILABLE).run_all()
    assert [r.name for r in results] == list(CHECKS)
    assert {r.name: r.outcome for r in results} == {
        "check_stable_key_across_attempts": "passed",
        "check_target_rejects_payload_drift": "skipped",
        "check_positive_probe": "passed",
        "check_negative_probe_only_after_settlement_bound": "passed",
        "check_unknown_probe_behaviour": "passed",
        "check_no_hidden_retries": "passed",
        "check_stale_fencing_token_is_refused": "skipped",
        "check_tool_raises_after_its_side_effect": "passed",
    }


# --- the suite has teeth: broken adapters fail it ---------------------------------------


class HiddenRetryAdapter(SimulatedAdapter):
    """Retries inside the adapter on a lost response: the forbidden hidden layer."""

    def _send(self, request: DispatchRequest) -> DispatchResult:
        try:
            return super()._send(request)
        except OutcomeUnknownError:
            return super()._send(request)


class FreshKeyAdapter(SimulatedAdapter):
    """Sends a new key on every attempt (the attempt id), defeating dedup."""

    def _send(self, request: DispatchRequest) -> DispatchResult:
        row = self.target.create(request.attempt_id, request.effect.request_hash)
        return DispatchResult(external_id=row.external_id, output={})


class UndocumentedErrorIsARefusalAdapter(SimulatedAdapter):
    """Takes an error that documents nothing for a refusal: what the mcp adapter did
    with an isError result by default before issue 19."""

    def _classify(self, failure: TargetFailure):  # type: ignore[no-untyped-def]
        if failure.kind == "error_after_commit":
            return TerminalAdapterError("refused", adapter=self.name)
        return super()._classify(failure)


class OptimisticProbeAdapter(SimulatedAdapter):
    """Turns a failed lookup into NOT_COMMITTED: a lie that licenses a duplicate."""

    def _lookup(self, request: ProbeRequest) -> ProbeResult:
        try:
            return super()._lookup(request)
        except Exception:
            return ProbeResult(status=ProbeStatus.NOT_COMMITTED)


@pytest.mark.parametrize(
    ("adapter_class", "safety", "check", "message"),
    [
        (
            HiddenRetryAdapter,
            SafetyClass.IDEMPOTENT,
            "check_no_hidden_retries",
            "a lost response: expected OutcomeUnknownError",
        ),
        (
            FreshKeyAdapter,
            SafetyClass.IDEMPOTENT,
            "check_stable_key_across_attempts",
            "the lost-response attempt committed: target holds 0 effect(s), not 1",
        ),
        (
            OptimisticProbeAdapter,
            SafetyClass.RECONCILABLE,
            "check_unknown_probe_behaviour",
            "an unavailable lookup of a absent effect said not_committed",
        ),
        (
            UndocumentedErrorIsARefusalAdapter,
            SafetyClass.UNSAFE,
            "check_tool_raises_after_its_side_effect",
            "tool raises after its side effect: classified TerminalAdapterError",
        ),
    ],
)
def test_suite_fails_a_broken_adapter(
    adapter_class: type[SimulatedAdapter], safety: SafetyClass, check: str, message: str
) -> None:
    suite = simulated_suite(safety, adapter_class)
    with pytest.raises(AssertionError, match=re.escape(message)):
        getattr(suite, check)()


@pytest.mark.django_db
@pytest.mark.parametrize("safety", [SafetyClass.IDEMPOTENT, SafetyClass.RECONCILABLE])
def test_suite_fails_a_fencing_header_the_target_does_not_read(
    target: TargetProcess, safety: SafetyClass
) -> None:
    # Given a contract that declares fencing under a header the target ignores
    declared = http_contract(target, safety, fencing_header="X-Not-Read-By-Target")
    with HttpAdapter(declared) as adapter:
        suite = AdapterConformance(adapter, target.harness())
        # Then the older claim is not refused, and the check says so
        with pytest.raises(AssertionError, match="an older claim after a newer one"):
            suite.check_stale_fencing_token_is_refused()


def test_fencing_check_skips_a_contract_without_fencing() -> None:
    with pytest.raises(ConformanceSkip, match="declares no fencing token"):
        simulated_suite(SafetyClass.IDEMPOTENT).check_stale_fencing_token_is_refused()


def test_suite_fails_a_contract_whose_bound_is_shorter_than_the_target() -> None:
    # Given a target that settles in 300ms and a contract that claims 100ms
    target = SimulatedTarget(
        SafetyClass.RECONCILABLE, clock=ManualClock(), settlement_delay=SIM_DELAY
    )
    lying = contract(
        SafetyClass.RECONCILABLE, settlement_bound=timedelta(milliseconds=100)
    )
    suite = AdapterConformance(SimulatedAdapter(lying, target), SimulatedHarness(target))
    # Then the negative-probe check refuses it before a probe is ever trusted
    with pytest.raises(AssertionError, match="shorter than the target's real"):
        suite.check_negative_probe_only_after_settlement_bound()


# --- a real MCP upstream whose tool raises after charging (issue 19, item 1) -----------

RAISING_SERVER = Path(__file__).with_name("mcp_raising_server.py")


class RaisingUpstreamHarness:
    """The conformance view of ``mcp_raising_server.py``: its charges file is the
    truth, and a flag file makes the next charge raise after it was written. Only
    the levers the raise-after-acting check uses are implemented."""

    def __init__(self, directory: Path) -> None:
        self.charges = directory / "charges.jsonl"
        self.raise_next = directory / "raise-next"

    def env(self) -> dict[str, str]:
        return {
            "CHARGES_FILE": str(self.charges),
            "RAISE_NEXT_FILE": str(self.raise_next),
        }

    def effect_count(self, key: str | None) -> int:
        if not self.charges.exists():
            return 0
        rows = [json.loads(line) for line in self.charges.read_text().splitlines()]
        return sum(1 for row in rows if key is None or row["key"] == key)

    def fail_after_commit_next(self) -> None:
        self.raise_next.touch()

    def reset(self) -> None:
        self.charges.unlink(missing_ok=True)
        self.raise_next.unlink(missing_ok=True)


def raising_suite(
    tmp_path: Path, safety: SafetyClass, **upstream: object
) -> AdapterConformance:
    harness = RaisingUpstreamHarness(tmp_path)
    keyed = safety is not SafetyClass.UNSAFE
    options: dict[str, object] = {
        "tool": "charge",
        "command": (sys.executable, str(RAISING_SERVER)),
        "env": harness.env(),
        "key_argument": "idempotency_key" if keyed else None,
        **upstream,
    }
    if safety is SafetyClass.RECONCILABLE:
        options.update(lookup_tool="lookup_charge", lookup_argument="reference")
    mcp_contract = EffectContract(
        name=f"raising.{safety.value}",
        version="1",
        tool=f"raising_{safety.value}",
        safety=safety,
        key_retention=timedelta(hours=1) if safety is SafetyClass.IDEMPOTENT else None,
        settlement_bound=timedelta(seconds=1)
        if safety is SafetyClass.RECONCILABLE
        else None,
        adapter="mcp",
        upstream=McpUpstream(**options),  # type: ignore[arg-type]
    )
    return AdapterConformance(
        McpAdapter(mcp_contract),
        harness,  # type: ignore[arg-type]
        arguments={"order": "42", "amount_minor": 1999},
    )


@pytest.mark.parametrize("safety", MODES, ids=[m.value for m in MODES])
def test_a_tool_that_raises_after_charging_passes_the_kit_by_default(
    tmp_path: Path, safety: SafetyClass
) -> None:
    # Given a real stdio upstream on the SDK's MCPServer whose tool charges, then
    # raises, and a contract that leaves tool_error at its default
    suite = raising_suite(tmp_path, safety)
    suite.harness.reset()
    # Then the kit's check holds: unknown, exactly one charge
    suite.check_tool_raises_after_its_side_effect()
    assert suite.harness.effect_count(None) == 1


def test_the_kit_fails_a_contract_that_calls_a_raise_after_charging_terminal(
    tmp_path: Path,
) -> None:
    # Given the same upstream behind a contract that claims every isError is final
    suite = raising_suite(tmp_path, SafetyClass.UNSAFE, tool_error="terminal")
    suite.harness.reset()
    # Then the check fails, naming the broken promise, over the one real charge
    with pytest.raises(AssertionError, match="classified TerminalAdapterError"):
        suite.check_tool_raises_after_its_side_effect()
    assert suite.harness.effect_count(None) == 1


# --- simulated target semantics ---------------------------------------------------------


def sim(
    safety: SafetyClass, **kwargs: object
) -> tuple[AdapterConformance, SimulatedTarget]:
    target = SimulatedTarget(safety, clock=ManualClock(), **kwargs)  # type: ignore[arg-type]
    suite = AdapterConformance(
        SimulatedAdapter(contract(safety), target), SimulatedHarness(target)
    )
    return suite, target


def test_expired_key_retention_lets_a_resend_create_a_second_effect() -> None:
    # Given an idempotent target that keeps keys for 1h, and one committed effect
    suite, target = sim(SafetyClass.IDEMPOTENT, key_retention=timedelta(hours=1))
    effect = suite.new_effect()
    first = suite.dispatch(effect)
    assert suite.dispatch(effect).external_id == first.external_id  # inside: deduped
    # When the horizon passes and the same key is sent again
    assert isinstance(target.clock, ManualClock)
    target.clock.advance(timedelta(hours=1))
    second = suite.dispatch(effect)
    # Then the target forgot the key: the honest failure mode is a second effect
    assert second.external_id != first.external_id
    assert target.effect_count(effect.downstream_key) == 2


@pytest.mark.parametrize(
    ("fault", "error", "requests", "rows"),
    [
        (Fault.REFUSE_CONNECTION, RetryableAdapterError, 0, 0),
        (Fault.REJECT, RetryableAdapterError, 1, 0),
        (Fault.TIMEOUT_BEFORE_COMMIT, OutcomeUnknownError, 1, 0),
        (Fault.LOSE_RESPONSE, OutcomeUnknownError, 1, 1),
        (Fault.TERMINAL, TerminalAdapterError, 1, 0),
        (Fault.KEY_IN_USE, RetryableAdapterError, 1, 0),
    ],
)
def test_each_fault_is_classified_by_what_it_proves(
    fault: Fault, error: type[Exception], requests: int, rows: int
) -> None:
    suite, target = sim(SafetyClass.UNSAFE)
    target.inject(fault)
    with pytest.raises(error):
        suite.dispatch(suite.new_effect())
    assert (target.requests, target.effect_count()) == (requests, rows)


def test_key_in_use_is_retry_later_and_the_resend_commits_once() -> None:
    # Issue 9, defect 3, as the HTTP adapter classifies a 409/423 to a same-key resend
    suite, target = sim(SafetyClass.IDEMPOTENT)
    effect = suite.new_effect()
    target.inject(Fault.KEY_IN_USE)
    caught = suite.expect(RetryableAdapterError, lambda: suite.dispatch(effect), "409")
    assert caught.details["reason"] == "key_in_use"
    assert target.effect_count(effect.downstream_key) == 0
    suite.dispatch(effect)
    suite.dispatch(effect)
    assert target.effect_count(effect.downstream_key) == 1


def test_unsafe_target_records_no_key_and_dedups_nothing() -> None:
    suite, target = sim(SafetyClass.UNSAFE)
    effect = suite.new_effect()
    suite.dispatch(effect)
    suite.dispatch(effect)
    assert target.effect_count() == 2
    assert {row.key for row in target.rows} == {None}
    assert suite.probe(effect).status is ProbeStatus.UNKNOWN


def test_probe_fault_is_not_consumed_by_a_dispatch() -> None:
    suite, target = sim(SafetyClass.RECONCILABLE)
    effect = suite.new_effect()
    target.inject(Fault.PROBE_UNAVAILABLE)
    suite.dispatch(effect)  # must not eat the probe fault
    assert suite.probe(effect).status is ProbeStatus.UNKNOWN
    assert suite.probe(effect).status is ProbeStatus.COMMITTED  # delay 0: visible
    assert suite.probe(effect).evidence == {
        "checked_at": target.clock.now().isoformat(),
        "visible_rows": 1,
    }


def test_registry_builds_one_target_per_contract_from_adapter_options() -> None:
    reset_targets()
    try:
        configured = contract(
            SafetyClass.RECONCILABLE, mode="unsafe", settlement_delay="250ms"
        )
        adapter = SimulatedAdapter(configured)
        assert (
            adapter.target is get_target(configured) is simulated_targets[configured.name]
        )
        assert adapter.target.mode is SafetyClass.UNSAFE
        assert adapter.target.settlement_delay == timedelta(milliseconds=250)
        plain = SimulatedAdapter(contract(SafetyClass.IDEMPOTENT))
        assert plain.target.key_retention == timedelta(hours=24)
    finally:
        reset_targets()
    assert simulated_targets == {}


def test_simulated_target_refuses_to_pretend_to_be_transactional() -> None:
    with pytest.raises(ConfigurationError, match="simulated-local"):
        SimulatedTarget(SafetyClass.TRANSACTIONAL)
