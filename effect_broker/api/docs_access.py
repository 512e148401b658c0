"""Who may read ``/docs`` and ``/openapi.json`` (``EFFECT_BROKER_API_DOCS``).

Issue 12: both were public in production. ``public`` serves them to anyone (the
development default); ``staff`` only to an admin session of a staff user (others are
sent to the admin login); ``off`` answers 404, as for a route that does not exist (the
production default). Read per request, so a test or a settings change needs no reload.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from ninja import NinjaAPI
from ninja.openapi.docs import Swagger, _csrf_needed

#: The values ``EFFECT_BROKER_API_DOCS`` takes.
DOCS_ACCESS = ("public", "staff", "off")

View = Callable[..., HttpResponse]


def docs_access(view: View) -> View:
    """Wrap a docs or schema view with the ``EFFECT_BROKER_API_DOCS`` rule."""
    for_staff = staff_member_required(view)

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        access = settings.EFFECT_BROKER_API_DOCS
        if access == "public":
            return view(request, *args, **kwargs)
        if access == "staff":
            return for_staff(request, *args, **kwargs)
        raise Http404("API docs are off")

    return guarded


class LocalSwagger(Swagger):
    """Swagger UI from ninja's bundled assets (``/static/ninja/...``), never a CDN.

    ninja renders its local template only when "ninja" is in ``INSTALLED_APPS`` and
    falls back to a CDN page otherwise. The broker finds ninja's templates and static
    files by location instead (config/settings.py: installing the app would import
    ninja in every worker and CLI process), so the page is rendered here, as ninja
    renders it for an installed app.
    """

    def render_page(
        self, request: HttpRequest, api: NinjaAPI, **kwargs: Any
    ) -> HttpResponse:
        self.settings["url"] = self.get_openapi_url(api, kwargs)
        context = {
            "swagger_settings": json.dumps(self.settings, indent=1),
            "api": api,
            "add_csrf": _csrf_needed(api),
        }
        return render(request, self.template, context)
