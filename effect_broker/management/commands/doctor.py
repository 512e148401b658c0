"""``effect-broker doctor [--json]``: what is wrong with this deployment, if anything."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from effect_broker.domain.contracts import parse_duration
from effect_broker.management.base import BrokerCommand
from effect_broker.management.tables import render_table, to_json
from effect_broker.services.diagnosis import DoctorOptions, run_checks

_MARK = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skipped": "skip"}
_DETAIL_LINES = 10


def _detail_line(check: str, detail: dict[str, Any]) -> str:
    """One readable line for one detail row of a failing or warning check."""
    if check == "waiting_effects":
        return (
            f"{detail['tool']}: {detail['count']} {detail['status']}, oldest "
            f"{detail['oldest_effect_id']} waiting {detail['oldest_age']}"
        )
    if check == "workers":
        return (
            f"worker {detail['worker_id']}: {detail['state']}, last heartbeat "
            f"{detail['heartbeat_age_seconds']:g}s ago, "
            f"{detail['running']} job(s) running"
        )
    if check == "pauses":
        return (
            f"pause {detail['pause_id']}: {detail['scope']}, by {detail['paused_by']} "
            f"{detail['age']} ago ({detail['reason']}); {detail['held_effects']} "
            "effect(s) wait"
        )
    if "message" in detail:  # a contract problem: file:contract:field: reason
        return str(detail["message"])
    return ", ".join(
        f"{key}={value}" for key, value in detail.items() if key not in ("why",)
    ) + (f" ({detail['why']})" if "why" in detail else "")


class Command(BrokerCommand):
    help = (
        "Check the database, migrations, procrastinate schema, master key, contracts, "
        "workers and stalled jobs, effects waiting for an operator, dispatch pauses, "
        "key retention against the retry horizon, and recent operation keys. Exit 1 "
        "when any check fails (FAIL); warnings (WARN) exit 0 unless --strict."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.add_argument(
            "--max-waiting-age",
            default="1h",
            metavar="DURATION",
            help="an outcome_unknown/manual_review effect older than this fails "
            "(e.g. 30m, 4h; default 1h)",
        )
        parser.add_argument(
            "--lint-sample",
            type=int,
            default=1000,
            metavar="N",
            help="how many of the newest effects the operation-key lint reads "
            "(default 1000)",
        )
        parser.add_argument(
            "--strict", action="store_true", help="exit 1 on warnings too"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            max_age = parse_duration(options["max_waiting_age"])
        except ValueError as exc:
            raise CommandError(f"--max-waiting-age: {exc}") from exc
        if options["lint_sample"] < 1:
            raise CommandError("--lint-sample must be at least 1")
        checks = run_checks(
            DoctorOptions(max_waiting_age=max_age, lint_sample=options["lint_sample"])
        )
        failed = [c for c in checks if c.status == "fail"]
        warned = [c for c in checks if c.status == "warn"]
        if options["json"]:
            self.stdout.write(
                to_json(
                    {
                        "ok": not failed,
                        "failed": [c.name for c in failed],
                        "warnings": [c.name for c in warned],
                        "checks": [c.as_dict() for c in checks],
                    }
                )
            )
        else:
            self.stdout.write(
                render_table(
                    ("CHECK", "STATUS", "SUMMARY"),
                    [(c.name, _MARK[c.status], c.summary) for c in checks],
                )
            )
            for check in checks:
                if check.status in ("fail", "warn") and check.details:
                    self.stdout.write(f"\n{check.name}:")
                    for detail in check.details[:_DETAIL_LINES]:
                        self.stdout.write(f"  {_detail_line(check.name, detail)}")
                    if len(check.details) > _DETAIL_LINES:
                        more = len(check.details) - _DETAIL_LINES
                        self.stdout.write(f"  ... and {more} more (--json)")
            self.stdout.write(
                f"\n{len(failed)} failed, {len(warned)} warning(s); "
                "details: effect-broker doctor --json"
            )
        if failed or (options["strict"] and warned):
            raise SystemExit(1)
