"""``effect-broker contracts conform CONTRACT[@VERSION]`` (issue 22, item 1): thin glue
over the conformance kit (adapters/conformance_kit.py) and its stored runs
(services/conformance_runs.py)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from effect_broker.domain.contracts import EffectContract, load_contracts
from effect_broker.domain.errors import ConfigurationError, ContractError
from effect_broker.management.tables import render_table, to_json

CONFORM_HELP = (
    "Prove a contract's target before trusting it: run the contract's real adapter "
    "through a local fault proxy (answer lost after commit, reset before arrival, "
    "answer past the attempt limit, delivered twice) and check the safety class's "
    "promises in the target's own answers. Sends real requests: refused unless the "
    "contract says sandbox = true or --yes-send-requests is given. One row per check "
    "(pass / FAIL / n/a) with the evidence; exit 1 on any FAIL. The result is stored "
    "per contract version (doctor shows it)."
)
#: Exit status when the run is refused before anything is sent.
REFUSED = 2


def add_conform_parser(sub: Any) -> None:
    """Add the ``conform`` action to ``contracts``."""
    conform = sub.add_parser(
        "conform",
        help="prove a contract's target with faults (sends requests)",
        description=CONFORM_HELP,
    )
    conform.add_argument(
        "contract",
        metavar="CONTRACT[@VERSION]",
        help="the contract name, and a version (default: the active one)",
    )
    conform.add_argument(
        "--file",
        default=None,
        metavar="FILE",
        help="contracts TOML file (default: the EFFECT_BROKER_CONTRACTS setting)",
    )
    conform.add_argument(
        "--arguments",
        default="{}",
        metavar="JSON",
        help="the tool arguments every request carries (a JSON object; default {})",
    )
    conform.add_argument(
        "--drift-arguments",
        default=None,
        metavar="JSON",
        help="the other payload sent under a used key (default: the arguments plus "
        '"conformance_drift")',
    )
    conform.add_argument(
        "--attempt-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the attempt's time limit; the slow answer comes 1s after it (default: "
        "the contract's attempt_timeout, else 2; a stdio MCP server is started "
        "before each timed attempt, outside its limit)",
    )
    conform.add_argument(
        "--yes-send-requests",
        action="store_true",
        help="send the requests although the contract does not mark a sandbox",
    )
    conform.add_argument("--json", action="store_true", help="print JSON")


def _object(text: str, option: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CommandError(f"{option}: not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise CommandError(f"{option}: must be a JSON object")
    return value


def find_contract(path: str, spec: str) -> EffectContract:
    """``name@version`` (or the active version of ``name``) from the file."""
    name, _, version = spec.partition("@")
    registry = load_contracts(path)
    versions = [c for c in registry if c.name == name]
    if not versions:
        known = ", ".join(sorted({c.name for c in registry})) or "none"
        raise CommandError(f"no contract {name!r} in {path} (known: {known})")
    if version:
        return registry.get(name, version)
    active = [c for c in versions if c.active]
    if not active:
        listed = ", ".join(c.version for c in versions)
        raise CommandError(
            f"contract {name!r} has no active version; name one ({name}@V; "
            f"versions: {listed})"
        )
    return active[0]


def default_attempt_limit(contract: EffectContract) -> float:
    """The contract's ``attempt_timeout``, else 2s. A stdio MCP server is started (or
    pinged) before each timed attempt (``McpAdapter.warm_up``), so its start is
    outside the limit and needs no larger one."""
    if contract.attempt_timeout is not None:
        return contract.attempt_timeout.total_seconds()
    return 2.0


def run_conform(command: BaseCommand, options: dict[str, Any]) -> None:
    """Plan, refuse or run, print, store; exit 1 on any FAIL."""
    from effect_broker.adapters.conformance_kit import ConformanceKit, rows_passed

    path = options["file"] or settings.EFFECT_BROKER_CONTRACTS
    try:
        contract = find_contract(path, options["contract"])
        arguments = _object(options["arguments"], "--arguments")
        drift = (
            _object(options["drift_arguments"], "--drift-arguments")
            if options["drift_arguments"] is not None
            else None
        )
        kit = ConformanceKit(
            contract,
            arguments=arguments,
            drift_arguments=drift,
            attempt_limit=options["attempt_limit"] or default_attempt_limit(contract),
        )
        plan = kit.plan()
    except (ConfigurationError, ContractError) as exc:
        raise CommandError(str(exc)) from exc
    # Said before anything is sent, on stderr with --json (stdout stays one document).
    out = command.stderr if options["json"] else command.stdout
    out.write(plan.sentence())
    if not contract.sandbox and not options["yes_send_requests"]:
        command.stderr.write(
            f"refused: contract {contract.name}@{contract.version} does not mark its "
            "target as a sandbox (sandbox = true); nothing was sent. Pass "
            "--yes-send-requests to send these requests anyway."
        )
        raise SystemExit(REFUSED)
    try:
        rows = kit.run()
    except (ConfigurationError, ContractError) as exc:
        raise CommandError(str(exc)) from exc
    passed = rows_passed(rows)
    stored = _store(command, plan, rows, kit.effect_requests_forwarded())
    if options["json"]:
        command.stdout.write(
            to_json(
                {
                    "contract": contract.name,
                    "version": contract.version,
                    "safety": contract.safety.value,
                    "target": plan.target,
                    "passed": passed,
                    "planned": {
                        "effect_requests": plan.effect_requests,
                        "lookups": plan.lookups,
                    },
                    "sent": {
                        "effect_requests": kit.effect_requests_forwarded(),
                        "lookups": kit.lookups_forwarded(),
                    },
                    "stored_run": stored,
                    "checks": [row.as_dict() for row in rows],
                }
            )
        )
    else:
        command.stdout.write(
            render_table(
                ("CHECK", "RESULT", "EVIDENCE"),
                [(row.check, row.outcome, row.evidence) for row in rows],
            )
        )
        failed = sum(row.outcome == "FAIL" for row in rows)
        command.stdout.write(
            f"{contract.name}@{contract.version}: "
            + (
                "every check that applies passed"
                if passed
                else f"{failed} check(s) FAILED: do not trust this target's "
                f"{contract.safety.value} promise"
            )
            + f" ({kit.effect_requests_forwarded()} effect request(s) sent)"
        )
    if not passed:
        raise SystemExit(1)


def _store(command: BaseCommand, plan: Any, rows: Any, sent: int) -> str | None:
    from effect_broker.services.conformance_runs import record_run

    try:
        return record_run(plan, rows, effect_requests=sent)
    except DatabaseError as exc:
        reason = " ".join(str(exc).split())
        command.stderr.write(f"warning: the run was not stored ({reason})")
        return None


__all__ = [
    "CONFORM_HELP",
    "add_conform_parser",
    "default_attempt_limit",
    "find_contract",
    "run_conform",
]
