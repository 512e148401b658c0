"""URL routes: admin (operator resolution), the versioned REST API and /metrics."""

from django.contrib import admin
from django.urls import path

from effect_broker.api import api
from effect_broker.api.problem_pages import problem_index, problem_page
from effect_broker.observability.endpoint import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
    # What a problem's ``type`` URI points at (RFC 9457; issue 21).
    path("problems/", problem_index, name="problem_index"),
    path("problems/<str:code>", problem_page, name="problem_page"),
    path("", api.urls),
]
