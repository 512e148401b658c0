"""``effect-broker tenants create NAME | list``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from effect_broker.models import Tenant
from effect_broker.services.tenants import create_tenant


class Command(BaseCommand):
    help = "Create a tenant (prints its API key once) or list tenants."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a tenant and print its API key")
        create.add_argument("name")
        sub.add_parser("list", help="list tenants")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "create":
            tenant, api_key = create_tenant(options["name"])
            self.stdout.write(f"tenant {tenant.name} id={tenant.id}")
            self.stdout.write(f"api key (shown once): {api_key}")
            return
        for tenant in Tenant.objects.order_by("name"):
            state = "disabled" if tenant.disabled else "enabled"
            self.stdout.write(f"{tenant.id}  {tenant.name}  {state}")
