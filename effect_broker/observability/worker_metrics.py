"""A worker's own metrics port (``EFFECT_BROKER_WORKER_METRICS_PORT``).

Why a port per worker rather than Prometheus's multiprocess mode (docs/observability.md):
workers run in their own containers, often on other hosts, where the multiprocess
mode needs one directory shared with the process that serves it; a SIGKILLed worker's
files stay behind and must be cleaned by hand; and its gauges need a per-metric merge
mode. A port per worker has none of that: each worker is one scrape target, and
Prometheus already handles a restarted process's counters (``rate``/``increase``).

The port serves ``prometheus_client.REGISTRY`` only: the ledger gauges are the API's,
so the ledger is reported once however many workers run.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from prometheus_client import REGISTRY, start_http_server

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_server: Any = None


def start_worker_metrics(port: int, addr: str = "0.0.0.0") -> int | None:  # noqa: S104
    """Serve this process's metrics on ``addr:port`` in a daemon thread; idempotent.

    Returns the bound port (``port=0`` picks a free one), or None when it could not
    bind: a worker without its metrics is still a worker, so the error is logged, not
    raised. Safe to call from every place a worker may boot.
    """
    global _server
    with _lock:
        if _server is not None:
            return int(_server.server_port)
        try:
            server, _thread = start_http_server(port, addr=addr, registry=REGISTRY)
        except OSError as exc:
            logger.error(
                "worker metrics port unavailable",
                extra={"action": "worker_metrics", "port": port, "error": str(exc)},
            )
            return None
        _server = server
    bound = int(server.server_port)
    logger.info(
        "worker metrics listening",
        extra={"action": "worker_metrics", "addr": addr, "port": bound},
    )
    return bound


def stop_worker_metrics() -> None:
    """Close the port (a graceful shutdown; tests). A later start opens it again."""
    global _server
    with _lock:
        server, _server = _server, None
    if server is not None:
        server.shutdown()
        server.server_close()


def start_from_settings() -> int | None:
    """Start the port when this process is a worker and a port is configured."""
    from django.conf import settings

    port = getattr(settings, "EFFECT_BROKER_WORKER_METRICS_PORT", None)
    if port is None or settings.EFFECT_BROKER_PROCESS_ROLE != "worker":
        return None
    return start_worker_metrics(port, settings.EFFECT_BROKER_WORKER_METRICS_ADDR)
