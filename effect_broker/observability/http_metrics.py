"""django-prometheus's HTTP metrics, without its two thread hops per request.

django-prometheus ships a Before and an After middleware built on Django's
``MiddlewareMixin``; under ASGI each runs its hooks through ``sync_to_async``, and its
``process_view`` is adapted the same way: three thread hops per request, on the
submit path that issue 13 took its thread hops out of (``api.admin_middleware``).
This one middleware calls the same hooks of the same classes directly - they only
touch counters, no I/O - so the metric families (``django_http_*``) and their
meaning are django-prometheus's own.

It sits outermost in ``MIDDLEWARE``, so a request refused by the boundary is counted
too; the two latency histograms therefore measure the same span. Refusals made
before Django (``api.admission``'s 503, ``api.body_limit``'s 413) are not counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse
from django_prometheus.middleware import (
    PrometheusAfterMiddleware,
    PrometheusBeforeMiddleware,
)


def _unused(request: HttpRequest) -> HttpResponse:  # pragma: no cover - never called
    raise RuntimeError("the hooks' own get_response is never called")


def http_metrics_middleware(
    get_response: Callable[[HttpRequest], Any],
) -> Callable[[HttpRequest], Any]:
    """Count requests and responses with django-prometheus's Before/After hooks."""
    before = PrometheusBeforeMiddleware(_unused)
    after = PrometheusAfterMiddleware(_unused)

    def on_request(request: HttpRequest) -> None:
        before.process_request(request)
        after.process_request(request)

    def on_response(request: HttpRequest, response: HttpResponse) -> HttpResponse:
        if getattr(request, "resolver_match", None) is not None:
            after.process_view(request, None)
        after.process_response(request, response)
        return before.process_response(request, response)

    if iscoroutinefunction(get_response):

        async def async_middleware(request: HttpRequest) -> HttpResponse:
            on_request(request)
            return on_response(request, await get_response(request))

        return markcoroutinefunction(async_middleware)

    def middleware(request: HttpRequest) -> HttpResponse:
        on_request(request)
        return on_response(request, get_response(request))

    return middleware


http_metrics_middleware.sync_capable = True  # type: ignore[attr-defined]
http_metrics_middleware.async_capable = True  # type: ignore[attr-defined]
