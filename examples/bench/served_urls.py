"""The project's routes plus ``/v1/bench/bare``: a plain sync Django view that returns
a constant, on an API path (so the middleware treats it as it treats the API's own
routes), with no django-ninja, no authentication and no database."""

from django.http import HttpRequest, HttpResponse
from django.urls import path

from config.urls import urlpatterns as project_urlpatterns

BARE_PATH = "/v1/bench/bare"


def bare(request: HttpRequest) -> HttpResponse:
    """What Django costs around a view that does nothing."""
    return HttpResponse(b'{"status":"ok"}', content_type="application/json")


urlpatterns = [path(BARE_PATH.lstrip("/"), bare), *project_urlpatterns]
