"""Django's session, auth and messages middleware, for the admin only.

The API authenticates every request by its bearer credential and never reads a
session, a user or a message. Under ASGI each of these middleware costs two thread
hops per request (``MiddlewareMixin`` runs ``process_request`` and
``process_response`` through ``sync_to_async``), which made ``/healthz`` cost
3.3-5.3 ms of CPU (issue 13). On API routes these subclasses hand the request
straight to the next layer; everywhere else (the admin) they are Django's own.

They subclass Django's classes so the admin's system checks (admin.E408-E410), which
look for those classes in ``MIDDLEWARE``, still pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth import middleware as auth_middleware
from django.contrib.messages import middleware as messages_middleware
from django.contrib.sessions import middleware as sessions_middleware
from django.http import HttpRequest

#: Paths served by the API surfaces (``effect_broker.api``); ``/metrics`` is listed for
#: when an exporter is mounted. ``/docs`` and ``/openapi.json`` keep the full stack.
API_PATH_PREFIXES = ("/v1/", "/healthz", "/readyz", "/metrics")


def is_api_path(path: str) -> bool:
    """True for a request path served by the API rather than the admin."""
    return path.startswith(API_PATH_PREFIXES)


class _AdminOnly:
    """Skip this middleware on API routes; behave as the wrapped class elsewhere."""

    get_response: Callable[[HttpRequest], Any]

    def __call__(self, request: HttpRequest) -> Any:
        if is_api_path(request.path_info):
            # In async mode this returns the next layer's coroutine, which Django
            # awaits exactly as it would await ours: no thread hop at all.
            return self.get_response(request)
        return super().__call__(request)  # type: ignore[misc]


class SessionMiddleware(_AdminOnly, sessions_middleware.SessionMiddleware):
    """Django's ``SessionMiddleware``, skipped on API routes."""


class AuthenticationMiddleware(_AdminOnly, auth_middleware.AuthenticationMiddleware):
    """Django's ``AuthenticationMiddleware``, skipped on API routes."""


class MessageMiddleware(_AdminOnly, messages_middleware.MessageMiddleware):
    """Django's ``MessageMiddleware``, skipped on API routes."""
