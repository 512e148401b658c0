"""Run the MCP server over stdio (one tenant, from its API key) or streamable HTTP.

stdio: the tenant's API key comes from ``EFFECT_BROKER_API_KEY``; the process serves
that tenant only. HTTP: each request carries ``Authorization: Bearer <tenant key>``,
checked by the same ``services.tenants.authenticate`` the REST API uses, and the tenant
rides to the handler on the request's scope.

Streamable HTTP is served two ways, with the same guards (issue 12):

- **mounted in the API** (``config/asgi.py``): ``/mcp`` on the API's own port, next to
  ``/v1/...``; the API's ``/healthz`` answers for the process, MCP included;
- **on its own port** (``effect-broker mcp --transport http``): ``/mcp`` and an open
  ``/healthz``.

Either way a credential in the query string is refused, an oversized body is refused
before it is read or the key is checked, and a refused key is a problem+json 401 with
``WWW-Authenticate: Bearer`` (a disabled tenant's key: 403 ``tenant_disabled``, as on
REST). The Host header must be in ``ALLOWED_HOSTS`` (the standalone server on a
loopback bind: a loopback name), an Origin header must be allowed, and a body must
pass REST's strict JSON parser (``effect_broker.mcp.request_guards``; issue 19).

The SDK's session manager needs a running task group (its ``run()``), normally entered
by the ASGI lifespan. ``McpEndpoint`` enters it at lifespan startup when the server
speaks lifespan, and otherwise on the first MCP request (``uvicorn --lifespan off``),
so the endpoint works either way; only the clean stop at shutdown needs the lifespan.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from django.conf import settings as django_settings
from django.http.request import validate_host
from mcp.server import ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from effect_broker.api.admission import ASGIApp, Receive, Scope, Send
from effect_broker.api.body_limit import body_limits
from effect_broker.api.problems import PROBLEM_JSON, problem_body
from effect_broker.api.query_credentials import QueryCredentialGuard
from effect_broker.domain.errors import (
    AuthenticationError,
    DisallowedHostError,
    EffectBrokerError,
)
from effect_broker.mcp.request_guards import (
    LOOPBACK_ORIGINS,
    OriginGuard,
    StrictJsonBody,
)
from effect_broker.mcp.server import McpSettings, build_server, in_thread
from effect_broker.models import Tenant
from effect_broker.services import awaiting
from effect_broker.services.tenants import authenticate

logger = logging.getLogger(__name__)

API_KEY_ENV = "EFFECT_BROKER_API_KEY"
#: Where streamable HTTP is served, mounted or on its own port.
MCP_PATH = "/mcp"
_TENANT = "effect_broker_tenant"


async def serve_stdio(tenant: Tenant, settings: McpSettings) -> None:
    """Serve ``tenant`` over this process's stdin and stdout until stdin closes."""
    server = build_server(lambda ctx: tenant, settings)
    try:
        async with stdio_server() as (read_stream, write_stream):
            options = server.create_initialization_options()
            await server.run(read_stream, write_stream, options)
    finally:
        await awaiting.close_change_hub()


def _tenant_of_request(ctx: ServerRequestContext[Any, Any]) -> Tenant:
    request = ctx.request
    tenant = getattr(request, "scope", {}).get("state", {}).get(_TENANT)
    if not isinstance(tenant, Tenant):  # the middleware lets no such request through
        raise AuthenticationError("no authenticated tenant on this request")
    return tenant


async def _send_problem(
    send: Send, status: int, code: str, detail: str, *, challenge: bool = False
) -> None:
    body = problem_body(status, code, detail)
    headers = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    if challenge:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BearerTenant:
    """ASGI middleware: a tenant API key on every request but ``/healthz``.

    With ``allowed_hosts``, the Host header is first checked the way Django checks it
    for the REST API (``ALLOWED_HOSTS``): mounted in the API, ``/mcp`` does not pass
    through Django, and must not be the one route that answers any Host.
    """

    def __init__(self, app: ASGIApp, *, allowed_hosts: list[str] | None = None) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") == "/healthz":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self.allowed_hosts is not None:
            host = headers.get(b"host", b"").decode("latin-1")
            if not validate_host(_without_port(host), self.allowed_hosts):
                error = DisallowedHostError()
                await _send_problem(send, error.http_status, error.code, str(error))
                return
        header = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        try:
            if scheme.lower() != "bearer":
                raise AuthenticationError("missing Authorization: Bearer <API key>")
            # in_thread gives the connection back (issue 19: it leaked one a request).
            tenant = await in_thread(authenticate, token.strip())
        except EffectBrokerError as exc:
            # REST's answer: 401 for a key that is not one, 403 tenant_disabled for a
            # disabled tenant's (issue 19: /mcp said 401 to both).
            status = exc.http_status
            await _send_problem(send, status, exc.code, str(exc), challenge=status == 401)
            return
        scope.setdefault("state", {})[_TENANT] = tenant
        await self.app(scope, receive, send)


def _without_port(host: str) -> str:
    """``host`` without its port, as Django's ``split_domain_port`` leaves it."""
    if host.endswith("]"):  # a bare IPv6 literal
        return host.lower()
    name, _, port = host.rpartition(":")
    return (name if name and port.isdigit() else host).lower()


class McpEndpoint:
    """The streamable-HTTP MCP endpoint as one ASGI app, owning the SDK session
    manager and the task group that manager needs running (module docstring)."""

    def __init__(
        self,
        settings: McpSettings,
        *,
        transport_security: TransportSecuritySettings | None = None,
    ) -> None:
        server = build_server(_tenant_of_request, settings)
        self.manager = StreamableHTTPSessionManager(
            app=server,
            # Each request stands alone: no server-side session to lose, and any
            # instance behind a load balancer can answer it.
            stateless=True,
            json_response=True,
            security_settings=transport_security,
        )
        self._task: asyncio.Task[None] | None = None
        self._started = asyncio.Event()
        self._stop = asyncio.Event()

    @property
    def running(self) -> bool:
        """True once the session manager's task group is up."""
        return self._started.is_set() and self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Start the session manager (once; later calls wait for that start)."""
        if self._task is None:
            self._task = asyncio.create_task(self._serve(), name="mcp-session-manager")
        if self._started.is_set() and not self._task.done():
            return
        started = asyncio.create_task(self._started.wait())
        try:
            await asyncio.wait({self._task, started}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            started.cancel()
        if self._task.done():
            # The manager can run only once: a failed or stopped one stays down.
            self._task.result()
            raise RuntimeError("the MCP session manager has stopped")

    async def stop(self) -> None:
        """Stop the session manager and this process's shared change listener."""
        self._stop.set()
        if self._task is not None:
            await self._task
        await awaiting.close_change_hub()

    async def _serve(self) -> None:
        async with self.manager.run():
            self._started.set()
            await self._stop.wait()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.start()  # at once when the lifespan already started it
        await self.manager.handle_request(scope, receive, send)  # type: ignore[arg-type]


def guarded(
    app: ASGIApp,
    *,
    allowed_hosts: list[str] | None = None,
    allowed_origins: tuple[str, ...] = (),
) -> ASGIApp:
    """``app`` behind the API's boundary guards and a tenant key (module docstring)."""
    origins = (*django_settings.EFFECT_BROKER_MCP_ALLOWED_ORIGINS, *allowed_origins)
    return QueryCredentialGuard(
        body_limits(
            OriginGuard(
                BearerTenant(StrictJsonBody(app), allowed_hosts=allowed_hosts),
                allowed_origins=origins,
            )
        )
    )


class McpMount:
    """ASGI: ``/mcp`` to the MCP endpoint (behind ``guarded``), everything else to
    ``api``. The lifespan goes to ``api`` as it is; its startup also starts the MCP
    session manager, and its shutdown stops it before ``api`` closes its pools."""

    def __init__(self, api: ASGIApp, endpoint: McpEndpoint) -> None:
        self.api = api
        self.endpoint = endpoint
        # The REST API's Host rule, applied to /mcp too (BearerTenant).
        self.mcp = guarded(endpoint, allowed_hosts=list(django_settings.ALLOWED_HOSTS))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
        elif scope["type"] == "http" and scope.get("path") in (MCP_PATH, MCP_PATH + "/"):
            await self.mcp(scope, receive, send)
        else:
            await self.api(scope, receive, send)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def hooked_receive() -> dict[str, Any]:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.endpoint.start()
            elif message["type"] == "lifespan.shutdown":
                try:
                    await self.endpoint.stop()
                except Exception:  # a failed stop must not hang the API's shutdown
                    logger.exception("MCP stop failed", extra={"action": "mcp"})
            return message

        await self.api(scope, hooked_receive, send)


async def _health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


def http_app(settings: McpSettings, *, host: str) -> ASGIApp:
    """The standalone streamable HTTP app: ``/mcp`` behind a tenant key, ``/healthz``
    open, for ``effect-broker mcp --transport http``."""
    transport_security = None
    loopback = host in ("127.0.0.1", "localhost", "::1")
    if loopback:
        # As the SDK does for a local bind: refuse a rebound DNS name.
        transport_security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=list(LOOPBACK_ORIGINS),
        )
    endpoint = McpEndpoint(settings, transport_security=transport_security)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await endpoint.start()
        try:
            yield
        finally:
            await endpoint.stop()

    app = Starlette(
        routes=[Route(MCP_PATH, endpoint), Route("/healthz", _health)],
        lifespan=lifespan,
    )
    if loopback:
        return guarded(app, allowed_origins=LOOPBACK_ORIGINS)
    # Any other bind answers whatever name reaches it: the API's Host rule (issue 19:
    # no Host or Origin check at all on a non-loopback bind).
    return guarded(app, allowed_hosts=list(django_settings.ALLOWED_HOSTS))
