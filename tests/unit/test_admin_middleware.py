"""Session, auth and messages middleware run for the admin and are skipped on API
routes (effect_broker.api.admin_middleware). No database: sessions are never read."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import middleware as auth_middleware
from django.contrib.messages import middleware as messages_middleware
from django.contrib.sessions import middleware as sessions_middleware
from django.core import checks
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from effect_broker.api import admin_middleware
from effect_broker.api.admin_middleware import is_api_path

ADMIN_ONLY = [
    admin_middleware.SessionMiddleware,
    admin_middleware.AuthenticationMiddleware,
    admin_middleware.MessageMiddleware,
]


def chain(*, is_async: bool) -> tuple[Any, list[HttpRequest]]:
    """Session -> auth -> messages -> a view that records the request it got."""
    seen: list[HttpRequest] = []

    if is_async:

        async def view(request: HttpRequest) -> HttpResponse:
            seen.append(request)
            return HttpResponse("ok")

        handler: Any = view
    else:

        def sync_view(request: HttpRequest) -> HttpResponse:
            seen.append(request)
            return HttpResponse("ok")

        handler = sync_view
    for middleware in reversed(ADMIN_ONLY):
        handler = middleware(handler)
    return handler, seen


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/effects", True),
        ("/v1/effects/abc/history", True),
        ("/healthz", True),
        ("/readyz", True),
        ("/metrics", True),
        ("/admin/", False),
        ("/admin/login/", False),
        ("/docs", False),
        ("/", False),
    ],
)
def test_which_paths_are_api_routes(path: str, api: bool) -> None:
    assert is_api_path(path) is api


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_api_routes_get_no_session_user_or_messages(is_async: bool) -> None:
    handler, seen = chain(is_async=is_async)
    request = RequestFactory().post("/v1/effects")
    response = handler(request)
    if is_async:
        response = asyncio.run(response)
    assert response.status_code == 200
    (passed,) = seen
    for attribute in ("session", "user", "_messages"):
        assert not hasattr(passed, attribute)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_the_admin_keeps_session_user_and_messages(is_async: bool) -> None:
    handler, seen = chain(is_async=is_async)
    request = RequestFactory().get("/admin/login/")
    response = handler(request)
    if is_async:
        response = asyncio.run(response)
    assert response.status_code == 200
    (passed,) = seen
    for attribute in ("session", "user", "_messages"):
        assert hasattr(passed, attribute)


def test_settings_use_them_in_place_of_djangos_own() -> None:
    django_classes = {
        sessions_middleware.SessionMiddleware,
        auth_middleware.AuthenticationMiddleware,
        messages_middleware.MessageMiddleware,
    }
    names = {f"{c.__module__}.{c.__qualname__}" for c in django_classes}
    assert not names & set(settings.MIDDLEWARE)
    ours = [f"{c.__module__}.{c.__qualname__}" for c in ADMIN_ONLY]
    assert [m for m in settings.MIDDLEWARE if m in ours] == ours
    for middleware in ADMIN_ONLY:
        assert issubclass(middleware, tuple(django_classes))


def test_the_admins_system_checks_accept_them() -> None:
    # admin.E408/E409/E410 look for (subclasses of) Django's three classes.
    errors = [e for e in checks.run_checks(tags=["admin"]) if e.level >= checks.ERROR]
    assert errors == []
