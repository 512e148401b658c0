"""Wake-ups on effect changes: LISTEN to the NOTIFY that migration 0009 sends.

Every transition appends one ``effect_events`` row, and its trigger notifies
``CHANNEL`` with the effect id at commit. A listener here is a dedicated autocommit
connection (LISTEN on a pooled or transactional connection would miss notifications or
hold a transaction open), opened to the same database Django uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from django.db import connection

from config.database import url_from_settings

#: Must match the channel in migration 0009.
CHANNEL = "effect_broker_effect_changed"


class ChangeListener:
    """An open LISTEN on ``CHANNEL``; ``wait`` blocks until a change or the timeout."""

    def __init__(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        self._conn = conn

    def wait(self, effect_id: str, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for a change of ``effect_id``: True if one
        came, False on timeout."""
        if timeout <= 0:
            return False
        for note in self._conn.notifies(timeout=timeout):
            if note.payload == effect_id:
                return True
        return False


@contextmanager
def listen_for_changes() -> Iterator[ChangeListener]:
    """LISTEN on ``CHANNEL`` for the duration of the block.

    LISTEN takes effect before this returns, so a caller that reads the row after
    entering sees either the change or its notification: no wake-up is lost.
    """
    url = url_from_settings(connection.settings_dict)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        yield ChangeListener(conn)
