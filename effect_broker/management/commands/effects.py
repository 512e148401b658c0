"""``effect-broker effects list|inspect|reconcile|resolve|fork|approve|deny``: the
operator's console.

This is a privileged local tool: whoever can run it can read the database, so it acts
across tenants. ``list`` shows every tenant unless ``--tenant`` narrows it, and the other
actions look up the tenant that owns the effect themselves (no ``--tenant`` needed). The
HTTP API, by contrast, only ever sees the caller's own tenant.

``resolve``, ``fork``, ``approve`` and ``deny`` write on an operator's authority:
``--as USERNAME`` names the acting staff user, who must exist, be active and staff,
and hold ``effect_broker.resolve_effect`` (checked by the service); the events carry
that name.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import CommandParser

from effect_broker.domain.canonical import canonical_json, parse_json_strict
from effect_broker.domain.errors import InvalidRequestError
from effect_broker.domain.evidence import EVIDENCE_SHAPES
from effect_broker.domain.states import EffectStatus
from effect_broker.management.base import BrokerCommand
from effect_broker.services import (
    approvals,
    forking,
    inspection,
    operators,
    pauses,
    resolution,
)
from effect_broker.services.runtime import get_runtime

_STATUSES = [s.value for s in EffectStatus]


#: ``effects resolve`` flags: one per operator verdict (mutually exclusive).
_RESOLUTION_FLAGS = (
    (
        "--succeeded",
        resolution.Resolution.SUCCEEDED,
        "proof of success: settle with a receipt (needs --evidence with "
        + ", ".join(EVIDENCE_SHAPES["succeeded"])
        + ")",
    ),
    (
        "--not-committed",
        resolution.Resolution.NOT_COMMITTED,
        "proof the target never applied it: requeue where the safety class allows "
        "(needs --evidence with " + ", ".join(EVIDENCE_SHAPES["not_committed"]) + ")",
    ),
    (
        "--failed",
        resolution.Resolution.FAILED,
        "mark final failure: never dispatched again",
    ),
)


class Command(BrokerCommand):
    help = (
        "Operate on effects across tenants: list them, inspect an effect's state and "
        "event history (optionally as of an event sequence), request reconciliation, "
        "or resolve an unknown outcome with one of three explicit choices. The tenant "
        "of an effect is looked up from its id; this is a privileged local tool."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        listing = sub.add_parser(
            "list",
            help="list effects, newest first",
            description="List effects across tenants, newest first. An effect marked "
            "'*' needs an operator: nothing automatic will settle it.",
        )
        listing.add_argument("--tenant", metavar="NAME", help="only this tenant")
        listing.add_argument(
            "--status", choices=_STATUSES, help="only this status, e.g. outcome_unknown"
        )
        listing.add_argument("--tool", metavar="T", help="only this tool")
        listing.add_argument(
            "--limit", type=int, default=50, metavar="N", help="at most N rows (max 500)"
        )

        inspect = sub.add_parser(
            "inspect",
            help="show an effect's state and verified event history",
            description="Fold the stored events (verifying their digest chain) into the "
            "effect's state. Read-only: no adapter or target is ever called.",
        )
        inspect.add_argument("effect_id")
        inspect.add_argument(
            "--at-sequence",
            type=int,
            metavar="N",
            help="show the state as it was after event N",
        )

        reconcile = sub.add_parser(
            "reconcile",
            help="request reconciliation of an unknown outcome",
            description="Defer a reconcile job for an outcome_unknown effect. Unsafe "
            "effects are refused: no probe can settle them and they are never resent "
            "automatically; resolve them instead.",
        )
        reconcile.add_argument("effect_id")

        resolve = sub.add_parser(
            "resolve",
            help="resolve an outcome_unknown or manual_review effect",
            description="Resolve an effect an operator has investigated (the tenant is\n"
            "looked up from the id), acting as the staff user named by --as. There is\n"
            "no 'retry anyway': --not-committed requeues only with evidence that the\n"
            "target never applied the request, only if the contract's retry limit\n"
            "allows another attempt, never for an unsafe effect (fork it instead), not\n"
            "before a reconcilable effect's settlement deadline, and not after an\n"
            "idempotent effect's key retention.",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog="examples:\n"
            "  effect-broker effects resolve ID --succeeded --reason 'charge in the "
            "dashboard' \\\n"
            '      --evidence \'{"source": "stripe dashboard", "reference": "ch_1"}\' '
            "--external-id ch_1 --as alice\n"
            "  effect-broker effects resolve ID --failed --reason 'customer cancelled' "
            "--as bob",
        )
        resolve.add_argument("effect_id")
        choice = resolve.add_mutually_exclusive_group(required=True)
        for flag, verdict, help_text in _RESOLUTION_FLAGS:
            choice.add_argument(
                flag,
                dest="resolution",
                action="store_const",
                const=verdict.value,
                help=help_text,
            )
        resolve.add_argument(
            "--reason", required=True, metavar="TEXT", help="why; recorded in the event"
        )
        resolve.add_argument(
            "--evidence",
            metavar="JSON",
            help="a JSON object; stored encrypted (succeeded) and by digest in the event",
        )
        resolve.add_argument("--external-id", metavar="X", help="the target's object id")
        _add_acting_user(resolve)

        fork = sub.add_parser(
            "fork",
            help="continue an unresolved effect as a new effect under a new key",
            description="Fork an outcome_unknown or manual_review effect (spec 'Replay\n"
            "and time-travel semantics'): in one transaction, the old effect is\n"
            "settled failed_final (event resolved_forked, naming the fork) on your\n"
            "attestation that it never committed, and a NEW effect with the same\n"
            "tool and arguments is reserved under --new-operation-key and dispatched.",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog="example:\n"
            "  effect-broker effects fork ID --new-operation-key order:7:charge:v2 "
            "--as alice \\\n"
            "      --reason 'no charge in the export' \\\n"
            '      --evidence \'{"source": "stripe export", '
            '"checked_at": "2026-12-03T21:00:00Z"}\'',
        )
        fork.add_argument("effect_id")
        fork.add_argument(
            "--new-operation-key",
            required=True,
            metavar="KEY",
            help="the new business operation's key (must differ from the old one)",
        )
        fork.add_argument(
            "--reason", required=True, metavar="TEXT", help="why; recorded in the event"
        )
        fork.add_argument(
            "--evidence",
            required=True,
            metavar="JSON",
            help="a JSON object with " + ", ".join(EVIDENCE_SHAPES["fork"]),
        )
        _add_acting_user(fork)

        for verb, text in _DECISIONS.items():
            decide = sub.add_parser(
                verb,
                help=text[0],
                description=text[1],
                formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog=f"example:\n  effect-broker effects {verb} ID --as alice "
                f"--reason '{text[2]}'",
            )
            decide.add_argument("effect_id")
            decide.add_argument(
                "--reason",
                required=True,
                metavar="TEXT",
                help="why; recorded in the event with your name",
            )
            _add_acting_user(decide)

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "list":
            self._list(options)
        elif action == "inspect":
            self._inspect(options["effect_id"], options["at_sequence"])
        elif action == "reconcile":
            self._reconcile(options["effect_id"])
        elif action == "fork":
            self._fork(options)
        elif action in _DECISIONS:
            self._decide(action, options)
        else:
            self._resolve(options)

    def _list(self, options: dict[str, Any]) -> None:
        rows = inspection.list_for_operators(
            tenant_name=options["tenant"],
            status=EffectStatus(options["status"]) if options["status"] else None,
            tool=options["tool"],
            limit=options["limit"],
        )
        now = get_runtime().clock.now()
        table = [("ID", "TENANT", "OPERATION KEY", "TOOL", "SAFETY", "STATUS", "AGE")]
        for row in rows:
            effect = row.effect
            table.append(
                (
                    effect.effect_id,
                    row.tenant_name,
                    effect.operation_key,
                    effect.tool,
                    effect.safety.value,
                    effect.status.value + (" *" if row.needs_operator else ""),
                    _age(now, effect.created_at),
                )
            )
        widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
        for line in table:
            self.stdout.write(
                "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
            )
        if not rows:
            self.stdout.write("(no effects)")
        elif any(row.needs_operator for row in rows):
            self.stdout.write(
                "* needs an operator: effect-broker effects resolve ID ... "
                "(awaiting_approval: effects approve|deny ID ...)"
            )

    def _inspect(self, effect_id: str, at_sequence: int | None) -> None:
        tenant = inspection.tenant_of(effect_id)
        record = inspection.get_effect(tenant, effect_id)
        folded = inspection.history(tenant, effect_id, at_sequence)
        as_of = (
            "now"
            if folded.at_sequence == folded.latest_sequence
            else f"as of event {folded.at_sequence} of {folded.latest_sequence}"
        )
        self.stdout.write(f"effect     {record.effect_id}")
        self.stdout.write(f"tenant     {tenant.name}")
        self.stdout.write(f"operation  {record.operation_key}")
        self.stdout.write(f"tool       {record.tool}")
        self.stdout.write(
            f"contract   {record.contract_name}@{record.contract_version} "
            f"({record.safety.value})"
        )
        self.stdout.write(
            f"status     {folded.status.value} (version {folded.version}, {as_of})"
        )
        if folded.at_sequence == folded.latest_sequence:
            self.stdout.write(f"attempts   {record.attempt_count}")
            if record.receipt_id:
                self.stdout.write(f"receipt    {record.receipt_id}")
            links = inspection.fork_links(record)
            if links.forked_from:
                self.stdout.write(f"forked     from {links.forked_from}")
            if links.forked_to:
                self.stdout.write(f"forked     to {links.forked_to}")
            if record.status is EffectStatus.AWAITING_APPROVAL:
                deadline = record.next_action_at
                self.stdout.write(
                    "needs      an operator's approval until "
                    f"{deadline:%Y-%m-%dT%H:%M:%SZ} (effect-broker effects "
                    "approve|deny)"
                    if deadline
                    else "needs      an operator's approval"
                )
            elif inspection.needs_operator(record):
                self.stdout.write(
                    "needs      an operator (effect-broker effects resolve)"
                )
            held = pauses.pause_holding(record)
            if held is not None:
                self.stdout.write(
                    f"paused     {held.describe()} by {held.paused_by} ({held.reason}); "
                    f"waits for: effect-broker tools resume --id {held.pause_id}"
                )
        self.stdout.write(f"chain      verified ({folded.latest_sequence} events)")
        self.stdout.write("")
        for event in folded.events:
            facts = event.facts
            move = f"{facts.old_status or '-'} -> {facts.new_status}"
            meta = canonical_json(dict(facts.metadata)).decode() if facts.metadata else ""
            self.stdout.write(
                f"{facts.sequence:>4}  {facts.occurred_at:%Y-%m-%dT%H:%M:%SZ}  "
                f"{facts.event_type:<26} {move:<34} {facts.actor}  {meta}".rstrip()
            )

    def _reconcile(self, effect_id: str) -> None:
        tenant = inspection.tenant_of(effect_id)
        asked = resolution.request_reconciliation(tenant, effect_id, requested_by="cli")
        status = asked.effect.status.value
        if asked.deferred:
            self.stdout.write(f"reconcile requested for {effect_id} (status {status})")
        else:
            self.stdout.write(f"nothing to reconcile: {effect_id} is {status}")

    def _resolve(self, options: dict[str, Any]) -> None:
        operator = operators.operator_by_username(options["acting_user"])
        evidence = _evidence(options["evidence"])
        effect_id = options["effect_id"]
        tenant = inspection.tenant_of(effect_id)
        before = inspection.get_effect(tenant, effect_id).status.value
        after = resolution.resolve(
            tenant,
            effect_id,
            options["resolution"],
            operator=operator,
            reason=options["reason"],
            evidence=evidence,
            external_id=options["external_id"],
        )
        line = f"resolved {after.effect_id}: {before} -> {after.status.value}"
        if after.receipt_id:
            line += f" (receipt {after.receipt_id})"
        if after.status is EffectStatus.PREPARED:
            line += " (requeued for dispatch)"
        self.stdout.write(line)

    def _fork(self, options: dict[str, Any]) -> None:
        operator = operators.operator_by_username(options["acting_user"])
        effect_id = options["effect_id"]
        forked = forking.fork(
            inspection.tenant_of(effect_id),
            effect_id,
            operator=operator,
            new_operation_key=options["new_operation_key"],
            reason=options["reason"],
            evidence=_evidence(options["evidence"]),
        )
        self.stdout.write(
            f"forked {forked.old.effect_id} ({forked.old.status.value}) -> "
            f"{forked.new.effect_id} {forked.new.operation_key} "
            f"({forked.new.status.value}, queued for dispatch)"
        )

    def _decide(self, verb: str, options: dict[str, Any]) -> None:
        operator = operators.operator_by_username(options["acting_user"])
        effect_id = options["effect_id"]
        decide = approvals.approve if verb == "approve" else approvals.deny
        after = decide(
            inspection.tenant_of(effect_id),
            effect_id,
            operator=operator,
            reason=options["reason"],
        )
        done, what = (
            ("approved", "queued for dispatch, once")
            if verb == "approve"
            else ("denied", "never sent, and it never will be")
        )
        self.stdout.write(
            f"{done} {after.effect_id}: awaiting_approval -> {after.status.value} "
            f"({what})"
        )


#: ``effects approve`` and ``effects deny``: help, description, an example reason.
_DECISIONS = {
    "approve": (
        "approve an effect awaiting approval (it is then dispatched once)",
        "Approve an awaiting_approval effect, acting as the staff user named by --as.\n"
        "The approval is bound to the effect's arguments and the contract it is\n"
        "pinned to, and consumed by its one dispatch: a second approval is refused\n"
        "(already_approved). Read its arguments first in the admin (an audited\n"
        "read); past its deadline it is refused (approval_expired).",
        "invoice 1234 checked",
    ),
    "deny": (
        "deny an effect awaiting approval (failed_final, never sent)",
        "Deny an awaiting_approval effect, acting as the staff user named by --as:\n"
        "it ends failed_final and is never sent; your name and reason are in its\n"
        "events.",
        "amount does not match the invoice",
    ),
}


def _add_acting_user(parser: CommandParser) -> None:
    parser.add_argument(
        "--as",
        dest="acting_user",
        required=True,
        metavar="USERNAME",
        help="the staff user you act as (active, staff, holds "
        f"{operators.RESOLVE_PERMISSION}); recorded in the events",
    )


def _evidence(raw: str | None) -> dict[str, Any]:
    if raw is None:
        return {}
    parsed = parse_json_strict(raw)
    if not isinstance(parsed, dict):
        raise InvalidRequestError("--evidence must be a JSON object")
    return parsed


def _age(now: datetime, then: datetime) -> str:
    seconds = max(0, int((now - then) / timedelta(seconds=1)))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    if minutes:
        return f"{minutes}m{seconds}s"
    return f"{seconds}s"
