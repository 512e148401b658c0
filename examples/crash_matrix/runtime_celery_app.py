"""The Celery app the runtime cells' worker runs: the recipe's app and task, plus the
same task calling the target directly (``runtime_alone``), tuned to notice in a
second what the defaults notice in ten.

Run: ``celery -A examples.crash_matrix.runtime_celery_app worker --pool prefork -c 1``.
"""

from __future__ import annotations

from typing import Any

import kombu.transport.sqlalchemy

from examples.crash_matrix.runtime_alone import charge_directly
from examples.runtimes.celery_checkout import app, charge_order

__all__ = ["app", "charge_alone", "charge_order"]

# kombu hands broker_transport_options to SQLAlchemy's create_engine too, so the
# polling interval (default 1 s) cannot be set there: set it on the transport.
kombu.transport.sqlalchemy.Transport.polling_interval = 0.2
# How long the worker waits for a result from a pool process that died before it
# reports the task lost and puts the message back (default 10 s).
app.conf.worker_lost_wait = 1.0


@app.task(name="matrix.charge_alone")
def charge_alone(target: str, body: dict[str, Any], marker: str) -> dict[str, Any]:
    """The task's charge without the broker (acks_late, so redelivered on a kill)."""
    return charge_directly(target, body, marker)
