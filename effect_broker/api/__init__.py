"""The REST surface (django-ninja): one Router per surface, thin glue that parses,
calls a service and maps errors (in one place: ``problems``).

- ``effects``: the public effects API, authenticated by a tenant's API key;
- ``operators``: resolution and forks, authenticated by an operator token;
- ``health``: liveness and readiness.

``from effect_broker.api import api`` is what ``config/urls.py`` mounts.
"""

from __future__ import annotations

from ninja import NinjaAPI

from effect_broker.api import effects, health, operators
from effect_broker.api.docs_access import docs_access
from effect_broker.api.problems import StrictJsonParser, install_handlers, problem

api = NinjaAPI(
    title="effect-broker",
    version="1",
    description=(
        "Reserve side effects once, dispatch them under one downstream idempotency key, "
        "and report outcome_unknown plainly when the target cannot prove what happened."
    ),
    parser=StrictJsonParser(),
    urls_namespace="effect_broker_api",
    docs_decorator=docs_access,
)
install_handlers(api)
api.add_router("", effects.router)
api.add_router("", operators.router)
api.add_router("", health.router)

__all__ = ["api", "problem"]
