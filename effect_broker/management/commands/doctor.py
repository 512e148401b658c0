"""``effect-broker doctor [--json]``: what is wrong with this deployment, if anything."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from effect_broker.domain.contracts import parse_duration
from effect_broker.management.tables import render_table, to_json
from effect_broker.services.diagnosis import DoctorOptions, run_checks

_MARK = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skipped": "skip"}


class Command(BaseCommand):
    help = (
        "Check the database, migrations, procrastinate schema, master key, contracts, "
        "workers and stalled jobs, effects waiting for an operator, key retention "
        "against the retry horizon, and recent operation keys. Exit 1 when any check "
        "fails (FAIL); warnings (WARN) exit 0 unless --strict."
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
            self.stdout.write(
                f"\n{len(failed)} failed, {len(warned)} warning(s); "
                "details: effect-broker doctor --json"
            )
        if failed or (options["strict"] and warned):
            raise SystemExit(1)
