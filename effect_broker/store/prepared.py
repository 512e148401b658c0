"""Server-side prepared statements for the ledger's hottest statements (issue 13).

Django's psycopg backend binds parameters on the client (``ClientCursor``, unless
``OPTIONS["server_side_binding"]``) and turns psycopg's own preparing off
(``prepare_threshold=None``), so every statement is parsed and planned on every call:
the reservation's planning alone measured 0.17-0.21 ms. ``cursor()`` hands out a
Django cursor (query logging, ``execute_wrappers``, error wrapping, django-prometheus
counting: all as for ``connection.cursor()``) whose psycopg cursor binds on the server
and prepares every statement it runs. Only the statements routed through it change:
the single reservation and the fenced compare-and-swap (claim, outcome, heartbeat).
Switching all of Django to server-side binding is not done: the ORM's SQL is not
always preparable (Django ticket #20516), and every ORM query would change how it is
typed at once.

**Per connection.** A prepared statement lives in the server session, and psycopg
keeps its name on the connection object. The API's and the workers' pools
(``config/capacity.py``) keep those objects across requests and jobs (psycopg_pool
resets nothing but an open transaction), so a statement prepared for one request is
reused by the next that borrows the connection. The first execution on a connection
is two round trips (Parse, then Bind/Execute); the next ones one, without parse or
plan (after PostgreSQL's five custom plans, the cached generic plan). psycopg
deallocates every statement of a connection after a ROLLBACK on it (also to a
savepoint); they are prepared again on their next use.

**Types.** Server-side binding sends each value with the type psycopg gives it: str
and None as ``unknown`` (PostgreSQL infers it from the context, as for a client-side
literal), int as int2/int4/int8 by size, bytes as bytea, an aware datetime as
timestamptz, timedelta as interval, bool as bool. The statements routed here bind only
these; jsonb values are cast in the SQL (``%s::jsonb``). The integration test
``test_prepared_statements.py`` runs every statement shape prepared and not.

**Off switch.** ``EFFECT_BROKER_DB_PREPARED_STATEMENTS=off`` (``config/settings.py``)
sends these statements as Django does everything else. Use it behind a
transaction-mode pooler that does not track prepared statements (PgBouncer before
1.21, or 1.21+ with ``max_prepared_statements = 0``): there, a statement prepared on
one server connection is later executed on another ("prepared statement "_pg3_0" does
not exist").
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import psycopg
from django.conf import settings
from django.db import connection, connections
from django.db.backends.postgresql.base import CursorDebugWrapper
from django.db.backends.utils import CursorWrapper

#: The connection's threshold for psycopg's *automatic* preparing, set the first time
#: this module uses it: psycopg prepares nothing, not even on request, while the
#: threshold is None (Django's default). So large that no statement reaches it: only
#: the statements this module runs are prepared, by asking (``prepare=True``). Django's
#: own queries bind on the client and are never prepared either way.
_ONLY_WHEN_ASKED = sys.maxsize


class _PreparingCursor(psycopg.Cursor[Any]):
    """A server-side binding cursor that prepares each statement it executes."""

    def execute(
        self,
        query: Any,
        params: Any = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> _PreparingCursor:
        super().execute(
            query, params, prepare=True if prepare is None else prepare, binary=binary
        )
        return self


class _LoggedCursor(CursorDebugWrapper):
    """Django's query-logging cursor wrapper (``DEBUG``, ``CaptureQueriesContext``),
    logging what a client-side cursor would: the statement with its values.

    Django reads the logged SQL back from the psycopg cursor (``last_executed_query``),
    which keeps nothing for a prepared execution; Django's own server-side binding
    mode composes it instead, with ``ops.compose_sql``, as this does.
    """

    def execute(self, sql: Any, params: Any = None) -> Any:
        try:
            logged = sql if params is None else self.db.ops.compose_sql(sql, params)
        except psycopg.DataError:  # as Django's own: a value it cannot quote
            logged = sql
        with self.debug_sql(logged, params):
            return CursorWrapper.execute(self, sql, params)


#: The cursor class per database alias: with django-prometheus's engine, the same
#: counting wrapper its connections put around Django's own cursors.
_CLASSES: dict[str, type[psycopg.Cursor[Any]]] = {}


def _cursor_class() -> type[psycopg.Cursor[Any]]:
    cls = _CLASSES.get(connection.alias)
    if cls is None:
        from django_prometheus.db.common import (
            DatabaseWrapperMixin,
            ExportingCursorWrapper,
        )

        cls = _PreparingCursor
        # ``connection`` is a proxy; the wrapper it stands for has the engine's class.
        if isinstance(connections[connection.alias], DatabaseWrapperMixin):
            cls = ExportingCursorWrapper(cls, connection.alias, connection.vendor)
        _CLASSES[connection.alias] = cls
    return cls


def enabled() -> bool:
    """Whether the ledger's hot statements are prepared (the settings flag
    ``EFFECT_BROKER_DB_PREPARED_STATEMENTS``, on unless switched off)."""
    return connection.vendor == "postgresql" and bool(
        getattr(settings, "EFFECT_BROKER_DB_PREPARED_STATEMENTS", True)
    )


@contextmanager
def cursor() -> Iterator[CursorWrapper]:
    """A cursor on Django's connection whose statements are prepared on the server
    (or Django's own cursor, when ``enabled()`` is false)."""
    if not enabled():
        with connection.cursor() as plain:
            yield plain
        return
    # What ``connection.cursor()`` does (BaseDatabaseWrapper._cursor), with a
    # different psycopg cursor: the health check that replaces a connection that
    # died while idle (issue 11), then the wrapper that logs and maps errors.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    raw: psycopg.Connection[Any] = connection.connection
    if raw.prepare_threshold is None:
        raw.prepare_threshold = _ONLY_WHEN_ASKED
    with connection.wrap_database_errors:
        inner = _cursor_class()(raw)
    connection.validate_thread_sharing()
    wrapped = (
        _LoggedCursor(inner, connection)
        if connection.queries_logged
        # django-stubs type the argument as Django's wrapper; it is the DB-API cursor.
        else connection.make_cursor(cast(Any, inner))
    )
    with wrapped as cur:
        yield cur
