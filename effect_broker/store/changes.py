"""Wake-ups on effect changes: LISTEN to the NOTIFY that migration 0009 sends.

Every transition appends one ``effect_events`` row, and its trigger notifies
``CHANNEL`` with the effect id at commit when the new state is one a waiter can stop
in (migration 0014: final, manual review, outcome unknown). A listener is a
dedicated autocommit connection (LISTEN on a pooled or transactional connection would
miss notifications or hold a transaction open), opened to the same database Django
uses - or to ``EFFECT_BROKER_LISTEN_DATABASE_URL`` when set: behind a pooler in
transaction mode a LISTEN would not outlive its statement's server connection. One
such connection serves every waiter of a process (``services.awaiting.ChangeHub``).
"""

from __future__ import annotations

import psycopg
from django.conf import settings
from django.db import connection

from effect_broker.store.database_url import url_from_settings

#: Must match the channel in migration 0009.
CHANNEL = "effect_broker_effect_changed"
#: How the listening connection names itself in ``pg_stat_activity``.
LISTENER_APPLICATION_NAME = "effect-broker-listener"


async def open_listener() -> psycopg.AsyncConnection[tuple[object, ...]]:
    """A new autocommit connection that LISTENs on ``CHANNEL``.

    LISTEN has taken effect when this returns: a change committed after it is
    notified on this connection, and one committed before is in any later read.
    """
    url = settings.EFFECT_BROKER_LISTEN_DATABASE_URL or url_from_settings(
        connection.settings_dict
    )
    conn = await psycopg.AsyncConnection.connect(
        url, autocommit=True, application_name=LISTENER_APPLICATION_NAME
    )
    try:
        await listen(conn)
    except BaseException:
        await conn.close()
        raise
    return conn


async def listen(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
    """(Re-)issue LISTEN on ``conn``: a no-op when it already listens, so it also
    serves as the probe that finds a connection dead."""
    await conn.execute(f"LISTEN {CHANNEL}")
