"""The API's ``/metrics``: this process's metrics plus the ledger gauges.

Access follows ``EFFECT_BROKER_METRICS`` (``settings_values.metrics_access``): public,
a bearer token compared in constant time, or off (404, as for a route that does not
exist). Read per request, so a settings override needs no reload.

The ledger gauges are not in ``prometheus_client.REGISTRY``: a worker serves that
registry on its own port, and the ledger must be reported once, not once per process.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.registry import CollectorRegistry

from effect_broker.api.problems import problem
from effect_broker.observability.collectors import LedgerCollector
from effect_broker.observability.control_collectors import ControlsCollector

_ledger = CollectorRegistry(auto_describe=False)
_ledger.register(LedgerCollector())
_ledger.register(ControlsCollector())


def _authorized(request: HttpRequest) -> bool:
    expected = settings.EFFECT_BROKER_METRICS_TOKEN
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return (
        bool(expected)
        and scheme.lower() == "bearer"
        and hmac.compare_digest(given.strip().encode(), expected.encode())
    )


def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus text exposition of this process and of the ledger."""
    access = settings.EFFECT_BROKER_METRICS_ACCESS
    if access == "off":
        return problem(404, "route_not_found", "/metrics is off (EFFECT_BROKER_METRICS)")
    if access == "token" and not _authorized(request):
        return problem(
            401, "unauthenticated", "/metrics needs the bearer token it was given"
        )
    if request.method not in ("GET", "HEAD"):
        return problem(405, "method_not_allowed", "/metrics answers GET")
    body = generate_latest(REGISTRY) + generate_latest(_ledger)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
