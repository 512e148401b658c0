"""``effect-broker tenants create|list|rotate-key|disable|enable``.

An API key is printed once, on ``create`` and ``rotate-key``; only its SHA-256 digest
is stored, so a lost key is replaced, never recovered. A disabled tenant's key is
refused by the API and the MCP server with 403 ``tenant_disabled``.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from effect_broker.management.base import BrokerCommand
from effect_broker.management.tables import render_table, to_json
from effect_broker.models import Tenant
from effect_broker.services import tenants


def _row(tenant: Tenant) -> dict[str, Any]:
    return {
        "id": str(tenant.id),
        "name": tenant.name,
        "state": "disabled" if tenant.disabled else "enabled",
        "created_at": tenant.created_at.isoformat(),
    }


class Command(BrokerCommand):
    help = (
        "Manage tenants: create one (its API key is printed once), list them, rotate "
        "a key (the old one stops working at once), disable or enable one."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON")
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        create = sub.add_parser(
            "create", help="create a tenant and print its API key once"
        )
        create.add_argument("name", help="unique tenant name (1-200 characters)")
        sub.add_parser("list", help="list tenants (never their keys)")
        for action, text in (
            ("rotate-key", "replace a tenant's API key and print the new one once"),
            ("disable", "refuse the tenant's API key from now on (403 tenant_disabled)"),
            ("enable", "accept the tenant's API key again"),
        ):
            one = sub.add_parser(action, help=text)
            one.add_argument("tenant", metavar="NAME_OR_ID")
        # --json is accepted after the action too (``tenants list --json``).
        for action_parser in sub.choices.values():
            action_parser.add_argument(
                "--json",
                action="store_true",
                default=False,
                dest="json_after",
                help="print JSON",
            )

    def handle(self, *args: Any, **options: Any) -> None:
        as_json = options["json"] or options.get("json_after", False)
        action = options["action"]
        if action == "list":
            rows = [_row(t) for t in Tenant.objects.order_by("name")]
            if as_json:
                self.stdout.write(to_json(rows))
            elif rows:
                self.stdout.write(
                    render_table(
                        ("ID", "NAME", "STATE", "CREATED"),
                        [(r["id"], r["name"], r["state"], r["created_at"]) for r in rows],
                    )
                )
            else:
                self.stdout.write(
                    "no tenants; create one: effect-broker tenants create NAME"
                )
            return
        api_key: str | None = None
        if action == "create":
            tenant, api_key = tenants.create_tenant(options["name"])
        elif action == "rotate-key":
            tenant, api_key = tenants.rotate_api_key(options["tenant"])
        else:
            tenant = tenants.set_disabled(options["tenant"], disabled=action == "disable")
        row = _row(tenant)
        if as_json:
            self.stdout.write(
                to_json({**row, **({"api_key": api_key} if api_key else {})})
            )
            return
        self.stdout.write(f"tenant {tenant.name} id={tenant.id} {row['state']}")
        if api_key:
            self.stdout.write(f"api key (shown once): {api_key}")
