"""Template tags for the operator console (the admin index's queue block)."""

from __future__ import annotations

from typing import Any

from django import template
from django.urls import reverse

from effect_broker import admin_console as console

register = template.Library()


@register.simple_tag(takes_context=True)
def operator_queue(context: dict[str, Any]) -> dict[str, Any] | None:
    """The queue's count, its oldest entry's age and its URL, for a user who may view
    effects (None otherwise: the index then shows no block)."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.has_perm("effect_broker.view_effectintent"):
        return None
    oldest = console.queue().first()
    return {
        "count": console.queue_count(),
        "oldest_age": console.age_of(oldest.created_at) if oldest else "",
        "url": reverse("admin:effect_broker_effectintent_queue"),
    }
