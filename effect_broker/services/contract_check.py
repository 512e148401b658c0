"""Checking a contracts file before a deploy: every problem, and whether targets answer.

``contracts validate`` (and ``doctor``, and ``/readyz``) use this. A bad contract file
makes every submit fail with 500 (issue 11), so it must be caught where an operator
looks: each problem as one ``file:contract:field: reason`` line, all of them at once.

``--probe`` asks each target whether it answers at all. It never sends a side effect:
an http target (or an MCP server over streamable HTTP) gets one bounded ``HEAD`` of
its base URL (scheme, host and port only, never the effect path), and any HTTP
answer - even a 404 or 405 - proves something listens there. An MCP server over
stdio is only looked up on PATH, never started.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import httpx

from effect_broker.domain.contracts import (
    EffectContract,
    check_contracts_text,
)
from effect_broker.domain.errors import ConfigurationError, ContractError

#: Adapters whose target lives in this process or its database: nothing to probe.
IN_PROCESS_ADAPTERS = frozenset({"simulated", "simulated-local"})
#: The probe's bound: connect, then the whole HEAD, in seconds.
PROBE_TIMEOUT = httpx.Timeout(5.0, connect=3.0)

ProbeState = Literal["ok", "failed", "skipped"]


@dataclass(frozen=True)
class Problem:
    """One problem in a contracts file, located as ``file:contract:field``."""

    file: str
    contract: str
    field: str
    reason: str

    def line(self) -> str:
        """``file:contract:field: reason``, the form compilers use."""
        return f"{self.file}:{self.contract}:{self.field}: {self.reason}"

    def as_dict(self) -> dict[str, str]:
        """JSON form."""
        return {
            "file": self.file,
            "contract": self.contract,
            "field": self.field,
            "reason": self.reason,
            "message": self.line(),
        }


@dataclass(frozen=True)
class ProbeOutcome:
    """Whether one contract's target answered (``--probe``)."""

    contract: str
    tool: str
    adapter: str
    state: ProbeState
    detail: str

    def as_dict(self) -> dict[str, str]:
        """JSON form."""
        return {
            "contract": self.contract,
            "tool": self.tool,
            "adapter": self.adapter,
            "state": self.state,
            "detail": self.detail,
        }


@dataclass
class ContractReport:
    """What ``contracts validate`` found in one file."""

    file: str
    contracts: list[EffectContract] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    probes: list[ProbeOutcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No problem in the file and no target that failed its probe."""
        return not self.problems and all(p.state != "failed" for p in self.probes)


def _label(contract: EffectContract) -> str:
    return f"{contract.name}@{contract.version}"


def _problem(error: ContractError, source: str) -> Problem:
    details = error.details
    contract = details.get("contract")
    version = details.get("version")
    index = details.get("index")
    line = details.get("line")
    if contract:
        where = f"{contract}@{version}" if version else str(contract)
    elif index is not None:
        where = f"contract #{index}"
    elif line is not None:
        where = f"line {line}"
    else:
        where = "-"
    reason = str(details.get("reason") or error)
    return Problem(
        file=str(details.get("file") or source),
        contract=where,
        field=str(details.get("field") or "-"),
        reason=reason,
    )


def _adapter_problem(
    contract: EffectContract, exc: ConfigurationError, source: str
) -> Problem:
    message = str(exc)
    # Adapters name the option first ("adapter_options.url must be ..."); keep that
    # as the field so the line points at the exact key.
    head, sep, rest = message.partition(" ")
    if head.startswith("adapter_options.") and sep:
        return Problem(source, _label(contract), head.rstrip(":"), rest)
    if message.startswith("unknown adapter"):
        return Problem(source, _label(contract), "adapter", message)
    return Problem(source, _label(contract), "adapter_options", message)


def validate_file(path: str | os.PathLike[str]) -> ContractReport:
    """Every problem in the contracts file at ``path``, including adapter options."""
    source = os.fspath(path)
    report = ContractReport(file=source)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        report.problems.append(
            Problem(source, "-", "-", f"cannot read contracts file: {exc}")
        )
        return report
    contracts, errors = check_contracts_text(text, source=source)
    report.problems.extend(_problem(error, source) for error in errors)
    report.contracts = contracts
    if not contracts and not errors:
        report.notes.append(f"{source}: no [[contract]] entries; every submit is refused")
    from effect_broker.adapters.registry import check_adapter

    for contract in report.contracts:
        if contract.adapter == "stripe" and not _stripe_key():
            report.notes.append(
                f"{source}:{_label(contract)}:adapter_options: not checked "
                "(STRIPE_TEST_KEY is unset)"
            )
            continue
        try:
            check_adapter(contract)
        except ConfigurationError as exc:
            report.problems.append(_adapter_problem(contract, exc, source))
    return report


def _stripe_key() -> str:
    return os.environ.get("STRIPE_TEST_KEY", "").strip()


def probe_targets(
    report: ContractReport, *, transport: httpx.BaseTransport | None = None
) -> list[ProbeOutcome]:
    """Ask each valid contract's target whether it answers; never send an effect."""
    outcomes = [_probe_one(contract, transport) for contract in report.contracts]
    report.probes = outcomes
    return outcomes


def _probe_one(
    contract: EffectContract, transport: httpx.BaseTransport | None
) -> ProbeOutcome:
    def outcome(state: ProbeState, detail: str) -> ProbeOutcome:
        return ProbeOutcome(
            _label(contract), contract.tool, contract.adapter, state, detail
        )

    kind = contract.adapter
    if kind in IN_PROCESS_ADAPTERS:
        return outcome("ok", "in-process simulated target")
    if kind == "http":
        # The lookup may live on another host than the send (probe_url): ask each
        # base once.
        urls = [str(contract.adapter_options.get(k, "")) for k in ("url", "probe_url")]
        by_base: dict[str, ProbeOutcome] = {}
        for url in filter(None, urls):
            key = _base(url) or url
            if key not in by_base:
                by_base[key] = _head_base(url, outcome, transport)
        results = list(by_base.values())
        if not results:
            return outcome("failed", "no url to probe")
        bad = [r for r in results if r.state == "failed"]
        if bad or len(results) == 1:
            return (bad or results)[0]
        return outcome("ok", "; ".join(r.detail for r in results))
    if kind == "mcp" and contract.upstream is not None:
        upstream = contract.upstream
        if upstream.url:
            return _head_base(upstream.url, outcome, transport)
        # A stdio server is started per attempt: check it can be, never start it
        # (its start-up is the upstream's code, not ours to run from a check).
        program = upstream.command[0] if upstream.command else ""
        found = shutil.which(program) if program else None
        if found is None:
            return outcome("failed", f"stdio command {program!r} not found on PATH")
        return outcome("ok", f"stdio command {program!r} found at {found}")
    if kind == "stripe":
        if not _stripe_key():
            return outcome("skipped", "STRIPE_TEST_KEY is unset")
        base = str(contract.adapter_options.get("api_base") or "https://api.stripe.com")
        return _head_base(base, outcome, transport)
    return outcome("failed", f"unknown adapter kind {kind!r}; cannot probe")


def _base(url: str) -> str | None:
    """``scheme://host:port/`` of ``url``, or None when it has none to probe."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or "{" in parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}/"


def _head_base(
    url: str,
    outcome: Callable[[ProbeState, str], ProbeOutcome],
    transport: httpx.BaseTransport | None,
) -> ProbeOutcome:
    base = _base(url)
    if base is None:
        return outcome("failed", f"no base URL to probe in {url!r}")
    # Only scheme://host:port/: the effect's own path is never requested, and HEAD
    # has no body and, by HTTP's definition, no side effect.
    try:
        with httpx.Client(
            timeout=PROBE_TIMEOUT,
            follow_redirects=False,
            trust_env=False,
            transport=transport,
        ) as client:
            response = client.head(base)
    except httpx.HTTPError as exc:
        return outcome("failed", f"HEAD {base}: {type(exc).__name__} {exc}".strip())
    return outcome("ok", f"HEAD {base} answered HTTP {response.status_code}")
