"""URL routes: admin (operator resolution), the versioned REST API and /metrics."""

from django.contrib import admin
from django.urls import path

from effect_broker.api import api
from effect_broker.observability.endpoint import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
    path("", api.urls),
]
