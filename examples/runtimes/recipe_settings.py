"""What every runtime recipe reads: where the broker is, the tenant's API key, the
PostgreSQL database the runtime keeps its own state in, and the order to charge.

The defaults fit ``effect-broker dev``: its API on port 8000 and its simulated
payment target behind the ``charge_idempotent`` tool.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from effect_broker.client import AsyncBrokerClient, BrokerClient

#: The dev stack's idempotent charge (``effect-broker dev``).
TOOL = "charge_idempotent"
#: Seconds between two looks at an effect that only an operator can settle.
POLL_SECONDS = 10.0


def _required(name: str, how: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        raise SystemExit(f"set {name}: {how}")
    return value


def broker_url() -> str:
    """The broker's API (``EFFECT_BROKER_URL``, default the dev stack's)."""
    return os.environ.get("EFFECT_BROKER_URL", "http://127.0.0.1:8000")


def api_key() -> str:
    """The tenant's API key (``EFFECT_BROKER_API_KEY``)."""
    return _required("EFFECT_BROKER_API_KEY", "the key `effect-broker dev` printed")


def broker() -> BrokerClient:
    """A client for one step; close it with ``with``."""
    return BrokerClient(broker_url(), api_key())


def async_broker() -> AsyncBrokerClient:
    """An asyncio client for one activity; close it with ``async with``."""
    return AsyncBrokerClient(broker_url(), api_key())


def runtime_database_url() -> str:
    """Where the runtime keeps its own state (``RUNTIME_DATABASE_URL``)."""
    return _required(
        "RUNTIME_DATABASE_URL",
        "a PostgreSQL URL, e.g. $(effect-broker db url --dbname checkout)",
    )


def parse_order(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    """The order to charge, from the command line."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--order", required=True, help="the order to charge")
    parser.add_argument("--amount-minor", type=int, default=1999)
    parser.add_argument("--currency", default="EUR")
    parser.add_argument("--tool", default=TOOL, help=f"the broker tool (default {TOOL})")
    parser.add_argument(
        "--poll",
        type=float,
        default=POLL_SECONDS,
        help="seconds between looks at an effect that awaits an operator",
    )
    return parser.parse_args(argv)


def charge_arguments(options: argparse.Namespace) -> dict[str, Any]:
    """The tool's arguments for the order."""
    return {
        "order": options.order,
        "amount_minor": options.amount_minor,
        "currency": options.currency,
    }
