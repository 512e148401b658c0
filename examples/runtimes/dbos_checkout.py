"""Charge an order from a DBOS workflow, through the broker (docs/how-to/runtime-dbos.md).

With ``effect-broker dev`` running in another terminal and the API key it printed::

    export EFFECT_BROKER_API_KEY=...
    export RUNTIME_DATABASE_URL=$(effect-broker db url --dbname dbos_checkout)
    python -m examples.runtimes.dbos_checkout --order 42

After a crash, run the same command again: DBOS recovers the workflow, re-runs the
charge step that had not been recorded, and the step replays the broker's effect under
the same key instead of charging a second time. When nobody knows whether the charge
happened (``OutcomeUnknown``), the workflow waits in a durable ``DBOS.sleep`` loop
until an operator has settled the effect (``effect-broker effects resolve``), then
carries on: a restart while it waits resumes the wait, not the charge.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from dbos import DBOS, SetWorkflowID

from effect_broker.client import OutcomeUnknown
from effect_broker.keys import dbos_key
from examples.runtimes.recipe_settings import (
    broker,
    charge_arguments,
    parse_order,
    runtime_database_url,
)


def _perform(key: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The effect under ``key``: its result, or that it awaits an operator."""
    with broker() as client:
        try:
            result = client.perform(key, tool=tool, arguments=arguments)
        except OutcomeUnknown as unknown:
            # A step's output is recorded: the workflow keeps "unknown" and waits,
            # instead of failing for good. EffectFailed still fails the step.
            return {"key": key, "status": "unknown", "effect_id": unknown.effect_id}
    return {"key": key, "status": "succeeded", "result": result}


@DBOS.step()
def charge(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Charge through the broker under this step's key."""
    # Workflow id + step id: the same when DBOS retries or recovers this step, so a
    # re-run replays the effect the first run created. Never an attempt counter.
    workflow_id, step_id = DBOS.workflow_id, DBOS.step_id
    assert workflow_id is not None  # both are set inside every step
    assert step_id is not None
    return _perform(dbos_key(workflow_id, step_id), tool, arguments)


@DBOS.step()
def look_again(key: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Submit the same key again: a replay of the effect, never a second charge."""
    return _perform(key, tool, arguments)


@DBOS.workflow()
def checkout(tool: str, arguments: dict[str, Any], poll: float) -> dict[str, Any]:
    """Charge once; wait durably while only an operator can settle the charge."""
    outcome = charge(tool, arguments)
    while outcome["status"] == "unknown":
        print(
            f"outcome unknown: effect {outcome['effect_id']} awaits an operator; "
            f"looking again every {poll:g}s",
            flush=True,
        )
        DBOS.sleep(poll)  # durable: after a restart it sleeps only what is left
        outcome = look_again(outcome["key"], tool, arguments)
    return dict(outcome["result"])


def main(argv: list[str] | None = None) -> int:
    """Run (or, after a crash, recover) the order's checkout workflow."""
    options = parse_order(__doc__ or "", argv)
    DBOS(
        config={
            "name": "checkout",
            "system_database_url": runtime_database_url(),
            "log_level": "WARNING",
        }
    )
    DBOS.launch()  # recovers this executor's unfinished workflows
    try:
        # One workflow per order: its id is what makes a rerun the same checkout.
        with SetWorkflowID(f"checkout-{options.order}"):
            handle = DBOS.start_workflow(
                checkout, options.tool, charge_arguments(options), options.poll
            )
        print("charged:", json.dumps(handle.get_result(), sort_keys=True), flush=True)
    finally:
        DBOS.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
