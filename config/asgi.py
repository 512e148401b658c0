"""ASGI entry point (uvicorn config.asgi:application): the API process, and the MCP
server's streamable HTTP transport mounted at ``/mcp`` (effect_broker.mcp.transports).

It declares its role before settings load, so it gets the API's connection pool and
never persistent connections (config/capacity.py), it reads a request's body before
admitting the request - refusing one over the size limit before reading it, one too
slow to arrive, and ambiguous framing (effect_broker.api.body_limit) - and it admits a
bounded number of requests at a time (effect_broker.api.admission). Django's own
middleware runs without a thread hop per hook, and the API's sync views on a pool of
threads rather than Django's one (effect_broker.api.asgi_handler).
"""

import os
from typing import Any

import django

# Set, not defaulted: an ASGI process is the API whatever the shared environment says.
os.environ["EFFECT_BROKER_PROCESS_ROLE"] = "api"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)  # what django.core.asgi.get_asgi_application does

from django.conf import settings  # noqa: E402  (settings are configured only now)
from django.db import connections  # noqa: E402
from django.db.backends.postgresql.base import (  # noqa: E402
    DatabaseWrapper as PostgresWrapper,
)

from effect_broker.api.admission import InFlightLimit  # noqa: E402
from effect_broker.api.asgi_handler import HopFreeASGIHandler  # noqa: E402
from effect_broker.api.body_limit import body_limits  # noqa: E402
from effect_broker.api.query_credentials import QueryCredentialGuard  # noqa: E402
from effect_broker.mcp.server import mcp_settings_from_env  # noqa: E402
from effect_broker.mcp.transports import McpEndpoint, McpMount  # noqa: E402
from effect_broker.store.pool_checks import use_on_django_pool  # noqa: E402

# The pool tests a connection with a round trip only when in doubt (something waits on
# its socket, it is new, or it sat idle > 5 s), not on every request (issue 13).
use_on_django_pool()


def _close_pools() -> None:
    """Close the pools this process opened (at lifespan shutdown, after uvicorn has
    let in-flight requests finish). Reading ``wrapper.pool`` would create a pool
    that was never used, so only those already registered are closed."""
    opened = getattr(PostgresWrapper, "_connection_pools", {})  # Django's registry
    for alias in settings.DATABASES:
        wrapper = connections[alias]
        if isinstance(wrapper, PostgresWrapper) and alias in opened:
            wrapper.close_pool()


def served(django_application: Any) -> Any:
    """``django_application`` behind the API's guards, with ``/mcp`` mounted beside it.

    A credential in the query string is refused (and scrubbed from the access log),
    and the body is read (bounded in size and time, ambiguous framing refused) before
    the request takes a slot: a slow body must not hold one (issue 19). ``/mcp`` goes
    to the MCP endpoint behind the same guards plus a tenant key; it is not under the
    in-flight limit, because a proxy call spends most of its time waiting for its
    effect while holding no connection (effect_broker.services.awaiting), and its
    database work is bounded by the same pool. Everything else is the API.
    """
    limits = settings.EFFECT_BROKER_API_ADMISSION
    api = QueryCredentialGuard(
        body_limits(
            InFlightLimit(
                django_application,
                max_in_flight=limits.max_in_flight,
                max_queued=limits.max_queued,
                queue_timeout=limits.queue_timeout,
                on_shutdown=_close_pools,
            )
        )
    )
    return McpMount(api, McpEndpoint(mcp_settings_from_env()))


application = served(HopFreeASGIHandler())
