"""Health surface: liveness and readiness, unauthenticated."""

from __future__ import annotations

from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse
from ninja import Router

from effect_broker.api.problems import problem
from effect_broker.api.schemas import with_problems

router = Router(tags=["health"])


@router.get(
    "/healthz",
    response=with_problems({200: dict[str, str]}, authenticated=False),
    summary="Liveness",
)
def healthz(request: HttpRequest) -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    response=with_problems({200: dict[str, str]}, authenticated=False),
    summary="Readiness: Postgres answers and migrations are applied",
)
def readyz(request: HttpRequest) -> HttpResponse | dict[str, str]:
    try:
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception as exc:  # any database failure means not ready
        return problem(503, "not_ready", f"database unavailable: {type(exc).__name__}")
    if pending:
        return problem(503, "not_ready", f"{len(pending)} migrations not applied")
    return {"status": "ready"}
