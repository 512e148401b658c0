"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.engine.harness import Bench, engine_bench


@pytest.fixture
def bench(db: None) -> Iterator[Bench]:
    """The engine bench: a tenant, simulated targets and a controllable clock."""
    with engine_bench() as b:
        yield b


def make_operator(username: str, *, staff: bool = True, permitted: bool = True) -> Any:
    """A user who may (by default) act as an operator: active staff holding
    ``effect_broker.resolve_effect``. Reuses the user if it exists."""
    from django.contrib.auth.models import Permission, User

    user, _ = User.objects.get_or_create(username=username, defaults={"is_staff": staff})
    if permitted:
        user.user_permissions.add(Permission.objects.get(codename="resolve_effect"))
    # A fresh instance: has_perm caches permissions on the object.
    return User.objects.get(pk=user.pk)


@pytest.fixture
def operator(db: None) -> Any:
    """The staff user 'ann', holding effect_broker.resolve_effect."""
    return make_operator("ann")


@pytest.fixture
def mcp_world(tmp_path: Any) -> Iterator[Any]:
    """Contracts with MCP faces, a tenant with its API key, the MCP server's env."""
    from tests.integration.mcp_support import open_world

    with open_world(tmp_path) as world:
        yield world
