"""Who may read ``/docs`` and ``/openapi.json`` (``EFFECT_BROKER_API_DOCS``).

Issue 12: both were public in production. ``public`` serves them to anyone (the
development default); ``staff`` only to an admin session of a staff user (others are
sent to the admin login); ``off`` answers 404, as for a route that does not exist (the
production default). Read per request, so a test or a settings change needs no reload.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.http import Http404, HttpRequest, HttpResponse

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
