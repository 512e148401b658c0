"""``effect-broker submit``: reserve an effect from the command line (prints JSON)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser

from effect_broker.domain.canonical import parse_json_strict
from effect_broker.domain.errors import InvalidRequestError, TenantNotFoundError
from effect_broker.domain.records import EffectRequest
from effect_broker.management.base import BrokerCommand
from effect_broker.models import Tenant
from effect_broker.services.submission import submit


class Command(BrokerCommand):
    help = (
        "Reserve an effect for a tenant and print the result as one JSON line. "
        "Submitting the same operation key and arguments again is a replay of the same "
        "effect; different arguments are refused with payload_conflict."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="tenant name")
        parser.add_argument("--tool", required=True, help="tool name bound to a contract")
        parser.add_argument(
            "--operation-key", required=True, help="stable business key, e.g. order:42:v1"
        )
        parser.add_argument(
            "--arguments", default="{}", help="the tool arguments as a JSON object"
        )
        parser.add_argument("--requested-by", default="cli")

    def handle(self, *args: Any, **options: Any) -> None:
        arguments = parse_json_strict(options["arguments"])
        if not isinstance(arguments, dict):
            raise InvalidRequestError("--arguments must be a JSON object")
        tenant = Tenant.objects.filter(name=options["tenant"]).first()
        if tenant is None:
            raise TenantNotFoundError(f"no tenant named {options['tenant']!r}")
        reservation = submit(
            tenant,
            EffectRequest(
                operation_key=options["operation_key"],
                tool=options["tool"],
                arguments=arguments,
                requested_by=options["requested_by"],
            ),
        )
        effect = reservation.effect
        self.stdout.write(
            json.dumps(
                {
                    "effect_id": effect.effect_id,
                    "status": effect.status.value,
                    "created": reservation.created,
                    "replayed": reservation.replayed,
                }
            )
        )
