"""How much one process takes on: its role, its database pool, its in-flight requests.

One environment serves the API and the workers (docker-compose shares it), but they
need different connection handling (issue 13, "an HTTP path that pools its
connections"):

* the **API** (``config/asgi.py`` sets ``EFFECT_BROKER_PROCESS_ROLE=api``) serves
  every request in a fresh async context, so a persistent connection
  (``CONN_MAX_AGE`` > 0) is never reused: one leaks per request until PostgreSQL
  refuses clients (measured: 45% of submits were 500s at concurrency 32). The API
  therefore ignores ``EFFECT_BROKER_DB_CONN_MAX_AGE``, with a warning, and borrows
  connections from a bounded pool instead (a new backend per request cost about 6 ms
  of PostgreSQL CPU);
* a **worker** (``effect-broker worker``, ``reconciler`` or ``procrastinate worker``
  set ``worker``) runs each job in a thread and closes Django's connection after it;
  the pool hands it back for the next job instead of starting a new backend;
* anything else (``cli``: management commands, tests, WSGI) keeps Django's defaults:
  no pool, ``CONN_MAX_AGE`` as configured.

Everything here is parsed at settings import and fails with one
``ConfigurationError`` line on a bad value.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from effect_broker.domain.errors import ConfigurationError

ROLE_ENV = "EFFECT_BROKER_PROCESS_ROLE"
API, WORKER, CLI = "api", "worker", "cli"
ROLES = (API, WORKER, CLI)


class ConnectionSettingIgnored(UserWarning):
    """A connection setting was ignored because it is unsafe for this process role."""


@dataclass(frozen=True)
class PoolSize:
    """Bounds of one role's psycopg pool; ``max_size == 0`` means no pool."""

    min_size: int
    max_size: int
    timeout: float


#: Defaults per role. The API: 8 connections are more than one process on a 2 vCPU
#: machine keeps busy (its Python work holds the GIL), and its in-flight limit
#: defaults to the same number, so a request never waits for a connection in normal
#: operation. A worker: a job's thread and its lease keeper's heartbeat thread hold
#: one connection each, plus the periodic sweep; 10 covers --concurrency 4.
POOL_DEFAULTS = {
    API: PoolSize(min_size=2, max_size=8, timeout=5.0),
    WORKER: PoolSize(min_size=2, max_size=10, timeout=30.0),
}


#: How long one psycopg_pool reconnect attempt keeps backing off (see apply_role).
POOL_RECONNECT_SECONDS = 5.0


@dataclass(frozen=True)
class Admission:
    """The API process's limit on requests in flight (``effect_broker.api.admission``)."""

    max_in_flight: int
    max_queued: int
    queue_timeout: float


#: Commands that run procrastinate workers (``effect_broker.workers``).
WORKER_COMMANDS = frozenset({"worker", "reconciler"})


def role_for_command(args: Sequence[str]) -> str:
    """The role of ``effect-broker <args>``: ``worker`` for ``worker``,
    ``reconciler`` and ``procrastinate worker``."""
    if args and args[0] in WORKER_COMMANDS:
        return WORKER
    if args and args[0] == "procrastinate":
        subcommand = next((a for a in args[1:] if not a.startswith("-")), None)
        if subcommand == "worker":
            return WORKER
    return CLI


def process_role() -> str:
    """This process's role from ``EFFECT_BROKER_PROCESS_ROLE`` (default ``cli``)."""
    raw = os.environ.get(ROLE_ENV, "").strip().lower()
    role = raw or CLI
    if role not in ROLES:
        raise ConfigurationError(
            f"{ROLE_ENV} must be one of {', '.join(ROLES)}, got {raw!r}"
        )
    return role


def _number(name: str, default: float, *, minimum: float, whole: bool) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < minimum:
        kind = "a whole number" if whole else "a number"
        raise ConfigurationError(f"{name} must be {kind} >= {minimum:g}, got {raw!r}")
    return value


def pool_size(role: str) -> PoolSize | None:
    """The pool bounds for ``role`` from the environment, or None for no pool."""
    default = POOL_DEFAULTS.get(role)
    if default is None:
        return None
    prefix = f"EFFECT_BROKER_{role.upper()}_DB_POOL"
    max_size = int(_number(f"{prefix}_MAX_SIZE", default.max_size, minimum=0, whole=True))
    if max_size == 0:
        return None
    min_size = int(
        _number(
            f"{prefix}_MIN_SIZE", min(default.min_size, max_size), minimum=0, whole=True
        )
    )
    if min_size > max_size:
        raise ConfigurationError(
            f"{prefix}_MIN_SIZE ({min_size}) must not exceed {prefix}_MAX_SIZE "
            f"({max_size})"
        )
    timeout = _number(f"{prefix}_TIMEOUT", default.timeout, minimum=0.001, whole=False)
    return PoolSize(min_size=min_size, max_size=max_size, timeout=timeout)


def apply_role(database: dict[str, Any], role: str) -> dict[str, Any]:
    """A copy of the DATABASES entry ``database`` with ``role``'s connection handling.

    With a pool, ``CONN_MAX_AGE`` must be 0 (Django refuses both at once; the pool is
    what keeps connections) and health checks are on: the pool then tests a
    connection before lending it, so a connection that died while idle (database
    restart) is replaced instead of failing the request or job that draws it. The
    worker commands and the API process then swap psycopg_pool's every-checkout query
    for a check that asks the server only when in doubt
    (``effect_broker.store.pool_checks``).
    """
    entry = {**database, "OPTIONS": dict(database.get("OPTIONS") or {})}
    size = pool_size(role)
    max_age = int(entry.get("CONN_MAX_AGE") or 0)
    if max_age and role == API:
        warnings.warn(
            f"EFFECT_BROKER_DB_CONN_MAX_AGE={max_age} is ignored by the API process: "
            "under ASGI every request runs in a new context and a persistent "
            "connection is never reused, so each request would leak one until "
            "PostgreSQL refuses clients. The API uses its connection pool "
            "(EFFECT_BROKER_API_DB_POOL_*); set the variable for workers only.",
            ConnectionSettingIgnored,
            stacklevel=2,
        )
    elif max_age and size is not None:
        warnings.warn(
            f"EFFECT_BROKER_DB_CONN_MAX_AGE={max_age} is ignored: this {role} process "
            f"keeps its connections in a pool (EFFECT_BROKER_{role.upper()}_DB_POOL_*); "
            f"set EFFECT_BROKER_{role.upper()}_DB_POOL_MAX_SIZE=0 to use persistent "
            "connections instead.",
            ConnectionSettingIgnored,
            stacklevel=2,
        )
    if role == API or size is not None:
        entry["CONN_MAX_AGE"] = 0
        entry["CONN_HEALTH_CHECKS"] = size is not None
    if size is not None:
        entry["OPTIONS"]["pool"] = {
            "min_size": size.min_size,
            "max_size": size.max_size,
            "timeout": size.timeout,
            "name": f"effect-broker-{role}",
            # psycopg_pool retries a failed connect with a doubling, uncapped delay
            # for up to this long (default 5 min): after a 60 s outage its next try
            # could come a minute after the database was back, every request a 503
            # meanwhile (issue 11). Giving up early restarts the backoff: the next
            # request that needs a connection tries at once.
            "reconnect_timeout": POOL_RECONNECT_SECONDS,
        }
    return entry


def admission(role: str, database: dict[str, Any]) -> Admission:
    """The API's in-flight limit: by default the pool's size (8 without a pool).

    At most as many requests as there are connections run at once, so a request does
    not wait for a connection; the rest wait in a bounded queue for a short time and
    are then refused with 503 ``overloaded`` (``effect_broker.api.admission``).
    """
    pool = (database.get("OPTIONS") or {}).get("pool") if role == API else None
    default_limit = int(pool["max_size"]) if pool else 8
    return Admission(
        max_in_flight=int(
            _number(
                "EFFECT_BROKER_API_MAX_IN_FLIGHT", default_limit, minimum=1, whole=True
            )
        ),
        max_queued=int(
            _number("EFFECT_BROKER_API_MAX_QUEUED", 1000, minimum=0, whole=True)
        ),
        queue_timeout=_number(
            "EFFECT_BROKER_API_QUEUE_TIMEOUT", 5.0, minimum=0.0, whole=False
        ),
    )
