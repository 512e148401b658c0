"""URL routes: admin (operator resolution) and the versioned REST API."""

from django.contrib import admin
from django.urls import path

from effect_broker.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", api.urls),
]
