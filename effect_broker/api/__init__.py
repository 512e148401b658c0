"""The REST surface (django-ninja): one Router per surface, thin glue that parses,
calls a service and maps errors (in one place: ``problems``).

- ``effects``: the public effects API, authenticated by a tenant's API key
  (``effect_batch``: its batch submit; ``effect_wait``: its long-poll);
- ``operators``: resolution and forks, authenticated by an operator token;
- ``pauses``: the operator's dispatch pauses, behind the same token;
- ``health``: liveness and readiness.

``from effect_broker.api import api`` is what ``config/urls.py`` mounts.
"""

from __future__ import annotations

from typing import Any

from ninja import NinjaAPI

from effect_broker.api import (
    effect_batch,
    effect_wait,
    effects,
    health,
    operators,
    pauses,
)
from effect_broker.api.database_unavailable import install as install_database_unavailable
from effect_broker.api.docs_access import LocalSwagger, docs_access
from effect_broker.api.problems import StrictJsonParser, install_handlers, problem
from effect_broker.api.schemas import problem_media_types


class BrokerApi(NinjaAPI):
    """The API, whose OpenAPI document declares errors as problem+json."""

    def get_openapi_schema(self, **kwargs: Any) -> Any:
        return problem_media_types(super().get_openapi_schema(**kwargs))


api = BrokerApi(
    title="effect-broker",
    version="1",
    description=(
        "Reserve side effects once, dispatch them under one downstream idempotency key, "
        "and report outcome_unknown plainly when the target cannot prove what happened."
        "\n\nEvery error is `application/problem+json` with a stable `code`. Rules "
        "for every value anywhere in a request body, free-form objects included: "
        "numbers within ±(2**53-1) (else 400 `number_out_of_range`; money travels as "
        "minor-unit integers or strings) and no NUL (U+0000) in any text (else 422 "
        "`unstorable_text`, naming the field)."
    ),
    parser=StrictJsonParser(),
    urls_namespace="effect_broker_api",
    docs=LocalSwagger(),
    docs_decorator=docs_access,
)
install_handlers(api)
install_database_unavailable(api)  # after install_handlers: it falls back to them
# Before the effects router: "/v1/effects/{effect_id}" would otherwise take "batch".
api.add_router("", effect_batch.router)
api.add_router("", effects.router)
api.add_router("", effect_wait.router)
api.add_router("", operators.router)
api.add_router("", pauses.router)
api.add_router("", health.router)

__all__ = ["api", "problem"]
