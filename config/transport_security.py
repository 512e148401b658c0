"""HTTPS settings: secure by default in production, with switches for a TLS proxy.

The admin carries operator sessions that can resolve effects, so production defaults
are the ones ``manage.py check --deploy`` asks for (issue 12, item 7): redirect to
HTTPS, HSTS, and cookies that never travel over plain HTTP. Development keeps all of
them off so a fresh clone works on http://127.0.0.1.

Health, readiness and metrics are exempt from the redirect: orchestrators and scrapers
probe them over plain HTTP inside the cluster, and a 301 would read as "down".
"""

from __future__ import annotations

import os

from config.environment import env_bool
from effect_broker.domain.errors import ConfigurationError

ONE_YEAR = 365 * 24 * 3600
#: Paths (Django's form: no leading slash) that never redirect to HTTPS.
REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]


def transport_security(*, production: bool) -> dict[str, object]:
    """The Django settings for HTTPS, read from the environment."""
    secure_cookies = env_bool("EFFECT_BROKER_SECURE_COOKIES", default=production)
    settings: dict[str, object] = {
        "SECURE_SSL_REDIRECT": env_bool("EFFECT_BROKER_SSL_REDIRECT", default=production),
        "SECURE_REDIRECT_EXEMPT": REDIRECT_EXEMPT,
        "SECURE_HSTS_SECONDS": _hsts_seconds(production),
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": env_bool(
            "EFFECT_BROKER_HSTS_INCLUDE_SUBDOMAINS", default=production
        ),
        # The header only permits a browser-vendor preload submission; it enrols nothing.
        "SECURE_HSTS_PRELOAD": env_bool("EFFECT_BROKER_HSTS_PRELOAD", default=production),
        "SESSION_COOKIE_SECURE": secure_cookies,
        "CSRF_COOKIE_SECURE": secure_cookies,
    }
    # Trust X-Forwarded-Proto only when asked: a proxy that does not overwrite it would
    # let any client claim HTTPS and skip the redirect.
    if env_bool("EFFECT_BROKER_BEHIND_TLS_PROXY", default=False):
        settings["SECURE_PROXY_SSL_HEADER"] = ("HTTP_X_FORWARDED_PROTO", "https")
    return settings


def _hsts_seconds(production: bool) -> int:
    raw = os.environ.get("EFFECT_BROKER_HSTS_SECONDS", "").strip()
    if not raw:
        return ONE_YEAR if production else 0
    if not raw.isdigit():
        raise ConfigurationError(
            f"EFFECT_BROKER_HSTS_SECONDS must be a whole number of seconds, got {raw!r}"
        )
    return int(raw)
