"""The operator controls in /metrics and doctor (issue 24, items 7 and 8): active
pauses, paused tools, the effects a pause holds, the effects waiting on a limit, and
doctor's pauses check."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from effect_broker.domain.states import SafetyClass
from effect_broker.observability.control_collectors import ControlsCollector
from effect_broker.services import diagnosis, pauses
from effect_broker.services.dispatch import dispatch
from tests.integration.engine.harness import TOOLS, Bench
from tests.integration.test_dispatch_limits import charge, limited_contracts

IDEMPOTENT = SafetyClass.IDEMPOTENT


def scrape(bench: Bench) -> dict[str, dict[tuple[str, ...], float]]:
    families = ControlsCollector(bench.registry).collect()
    return {
        family.name: {tuple(s.labels.values()): s.value for s in family.samples}
        for family in families
    }


def test_without_pauses_the_gauges_are_zero_and_doctor_says_so(bench: Bench) -> None:
    gauges = scrape(bench)
    assert gauges["effect_broker_controls_scrape_success"] == {(): 1}
    assert gauges["effect_broker_dispatch_pauses"] == {
        ("contract",): 0,
        ("tenant",): 0,
        ("tool",): 0,
    }
    assert gauges["effect_broker_dispatch_pause_oldest_age_seconds"] == {(): 0}
    assert set(gauges["effect_broker_tool_paused"].values()) == {0}
    assert set(gauges["effect_broker_effects_paused"].values()) == {0}
    check = diagnosis.check_pauses()
    assert (check.status, check.summary) == ("ok", "no dispatch pause")


def test_a_pause_shows_in_the_gauges_and_in_doctor(bench: Bench, operator: Any) -> None:
    # Given two held effects under a tool pause, and a tenant pause
    held = [bench.submit(IDEMPOTENT) for _ in range(2)]
    pauses.pause(tool=TOOLS[IDEMPOTENT], reason="stripe incident", operator=operator)
    pauses.pause(tenant=bench.tenant.name, reason="fraud review", operator=operator)
    # When /metrics is scraped
    gauges = scrape(bench)
    # Then the pauses are counted by scope, the tool is paused for everyone, and
    # the held effects are counted on their contract
    assert gauges["effect_broker_dispatch_pauses"][("tool",)] == 1
    assert gauges["effect_broker_dispatch_pauses"][("tenant",)] == 1
    assert gauges["effect_broker_tool_paused"][(TOOLS[IDEMPOTENT],)] == 1
    assert gauges["effect_broker_tool_paused"][(TOOLS[SafetyClass.UNSAFE],)] == 0
    labels = (TOOLS[IDEMPOTENT], "t.idempotent", "1", "idempotent")
    assert gauges["effect_broker_effects_paused"][labels] == 2
    # ... and doctor warns, naming each pause, its operator, reason and held count
    check = diagnosis.check_pauses()
    assert check.status == "warn"
    assert check.summary.startswith("2 active pause(s) hold 2 effect(s): ")
    by_scope = {row["scope"]: row for row in check.details}
    tool_pause = by_scope[f"tool {TOOLS[IDEMPOTENT]}"]
    assert (tool_pause["paused_by"], tool_pause["reason"]) == ("ann", "stripe incident")
    assert tool_pause["held_effects"] == 2
    assert by_scope[f"tenant {bench.tenant.name}"]["held_effects"] == 2
    # When the tool pause is lifted, the tenant's pause still holds them
    pauses.resume(tool=TOOLS[IDEMPOTENT], operator=operator)
    assert dispatch(held[0].effect_id, worker="w1").status.value == "prepared"
    assert scrape(bench)["effect_broker_tool_paused"][(TOOLS[IDEMPOTENT],)] == 0


@pytest.fixture
def limited(bench: Bench) -> Iterator[Bench]:
    with limited_contracts(bench) as limited:
        yield limited


def test_effects_over_a_limit_show_as_waiting_on_it(limited: Bench) -> None:
    records = [charge(limited, "two_per_second", n) for n in range(3)]
    for record in records:
        dispatch(record.effect_id, worker="w1")
    gauges = scrape(limited)
    waiting = gauges["effect_broker_effects_waiting_on_limit"]
    assert waiting[("two_per_second", "t.two-per-second", "1", "idempotent")] == 2
    # A contract without limits is not listed; one with limits and none waiting is 0
    assert ("idempotent_charge", "t.idempotent", "1", "idempotent") not in waiting
    assert waiting[("one_at_a_time", "t.one-at-a-time", "1", "idempotent")] == 0
