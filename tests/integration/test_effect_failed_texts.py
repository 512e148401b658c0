"""Issue 19, item 1 (last part): ``failed_final`` is not always proof. The SDK's
``EffectFailed`` and the MCP proxy's answer said "the broker holds proof that it did
not take effect" even after an operator's ``resolve failed`` without evidence on an
effect whose request may have reached the target. They now say what is known, read
from the effect's ``outcome_in_doubt`` (on the wire since this issue).
"""

from __future__ import annotations

import json

import pytest

from effect_broker.adapters.simulated_adapter import Fault
from effect_broker.api.schemas import effect_out
from effect_broker.client import EffectFailed
from effect_broker.client.in_process import InProcessClient
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.mcp.server import _outcome
from effect_broker.services import resolution
from effect_broker.services.dispatch import dispatch
from tests.integration.conftest import make_operator
from tests.integration.engine.harness import TOOLS, Bench

PROOF = "holds proof that it did not take effect"


def replay(bench: Bench, record, safety: SafetyClass) -> EffectFailed:  # type: ignore[no-untyped-def]
    """The caller redoes the step with the same key and arguments (a replay)."""
    client = InProcessClient(bench.tenant)
    arguments = {"amount_minor": 100, "ref": record.operation_key}
    with pytest.raises(EffectFailed) as caught:
        client.perform(
            record.operation_key, tool=TOOLS[safety], arguments=arguments, timeout=1
        )
    return caught.value


def mcp_text(bench: Bench, record) -> str:  # type: ignore[no-untyped-def]
    answer = _outcome(bench.tenant, record)
    assert answer.is_error is True
    return " ".join(block.text for block in answer.content)  # type: ignore[union-attr]


def test_a_refusal_the_target_proved_is_reported_as_proof(bench: Bench) -> None:
    # Given an effect the target refused on its only attempt (nothing in doubt)
    record = bench.submit(SafetyClass.UNSAFE)
    bench.targets[SafetyClass.UNSAFE].inject(Fault.TERMINAL)
    failed = dispatch(record.effect_id, worker="w1")
    assert (failed.status, failed.outcome_in_doubt) == (EffectStatus.FAILED_FINAL, False)
    # Then the SDK says the broker holds proof, and the wire says nothing is in doubt
    error = replay(bench, record, SafetyClass.UNSAFE)
    assert PROOF in str(error)
    assert error.effect.outcome_in_doubt is False
    assert effect_out(failed)["outcome_in_doubt"] is False
    assert "it will not be sent again" in mcp_text(bench, failed)
    assert bench.target_rows(record) == 0


def test_an_operator_giving_up_without_evidence_is_not_called_proof(bench: Bench) -> None:
    # Given an unsafe effect whose answer was lost after the target charged
    record = bench.unknown_outcome(SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    assert bench.target_rows(record) == 1
    # When an operator marks it failed without evidence
    failed = resolution.resolve_failed(
        bench.tenant,
        record.effect_id,
        operator=make_operator("erin"),
        reason="customer gave up",
    )
    assert (failed.status, failed.outcome_in_doubt) == (EffectStatus.FAILED_FINAL, True)
    # Then the SDK says what is known: an operator decided, nothing proved it absent
    error = replay(bench, record, SafetyClass.UNSAFE)
    text = str(error)
    assert PROOF not in text
    assert "by an operator's decision" in text
    assert "nothing proved that it did not take effect" in text
    assert "before doing this again under another operation key" in text
    assert error.effect.outcome_in_doubt is True
    # and so do the HTTP wire and the MCP proxy's answer
    assert json.loads(json.dumps(effect_out(failed), default=str))["outcome_in_doubt"]
    answer = mcp_text(bench, failed)
    assert "by an operator's decision" in answer
    assert "nothing proved that it did not happen" in answer
    assert "Do NOT redo it under another operation key" in answer
    # and the replays sent nothing: still the one charge
    assert bench.target_rows(record) == 1
