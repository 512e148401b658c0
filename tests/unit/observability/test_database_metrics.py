"""django-prometheus's query metrics keep each role's connection pool as configured."""

from __future__ import annotations

import pytest

from config import capacity
from effect_broker.observability.database import (
    METERED_ENGINE,
    PLAIN_ENGINE,
    with_query_metrics,
)

URL_ENTRY = {
    "ENGINE": PLAIN_ENGINE,
    "NAME": "broker",
    "USER": "u",
    "PASSWORD": "",
    "HOST": "db",
    "PORT": "5432",
    "OPTIONS": {"sslmode": "require"},
    "CONN_MAX_AGE": 0,
    "CONN_HEALTH_CHECKS": False,
}


@pytest.mark.parametrize("role", [capacity.API, capacity.WORKER, capacity.CLI])
def test_the_metered_engine_keeps_the_roles_pool_and_options(role) -> None:
    plain = capacity.apply_role(URL_ENTRY, role)
    metered = with_query_metrics(plain)
    assert metered["ENGINE"] == METERED_ENGINE
    assert {k: v for k, v in metered.items() if k != "ENGINE"} == {
        k: v for k, v in plain.items() if k != "ENGINE"
    }
    if role != capacity.CLI:
        assert metered["OPTIONS"]["pool"]["name"] == f"effect-broker-{role}"


def test_the_embedded_server_keeps_its_own_engine() -> None:
    embedded = {**URL_ENTRY, "ENGINE": "effect_broker.embedded_db"}
    assert with_query_metrics(embedded) is embedded


def test_the_metered_backend_is_djangos_postgresql_backend_underneath() -> None:
    # Django's pool, asgi's pool shutdown and the test conftest all rely on it
    from django.db.backends.postgresql.base import DatabaseWrapper as Postgres
    from django_prometheus.db.backends.postgresql.base import DatabaseWrapper

    assert issubclass(DatabaseWrapper, Postgres)
    assert METERED_ENGINE.endswith("postgresql")
