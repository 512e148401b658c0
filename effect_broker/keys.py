"""Operation keys from each runtime's retry-stable identity. Pure functions: no
runtime, no Django and no broker needs to be installed to use them.

An operation key must name one business operation and stay the same on every
redelivery of it (spec "Operation identity"). Each runtime has an identity that
survives its own retries, and one that does not:

=========  ==========================================  ===================================
runtime    stable across retries (the key)             changes on a retry (never in it)
=========  ==========================================  ===================================
Temporal   workflow id + activity id                   attempt; the run id (a workflow
                                                       retry or continue-as-new is a new
                                                       run)
Celery     the task id (``self.request.id``)           ``request.retries``; the id of a
                                                       new ``apply_async``
DBOS       workflow id + step id                       the step's retry attempt
LangGraph  thread id + the business operation, from    the step, task id and checkpoint
           the graph's state                           namespace (an ``update_state``
                                                       before a resume moves them)
agent      run id + the model's tool-call id           the loop's iteration counter
plain      the business key ``order:42:charge:v1``     -
=========  ==========================================  ===================================

Each helper's docstring says why its identity holds, and where it stops holding.

How parts become a key: ``<runtime>:<part>:<part>...``, every part checked (a string,
not empty, no leading or trailing whitespace, printable) and escaped (``%`` -> ``%25``,
``:`` -> ``%3A``), so two different identities can never produce one key (workflow
``a:b`` with activity ``c`` is not workflow ``a`` with activity ``b:c``). A key longer
than the broker accepts (200 characters) is replaced by ``<runtime>:%sha256:<hex>`` of
itself: still stable, still one per identity (``%sha256`` cannot come out of an
escaped part).

``action`` names which effect of a step this is, when one activity, task or node
performs more than one (``action="charge"`` and ``action="email"``): two effects under
one key would be a payload conflict.
"""

from __future__ import annotations

import hashlib

from effect_broker.domain.keys import MAX_OPERATION_KEY_LENGTH

#: Keys longer than this become a digest. Frozen at the broker's first key limit:
#: the helpers must build the same key for the same inputs in every release, or a
#: retry across an upgrade would be a second operation. Raising the broker's limit
#: (issue 21: 255, the Idempotency-Key draft's) must not move it.
SHORTEN_ABOVE = 200
assert SHORTEN_ABOVE <= MAX_OPERATION_KEY_LENGTH

__all__ = [
    "RUNTIME_PREFIXES",
    "KeyPartError",
    "agent_key",
    "business_key",
    "celery_key",
    "dbos_key",
    "langgraph_key",
    "temporal_key",
]

#: The first part of every runtime helper's key; a business key may not start so.
RUNTIME_PREFIXES = frozenset({"temporal", "celery", "dbos", "langgraph", "agent"})


class KeyPartError(ValueError):
    """A part of an operation key is unusable (empty, padded, unprintable, wrong type)."""


def _text(name: str, value: object, *, allow_int: bool = False) -> str:
    """Check one part and return it escaped."""
    if isinstance(value, bool):
        raise KeyPartError(f"{name} must be a string, not a bool")
    if isinstance(value, int) and allow_int:
        if value < 0:
            raise KeyPartError(f"{name} must not be negative, got {value}")
        return str(value)
    if not isinstance(value, str):
        kind = "a string or a non-negative int" if allow_int else "a string"
        raise KeyPartError(f"{name} must be {kind}, not {type(value).__name__}")
    if not value:
        raise KeyPartError(f"{name} is empty: an empty part identifies nothing")
    if value != value.strip():
        # "wf-1" and "wf-1 " would be two keys for one operation.
        raise KeyPartError(f"{name} {value!r} starts or ends with whitespace")
    if not value.isprintable():
        raise KeyPartError(f"{name} {value!r} contains unprintable characters")
    return value.replace("%", "%25").replace(":", "%3A")


def _key(prefix: str, parts: list[str], action: str | None) -> str:
    if action is not None:
        parts = [*parts, _text("action", action)]
    key = ":".join([prefix, *parts])
    if len(key) > SHORTEN_ABOVE:
        return _digest_key(prefix, key)
    return key


def _digest_key(prefix: str, key: str) -> str:
    # "%sha256" cannot occur in an escaped part ("%" always becomes "%25"), so a digest
    # key never equals a key built from parts.
    return f"{prefix}:%sha256:{hashlib.sha256(key.encode('utf-8')).hexdigest()}"


def temporal_key(workflow_id: str, activity_id: str, *, action: str | None = None) -> str:
    """Key for an effect performed by a Temporal activity: ``workflow_id`` and
    ``activity_id`` from ``temporalio.activity.info()``.

    Why these: Temporal retries an activity under the same activity id, only
    ``info.attempt`` grows; and the workflow id is the one identity a workflow keeps
    when Temporal runs it again. Never the run id (``info.workflow_run_id``): a
    workflow retry (its retry policy), a reset and continue-as-new each start a new
    run with a new run id under the same workflow id, so a key with the run id in it
    names a new operation on every one of them - a second charge after a workflow
    retry. Never ``attempt`` either.

    Where it stops holding: the Python SDK's default activity ids are a per-run
    sequence (``"1"``, ``"2"``, ...), stable across activity retries and replay. A
    retried run executes the same activities in the same order, so its ``"1"`` is the
    first run's ``"1"`` and replays it, as it should; but a run started by
    continue-as-new is the next iteration, counts from ``"1"`` again, and would
    replay the previous iteration's effect instead of performing its own: a workflow
    that continues as new must give its activities explicit ids
    (``activity_id="charge-order-42"``) or pass the iteration as ``action``. And the
    workflow id must name one business operation: with an id reuse policy that
    allows a second execution, that execution replays the first one's effects.
    """
    return _key(
        "temporal",
        [_text("workflow_id", workflow_id), _text("activity_id", activity_id)],
        action,
    )


def celery_key(task_id: str, *, action: str | None = None) -> str:
    """Key for an effect performed by a Celery task: ``self.request.id``.

    Why it holds: ``Task.retry()`` sends the task again with the same task id (only
    ``request.retries`` grows), and with ``acks_late`` a message the worker had not
    acknowledged when it died (the worker killed, or its child with
    ``task_reject_on_worker_lost``) is delivered again - the same message, the same
    task id. A broker's visibility timeout (Redis, SQS) may redeliver it while the
    first run still works: both runs then use one key and the broker performs the
    effect once.

    Where it stops: a new ``apply_async`` (or ``.delay()``) is a new task with a new
    id, even for the same operation - a producer that retries its own enqueue, or a
    beat schedule that fires twice. When the producer itself may enqueue one
    operation twice, use ``business_key``, or pass ``task_id=`` a business identity to
    ``apply_async``.
    """
    return _key("celery", [_text("task_id", task_id)], action)


def dbos_key(workflow_id: str, step_id: int, *, action: str | None = None) -> str:
    """Key for an effect performed by a DBOS step: ``DBOS.workflow_id`` and
    ``DBOS.step_id``.

    Why it holds across recovery: the workflow id is the workflow's idempotency key,
    and the step id is the step's position in its workflow, counted in call order.
    Recovery runs the workflow function again from the start under the same workflow
    id: its completed steps return the outputs DBOS recorded without running, so a
    deterministic workflow reaches the unfinished step with the same count, and that
    step runs again under the same id. A retry of the
    step (``retries_allowed``) keeps its id too.

    Where it stops: the count assumes the same code takes the same path. DBOS
    recovers a pending workflow only on the application version that started it, so
    a deploy does not renumber a recovering workflow's steps; but a workflow whose
    step order depends on something outside DBOS (the clock, a random choice, a read
    that is not a step) may reach the effect at another position - pass ``action``
    or key on the business operation (``business_key``) then.
    """
    return _key(
        "dbos",
        [_text("workflow_id", workflow_id), _text("step_id", step_id, allow_int=True)],
        action,
    )


def langgraph_key(
    thread_id: str,
    operation: str,
    *removed: object,
    action: str | None = None,
    **removed_keywords: object,
) -> str:
    """Key for an effect performed by a LangGraph node: the thread, and the business
    operation the node performs, taken from the graph's state.

    ``thread_id`` is ``config["configurable"]["thread_id"]``. ``operation`` names what
    is done, from the state, never from where the graph is: the business action
    (``f"order:{state['order_id']}:charge"``), or a key an earlier node wrote into the
    state (a node that plans the charge stores ``{"charge_key": ...}``; LangGraph
    checkpoints the state before the next node runs, so every re-run of the charging
    node reads the same one).

    Why not the node and its step (``metadata["langgraph_step"]``), the task id or
    ``checkpoint_ns``: they are positions in the thread's checkpoint history, and
    recovery can move them. A ``RetryPolicy`` retry, and a plain resume after a
    crash, re-run the node at the same step; but an ``update_state`` before the
    resume - a person repairing the state, the usual human-in-the-loop fix - writes
    a checkpoint, and the node re-runs one step later under a new task id (a
    subgraph's namespace embeds that id). A key built from them would name a second
    operation: a second charge (``tests/unit/test_keys.py`` shows the step move).
    Earlier releases built the key from node and step; that call
    (``langgraph_key(thread_id, node, step)``) is now a ``TypeError``: it fails
    loudly instead of silently naming a second operation.

    Where it stops: two threads performing the same business operation have two
    keys; when a user may start the same operation in a new thread, use
    ``business_key``. Nodes fanned out with ``Send`` perform one operation each: put
    the item's identity in ``operation`` (or ``action``).
    """
    if removed or removed_keywords:
        given = [repr(value) for value in removed] + list(removed_keywords)
        raise TypeError(
            "langgraph_key(thread_id, operation, *, action=None) takes the business "
            "operation from the graph's state, not the node's position (node, step, "
            f"checkpoint_ns), which can move after recovery; got also {', '.join(given)}"
        )
    return _key(
        "langgraph",
        [_text("thread_id", thread_id), _text("operation", operation)],
        action,
    )


def agent_key(run_id: str, tool_call_id: str, *, action: str | None = None) -> str:
    """Key for an effect an agent loop performs for one tool call: the loop's run id
    and the model's tool-call id (OpenAI ``tool_calls[].id``, Anthropic ``tool_use``
    ``id``, an MCP request's call).

    The tool-call id is written by the model into its response; a loop that stores the
    response before running the tools, and re-runs them from it after a crash, sees the
    same id again. A response generated anew carries new ids, so the loop must resume
    from the stored response, not ask the model again.
    """
    return _key(
        "agent", [_text("run_id", run_id), _text("tool_call_id", tool_call_id)], action
    )


def business_key(*parts: str | int, version: int = 1) -> str:
    """A plain business key: ``business_key("order", 42, "charge")`` is
    ``order:42:charge:v1``.

    Parts are the business identity of the operation (entity, its id, the action);
    ``version`` is part of that identity and changes only with the meaning of the
    operation itself. The first part may not be a runtime helper's prefix
    (``temporal``, ``celery``, ...), so a business key never equals a runtime key.
    """
    if not parts:
        raise KeyPartError("business_key needs at least one part")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise KeyPartError(f"version must be an int >= 1, got {version!r}")
    texts = [_text(f"part {n}", p, allow_int=True) for n, p in enumerate(parts, 1)]
    if texts[0] in RUNTIME_PREFIXES:
        raise KeyPartError(
            f"a business key may not start with {texts[0]!r}: that prefix belongs to "
            f"effect_broker.keys.{texts[0]}_key"
        )
    key = ":".join([*texts, f"v{version}"])
    if len(key) > SHORTEN_ABOVE:
        return _digest_key(texts[0][:32], key)
    return key
