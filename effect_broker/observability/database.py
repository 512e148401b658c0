"""django-prometheus's database metrics, kept compatible with the per-role pool.

``django_prometheus.db.backends.postgresql`` is Django's PostgreSQL backend plus a
cursor class that counts and times every query (``django_db_*``). It sets that class
as the psycopg ``cursor_factory`` in ``get_connection_params``, which is also where
Django builds its connection pool's arguments (``DatabaseWrapper.pool``): pooled
connections get the counting cursor, and the pool options of ``config.capacity``
(min/max size, timeout, health checks) pass through untouched. Two things change
meaning under a pool: ``django_db_new_connections_total`` counts connections taken
from the pool, not backends started.

The embedded development server keeps its own engine (``effect_broker.embedded_db``
starts the server on first connect, and the crash matrix identifies it by name);
production always names ``DATABASE_URL``, so the wrapper covers every deployment.
"""

from __future__ import annotations

from typing import Any

PLAIN_ENGINE = "django.db.backends.postgresql"
METERED_ENGINE = "django_prometheus.db.backends.postgresql"


def with_query_metrics(database: dict[str, Any]) -> dict[str, Any]:
    """A copy of a DATABASES entry whose queries are counted (plain PostgreSQL only)."""
    if database.get("ENGINE") != PLAIN_ENGINE:
        return database
    return {**database, "ENGINE": METERED_ENGINE}
