"""The runtime recipes (examples/runtimes/) run as their pages print them, against a
live broker: one charge per order however often they run, and a workflow that meets
an unknown outcome waits - durably, through a crash for DBOS - until an operator
resolves the effect from the CLI, then completes with that one charge.

The crash-after-the-target-committed proof per runtime is the crash matrix's
(``effect-broker demo crash-matrix --only runtime``; tests/crash/test_runtime_cells.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from examples.crash_matrix.contracts import TOOLS
from examples.crash_matrix.runtime_support import Program, start_temporal
from tests.acceptance.runtime_stack import Stack, live_stack

pytestmark = pytest.mark.slow

UNSAFE = TOOLS["unsafe"]
#: The evidence an operator records after finding the charge in the target's table.
EVIDENCE = '{"source": "target charges table", "reference": "row for the order"}'


@pytest.fixture(scope="module")
def stack(django_db_setup: None, django_db_blocker: Any) -> Iterator[Stack]:
    with django_db_blocker.unblock(), live_stack() as running:
        yield running


def finished(program: Program, timeout: float = 60) -> str:
    """The program's output once it exited 0."""
    code = program.wait(timeout)
    output = program.output()
    assert code == 0, output[-3000:]
    return output


def charged(output: str) -> dict[str, Any]:
    """The result a recipe printed on its ``charged:`` line."""
    line = next(x for x in output.splitlines() if x.startswith("charged: "))
    return json.loads(line.removeprefix("charged: "))


def awaiting_operator(program: Program, timeout: float = 60) -> str:
    """The effect id a recipe printed when it started waiting for an operator."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(
            r"outcome unknown: effect (\S+) awaits an operator", program.output()
        )
        if found:
            return found.group(1)
        assert program.process.poll() is None, program.output()[-3000:]
        time.sleep(0.1)
    raise AssertionError(f"no unknown outcome reported:\n{program.output()[-3000:]}")


def resolve_as_charged(stack: Stack, effect_id: str) -> None:
    """The operator saw the charge in the target and records it (the CLI)."""
    result = stack.cli(
        "effects", "resolve", effect_id, "--succeeded",
        "--reason", "the charge is in the target's table",
        "--evidence", EVIDENCE, "--as", "olga",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_dbos_recipe_charges_once_and_a_rerun_replays(stack: Stack) -> None:
    first = finished(
        stack.start("dbos-1", "examples.runtimes.dbos_checkout", "--order", "d1")
    )
    again = finished(
        stack.start("dbos-2", "examples.runtimes.dbos_checkout", "--order", "d1")
    )
    assert charged(first) == charged(again)
    assert charged(first)["status"] == "succeeded"
    assert stack.charges("d1") == 1


def test_dbos_waits_durably_through_a_crash_for_the_operator(stack: Stack) -> None:
    # Given an unsafe charge whose answer is lost after the target committed it
    stack.target.inject("drop_connection_after_commit")
    args = ("--order", "d2", "--tool", UNSAFE, "--poll", "0.5")
    waiting = stack.start("dbos-wait-1", "examples.runtimes.dbos_checkout", *args)
    effect_id = awaiting_operator(waiting)
    # When the process dies while the workflow waits, and DBOS recovers it
    waiting.kill()
    recovered = stack.start("dbos-wait-2", "examples.runtimes.dbos_checkout", *args)
    time.sleep(1.5)  # it is waiting again, not finished and not failed
    assert recovered.process.poll() is None, recovered.output()[-3000:]
    # and the operator resolves the effect from the CLI
    resolve_as_charged(stack, effect_id)
    # Then the workflow completes with the operator's evidence, and one charge
    assert charged(finished(recovered)) == json.loads(EVIDENCE)
    assert stack.charges("d2") == 1


def test_langgraph_recipe_charges_once_and_a_rerun_replays(stack: Stack) -> None:
    recipe = "examples.runtimes.langgraph_checkout"
    first = finished(stack.start("lg-1", recipe, "--order", "l1"))
    again = finished(stack.start("lg-2", recipe, "--order", "l1"))
    assert charged(first) == charged(again)
    assert stack.charges("l1") == 1


def test_langgraph_interrupts_on_unknown_and_resumes_after_the_operator(
    stack: Stack,
) -> None:
    recipe = "examples.runtimes.langgraph_checkout"
    stack.target.inject("drop_connection_after_commit")
    args = ("--order", "l2", "--tool", UNSAFE)
    # The graph stops at its interrupt; the checkpoint keeps the pause
    paused = stack.start("lg-wait-1", recipe, *args)
    effect_id = awaiting_operator(paused)
    assert paused.wait(30) == 3
    resolve_as_charged(stack, effect_id)
    resumed = finished(stack.start("lg-wait-2", recipe, *args))
    assert charged(resumed) == json.loads(EVIDENCE)
    assert stack.charges("l2") == 1


def test_celery_recipe_charges_once_and_retries_under_one_key_for_the_operator(
    stack: Stack,
) -> None:
    worker = stack.start(
        "celery-worker", "celery", "-A", "examples.runtimes.celery_checkout",
        "worker", "--pool", "prefork", "-c", "1",
    )  # fmt: skip
    recipe = "examples.runtimes.celery_checkout"
    try:
        first = finished(stack.start("celery-1", recipe, "--order", "c1"))
        assert charged(first)["status"] == "succeeded"
        assert stack.charges("c1") == 1
        # An unknown outcome: the task retries itself under the same task id
        stack.target.inject("drop_connection_after_commit")
        waiting = stack.start(
            "celery-2", recipe, "--order", "c2", "--tool", UNSAFE, "--poll", "0.5"
        )
        effect_id = awaiting_operator(worker)
        retried = f"effect {effect_id} awaits"
        while worker.output().count(retried) < 2:  # a retry, under the same key
            assert waiting.process.poll() is None, waiting.output()[-3000:]
            time.sleep(0.1)
        resolve_as_charged(stack, effect_id)
        assert charged(finished(waiting)) == json.loads(EVIDENCE)
        assert stack.charges("c2") == 1
    finally:
        worker.kill()


def test_temporal_recipe_charges_once_on_a_development_server(stack: Stack) -> None:
    server, address = start_temporal(stack.workdir)
    recipe = "examples.runtimes.temporal_checkout"
    try:
        run = stack.start("tp-1", recipe, "--order", "t1", TEMPORAL_ADDRESS=address)
        assert charged(finished(run))["status"] == "succeeded"
    finally:
        server.kill()
    assert stack.charges("t1") == 1


def test_temporal_recipe_activity_replays_on_a_retry_in_a_new_run(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The recipe's activity itself, without a server: an attempt of run A, then a
    # retry (attempt 3) after the workflow was retried as run B.
    from temporalio.testing import ActivityEnvironment

    from examples.runtimes.temporal_checkout import Charge, charge

    for name, value in stack.recipe_env().items():
        monkeypatch.setenv(name, value)
    env = ActivityEnvironment()
    base = dataclasses.replace(env.info, workflow_id="checkout-t2", activity_id="1")
    request = Charge(
        tool=TOOLS["idempotent"],
        arguments={"order": "t2", "amount_minor": 1999, "currency": "EUR"},
    )
    results = []
    for attempt, run in [(1, "run-a"), (3, "run-b")]:
        env.info = dataclasses.replace(base, attempt=attempt, workflow_run_id=run)
        results.append(asyncio.run(env.run(charge, request)))
    assert results[0] == results[1]
    assert stack.charges("t2") == 1
