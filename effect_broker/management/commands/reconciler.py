"""``effect-broker reconciler``: a worker for reconciliation and the periodic sweep
only, never dispatch - so reconciling lost answers keeps its own capacity when
dispatch is busy (spec "Reconciliation"). It outlives database outages like
``effect-broker worker``."""

from __future__ import annotations

from effect_broker.management.commands import worker
from effect_broker.workers.supervision import EXIT_GAVE_UP, RECONCILER_QUEUES


class Command(worker.Command):
    help = (
        "Run a reconciler: a worker on the reconcile and maintenance queues only "
        f"({', '.join(RECONCILER_QUEUES)}), so lost answers are reconciled and the "
        "periodic sweep runs even while dispatch is busy. It survives database outages "
        "and failovers, waiting with backoff and running again in the same process. "
        "SIGTERM or Ctrl-C stop it gracefully; a second signal stops it at once. Exit "
        f"codes: 0 after a requested stop, {EXIT_GAVE_UP} when --max-outage ran out, "
        "2 on bad configuration."
    )
    queues = RECONCILER_QUEUES
    default_name = "reconciler"
    default_concurrency = 2
