"""Django's own middleware, without a thread hop per hook under ASGI (issue 25 item 2).

Under ASGI, Django runs each hook of a ``MiddlewareMixin`` (``process_request``,
``process_view``, ``process_response``) through ``sync_to_async``: a hop to the one
thread that runs every sync part of every request, and back. And one middleware that
is sync only - WhiteNoise's - made everything outside it sync: Django adapted the
chain with a hop into that thread and an ``async_to_sync`` back to the event loop.
Measured in process on a ``/healthz``: ten hops and one ``async_to_sync``
(docs/benchmarks.md, "One API process").

The hooks of Django's security, common and clickjacking middleware only read the
request and set headers: no I/O, nothing that must run on the sync thread. Here
they are called inline, in the event loop, for every request. The CSRF middleware's
hooks are inline on the API's routes only (bearer-authenticated, its views are
CSRF-exempt, nothing reads a session there); on the admin's routes
``CSRF_USE_SESSIONS`` could make them read a session from the database, so they
keep Django's hops. Under WSGI every class here behaves as Django's own.

``StaticFilesMiddleware`` is WhiteNoise's, able to run async: a request whose path
is not a static file costs one dict lookup and no hop; a static file is served
(WhiteNoise's compressed, cached files) through one hop.

``MIDDLEWARE`` keeps Django's and WhiteNoise's dotted paths: Django's deploy checks
(``check --deploy``: HSTS, SSL redirect, CSRF, clickjacking) look for those exact
strings and would otherwise skip or fail. The ASGI application swaps in the classes
here (``HOP_FREE``) when it builds its middleware chain
(``effect_broker.api.asgi_handler``).
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponseBase
from django.middleware import clickjacking, common, csrf, security
from whitenoise.middleware import WhiteNoiseMiddleware

from effect_broker.api.admin_middleware import is_api_path


class _InlineHooks:
    """In async mode, call this middleware's hooks inline when ``inline`` says so."""

    async_mode: bool
    get_response: Any

    def inline(self, request: HttpRequest) -> bool:
        """True when the hooks may run in the event loop for ``request``."""
        return True

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        if not self.inline(request):
            return await super().__acall__(request)  # type: ignore[misc]
        response = None
        if hasattr(self, "process_request"):
            response = self.process_request(request)
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            response = self.process_response(request, response)
        return response


class SecurityMiddleware(_InlineHooks, security.SecurityMiddleware):
    """Django's ``SecurityMiddleware`` (headers, SSL redirect), hooks inline."""


class CommonMiddleware(_InlineHooks, common.CommonMiddleware):
    """Django's ``CommonMiddleware`` (host check, APPEND_SLASH), hooks inline."""


class XFrameOptionsMiddleware(_InlineHooks, clickjacking.XFrameOptionsMiddleware):
    """Django's ``XFrameOptionsMiddleware`` (one header), hooks inline."""


class CsrfViewMiddleware(_InlineHooks, csrf.CsrfViewMiddleware):
    """Django's ``CsrfViewMiddleware``; its hooks are inline on the API's routes."""

    def __init__(self, get_response: Any) -> None:
        super().__init__(get_response)
        if self.async_mode:
            # Django calls ``process_view`` through sync_to_async unless it is a
            # coroutine function: an instance attribute it reads when it builds the
            # handler's view middleware.
            self.process_view = self._process_view_async  # type: ignore[method-assign, assignment]

    def inline(self, request: HttpRequest) -> bool:
        return is_api_path(request.path_info)

    async def _process_view_async(
        self, request: HttpRequest, callback: Any, args: Any, kwargs: Any
    ) -> HttpResponseBase | None:
        view = super().process_view
        if self.inline(request):
            return view(request, callback, args, kwargs)
        return await sync_to_async(view, thread_sensitive=True)(
            request, callback, args, kwargs
        )


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """WhiteNoise's middleware, sync and async: under ASGI a path that is not a static
    file goes on without a hop."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        super().__init__(get_response)
        # Without WHITENOISE_ROOT every file it serves is under STATIC_URL.
        self._under_static_only = not getattr(settings, "WHITENOISE_ROOT", None)
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self._acall(request)
        return super().__call__(request)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        path = request.path_info
        if self._under_static_only and not path.startswith(self.static_prefix):
            static_file = None
        elif self.autorefresh:
            # Looks on disk (DEBUG): not in the event loop.
            static_file = await sync_to_async(self.find_file)(path)
        else:
            static_file = self.files.get(path)
        if static_file is None:
            return await self.get_response(request)
        # Opens the file: in the sync thread, as Django would have run WhiteNoise.
        return await sync_to_async(self.serve)(static_file, request)


#: Django's (and WhiteNoise's) middleware in ``MIDDLEWARE`` -> its hop-free version.
HOP_FREE = {
    "django.middleware.security.SecurityMiddleware": SecurityMiddleware,
    "django.middleware.common.CommonMiddleware": CommonMiddleware,
    "django.middleware.csrf.CsrfViewMiddleware": CsrfViewMiddleware,
    "django.middleware.clickjacking.XFrameOptionsMiddleware": XFrameOptionsMiddleware,
    "whitenoise.middleware.WhiteNoiseMiddleware": StaticFilesMiddleware,
}
