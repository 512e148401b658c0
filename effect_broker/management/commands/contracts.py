"""``effect-broker contracts validate [FILE] [--probe] [--json]``;
``effect-broker contracts schema``: the contracts file's JSON Schema, for editors;
``effect-broker contracts conform CONTRACT[@VERSION] [--file FILE] [--json] ...``."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser

from effect_broker.domain.contract_fields import schema_text
from effect_broker.management.base import BrokerCommand
from effect_broker.management.conform import add_conform_parser, run_conform
from effect_broker.management.tables import render_table, to_json
from effect_broker.services.contract_check import probe_targets, validate_file


class Command(BrokerCommand):
    help = (
        "Check a contracts file: every problem as 'file:contract:field: reason', exit 1 "
        "if there is any. --probe also asks each target whether it answers (a HEAD of "
        "an http target's base URL; never an effect)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        validate = sub.add_parser(
            "validate",
            help="check a contracts file (default: EFFECT_BROKER_CONTRACTS)",
            description=self.help,
        )
        validate.add_argument(
            "file",
            nargs="?",
            default=None,
            metavar="FILE",
            help="contracts TOML file (default: the EFFECT_BROKER_CONTRACTS setting)",
        )
        validate.add_argument(
            "--probe",
            action="store_true",
            help="also check that each target answers (bounded; sends no effect)",
        )
        validate.add_argument("--json", action="store_true", help="print JSON")
        add_conform_parser(sub)
        sub.add_parser(
            "schema",
            help="print the JSON Schema of a contracts file (for editors)",
            description="Print the JSON Schema of a contracts file, generated from the "
            "one definition of its fields. Save it next to your contracts.toml and put "
            "'#:schema ./contracts.schema.json' on the file's first line: editors with "
            "a TOML language server (Taplo, Even Better TOML) then check it as you type. "
            "The broker's own check stays 'contracts validate'.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "conform":
            run_conform(self, options)
            return
        if options["action"] == "schema":
            self.stdout.write(schema_text())
            return
        path = options["file"] or settings.EFFECT_BROKER_CONTRACTS
        report = validate_file(path)
        if options["probe"]:
            probe_targets(report)
        if options["json"]:
            self.stdout.write(
                to_json(
                    {
                        "file": report.file,
                        "ok": report.ok,
                        "contracts": [
                            {
                                "name": c.name,
                                "version": c.version,
                                "tool": c.tool,
                                "safety": c.safety.value,
                                "adapter": c.adapter,
                                "active": c.active,
                            }
                            for c in report.contracts
                        ],
                        "problems": [p.as_dict() for p in report.problems],
                        "notes": report.notes,
                        "probes": [p.as_dict() for p in report.probes],
                    }
                )
            )
        else:
            self._human(report)
        if not report.ok:
            raise SystemExit(1)

    def _human(self, report: Any) -> None:
        for problem in report.problems:
            self.stderr.write(problem.line())
        for note in report.notes:
            self.stdout.write(f"note: {note}")
        if report.contracts:
            self.stdout.write(
                render_table(
                    ("CONTRACT", "VERSION", "TOOL", "SAFETY", "ADAPTER", "ACTIVE"),
                    [
                        (
                            c.name,
                            c.version,
                            c.tool,
                            c.safety.value,
                            c.adapter,
                            "yes" if c.active else "no",
                        )
                        for c in report.contracts
                    ],
                )
            )
        if report.probes:
            self.stdout.write("")
            self.stdout.write(
                render_table(
                    ("CONTRACT", "ADAPTER", "PROBE", "DETAIL"),
                    [(p.contract, p.adapter, p.state, p.detail) for p in report.probes],
                )
            )
        failed = sum(p.state == "failed" for p in report.probes)
        if report.problems:
            self.stderr.write(
                f"{report.file}: {len(report.problems)} problem(s); fix them before "
                "deploying (every submit fails while the file is invalid)"
            )
        elif failed:
            self.stderr.write(f"{report.file}: {failed} target(s) did not answer")
        else:
            self.stdout.write(f"{report.file}: {len(report.contracts)} contract(s) valid")
