"""The runtime alone: each recipe's workflow shape, its step calling the payment
target directly instead of through the broker - the baseline of the runtime cells.

The step posts the charge the way a client library does when nobody gives it a key
of the runtime's identity: a fresh ``Idempotency-Key`` per request (as the naive
baseline does). Right after the target's answer arrives, the first run SIGKILLs its
own process (a marker file makes it the first run only): the target has committed,
the runtime has not recorded the step. Run the same command again and the runtime
recovers: DBOS re-runs the unrecorded step, LangGraph the node after its last
checkpoint, Temporal retries the timed-out activity, and Celery's worker (see
``runtime_celery_app``) redelivers the task. Each re-run charges again.

Run: ``python -m examples.crash_matrix.runtime_alone {dbos,langgraph,temporal,celery}
--target URL --body JSON --marker FILE --id ID``; prints ``charged: {...}`` at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import uuid
from typing import Any

import httpx


def crash_once(marker: str) -> None:
    """SIGKILL this process the first time it gets here (the marker remembers)."""
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def charge_directly(target: str, body: dict[str, Any], marker: str) -> dict[str, Any]:
    """POST the charge to the target; die once right after its answer."""
    with httpx.Client(trust_env=False, timeout=10.0) as client:
        response = client.post(
            f"{target}/idempotent/charges",
            json=body,
            headers={"Idempotency-Key": str(uuid.uuid4())},  # new per request
        )
    response.raise_for_status()
    crash_once(marker)
    result: dict[str, Any] = response.json()
    return result


def run_dbos(options: argparse.Namespace) -> dict[str, Any]:
    """A DBOS workflow whose one step charges directly."""
    from dbos import DBOS, SetWorkflowID

    from examples.runtimes.recipe_settings import runtime_database_url

    @DBOS.step()
    def charge() -> dict[str, Any]:
        return charge_directly(options.target, options.body, options.marker)

    @DBOS.workflow()
    def checkout_alone() -> dict[str, Any]:
        return charge()

    DBOS(
        config={
            "name": "checkout-alone",
            "system_database_url": runtime_database_url(),
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    try:
        with SetWorkflowID(options.id):
            handle = DBOS.start_workflow(checkout_alone)
        return dict(handle.get_result())
    finally:
        DBOS.destroy()


def run_langgraph(options: argparse.Namespace) -> dict[str, Any]:
    """A LangGraph graph whose charge node charges directly (Postgres checkpoints)."""
    from typing import TypedDict

    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, StateGraph

    from examples.runtimes.recipe_settings import runtime_database_url

    class State(TypedDict, total=False):
        body: dict[str, Any]
        result: dict[str, Any]

    def charge(state: State) -> dict[str, Any]:
        return {"result": charge_directly(options.target, state["body"], options.marker)}

    graph = StateGraph(State)
    graph.add_node("charge", charge)
    graph.add_edge(START, "charge")
    graph.add_edge("charge", END)
    config: RunnableConfig = {"configurable": {"thread_id": options.id}}
    with PostgresSaver.from_conn_string(runtime_database_url()) as saver:
        saver.setup()
        app = graph.compile(checkpointer=saver)
        state = app.get_state(config)
        out = (
            app.invoke(None, config)
            if state.next
            else app.invoke({"body": options.body}, config)
        )
    return dict(out["result"])


def run_temporal(options: argparse.Namespace) -> dict[str, Any]:
    """The recipe's Temporal workflow with a ``charge`` activity that charges
    directly; the server retries it on the next worker after the kill."""
    from temporalio import activity
    from temporalio.client import Client
    from temporalio.exceptions import WorkflowAlreadyStartedError
    from temporalio.worker import Worker

    from examples.runtimes.temporal_checkout import (
        TASK_QUEUE,
        Charge,
        Checkout,
        sticky_timeout,
    )

    # Typed Any: the annotation of a function defined in here cannot be resolved by
    # name, so the activity takes the workflow's Charge as its JSON object.
    @activity.defn(name="charge")
    def charge(request: Any) -> dict[str, Any]:
        return charge_directly(options.target, request["arguments"], options.marker)

    async def main() -> dict[str, Any]:
        client = await Client.connect(os.environ["TEMPORAL_ADDRESS"])
        request = Charge(
            tool="-",
            arguments=options.body,
            poll=0.5,
            activity_timeout=float(os.environ.get("CHECKOUT_ACTIVITY_TIMEOUT", "30")),
        )
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=2) as threads:
            async with Worker(
                client,
                task_queue=TASK_QUEUE,
                workflows=[Checkout],
                activities=[charge],
                activity_executor=threads,
                sticky_queue_schedule_to_start_timeout=sticky_timeout(),
            ):
                try:
                    handle = await client.start_workflow(
                        Checkout.run, request, id=options.id, task_queue=TASK_QUEUE
                    )
                except WorkflowAlreadyStartedError:
                    handle = client.get_workflow_handle(options.id)
                result: dict[str, Any] = await handle.result()
                return result

    return asyncio.run(main())


def run_celery(options: argparse.Namespace) -> dict[str, Any]:
    """Send the direct task to the worker and wait for its result."""
    from examples.crash_matrix.runtime_celery_app import charge_alone

    result = charge_alone.apply_async(
        (options.target, options.body, options.marker), task_id=options.id
    )
    return dict(result.get(interval=0.2))


RUNNERS = {
    "dbos": run_dbos,
    "langgraph": run_langgraph,
    "temporal": run_temporal,
    "celery": run_celery,
}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("runtime", choices=sorted(RUNNERS))
    parser.add_argument("--target", required=True)
    parser.add_argument("--body", required=True, type=json.loads)
    parser.add_argument("--marker", required=True)
    parser.add_argument("--id", required=True, help="workflow, thread or task id")
    options = parser.parse_args(argv)
    result = RUNNERS[options.runtime](options)
    print("charged:", json.dumps(result, sort_keys=True), flush=True)
    if options.runtime == "temporal":
        from examples.runtimes.temporal_checkout import exit_now

        exit_now(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
