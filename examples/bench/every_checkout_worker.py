"""``effect-broker worker`` whose pools test every connection they lend, as before
``effect_broker.store.pool_checks`` (psycopg_pool's empty query on every checkout,
Django's and procrastinate's pool alike), everything else as shipped. Only the
commits A/B bench (``examples.bench.commits_ab``) starts it::

    python -m examples.bench.every_checkout_worker -n NAME -c 1
"""

from __future__ import annotations

import sys
from typing import Any

from effect_broker.cli import main
from effect_broker.store import pool_checks


def _always(conn: Any, now: float | None = None) -> bool:
    return True


if __name__ == "__main__":
    # The "before" arm: every checkout pays the round trip.
    pool_checks.needs_round_trip = _always
    sys.exit(main(["worker", *sys.argv[1:]]))
