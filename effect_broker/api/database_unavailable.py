"""503 ``database_unavailable`` while PostgreSQL cannot be reached (issue 11).

During a database crash, restart or failover the API answered 1,636 x 500
``internal_error``, each with a traceback in the log, where a caller needs to hear
"nothing was recorded, try again shortly". Here an error that means the database is
out of reach becomes the problem document ``database_unavailable`` with
``Retry-After``, and the log gets one warning line per ``LOG_EVERY_SECONDS`` (with
how many requests were refused since), not a traceback per request.

Out of reach means: the connection failed or broke (no SQLSTATE, or class 08), the
server is shutting down, crashed or still starting/recovering (57P01, 57P02, 57P03),
or the pool timed out *without* being full - it could not open a connection. A pool
that timed out full is load, not an outage: that stays 503 ``overloaded``
(``effect_broker.api.problems``), as does PostgreSQL's own connection limit (53300).
A statement timeout or a lock timeout is neither and stays a 500.

Resending is safe: a submit that met a broken connection either never committed or
committed and will replay under its operation key.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg
from django.db import DatabaseError as DjangoDatabaseError
from django.db import connections
from django.http import HttpRequest, HttpResponse
from django.utils.deprecation import MiddlewareMixin
from ninja import NinjaAPI
from psycopg_pool import PoolTimeout

from effect_broker.api import problems
from effect_broker.api.problems import PROBLEM_JSON, problem_body
from effect_broker.domain.errors import DatabaseUnavailableError

logger = logging.getLogger(__name__)

#: Seconds a refused caller should wait: a restart or failover takes seconds.
RETRY_AFTER_SECONDS = 2
#: At most one log line per this many seconds while the database is away.
LOG_EVERY_SECONDS = 10.0

#: SQLSTATEs of a server going away or not yet there, by the reason we report.
_SQLSTATE_REASONS = {
    "57P01": "server_shutting_down",  # admin_shutdown (pg_ctl stop, failover)
    "57P02": "server_crashed",  # crash_shutdown (another backend crashed)
    "57P03": "server_starting",  # cannot_connect_now (startup, crash recovery)
}


def unavailable_reason(exc: BaseException) -> str | None:
    """Why ``exc`` (a Django database error or its psycopg cause) means the database
    is out of reach, or None when it means something else."""
    cause = exc.__cause__ if isinstance(exc, DjangoDatabaseError) else exc
    if isinstance(cause, PoolTimeout):
        return "no_connection" if _pool_could_not_grow() else None
    if not isinstance(cause, psycopg.OperationalError):
        return None
    sqlstate = cause.sqlstate
    if sqlstate is None or sqlstate.startswith("08"):
        return "connection_failed"
    return _SQLSTATE_REASONS.get(sqlstate)


def _pool_could_not_grow() -> bool:
    """Whether the default pool timed out below its size: it could not connect.

    A pool that is full and busy is overload; one that has fewer connections than it
    may hold, while a request waited its whole timeout, failed to open more.
    """
    wrapper = connections["default"]
    pool = getattr(wrapper, "pool", None)  # Django's psycopg pool, when configured
    if pool is None:
        return True  # no pool: a timeout can only come from connecting
    stats = pool.get_stats()
    return int(stats.get("pool_size", 0)) < int(pool.max_size)


class _RateLimitedWarning:
    """One warning line per interval, counting the refusals it stands for."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._lock = threading.Lock()
        self._last = -float("inf")
        self._refused = 0

    def refused(self, reason: str, exc: BaseException) -> None:
        with self._lock:
            self._refused += 1
            now = time.monotonic()
            if now - self._last < self.every:
                return
            self._last, count, self._refused = now, self._refused, 0
        logger.warning(
            "database unavailable (%s): answering 503 database_unavailable; %d "
            "request(s) refused since the last line; %s",
            reason,
            count,
            " ".join(str(exc.__cause__ or exc).split())[:200],
            extra={"action": "database_unavailable", "reason": reason, "count": count},
        )


_warning = _RateLimitedWarning(LOG_EVERY_SECONDS)


def database_unavailable(reason: str) -> HttpResponse:
    """503 ``database_unavailable`` with ``Retry-After``: nothing was recorded."""
    response = HttpResponse(
        problem_body(
            DatabaseUnavailableError.http_status,
            DatabaseUnavailableError.code,
            DatabaseUnavailableError.default_message(),
            reason=reason,
        ),
        status=DatabaseUnavailableError.http_status,
        content_type=PROBLEM_JSON,
    )
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    # Django's request logger would add a line per refused request; ours counts them.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def refuse_if_unavailable(
    request: HttpRequest, exc: BaseException
) -> HttpResponse | None:
    """The 503 for ``exc`` when it means the database is out of reach, else None."""
    reason = unavailable_reason(exc)
    if reason is None:
        return None
    _warning.refused(reason, exc)
    return database_unavailable(reason)


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    """The same 503 for views outside the API (the admin, health), whose errors
    Django, not django-ninja, turns into responses. Only ``process_exception``: it
    costs nothing on a request that does not fail."""

    def process_exception(
        self, request: HttpRequest, exception: Exception
    ) -> HttpResponse | None:
        return refuse_if_unavailable(request, exception)


def install(api: NinjaAPI) -> None:
    """Answer the API's database errors with this 503 first, then as ``problems``
    does (``overloaded``, else 500). Call after ``problems.install_handlers``."""

    def database_error(request: HttpRequest, exc: DjangoDatabaseError) -> HttpResponse:
        return refuse_if_unavailable(request, exc) or problems.database_error(
            request, exc
        )

    api.exception_handler(DjangoDatabaseError)(database_error)
