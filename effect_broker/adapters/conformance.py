"""A reusable conformance suite: does an adapter keep the protocol against its target?

Spec "Guarantee vocabulary": what the broker may promise depends on what the target and
its adapter can prove. An adapter author runs ``AdapterConformance(adapter,
harness).run_all()`` against a real (or simulated) target. The ``TargetHarness`` is the
test's view of the target's own truth - how many effects really happened - plus levers
to lose a response, reject a request, break a lookup and let time pass.

Each ``check_*`` method raises ``AssertionError`` with a message naming the broken
promise, or ``ConformanceSkip`` when it does not apply to the adapter's safety class.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Literal, Protocol, TypeVar

from effect_broker.adapters.base import (
    DispatchRequest,
    DispatchResult,
    EffectAdapter,
    ProbeRequest,
    ProbeResult,
)
from effect_broker.adapters.simulated_adapter import Fault, SimulatedTarget
from effect_broker.domain.clock import ManualClock
from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.errors import (
    AdapterError,
    OutcomeUnknownError,
    RetryableAdapterError,
    TerminalAdapterError,
)
from effect_broker.domain.keys import downstream_key as derive_downstream_key
from effect_broker.domain.keys import request_hash
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, ProbeStatus, SafetyClass

_E = TypeVar("_E", bound=AdapterError)
_TENANT_ID = "conformance-tenant"
# A fixed, obviously-synthetic tenant key: downstream keys look like production ones.
_TENANT_KEY = b"effect-broker-conformance-key-32"


class TargetHarness(Protocol):
    """The test's view of a target: its truth, and levers to make it fail."""

    def effect_count(self, key: str | None) -> int:
        """Effects that really happened under ``key`` (all effects for None)."""
        ...

    def request_count(self) -> int:
        """Create requests that reached the target (lookups excluded)."""
        ...

    def lose_next_response(self) -> None:
        """Commit the next create, then lose its response."""
        ...

    def reject_next(self) -> None:
        """Reject the next create before commit, documented as "not committed"."""
        ...

    def fail_after_commit_next(self) -> None:
        """Commit the next create, then answer with an error that documents nothing:
        how the target's framework reports an unexpected failure (an MCP tool that
        raised after acting - the SDK's server answers ``isError`` with no code - or
        an HTTP 500). Optional: a harness without it skips that check."""
        ...

    def probe_unavailable_next(self) -> None:
        """Make the next lookup fail to answer."""
        ...

    def reset(self) -> None:
        """Forget all effects, counters and queued faults."""
        ...

    def settlement_bound(self) -> timedelta | None:
        """How long the target's lookup really takes to see a commit."""
        ...

    def advance_past_settlement(self) -> None:
        """Let the settlement delay pass (sleep or move a clock)."""
        ...


class ConformanceSkip(Exception):
    """A check that does not apply to this adapter's safety class or capabilities."""


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The outcome of one conformance check."""

    name: str
    outcome: Literal["passed", "failed", "skipped"]
    detail: str = ""


def make_effect_record(
    contract: EffectContract,
    operation_key: str,
    arguments: Mapping[str, object],
    downstream_key: str,
    *,
    tenant_id: str = _TENANT_ID,
    version: int = 1,
) -> EffectRecord:
    """A synthetic DISPATCHING effect row, as the dispatcher would hand it over."""
    now = datetime.now(UTC)
    return EffectRecord(
        effect_id=str(uuid.uuid4()),
        tenant_id=tenant_id,
        operation_key=operation_key,
        tool=contract.tool,
        request_hash=request_hash(
            tool=contract.tool,
            arguments=arguments,
            contract_name=contract.name,
            contract_version=contract.version,
        ),
        downstream_key=downstream_key,
        contract_name=contract.name,
        contract_version=contract.version,
        safety=contract.safety,
        status=EffectStatus.DISPATCHING,
        version=version,
        attempt_count=1,
        arguments_preview={},
        next_action_at=None,
        lease_owner="conformance",
        lease_expires_at=None,
        first_dispatch_at=now,
        retention_deadline=now + contract.key_retention
        if contract.key_retention
        else None,
        settlement_deadline=(
            now + contract.settlement_bound if contract.settlement_bound else None
        ),
        outcome_in_doubt=False,
        receipt_id=None,
        trace_id=None,
        requested_by="conformance",
        created_at=now,
        updated_at=now,
    )


class SimulatedHarness:
    """``TargetHarness`` over a ``SimulatedTarget``; moves its ``ManualClock`` if any."""

    def __init__(self, target: SimulatedTarget) -> None:
        self.target = target

    def effect_count(self, key: str | None) -> int:
        """Rows in the target's table under ``key``."""
        return self.target.effect_count(key)

    def request_count(self) -> int:
        """Create requests that reached the target."""
        return self.target.requests

    def lose_next_response(self) -> None:
        """Queue LOSE_RESPONSE."""
        self.target.inject(Fault.LOSE_RESPONSE)

    def reject_next(self) -> None:
        """Queue REJECT."""
        self.target.inject(Fault.REJECT)

    def fail_after_commit_next(self) -> None:
        """Queue FAIL_AFTER_COMMIT."""
        self.target.inject(Fault.FAIL_AFTER_COMMIT)

    def probe_unavailable_next(self) -> None:
        """Queue PROBE_UNAVAILABLE."""
        self.target.inject(Fault.PROBE_UNAVAILABLE)

    def reset(self) -> None:
        """Reset the target."""
        self.target.reset()

    def settlement_bound(self) -> timedelta | None:
        """The target's settlement delay."""
        return self.target.settlement_delay

    def advance_past_settlement(self) -> None:
        """Advance the manual clock (or sleep) past the settlement delay."""
        step = self.target.settlement_delay + timedelta(milliseconds=1)
        if isinstance(self.target.clock, ManualClock):
            self.target.clock.advance(step)
        else:
            time.sleep(step.total_seconds())


CHECKS = (
    "check_stable_key_across_attempts",
    "check_target_rejects_payload_drift",
    "check_positive_probe",
    "check_negative_probe_only_after_settlement_bound",
    "check_unknown_probe_behaviour",
    "check_no_hidden_retries",
    "check_stale_fencing_token_is_refused",
    "check_tool_raises_after_its_side_effect",
)


class AdapterConformance:
    """Runs the protocol checks for one adapter against one target harness."""

    def __init__(
        self,
        adapter: EffectAdapter,
        harness: TargetHarness,
        *,
        arguments: Mapping[str, object] | None = None,
    ) -> None:
        self.adapter = adapter
        self.harness = harness
        self.contract = adapter.contract
        self.safety = adapter.contract.safety
        self.arguments: Mapping[str, object] = arguments or {
            "order": "42",
            "amount_minor": 1999,
            "currency": "EUR",
        }

    # --- helpers ---------------------------------------------------------------------

    def new_effect(self, arguments: Mapping[str, object] | None = None) -> EffectRecord:
        """A fresh effect with its own operation key and downstream key."""
        operation_key = f"conformance:{uuid.uuid4().hex}"
        key = derive_downstream_key(_TENANT_KEY, _TENANT_ID, operation_key)
        return make_effect_record(
            self.contract, operation_key, arguments or self.arguments, key
        )

    def drifted(
        self, effect: EffectRecord, arguments: Mapping[str, object]
    ) -> EffectRecord:
        """The same operation and downstream key with a different payload."""
        changed = make_effect_record(
            self.contract, effect.operation_key, arguments, effect.downstream_key
        )
        assert changed.request_hash != effect.request_hash
        return changed

    def dispatch(
        self, effect: EffectRecord, arguments: Mapping[str, object] | None = None
    ) -> DispatchResult:
        """One attempt, with a new attempt id."""
        return self.adapter.dispatch(
            DispatchRequest(
                effect=effect,
                arguments=arguments or self.arguments,
                attempt_id=str(uuid.uuid4()),
                contract=self.contract,
            )
        )

    def probe(self, effect: EffectRecord) -> ProbeResult:
        """Ask the adapter whether ``effect`` committed."""
        return self.adapter.probe(
            ProbeRequest(effect=effect, arguments=self.arguments, contract=self.contract)
        )

    @staticmethod
    def expect(error: type[_E], call: Callable[[], object], what: str) -> _E:
        """Run ``call``; return the ``error`` it raises, fail on anything else."""
        try:
            result = call()
        except error as exc:
            return exc
        except AdapterError as exc:
            raise AssertionError(
                f"{what}: expected {error.__name__}, got {type(exc).__name__} ({exc})"
            ) from exc
        raise AssertionError(f"{what}: expected {error.__name__}, got result {result!r}")

    def _count(self, key: str | None, expected: int, why: str) -> None:
        # The target holds the key as the contract writes it (key_template).
        written = self.contract.upstream_key(key) if key is not None else None
        actual = self.harness.effect_count(written)
        assert actual == expected, (
            f"{why}: target holds {actual} effect(s), not {expected}"
        )

    # --- checks ----------------------------------------------------------------------

    def check_stable_key_across_attempts(self) -> None:
        """Every attempt of one effect reaches the target under the same key."""
        if self.safety is SafetyClass.UNSAFE:
            raise ConformanceSkip("an unsafe target takes no key")
        effect = self.new_effect()
        self.harness.lose_next_response()
        self.expect(OutcomeUnknownError, lambda: self.dispatch(effect), "lost response")
        self._count(effect.downstream_key, 1, "the lost-response attempt committed")
        second = self.dispatch(effect)
        if self.safety is SafetyClass.IDEMPOTENT:
            # Scenario A: the redispatch with the same key returns the same charge.
            self._count(effect.downstream_key, 1, "idempotent redispatch must dedup")
            third = self.dispatch(effect)
            assert third.external_id == second.external_id is not None, (
                f"same key, different answers: {second.external_id!r} vs "
                f"{third.external_id!r}"
            )
        else:
            # No dedup, but both rows are findable by the one correlation key.
            self._count(effect.downstream_key, 2, "both attempts carry the same key")

    def check_target_rejects_payload_drift(self) -> None:
        """Same key + different payload is refused terminally and creates nothing."""
        if self.safety is not SafetyClass.IDEMPOTENT:
            raise ConformanceSkip("payload drift is an idempotent-target promise")
        effect = self.new_effect()
        self.dispatch(effect)
        changed_args = {**self.arguments, "amount_minor": 1}
        drifted = self.drifted(effect, changed_args)
        self.expect(
            TerminalAdapterError,
            lambda: self.dispatch(drifted, changed_args),
            "payload drift under one key",
        )
        self._count(effect.downstream_key, 1, "a drifted payload must not commit")

    def check_positive_probe(self) -> None:
        """After settlement, a committed effect probes COMMITTED with its external id."""
        if self.safety is SafetyClass.UNSAFE:
            raise ConformanceSkip("an unsafe target has no lookup")
        effect = self.new_effect()
        result = self.dispatch(effect)
        self.harness.advance_past_settlement()
        probe = self.probe(effect)
        if probe.status is ProbeStatus.UNKNOWN and self.safety is SafetyClass.IDEMPOTENT:
            raise ConformanceSkip("this idempotent adapter has no lookup")
        assert probe.status is ProbeStatus.COMMITTED, (
            f"a settled commit probed {probe.status.value}, not committed"
        )
        assert probe.external_id == result.external_id, (
            f"probe found {probe.external_id!r}, dispatch returned {result.external_id!r}"
        )

    def check_negative_probe_only_after_settlement_bound(self) -> None:
        """NOT_COMMITTED before the bound is shown inconclusive; after it, it is true."""
        if self.safety is not SafetyClass.RECONCILABLE:
            raise ConformanceSkip("settlement bounds are a reconcilable-target promise")
        real = self.harness.settlement_bound() or timedelta(0)
        declared = self.contract.settlement_bound or timedelta(0)
        # A contract that settles faster than the target would let the broker take an
        # early NOT_COMMITTED as conclusive and redispatch a committed charge.
        assert declared >= real, (
            f"contract settlement_bound {declared} is shorter than the target's real "
            f"settlement delay {real}"
        )
        effect = self.new_effect()
        self.harness.lose_next_response()
        self.expect(OutcomeUnknownError, lambda: self.dispatch(effect), "lost response")
        self._count(effect.downstream_key, 1, "the lost-response attempt committed")
        early = self.probe(effect)
        # Right after the commit the lookup may not see it yet: NOT_COMMITTED "at
        # most", which the row counted above proves is not conclusive.
        assert early.status in {ProbeStatus.NOT_COMMITTED, ProbeStatus.COMMITTED}, (
            f"an early probe of a reachable target said {early.status.value}"
        )
        self.harness.advance_past_settlement()
        settled = self.probe(effect)
        assert settled.status is ProbeStatus.COMMITTED, (
            f"after the settlement bound the committed effect probed "
            f"{settled.status.value}: the lookup contract is not truthful"
        )
        assert settled.external_id, "a COMMITTED probe must name the external id"
        absent = self.new_effect()
        self.harness.advance_past_settlement()
        negative = self.probe(absent)
        self._count(absent.downstream_key, 0, "the never-sent effect")
        assert negative.status is ProbeStatus.NOT_COMMITTED, (
            f"a settled absence probed {negative.status.value}, not not_committed"
        )

    def check_unknown_probe_behaviour(self) -> None:
        """A lookup that cannot answer is UNKNOWN, never NOT_COMMITTED."""
        effect = self.new_effect()
        self.dispatch(effect)
        self.harness.advance_past_settlement()
        if self.safety is SafetyClass.UNSAFE:
            status = self.probe(effect).status
            assert status is ProbeStatus.UNKNOWN, f"an unsafe probe said {status.value}"
            return
        for subject, what in ((self.new_effect(), "absent"), (effect, "committed")):
            self.harness.probe_unavailable_next()
            status = self.probe(subject).status
            assert status is ProbeStatus.UNKNOWN, (
                f"an unavailable lookup of a {what} effect said {status.value}: only "
                "UNKNOWN is honest when the target cannot answer"
            )

    def check_no_hidden_retries(self) -> None:
        """One dispatch is exactly one request, on success, loss and rejection."""
        cases: list[tuple[str, Callable[[], None], type[AdapterError] | None]] = [
            ("a success", lambda: None, None),
            ("a lost response", self.harness.lose_next_response, OutcomeUnknownError),
            ("a rejection", self.harness.reject_next, RetryableAdapterError),
        ]
        for what, arrange, error in cases:
            effect = self.new_effect()
            before = self.harness.request_count()
            effects_before = self.harness.effect_count(None)
            arrange()
            if error is None:
                self.dispatch(effect)
            else:
                self.expect(error, partial(self.dispatch, effect), what)
            sent = self.harness.request_count() - before
            assert sent == 1, f"{what}: one dispatch reached the target {sent} times"
            made = self.harness.effect_count(None) - effects_before
            expected = 0 if error is RetryableAdapterError else 1
            assert made == expected, f"{what}: {made} effect(s) committed, not {expected}"

    def check_stale_fencing_token_is_refused(self) -> None:
        """A newer claim commits; a later, older claim is refused and commits nothing."""
        if not self.adapter.sends_fencing_token:
            raise ConformanceSkip("the contract declares no fencing token")
        older = self.new_effect()
        newer = replace(older, version=older.version + 1)
        self.dispatch(newer)
        self._count(older.downstream_key, 1, "the newer claim committed")
        before = self.harness.request_count()
        # A worker paused since the older claim sends only now (issue 9, the zombie).
        refused = self.expect(
            TerminalAdapterError,
            lambda: self.dispatch(older),
            "an older claim after a newer one",
        )
        assert refused.details.get("reason") == "stale_fencing_token", (
            f"an older claim was refused for {refused.details.get('reason')!r}, not "
            "as a stale fencing token"
        )
        sent = self.harness.request_count() - before
        assert sent == 1, f"the stale claim reached the target {sent} times, not once"
        self._count(older.downstream_key, 1, "a stale claim must commit nothing")

    def check_tool_raises_after_its_side_effect(self) -> None:
        """A target that acted and then failed with an error that documents nothing
        is unknown: never a refusal (``failed_final`` over a charge, and a caller who
        redoes it under a new key charges twice) and never a retry (issue 19, item 1).

        The MCP SDK's own server answers every exception a tool raises with
        ``isError`` and no code, a tool that charged and then raised included; an
        HTTP 500 is the same answer."""
        lever = getattr(self.harness, "fail_after_commit_next", None)
        if lever is None:
            raise ConformanceSkip("the harness cannot make the target fail after acting")
        effect = self.new_effect()
        effects_before = self.harness.effect_count(None)
        lever()
        what = "tool raises after its side effect"
        try:
            result = self.dispatch(effect)
        except OutcomeUnknownError:
            pass
        except AdapterError as exc:
            raise AssertionError(
                f"{what}: classified {type(exc).__name__} ({exc}); the target acted, "
                "so only OutcomeUnknownError is honest"
            ) from exc
        else:
            raise AssertionError(f"{what}: the dispatch returned a result {result!r}")
        made = self.harness.effect_count(None) - effects_before
        assert made == 1, f"{what}: {made} effect(s) committed, not 1"

    def run_all(self) -> list[CheckResult]:
        """Run every check on a reset target; collect passed/failed/skipped results."""
        results = []
        for name in CHECKS:
            self.harness.reset()
            try:
                getattr(self, name)()
            except ConformanceSkip as skip:
                results.append(CheckResult(name, "skipped", str(skip)))
            except AssertionError as failure:
                results.append(CheckResult(name, "failed", str(failure)))
            else:
                results.append(CheckResult(name, "passed"))
        return results


__all__ = [
    "CHECKS",
    "AdapterConformance",
    "CheckResult",
    "ConformanceSkip",
    "SimulatedHarness",
    "TargetHarness",
    "make_effect_record",
]
