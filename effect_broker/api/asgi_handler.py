"""The API's ASGI handler: Django's, with the API's sync views on a pool of threads
kept for the process, and its middleware without thread hops (issue 25 item 2).

Under ASGI, Django gives every request a sync thread of its own (``asgiref``'s
``ThreadSensitiveContext``: a new thread started for the request and joined at its
end) and runs there, one hop at a time, each hook of a sync middleware and the sync
view. In a profile of an API process under submits, starting and joining those
threads took about a fifth of the samples (docs/benchmarks.md, "One API process").

Here, on an API route (``/v1/``, ``/healthz``, ``/readyz``, ``/metrics``):

* Django's middleware runs without hops (``inline_middleware.HOP_FREE``);
* a sync view runs on one of ``threads`` threads that live as long as the process,
  as it would on a threaded WSGI server. There are as many as the API admits
  requests at once (``EFFECT_BROKER_API_MAX_IN_FLIGHT``, by default the pool's
  size), so an admitted request never waits for a thread; past the pool's size it
  waits for a connection, with the pool's timeout (503 ``database_pool``), as
  before. Django's connections are per async context and per thread
  (``asgiref.local.Local``): the view's thread opens its own, borrowed from the
  API's pool, in a copy of the request's context, and gives it back before the
  view's answer leaves the thread - what ``request_finished`` does on Django's
  thread;
* what remains is Django's own handler: one hop for the ``request_started``
  receivers and one for ``request_finished`` (both find no connection to close:
  the view's thread gave its own back). They go to asgiref's one process-wide sync
  thread instead of a thread started per request.

The admin keeps Django's handling (a thread per request, each hook a hop): nothing
there is hot, and a slow admin page then holds up no API request.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.db import close_old_connections
from django.http import HttpRequest
from django.urls import ResolverMatch

from effect_broker.api.admin_middleware import is_api_path
from effect_broker.api.inline_middleware import HOP_FREE


def view_threads() -> int:
    """Threads for the API's sync views: as many as requests it admits at once."""
    return int(settings.EFFECT_BROKER_API_ADMISSION.max_in_flight)


def _dotted(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _run_view(
    view: Callable[..., Any], request: HttpRequest, args: Any, kwargs: Any
) -> Any:
    try:
        return view(request, *args, **kwargs)
    finally:
        # In this thread, which opened them: back to the pool (or closed).
        close_old_connections()


class HopFreeASGIHandler(ASGIHandler):
    """Django's ASGI handler: hop-free middleware, API views on ``threads`` threads."""

    def __init__(self, threads: int | None = None) -> None:
        self._executor = ThreadPoolExecutor(
            max_workers=threads or view_threads(), thread_name_prefix="api-view"
        )
        self._threaded: dict[Callable[..., Any], Callable[..., Any]] = {}
        super().__init__()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and is_api_path(scope.get("path") or ""):
            await self.handle(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    def load_middleware(self, is_async: bool = False) -> None:
        # Django reads settings.MIDDLEWARE here and nowhere else; the swap lasts
        # while the chain is built (once, at start-up, before any request), so the
        # settings and the deploy checks still name Django's own classes.
        configured = list(settings.MIDDLEWARE)
        settings.MIDDLEWARE = [
            _dotted(HOP_FREE[path]) if path in HOP_FREE else path for path in configured
        ]
        try:
            super().load_middleware(is_async=is_async)
        finally:
            settings.MIDDLEWARE = configured

    def resolve_request(self, request: HttpRequest) -> ResolverMatch:
        match = super().resolve_request(request)
        if is_api_path(request.path_info) and not iscoroutinefunction(match.func):
            match.func = self._on_threads(match.func)
        return match

    def _on_threads(self, view: Callable[..., Any]) -> Callable[..., Any]:
        known = self._threaded.get(view)
        if known is not None:
            return known
        executor = self._executor

        # wraps: Django and its middleware read the view's attributes
        # (csrf_exempt, _non_atomic_requests) from the callback.
        @functools.wraps(view)
        async def threaded(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            context = contextvars.copy_context()  # tracing's span, Django's locals
            return await asyncio.get_running_loop().run_in_executor(
                executor, context.run, _run_view, view, request, args, kwargs
            )

        self._threaded[view] = threaded
        return threaded
