"""Admin login throttling (issue 19, item 12: 60 wrong passwords in a row were all
tried, and a right one after them let in).

After ``EFFECT_BROKER_ADMIN_LOGIN_MAX_FAILURES`` failed logins for one username from
one client address, that pair is locked out until ``EFFECT_BROKER_ADMIN_LOGIN_LOCKOUT
_SECONDS`` after its first failure: every attempt is refused, the right password
included, and the login form says so. A success before that clears the count.

Per username *and* address, so a stranger cannot lock an operator out from elsewhere.
Behind a proxy every client has the proxy's address (``REMOTE_ADDR``); the throttle
then works per username. The count lives in the database (one upsert per failure), so
every API process shares it. Hand-written rather than django-axes: one small table, one
backend and one form, with no middleware, no new dependency and no change for code
that calls ``authenticate`` without a request.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection
from django.http import HttpRequest
from django.utils import timezone

from effect_broker.models import AdminLoginFailure

_RECORD_FAILURE = """
INSERT INTO admin_login_failures AS f (key, failures, window_started_at)
VALUES (%(key)s, 1, %(now)s)
ON CONFLICT (key) DO UPDATE SET
    failures = CASE WHEN f.window_started_at <= %(expired)s THEN 1
                    ELSE f.failures + 1 END,
    window_started_at = CASE WHEN f.window_started_at <= %(expired)s THEN %(now)s
                             ELSE f.window_started_at END
"""


def _window() -> timedelta:
    return timedelta(seconds=settings.EFFECT_BROKER_ADMIN_LOGIN_LOCKOUT_SECONDS)


def _key(username: str | None, request: HttpRequest | None) -> str:
    address = request.META.get("REMOTE_ADDR", "") if request is not None else ""
    text = f"{(username or '').casefold()}\0{address}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def locked_until(username: str | None, request: HttpRequest | None) -> datetime | None:
    """When the lockout of this username and address ends; None when not locked."""
    row = AdminLoginFailure.objects.filter(key=_key(username, request)).first()
    if row is None or row.failures < settings.EFFECT_BROKER_ADMIN_LOGIN_MAX_FAILURES:
        return None
    until = row.window_started_at + _window()
    return until if until > timezone.now() else None


def _record_failure(username: str | None, request: HttpRequest | None) -> None:
    now = timezone.now()
    params: dict[str, str | datetime] = {
        "key": _key(username, request),
        "now": now,
        "expired": now - _window(),
    }
    with connection.cursor() as cursor:
        cursor.execute(_RECORD_FAILURE, params)


class ThrottledModelBackend(ModelBackend):
    """Django's ``ModelBackend``, refusing a locked-out username and address."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        if locked_until(username, request) is not None:
            # PermissionDenied stops Django's authenticate(): no other backend tries.
            raise PermissionDenied("too many failed logins")
        user = super().authenticate(request, username, password, **kwargs)
        if user is None:
            _record_failure(username, request)
        else:
            AdminLoginFailure.objects.filter(key=_key(username, request)).delete()
        return user


class ThrottledAdminLoginForm(AdminAuthenticationForm):
    """The admin's login form, saying plainly that a lockout is one."""

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username")
        until = locked_until(username, self.request)
        if until is not None:
            minutes = max(1, round((until - timezone.now()).total_seconds() / 60))
            raise ValidationError(
                f"Too many failed logins for this username from this address. Try "
                f"again in about {minutes} minute(s).",
                code="locked_out",
            )
        return super().clean()
