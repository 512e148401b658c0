"""Health surface: liveness and readiness, unauthenticated.

``/healthz`` is liveness: the process answers HTTP. It touches nothing else, so a
database outage never gets a healthy API process restarted.

``/readyz`` is readiness: this deployment can accept work and get it done. It fails
(503 problem+json, ``code: not_ready``, one ``reasons`` entry per failure) when

* the process's connection pool lends no connection within
  ``POOL_CHECK_SECONDS`` (issue 19: with its pool drained by a leak, every REST call
  was a 503 while the process still looked healthy; the Docker image and compose
  health-check this route, so such a process is reported unhealthy);
* PostgreSQL does not answer, or migrations are not applied;
* the contracts file is invalid (every submit would be a 500; issue 11);
* no worker has sent a heartbeat within ``EFFECT_BROKER_READY_WORKER_SECONDS``
  (default: the stalled-worker timeout, 30 s; ``0`` skips this check for an API
  that is deliberately deployed before its workers): accepted effects would wait.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse
from ninja import Router

from effect_broker.api.problems import problem
from effect_broker.api.schemas import with_problems

router = Router(tags=["health"])

#: How long ``/readyz`` waits for the pool to lend a connection: short, since a
#: probe has a timeout of its own (3 s in the Dockerfile) and a healthy pool with
#: requests in flight lends one in milliseconds.
POOL_CHECK_SECONDS = 1.0


@router.get(
    "/healthz",
    response=with_problems({200: dict[str, str]}, authenticated=False),
    summary="Liveness",
)
async def healthz(request: HttpRequest) -> dict[str, str]:
    # Async: it touches nothing, so under ASGI it needs no hop to the sync thread.
    return {"status": "ok"}


@router.get(
    "/readyz",
    response=with_problems({200: dict[str, str]}, authenticated=False),
    summary="Readiness: database, migrations, valid contracts and a live worker",
)
def readyz(request: HttpRequest) -> HttpResponse | dict[str, str]:
    reasons = not_ready_reasons()
    if reasons:
        return problem(
            503,
            "not_ready",
            "; ".join(r["detail"] for r in reasons),
            reasons=reasons,
        )
    return {"status": "ready"}


def not_ready_reasons() -> list[dict[str, str]]:
    """Why this deployment is not ready (empty: ready)."""
    reasons = _contract_reasons()
    pool_reason = _pool_reason()
    if pool_reason is not None:
        # Every check below would wait the pool's own timeout for the same answer.
        reasons.append(pool_reason)
        return reasons
    try:
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception as exc:  # any database failure means not ready
        reasons.append(
            {"check": "database", "detail": f"database unavailable: {type(exc).__name__}"}
        )
        return reasons
    if pending:
        reasons.append(
            {"check": "migrations", "detail": f"{len(pending)} migrations not applied"}
        )
        return reasons  # the worker table may not exist yet
    window = settings.EFFECT_BROKER_READY_WORKER_SECONDS
    if window > 0:
        try:
            live = _live_workers(window)
        except Exception as exc:
            reasons.append(
                {
                    "check": "workers",
                    "detail": f"cannot read workers: {type(exc).__name__}",
                }
            )
        else:
            if live == 0:
                reasons.append(
                    {
                        "check": "workers",
                        "detail": f"no live worker (no heartbeat within {window:g}s)",
                    }
                )
    return reasons


def _pool_reason() -> dict[str, str] | None:
    """Why the connection pool cannot lend a connection now (None: it can, or this
    process has no pool). Borrows one with a short timeout and gives it back."""
    # Django's PostgreSQL wrapper: its pool, or None when it has none configured.
    pool = getattr(connection, "pool", None)
    if pool is None:
        return None
    try:
        pool.open()  # as Django does before it borrows: the pool opens on first use
        with pool.connection(timeout=POOL_CHECK_SECONDS):
            return None
    except Exception as exc:  # PoolTimeout, or a failed connect: not ready either way
        stats = pool.get_stats()
        lent = stats.get("pool_size", 0) - stats.get("pool_available", 0)
        return {
            "check": "database_pool",
            "detail": (
                f"the connection pool lent no connection within {POOL_CHECK_SECONDS:g}s "
                f"({lent} of {pool.max_size} lent; {type(exc).__name__})"
            ),
        }


def _live_workers(window: float) -> int:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM procrastinate_workers"
            " WHERE last_heartbeat >= now() - make_interval(secs => %s)",
            [window],
        )
        count: int = cur.fetchone()[0]
    return count


_lock = threading.Lock()
_contracts_seen: dict[str, Any] = {}


def _contract_reasons() -> list[dict[str, str]]:
    """Problems in the contracts file, re-read only when the file changes (a probe
    every few seconds must not rebuild adapters each time)."""
    from effect_broker.services.contract_check import validate_file

    path = settings.EFFECT_BROKER_CONTRACTS
    try:
        stat = os.stat(path)
        stamp: tuple[object, ...] = (path, stat.st_mtime_ns, stat.st_size)
    except OSError as exc:
        return [{"check": "contracts", "detail": f"{path}: cannot read: {exc.strerror}"}]
    with _lock:
        if _contracts_seen.get("stamp") != stamp:
            report = validate_file(path)
            _contracts_seen["stamp"] = stamp
            _contracts_seen["reasons"] = [
                {"check": "contracts", "detail": p.line()} for p in report.problems
            ]
        return list(_contracts_seen["reasons"])
