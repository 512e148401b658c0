"""``effect-broker tools list|pause|resume|pauses``: the operator's controls on dispatch.

Issue 24, item 7. ``pause`` stops new sends of a tool, a contract or a tenant (or a
combination) until ``resume``: the effects wait, none is failed, and an attempt in
flight finishes. Both act on an operator's authority (``--as USERNAME``: an active
staff user holding ``effect_broker.resolve_effect``), recorded with the reason.
``list`` shows every contract's tool with its dispatch limits and what pauses it.
"""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

from django.core.management.base import CommandParser

from effect_broker.domain.pauses import Pause
from effect_broker.management.base import BrokerCommand
from effect_broker.management.tables import render_table
from effect_broker.services import operators, pauses
from effect_broker.services.runtime import get_runtime

_SCOPE_HELP = (
    "A scope is a TOOL, a --contract (NAME for every version, or NAME@VERSION), a "
    "--tenant, or several: every one given must match."
)


def _add_scope(parser: CommandParser, *, resume: bool = False) -> None:
    of = "the paused scope's " if resume else ""
    parser.add_argument(
        "tool", nargs="?", metavar="TOOL", help=f"{of}tool (a contract's tool)"
    )
    parser.add_argument(
        "--contract",
        metavar="NAME[@VERSION]",
        help=f"{of}contract: every version, or one",
    )
    parser.add_argument("--tenant", metavar="NAME", help=f"{of}tenant (only its effects)")


def _wrapped(text: str) -> str:
    """A description wrapped as argparse would (the epilogs' examples keep their
    lines, so the parser formats raw text)."""
    return textwrap.fill(text, width=86)


def _add_acting_user(parser: CommandParser) -> None:
    parser.add_argument(
        "--as",
        dest="acting_user",
        required=True,
        metavar="USERNAME",
        help="the staff user you act as (active, staff, holds "
        f"{operators.RESOLVE_PERMISSION}); recorded with the pause",
    )


class Command(BrokerCommand):
    help = (
        "Pause and resume dispatch per tool, contract or tenant, and list the tools "
        "with their dispatch limits (max_in_flight, rate_limit) and pauses. A paused "
        "effect waits: it is never failed for a pause, and an attempt already in "
        "flight finishes. This is a privileged local tool."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        sub.add_parser(
            "list",
            help="every contract's tool, its limits and what pauses it",
            description="Every contract in the contracts file with its dispatch limits "
            "and the active pauses covering its tool.",
        )
        pause = sub.add_parser(
            "pause",
            help="pause dispatch of a tool, a contract or a tenant",
            description=_wrapped(
                "Pause dispatch: every effect in the scope that has not been sent "
                "waits (prepared or retryable, and an idempotent effect's same-key "
                "resend after an unknown outcome) until the pause is resumed. Nothing "
                "is failed; an attempt in flight finishes; a reconcilable effect's "
                "lookup still runs (it only reads). Callers see the reason on the "
                "effect. " + _SCOPE_HELP
            ),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog="examples:\n"
            "  effect-broker tools pause charge_card --reason 'stripe incident "
            "INC-42' --as alice\n"
            "  effect-broker tools pause --contract payments.charge@2 --reason "
            "'bad deploy' --as alice\n"
            "  effect-broker tools pause --tenant acme --reason 'fraud review' --as bob",
        )
        _add_scope(pause)
        pause.add_argument(
            "--reason",
            required=True,
            metavar="TEXT",
            help="why; shown to callers on every effect it holds",
        )
        _add_acting_user(pause)
        resume = sub.add_parser(
            "resume",
            help="resume a pause: the effects it held are sent",
            description=_wrapped(
                "Resume one active pause, named by --id or by its exact scope (as it "
                "was paused); the effects it held are deferred for dispatch again "
                "(within the contract's limits)."
            ),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog="examples:\n"
            "  effect-broker tools resume charge_card --as alice\n"
            "  effect-broker tools resume --id 0190... --reason 'incident over' --as bob",
        )
        _add_scope(resume, resume=True)
        resume.add_argument("--id", metavar="PAUSE_ID", help="the pause to resume")
        resume.add_argument(
            "--reason", default="", metavar="TEXT", help="why; recorded with the pause"
        )
        _add_acting_user(resume)
        listing = sub.add_parser(
            "pauses",
            help="list active pauses (--all: resumed ones too)",
            description="Active pauses, oldest first, with the effects each holds; "
            "--all adds the resumed ones, newest first.",
        )
        listing.add_argument("--all", action="store_true", help="include resumed ones")
        listing.add_argument(
            "--limit", type=int, default=100, metavar="N", help="at most N (default 100)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "list":
            self._list()
        elif action == "pauses":
            self._pauses(options)
        elif action == "pause":
            self._pause(options)
        else:
            self._resume(options)

    def _pause(self, options: dict[str, Any]) -> None:
        paused = pauses.pause(
            tool=options["tool"],
            contract=options["contract"],
            tenant=options["tenant"],
            reason=options["reason"],
            operator=operators.operator_by_username(options["acting_user"]),
        )
        held = pauses.held_count(paused.pause_id)
        self.stdout.write(
            f"paused {paused.describe()} (pause {paused.pause_id}); {held} effect(s) "
            "wait; attempts in flight finish"
        )

    def _resume(self, options: dict[str, Any]) -> None:
        operator = operators.operator_by_username(options["acting_user"])
        resumed = pauses.resume(
            options["id"],
            tool=options["tool"],
            contract=options["contract"],
            tenant=options["tenant"],
            operator=operator,
            reason=options["reason"],
        )
        self.stdout.write(
            f"resumed {resumed.pause.describe()} (pause {resumed.pause.pause_id}); "
            f"{resumed.redeferred} waiting effect(s) queued for dispatch"
        )

    def _pauses(self, options: dict[str, Any]) -> None:
        found = pauses.list_pauses(include_resumed=options["all"], limit=options["limit"])
        if not found:
            self.stdout.write("(no pause)" if options["all"] else "(no active pause)")
            return
        rows = [
            (
                p.pause_id,
                p.describe(),
                "active" if p.active else f"resumed by {p.resumed_by}",
                str(pauses.held_count(p.pause_id)) if p.active else "-",
                p.paused_by,
                f"{p.paused_at:%Y-%m-%dT%H:%M:%SZ}",
                p.reason,
            )
            for p in found
        ]
        self.stdout.write(
            render_table(("ID", "SCOPE", "STATE", "HELD", "BY", "SINCE", "REASON"), rows)
        )

    def _list(self) -> None:
        active = pauses.active_pauses()
        rows = []
        for contract in get_runtime().registry:
            limits = contract.limits
            rows.append(
                (
                    contract.tool,
                    contract.label + ("" if contract.active else " (inactive)"),
                    contract.safety.value,
                    "-" if limits.max_in_flight is None else str(limits.max_in_flight),
                    "-" if limits.rate_limit is None else f"{limits.rate_limit:g}/s",
                    _paused_text(contract.tool, contract.name, contract.version, active),
                )
            )
        self.stdout.write(
            render_table(
                ("TOOL", "CONTRACT", "SAFETY", "MAX IN FLIGHT", "RATE", "PAUSED"), rows
            )
        )


def _paused_text(tool: str, name: str, version: str, active: list[Pause]) -> str:
    """The active pauses covering a contract's effects (all, or some tenants')."""
    parts = []
    for p in active:
        scope = p.scope
        if scope.tool not in (None, tool) or scope.contract_name not in (None, name):
            continue
        if scope.contract_version not in (None, version):
            continue
        parts.append(
            f"{'tenant ' + (p.tenant_name or '?') if scope.tenant_id else 'yes'} "
            f"({p.reason})"
        )
    return "; ".join(parts) or "-"
