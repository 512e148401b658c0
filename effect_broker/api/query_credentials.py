"""Credentials in a query string are refused, and kept out of the access log (ASGI
middleware).

Issue 12: a key passed as ``?api_key=`` landed in the access log, where anyone who
reads logs can use it. A query string is the wrong place for a credential (URLs are
logged, cached and sent on as referrers), so a request carrying one - a parameter
named like a credential, or any value shaped like a broker key (``eb_...``,
``ebop_...``) - is refused with 400 ``credential_in_query`` before the application
runs, and the offending parameters are removed from the request's ``scope``, which is
what the server's access log line is built from when the response is sent. The key
is then as exposed as it was the moment it was sent: rotate it.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import parse_qsl, urlencode

from effect_broker.api.admission import ASGIApp, Receive, Scope, Send
from effect_broker.api.problems import PROBLEM_JSON, problem_body
from effect_broker.domain.errors import CredentialInQueryError

logger = logging.getLogger(__name__)

#: Parameter names refused whatever their value (compared lower-cased).
CREDENTIAL_NAMES = frozenset(
    {"api_key", "apikey", "key", "access_token", "token", "auth", "authorization"}
)
#: The shape of the broker's own credentials (tenant keys ``eb_``, operator tokens
#: ``ebop_``, each a prefix and at least 32 URL-safe characters), so that an ordinary
#: value such as an operation prefix ``eb_order:`` is not taken for one.
_BROKER_CREDENTIAL = re.compile(r"(?:eb|ebop)_[A-Za-z0-9_-]{32,}")


def _is_credential(name: str, value: str) -> bool:
    return (
        name.strip().lower() in CREDENTIAL_NAMES
        or _BROKER_CREDENTIAL.fullmatch(value.strip()) is not None
    )


class QueryCredentialGuard:
    """ASGI middleware: 400 ``credential_in_query``, and the credential scrubbed from
    ``scope`` (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("query_string", b"") if scope["type"] == "http" else b""
        if not raw:
            await self.app(scope, receive, send)
            return
        pairs = parse_qsl(raw.decode("latin-1"), keep_blank_values=True)
        refused = [name for name, value in pairs if _is_credential(name, value)]
        if not refused:
            await self.app(scope, receive, send)
            return
        # In place: the server logs from this very dict once the response is sent.
        scope["query_string"] = urlencode(
            [(n, v) for n, v in pairs if not _is_credential(n, v)]
        ).encode("latin-1")
        logger.warning(
            "refused: credential in query string",
            extra={"action": "credential_in_query", "path": scope.get("path")},
        )
        body = problem_body(
            CredentialInQueryError.http_status,
            CredentialInQueryError.code,
            CredentialInQueryError.default_message(),
        )
        await send(
            {
                "type": "http.response.start",
                "status": CredentialInQueryError.http_status,
                "headers": [
                    (b"content-type", PROBLEM_JSON.encode()),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def refused_names(query_string: str) -> list[str]:
    """The parameters of ``query_string`` that carry a credential."""
    pairs = parse_qsl(query_string, keep_blank_values=True)
    return [name for name, value in pairs if _is_credential(name, value)]


class WsgiQueryCredentialGuard:
    """WSGI middleware (``effect-broker serve --wsgi``): the same 400
    ``credential_in_query``. The access log cannot be scrubbed from here (gunicorn
    logs from its own parse of the request line), so ``serve --wsgi`` logs paths
    without their query string instead."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if not refused_names(environ.get("QUERY_STRING", "")):
            return self.app(environ, start_response)
        logger.warning(
            "refused: credential in query string",
            extra={"action": "credential_in_query", "path": environ.get("PATH_INFO")},
        )
        body = problem_body(
            CredentialInQueryError.http_status,
            CredentialInQueryError.code,
            CredentialInQueryError.default_message(),
        )
        start_response(
            f"{CredentialInQueryError.http_status} Bad Request",
            [("Content-Type", PROBLEM_JSON), ("Content-Length", str(len(body)))],
        )
        return [body]
