"""Shared fixtures. Every database test runs on a real PostgreSQL server.

Which server is decided by config.database at settings import: DATABASE_URL when set,
EFFECT_BROKER_TEST_DB=docker for testcontainers, otherwise the embedded server.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from config import database


def pytest_report_header(config: pytest.Config) -> str:
    from django.conf import settings

    db = settings.DATABASES["default"]
    where = "DATABASE_URL" if db["ENGINE"].endswith("postgresql") else "embedded server"
    return f"effect-broker database: {where} host={db['HOST'] or 'localhost'}"


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    reason = database.UNAVAILABLE_REASON
    if not reason:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "django_db" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tenant(db: None):  # type: ignore[no-untyped-def]
    """A fresh enabled tenant."""
    from effect_broker.services.tenants import create_tenant

    return create_tenant("acme")[0]


@pytest.fixture
def other_tenant(db: None):  # type: ignore[no-untyped-def]
    """A second tenant, for isolation tests."""
    from effect_broker.services.tenants import create_tenant

    return create_tenant("globex")[0]


@pytest.fixture
def fresh_runtime() -> Iterator[None]:
    """Reset the cached runtime around a test that overrides it."""
    from effect_broker.services import runtime

    runtime.reset()
    yield
    runtime.reset()
