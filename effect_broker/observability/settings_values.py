"""The observability settings, parsed from the environment at settings import.

Each bad value raises one ``ConfigurationError`` line naming the variable.
"""

from __future__ import annotations

import os

from effect_broker.domain.errors import ConfigurationError

#: The values ``EFFECT_BROKER_METRICS`` takes.
METRICS_ACCESS = ("public", "token", "off")


def metrics_access(*, production: bool) -> tuple[str, str]:
    """``(access, token)`` for the API's ``/metrics``.

    ``EFFECT_BROKER_METRICS_TOKEN`` set: a scrape must send it as a bearer token
    (Prometheus: ``authorization: {credentials: ...}``). Unset: public in development,
    off (404) in production, where the API faces callers and the counts describe the
    business (charges per tool, failures). ``EFFECT_BROKER_METRICS`` overrides:
    ``public``, ``token`` or ``off``.
    """
    token = os.environ.get("EFFECT_BROKER_METRICS_TOKEN", "").strip()
    raw = os.environ.get("EFFECT_BROKER_METRICS", "").strip().lower()
    access = raw or ("token" if token else "off" if production else "public")
    if access not in METRICS_ACCESS:
        raise ConfigurationError(
            f"EFFECT_BROKER_METRICS must be public, token or off, got {raw!r}"
        )
    if access == "token" and len(token) < 16:
        raise ConfigurationError(
            "EFFECT_BROKER_METRICS=token needs EFFECT_BROKER_METRICS_TOKEN of at least "
            "16 characters"
        )
    return access, token


def worker_metrics_port() -> int | None:
    """``EFFECT_BROKER_WORKER_METRICS_PORT``: where a worker serves its metrics, or
    None (unset: no port is opened)."""
    raw = os.environ.get("EFFECT_BROKER_WORKER_METRICS_PORT", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ConfigurationError(
            "EFFECT_BROKER_WORKER_METRICS_PORT must be a port number 1-65535, "
            f"got {raw!r}"
        )
    return int(raw)
