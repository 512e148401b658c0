"""``effect-broker worker`` with procrastinate's own fetch loop: the wake-up fix of
``effect_broker.workers.wakeups`` switched off, everything else as shipped. Only the
wake-up A/B bench (``examples.bench.wakeup_ab``) starts it::

    python -m examples.bench.stock_wakeup_worker -n NAME -c 1
"""

from __future__ import annotations

import sys

from procrastinate.worker import Worker

from effect_broker.cli import main
from effect_broker.workers.wakeups import WakeKeepingWorker

if __name__ == "__main__":
    # The "before" arm: the pass that may clear a wake-up is not followed by a re-wake.
    WakeKeepingWorker._fetch_and_process_jobs = Worker._fetch_and_process_jobs  # type: ignore[method-assign]
    sys.exit(main(["worker", *sys.argv[1:]]))
