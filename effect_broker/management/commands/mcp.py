"""``effect-broker mcp``: the MCP server (issue 10, item 1), over stdio or HTTP."""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
from django.core.management.base import CommandParser

from effect_broker.domain.errors import EffectBrokerError
from effect_broker.management.base import BrokerCommand
from effect_broker.mcp.server import (
    DEFAULT_WAIT_SECONDS,
    STRICT_ENV,
    WAIT_ENV,
    mcp_settings_from_env,
)
from effect_broker.mcp.transports import API_KEY_ENV, http_app, serve_stdio
from effect_broker.services.tenants import authenticate


class Command(BrokerCommand):
    help = (
        "Serve the MCP server: management tools (get_effect, list_unknown_effects, "
        "get_receipt, request_reconciliation) and one proxy tool per contract with an "
        "exposed [contract.mcp] table. stdio serves the tenant whose API key is in "
        f"${API_KEY_ENV}; http serves streamable HTTP at /mcp, each request with "
        "'Authorization: Bearer <tenant API key>', and /healthz."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--transport",
            choices=["stdio", "http"],
            default="stdio",
            help=f"stdio (one tenant, key from ${API_KEY_ENV}) or http (default: stdio)",
        )
        parser.add_argument("--host", default="127.0.0.1", help="http: bind address")
        parser.add_argument("--port", type=int, default=8765, help="http: port")
        parser.add_argument(
            "--wait-seconds",
            type=float,
            default=None,
            help="how long a proxy call waits for its effect to settle before answering "
            f"'still running' (default ${WAIT_ENV} or {DEFAULT_WAIT_SECONDS:g})",
        )
        parser.add_argument(
            "--no-strict",
            action="store_true",
            help="also list and forward [[passthrough]] tools that are not verified "
            "read-only (their description warns that the broker gives no guarantee); "
            f"default: strict, unless ${STRICT_ENV}=0",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            settings = mcp_settings_from_env(
                options["wait_seconds"], no_strict=options["no_strict"]
            )
        except EffectBrokerError as exc:
            # One line on stderr: with stdio, stdout belongs to the MCP protocol.
            sys.stderr.write(f"effect-broker mcp: refusing to start: {exc}\n")
            raise SystemExit(2) from None
        if options["transport"] == "stdio":
            key = os.environ.get(API_KEY_ENV, "").strip()
            try:
                tenant = authenticate(key)
            except EffectBrokerError as exc:
                # One line on stderr: stdout belongs to the MCP protocol.
                sys.stderr.write(
                    f"effect-broker mcp: refusing to start: ${API_KEY_ENV} must hold "
                    f"a tenant API key ({exc.code}: {exc})\n"
                )
                raise SystemExit(2) from None
            anyio.run(serve_stdio, tenant, settings)
            return
        import uvicorn

        uvicorn.run(
            http_app(settings, host=options["host"]),
            host=options["host"],
            port=options["port"],
            log_level="info",
        )
