"""The demo agent with a live model (issue 10, item 7): opt-in, billed API calls.

Each test runs only with its provider's key set (``OPENAI_API_KEY`` for OpenAI,
``XAI_API_KEY`` for Grok through xAI's OpenAI-compatible endpoint; ``OPENAI_MODEL`` /
``XAI_MODEL`` pick the model) and skips with that reason otherwise. The model decides
only which tool to call with which arguments: the loop's fixed code derives the key and
delivers every charge call three times, and the target's own table must hold exactly
one charge per charge call the model made.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from examples.agent.providers import GrokProvider, OpenAIProvider
from tests.integration.agent_support import open_agent_world, run_agent

PROMPT = (
    "Charge order 42: 1999 minor units of EUR, with the charge_order tool. Then tell "
    "me the target's charge id."
)


def live(variable: str, what: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        not os.environ.get(variable),
        reason=f"live {what} test: set {variable} to run it (a real, billed API call)",
    )


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "provider_class",
    [
        pytest.param(OpenAIProvider, marks=live("OPENAI_API_KEY", "OpenAI"), id="openai"),
        pytest.param(GrokProvider, marks=live("XAI_API_KEY", "Grok (xAI)"), id="grok"),
    ],
)
def test_a_live_model_charges_once_per_tool_call_though_each_is_delivered_3_times(
    provider_class: type[OpenAIProvider], tmp_path: Path
) -> None:
    with open_agent_world(tmp_path) as world:
        run = run_agent(
            world, provider_class(), f"live-{uuid.uuid4().hex[:8]}", prompt=PROMPT
        )
        charge_calls = {d.call_id for d in run.deliveries if d.tool == "charge_order"}
        # The model charged at least once (else the test proved nothing)
        assert charge_calls, f"the model made no charge_order call: {run.final!r}"
        for call_id in charge_calls:
            copies = [d for d in run.deliveries if d.call_id == call_id]
            assert len(copies) == 3
            assert len({d.effect_id for d in copies}) == 1
            assert {d.status for d in copies} == {"succeeded"}
        # One charge in the target's own table per charge call, not per delivery
        assert world.target.count_charges() == len(charge_calls)
        assert world.intents() == len(charge_calls)
        assert run.final
