"""Run the MCP server over stdio (one tenant, from its API key) or streamable HTTP.

stdio: the tenant's API key comes from ``EFFECT_BROKER_API_KEY``; the process serves
that tenant only. HTTP: each request carries ``Authorization: Bearer <tenant key>``,
checked by the same ``services.tenants.authenticate`` the REST API uses, and the tenant
rides to the handler on the request's scope. ``/healthz`` answers without a key. The
HTTP app sits behind the same boundary guards as the REST API: a credential in the
query string is refused, and an oversized body is refused before it is read or the key
is checked (issue 12).
"""

from __future__ import annotations

from typing import Any

import anyio
from django.conf import settings as django_settings
from mcp.server import ServerRequestContext
from mcp.server.stdio import stdio_server
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from effect_broker.api.body_limit import BodySizeLimit
from effect_broker.api.problems import PROBLEM_JSON, problem_body
from effect_broker.api.query_credentials import QueryCredentialGuard
from effect_broker.domain.errors import AuthenticationError, EffectBrokerError
from effect_broker.mcp.server import McpSettings, build_server
from effect_broker.models import Tenant
from effect_broker.services.tenants import authenticate

API_KEY_ENV = "EFFECT_BROKER_API_KEY"
_TENANT = "effect_broker_tenant"


async def serve_stdio(tenant: Tenant, settings: McpSettings) -> None:
    """Serve ``tenant`` over this process's stdin and stdout until stdin closes."""
    server = build_server(lambda ctx: tenant, settings)
    async with stdio_server() as (read_stream, write_stream):
        options = server.create_initialization_options()
        await server.run(read_stream, write_stream, options)


def _tenant_of_request(ctx: ServerRequestContext[Any, Any]) -> Tenant:
    request = ctx.request
    tenant = getattr(request, "scope", {}).get("state", {}).get(_TENANT)
    if not isinstance(tenant, Tenant):  # the middleware lets no such request through
        raise AuthenticationError("no authenticated tenant on this request")
    return tenant


class BearerTenant:
    """ASGI middleware: a tenant API key on every request but ``/healthz``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") == "/healthz":
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode()
        scheme, _, token = header.partition(" ")
        try:
            if scheme.lower() != "bearer":
                raise AuthenticationError("missing Authorization: Bearer <API key>")
            tenant = await anyio.to_thread.run_sync(authenticate, token.strip())
        except EffectBrokerError as exc:
            body = problem_body(401, exc.code, str(exc))
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", PROBLEM_JSON.encode()),
                        (b"www-authenticate", b"Bearer"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        scope.setdefault("state", {})[_TENANT] = tenant
        await self.app(scope, receive, send)


async def _health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


def http_app(settings: McpSettings, *, host: str) -> QueryCredentialGuard:
    """The streamable HTTP app: ``/mcp`` behind a tenant key, ``/healthz`` open."""
    server = build_server(_tenant_of_request, settings)
    app = server.streamable_http_app(
        streamable_http_path="/mcp",
        # Each request stands alone: no server-side session to lose, and any
        # instance behind a load balancer can answer it.
        stateless_http=True,
        json_response=True,
        host=host,
        custom_starlette_routes=[Route("/healthz", _health)],
    )
    return QueryCredentialGuard(
        BodySizeLimit(
            BearerTenant(app),
            max_body_bytes=django_settings.EFFECT_BROKER_MAX_BODY_BYTES,
        )
    )
