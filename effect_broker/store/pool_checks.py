"""Pool health checks that cost a round trip only when one can tell something.

psycopg_pool's ``check_connection`` sends an empty query on every checkout. That is a
committed transaction each time (``pg_stat_database.xact_commit`` counts it): measured
in issue 13, one per dispatched effect on Django's worker pool and two per job on
procrastinate's pool (fetch and finish), three of the eleven commits per effect.

A connection that died while it sat in the pool has almost always been told so by the
server: a restart, a crash, ``pg_terminate_backend`` or ``idle_session_timeout`` send an
error and close the socket (a killed backend's socket is closed by its kernel). Nobody
reads a pooled connection's socket, so whatever arrived is still waiting there, and a
zero-timeout ``poll`` sees it without a round trip. So the check here:

* sends psycopg_pool's empty query when the socket has anything to read, when psycopg
  already knows the connection is not healthy, when the connection is new to this
  check, or when it was last lent more than ``IDLE_CHECK_SECONDS`` ago (a peer that
  vanished without a word - a dropped route, a firewall's idle timeout - is not
  visible on the socket; after a while idle, pay for the round trip);
* otherwise lends the connection as it is.

A failed check makes the pool throw the connection away and lend another, as before.
What no check closes is a connection that dies between the check and its use; that
was so with the empty query too, and a job that meets it fails and is retried (issue
11's outage tests).

Where it is installed: the worker commands (``effect-broker worker``, ``reconciler``)
build procrastinate's pool with it (``procrastinate_connector``) and put it on
Django's pool (``use_on_django_pool``); the API process (``config/asgi.py``) puts it on
Django's pool too, where the empty query was one round trip per request that
``/healthz`` (no database) does not make. Django hands its pool psycopg_pool's own
check when ``CONN_HEALTH_CHECKS`` is on and accepts no other (its ``pool`` property
passes ``check=`` itself), so the check is swapped on the pool it built. Anything
else with a pool (``procrastinate worker``) keeps the empty query on every checkout.
A request that meets a connection which died after its check is answered 503
``database_unavailable`` (issue 11), as it was with the empty query.
"""

from __future__ import annotations

import select
import time
from typing import TYPE_CHECKING, Any

from psycopg import AsyncConnection, Connection
from psycopg.pq import ConnStatus, TransactionStatus
from psycopg_pool import AsyncConnectionPool, ConnectionPool

if TYPE_CHECKING:
    from procrastinate import PsycopgConnector

#: A connection lent longer ago than this gets the empty query again.
IDLE_CHECK_SECONDS = 5.0

#: Attribute on the connection: ``time.monotonic()`` when this check last lent it.
_LENT_AT = "_effect_broker_lent_at"


def needs_round_trip(
    conn: Connection[Any] | AsyncConnection[Any], now: float | None = None
) -> bool:
    """Whether the pool must test ``conn`` with a query before lending it."""
    now = time.monotonic() if now is None else now
    lent_at: float | None = getattr(conn, _LENT_AT, None)
    setattr(conn, _LENT_AT, now)
    if lent_at is None or now - lent_at > IDLE_CHECK_SECONDS:
        return True
    pgconn = conn.pgconn
    if (
        conn.closed
        or pgconn.status != ConnStatus.OK
        or pgconn.transaction_status != TransactionStatus.IDLE
    ):
        return True
    return _readable(pgconn.socket)


def _readable(fd: int) -> bool:
    """Data, an error or end-of-file waits on ``fd`` (no wait, no round trip)."""
    try:
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(fd, select.POLLIN | select.POLLPRI)
            return bool(poller.poll(0))
        readable, _, _ = select.select([fd], [], [], 0)
        return bool(readable)
    except (OSError, ValueError):  # a closed or invalid descriptor: test it for real
        return True


def check_when_in_doubt(conn: Connection[Any]) -> None:
    """``ConnectionPool(check=...)``: psycopg_pool's check, only when in doubt."""
    if needs_round_trip(conn):
        ConnectionPool.check_connection(conn)


async def check_when_in_doubt_async(conn: AsyncConnection[Any]) -> None:
    """``AsyncConnectionPool(check=...)``: the same for procrastinate's pool."""
    if needs_round_trip(conn):
        await AsyncConnectionPool.check_connection(conn)


def use_on_django_pool(alias: str = "default") -> bool:
    """Put ``check_when_in_doubt`` on Django's pool for ``alias`` in place of
    psycopg_pool's every-checkout check; False when it has no pool or no check (no
    pool: nothing to do; ``CONN_HEALTH_CHECKS`` off: nothing is checked, leave it)."""
    from django.db import connections

    # Django builds the pool here (not opened) if need be; None: not pooled.
    pool: ConnectionPool[Any] | None = getattr(connections[alias], "pool", None)
    # psycopg_pool reads ``_check`` on every getconn; Django offers no other way in.
    # A psycopg_pool without it keeps its own check (safe, one commit dearer).
    if pool is None or getattr(pool, "_check", None) is None:
        return False
    pool._check = check_when_in_doubt
    return True


async def autocommit(conn: AsyncConnection[Any]) -> None:
    """``AsyncConnectionPool(configure=...)``: every statement its own transaction.

    procrastinate runs each of its queries (fetch, finish, heartbeat, ...) alone on a
    pooled connection, one SQL function call each. On a connection in psycopg's
    default transaction mode that is three round trips, ``BEGIN``, the call and the
    pool's ``COMMIT`` on return; in autocommit it is one, and the same one commit
    (issue 25: four round trips per dispatched effect, fetch and finish). Nothing in
    procrastinate 3.10 opens a transaction of several statements on its pool.
    """
    await conn.set_autocommit(True)


def procrastinate_connector(
    params: dict[str, Any], **pool_options: Any
) -> PsycopgConnector:
    """procrastinate's worker connector over ``params``: its pool checks a connection
    only when in doubt (procrastinate's own pool checks every checkout), and its
    connections are in autocommit (``autocommit``)."""
    from procrastinate import PsycopgConnector

    def pool_factory(**options: Any) -> AsyncConnectionPool[Any]:
        # Not ``autocommit=True`` in the connection kwargs: procrastinate's LISTEN
        # connection is opened with those kwargs AND its own autocommit=True.
        return AsyncConnectionPool(
            **{**options, "check": check_when_in_doubt_async, "configure": autocommit}
        )

    return PsycopgConnector(kwargs=params, pool_factory=pool_factory, **pool_options)
