"""The bare procrastinate job of the floor: a no-op task, sync like the broker's tasks
(procrastinate runs sync tasks in a thread, so both pay the same hop)."""

from __future__ import annotations

from procrastinate.contrib.django import app

NOOP_TASK_NAME = "examples.bench.noop"


@app.task(queue="dispatch", name=NOOP_TASK_NAME)
def noop(n: int) -> None:
    """Do nothing: what is left is procrastinate's own cost (fetch, run, finish)."""
