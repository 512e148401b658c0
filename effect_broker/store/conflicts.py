"""A write the database cancelled for a concurrent one, as the domain's retryable error.

Issue 19, item 3: two batches holding the same keys in opposite orders deadlocked, and
the one PostgreSQL cancelled reached the caller as ``500 internal_error``. A deadlock
(40P01) or serialization failure (40001) rolls the whole statement back - each ledger
write is one statement - so nothing was recorded and the same request may simply be
sent again: that is ``DatabaseConflictError`` (503 with ``Retry-After``), raised from
the database error so the cause survives (STYLE rule 3).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DatabaseError

from effect_broker.domain.errors import DatabaseConflictError

logger = logging.getLogger(__name__)


@contextmanager
def retryable_conflicts() -> Iterator[None]:
    """Re-raise a deadlock or serialization failure inside the block as
    ``DatabaseConflictError``; every other error passes unchanged."""
    try:
        yield
    except DatabaseError as exc:
        conflict = DatabaseConflictError.of(exc)
        if conflict is None:
            raise
        # One line per cancelled write, so a rate of them shows in the log; the
        # server's message is left out (it may quote a row's values, STYLE rule 8).
        logger.warning(
            "write cancelled by the database for a concurrent one: %s",
            conflict.details["reason"],
            extra={
                "action": "database_conflict",
                "sqlstate": conflict.details["sqlstate"],
            },
        )
        raise conflict from exc
