"""Charge an order from a Celery task, through the broker
(docs/how-to/runtime-celery.md).

Celery's queue and results live in PostgreSQL here (kombu's SQLAlchemy transport and
Celery's database backend), so nothing but the broker's database is needed. With
``effect-broker dev`` running and the API key it printed, in two terminals::

    export EFFECT_BROKER_API_KEY=...
    export RUNTIME_DATABASE_URL=$(effect-broker db url --dbname celery_checkout)
    celery -A examples.runtimes.celery_checkout worker --pool prefork -c 1
    python -m examples.runtimes.celery_checkout --order 42

The task is ``acks_late`` with ``task_reject_on_worker_lost``: when the process running
it dies, the worker puts the message back and the task runs again with the same task
id, so under the same key, and replays the broker's effect instead of charging twice.
When nobody knows whether the charge happened (``OutcomeUnknown``), the task retries
itself with a countdown under the same task id until an operator has settled the
effect (``effect-broker effects resolve``); each retry is a replay, never a charge.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from celery import Celery, Task

from effect_broker.client import OutcomeUnknown
from effect_broker.keys import celery_key
from examples.runtimes.recipe_settings import (
    broker,
    charge_arguments,
    parse_order,
    runtime_database_url,
)


def _sqlalchemy_url(url: str) -> str:
    """``postgresql://...`` as SQLAlchemy names the psycopg 3 driver."""
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


app = Celery("checkout")
app.conf.update(
    broker_url=f"sqla+{_sqlalchemy_url(runtime_database_url())}",
    result_backend=f"db+{_sqlalchemy_url(runtime_database_url())}",
    # The message is acknowledged after the task returned, and put back when the
    # process running it dies: the task runs at least once, hence the stable key.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)


# An explicit name: the same whether this file runs as a module or as __main__.
@app.task(bind=True, max_retries=None, name="checkout.charge_order")
def charge_order(self: Task, tool: str, arguments: dict[str, Any], poll: float) -> Any:
    """Charge through the broker under this task's key."""
    # The task id: the same on a redelivery and on self.retry(); never
    # request.retries, which grows with each retry.
    key = celery_key(self.request.id)
    with broker() as client:
        try:
            return client.perform(key, tool=tool, arguments=arguments)
        except OutcomeUnknown as unknown:
            print(
                f"outcome unknown: effect {unknown.effect_id} awaits an operator; "
                f"retrying in {poll:g}s under the same key",
                flush=True,
            )
            # Same task id, same key: the retry replays this effect, never a charge.
            raise self.retry(countdown=poll) from None


def main(argv: list[str] | None = None) -> int:
    """Send the order's charge task and wait for its result."""
    options = parse_order(__doc__ or "", argv)
    # A task id of the order's own: sending it again is the same task, the same key.
    result = charge_order.apply_async(
        (options.tool, charge_arguments(options), options.poll),
        task_id=f"checkout-{options.order}-charge",
    )
    print("charged:", json.dumps(result.get(), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
