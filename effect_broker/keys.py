"""Operation keys from each runtime's retry-stable identity. Pure functions: no
runtime, no Django and no broker needs to be installed to use them.

An operation key must name one business operation and stay the same on every
redelivery of it (spec "Operation identity"). Each runtime has an identity that
survives its own retries, and one that does not:

=========  ==========================================  ==================================
runtime    stable across retries (the key)             changes per attempt (never in it)
=========  ==========================================  ==================================
Temporal   workflow id + activity id                   attempt, run id of the attempt
Celery     the task id (``self.request.id``)           ``request.retries``
DBOS       workflow id + step id                       the step's retry attempt
LangGraph  thread id + node + step (+ subgraph ns)    the node's retry attempt, run id
agent      run id + the model's tool-call id           the loop's iteration counter
plain      the business key ``order:42:charge:v1``     -
=========  ==========================================  ==================================

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
    """Key for an effect performed by a Temporal activity.

    From ``temporalio.activity.info()``: ``workflow_id`` and ``activity_id``, never
    ``attempt`` (it grows with every retry of the activity, while the activity id stays)
    and never the run id. The Python SDK's default activity ids are a per-run sequence
    (``"1"``, ``"2"``, ...), stable across retries and replay; a run started by
    continue-as-new counts from ``"1"`` again, so a workflow that continues as new must
    give its activities explicit ids (``activity_id="charge-order-42"``) or pass the
    iteration as ``action``. The workflow id must name one business operation: with an
    id reuse policy that allows a second execution, that execution replays the first
    one's effects.
    """
    return _key(
        "temporal",
        [_text("workflow_id", workflow_id), _text("activity_id", activity_id)],
        action,
    )


def celery_key(task_id: str, *, action: str | None = None) -> str:
    """Key for an effect performed by a Celery task: ``self.request.id``.

    ``Task.retry()`` sends the task again with the same task id (only
    ``request.retries`` grows), and an ``acks_late`` redelivery carries the same
    message. A second ``.delay()`` is a second task with its own id: when the producer
    itself may enqueue one operation twice, use ``business_key`` or pass
    ``task_id=`` a business identity to ``apply_async``.
    """
    return _key("celery", [_text("task_id", task_id)], action)


def dbos_key(workflow_id: str, step_id: int, *, action: str | None = None) -> str:
    """Key for an effect performed by a DBOS step: ``DBOS.workflow_id`` and
    ``DBOS.step_id``.

    The step id is the step's position in its workflow: the same for every retry of
    the step (``retries_allowed``) and when a recovered workflow re-executes a step that
    had not completed; the workflow id is the workflow's idempotency key.
    """
    return _key(
        "dbos",
        [_text("workflow_id", workflow_id), _text("step_id", step_id, allow_int=True)],
        action,
    )


def langgraph_key(
    thread_id: str,
    node: str,
    step: int,
    *,
    checkpoint_ns: str = "",
    action: str | None = None,
) -> str:
    """Key for an effect performed by a LangGraph node.

    From the node's ``config``: ``configurable.thread_id``, and ``metadata``'s
    ``langgraph_node`` and ``langgraph_step``. A node retried by its ``RetryPolicy``,
    or re-run when the graph resumes from its checkpoint after a failure, has the same
    thread, node and step; a later visit of the node has a later step. Inside a
    subgraph pass ``checkpoint_ns=config["metadata"].get("checkpoint_ns", "")``: a
    subgraph's steps count on their own, and its namespace (``"sub:<task id>"``, the id
    derived from the parent's checkpoint) tells them apart. Nodes fanned out with
    ``Send`` share a step: pass ``action`` (the item's identity) to tell them apart.
    """
    namespace = "" if checkpoint_ns == "" else _text("checkpoint_ns", checkpoint_ns)
    return _key(
        "langgraph",
        [
            _text("thread_id", thread_id),
            namespace,
            _text("node", node),
            _text("step", step, allow_int=True),
        ],
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
