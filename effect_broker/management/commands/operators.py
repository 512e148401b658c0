"""``effect-broker operators create-token|list-tokens|revoke-token``: operator tokens.

An operator token authenticates the operator API (``POST /v1/effects/{id}/resolve``
and ``/fork``) as the staff user who owns it. It is printed once and stored only as a
SHA-256 digest; the user's permission is re-checked on every call.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from effect_broker.management.base import BrokerCommand
from effect_broker.models import OperatorToken
from effect_broker.services import operators


class Command(BrokerCommand):
    help = (
        "Create, list or revoke operator tokens. A token acts as its owning staff user, "
        f"who must be active and hold {operators.RESOLVE_PERMISSION}."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        create = sub.add_parser(
            "create-token", help="create a token for a staff user (printed once)"
        )
        create.add_argument("--user", required=True, metavar="USERNAME")
        create.add_argument("--name", default="", metavar="LABEL")
        sub.add_parser("list-tokens", help="list tokens (never the tokens themselves)")
        revoke = sub.add_parser("revoke-token", help="revoke a token by id")
        revoke.add_argument("token_id")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "create-token":
            row, token = operators.create_token(options["user"], name=options["name"])
            self.stdout.write(f"operator token {row.id} for {row.user.get_username()}")
            self.stdout.write(f"token (shown once): {token}")
        elif action == "revoke-token":
            row = operators.revoke_token(options["token_id"])
            self.stdout.write(f"revoked {row.id} ({row.name})")
        else:
            for row in OperatorToken.objects.select_related("user").order_by(
                "created_at"
            ):
                state = "revoked" if row.revoked_at else "active"
                self.stdout.write(
                    f"{row.id}  {row.user.get_username()}  {row.name}  {state}"
                )
