"""The HTTP boundary (outermost Django middleware): what every request passes first
and every error response passes last.

Issue 12 found that, outside django-ninja's handlers, errors answered as Django
answers them: HTML for unknown routes and wrong methods, and with ``DEBUG`` on, the
debug page with a traceback for a wrong Host header. And a NUL in a path or query
string reached PostgreSQL as a 500. Here:

- a Host not in ``ALLOWED_HOSTS`` is 400 ``disallowed_host`` before anything else
  reads it (Django raises ``DisallowedHost`` from whichever middleware asks first,
  and with ``DEBUG`` on renders it as its debug page);
- the path and the query string go through the one storable-text rule
  (``effect_broker.domain.storable_text``), on every route, the admin's included;
- every error response off the admin that is not already problem+json - Django's
  404 (its debug 404 too), ninja's 405, a debug 500 - is replaced by the problem
  for its status, keeping ``Allow``, ``Retry-After`` and ``WWW-Authenticate``.

The admin keeps its own HTML pages: people read them, not programs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.core.exceptions import (
    DisallowedHost,
    SuspiciousOperation,
    TooManyFieldsSent,
)
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import sync_and_async_middleware

from effect_broker.api.problems import PROBLEM_JSON, domain_error, problem
from effect_broker.domain.errors import (
    DisallowedHostError,
    EffectBrokerError,
    InvalidRequestError,
    MethodNotAllowedError,
    PayloadTooLargeError,
    RouteNotFoundError,
    UnstorableTextError,
    UnsupportedMediaTypeError,
)
from effect_broker.domain.storable_text import require_storable

#: Paths whose errors stay HTML: the admin and its static files.
HTML_PATH_PREFIXES = ("/admin/", "/static/")

#: The problem for an error response that carries none, by status.
_BY_STATUS: dict[int, type[EffectBrokerError]] = {
    400: InvalidRequestError,
    404: RouteNotFoundError,
    405: MethodNotAllowedError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
}
_KEPT_HEADERS = ("Allow", "Retry-After", "WWW-Authenticate")


def refusal(request: HttpRequest) -> HttpResponse | None:
    """The problem refusing ``request`` before any view runs, or None."""
    try:
        request.get_host()
    except DisallowedHost:
        # The host is not echoed: it is the caller's text, and this is logged nowhere.
        return domain_error(request, DisallowedHostError())
    try:
        require_storable(request.path_info, "path")
        require_storable(
            {k: v[0] if len(v) == 1 else v for k, v in request.GET.lists()}, "query"
        )
    except UnstorableTextError as exc:
        return domain_error(request, exc)
    except TooManyFieldsSent:
        # Raised from here it would escape every handler and, with DEBUG on, show
        # the debug page.
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        return domain_error(
            request, InvalidRequestError(f"more than {limit} query parameters")
        )
    except SuspiciousOperation:
        return domain_error(request, InvalidRequestError("malformed request"))
    return None


def as_problem(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """``response`` itself, or, for an error off the admin that is not problem+json,
    the problem for its status."""
    status = response.status_code
    if (
        status < 400
        or request.path_info.startswith(HTML_PATH_PREFIXES)
        or response.get("Content-Type", "").startswith(PROBLEM_JSON)
    ):
        return response
    error = _BY_STATUS.get(status)
    if error is not None:
        code, detail = error.code, error.default_message()
    elif status >= 500:
        code, detail = "internal_error", "internal error; see server logs"
    else:
        code, detail = "http_error", _phrase(status)
    replaced = problem(status, code, detail)
    for header in _KEPT_HEADERS:
        if header in response:
            replaced[header] = response[header]
    return replaced


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"HTTP {status}"


Handler = Callable[[HttpRequest], HttpResponse]
AsyncHandler = Callable[[HttpRequest], Awaitable[HttpResponse]]


@sync_and_async_middleware
def http_boundary(get_response: Handler | AsyncHandler) -> Handler | AsyncHandler:
    """Django middleware: ``refusal`` first, ``as_problem`` last (module docstring).

    Sync and async alike, so under ASGI it costs no thread hop (issue 13)."""
    if iscoroutinefunction(get_response):
        async_next: AsyncHandler = get_response

        async def boundary_async(request: HttpRequest) -> HttpResponse:
            refused = refusal(request)
            if refused is not None:
                return refused
            return as_problem(request, await async_next(request))

        return boundary_async

    sync_next: Handler = get_response  # type: ignore[assignment]

    def boundary(request: HttpRequest) -> HttpResponse:
        refused = refusal(request)
        if refused is not None:
            return refused
        return as_problem(request, sync_next(request))

    return boundary
