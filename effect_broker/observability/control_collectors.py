"""Gauges of the operator controls, read from PostgreSQL at scrape time (issue 24).

Like the ledger gauges (``collectors``), these describe the database, not a process,
so only the API's ``/metrics`` serves them, once however many workers run:

* ``effect_broker_dispatch_pauses{scope}``: active pauses, by what they name
  (``tool``, ``contract``, ``tenant``, or a combination such as ``tool+tenant``);
* ``effect_broker_dispatch_pause_oldest_age_seconds``: since the oldest active
  pause began (0 with none);
* ``effect_broker_tool_paused{tool}``: 1 while dispatch of a tool is paused for
  every tenant (a tool pause, or a contract pause of its active contract), else 0;
* ``effect_broker_effects_paused{tool, contract, contract_version, safety_class}``:
  effects an active pause holds now (not sent; they wait for a resume);
* ``effect_broker_effects_waiting_on_limit{...}``: due, unsent, unpaused effects of
  contracts with ``max_in_flight`` or ``rate_limit``: waiting for a slot or a token
  (or, for a moment, for a free worker);

and ``effect_broker_controls_scrape_success``. The held-effects query runs only while
a pause is active, so a deployment without pauses pays one index probe per scrape;
all of it under the same 2 s statement timeout as the ledger gauges.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from django.db import connection, transaction
from django.db.models import Min
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from effect_broker.domain.contracts import ContractRegistry
from effect_broker.models import DispatchPause
from effect_broker.observability.collectors import STATEMENT_TIMEOUT_MS
from effect_broker.observability.metrics import EFFECT_LABELS
from effect_broker.store import dispatch_controls

logger = logging.getLogger(__name__)

PAUSES = "effect_broker_dispatch_pauses"
PAUSE_AGE = "effect_broker_dispatch_pause_oldest_age_seconds"
TOOL_PAUSED = "effect_broker_tool_paused"
HELD = "effect_broker_effects_paused"
WAITING_ON_LIMIT = "effect_broker_effects_waiting_on_limit"
SCRAPE_SUCCESS = "effect_broker_controls_scrape_success"

#: Every metric family this collector can export.
METRIC_NAMES = (PAUSES, PAUSE_AGE, TOOL_PAUSED, HELD, WAITING_ON_LIMIT, SCRAPE_SUCCESS)

Row = tuple[str, str, str, str, int, float]


@dataclass
class ControlsReading:
    """What one scrape read."""

    scopes: list[tuple[str | None, str | None, str | None, str | None]]
    oldest_age: float
    held: list[Row] = field(default_factory=list)
    waiting: list[Row] = field(default_factory=list)


def read_controls(registry: ContractRegistry | None) -> ControlsReading:
    """Active pauses, the effects they hold and those waiting on limits."""
    limited = sorted(
        {c.name for c in registry or () if c.limits.limited} if registry else set()
    )
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}")
        active = DispatchPause.objects.filter(resumed_at__isnull=True)
        scopes = list(
            active.values_list("tool", "contract_name", "contract_version", "tenant_id")
        )
        oldest = active.aggregate(oldest=Min("paused_at"))["oldest"]
        age = 0.0 if oldest is None else (timezone.now() - oldest).total_seconds()
        return ControlsReading(
            scopes=[
                (tool, name, version, None if tenant is None else str(tenant))
                for tool, name, version, tenant in scopes
            ],
            oldest_age=max(0.0, age),
            held=dispatch_controls.held_by_contract() if scopes else [],
            waiting=dispatch_controls.waiting_on_limits(limited),
        )


def scope_kind(
    tool: str | None, name: str | None, version: str | None, tenant: str | None
) -> str:
    """``tool``, ``contract``, ``tenant``, or a combination joined by ``+``."""
    parts = [
        kind
        for kind, value in (("tool", tool), ("contract", name), ("tenant", tenant))
        if value is not None
    ]
    return "+".join(parts)


class ControlsCollector(Collector):
    """Pauses, paused tools, held effects and effects waiting on limits."""

    def __init__(self, registry: ContractRegistry | None = None) -> None:
        # None: the process runtime's registry, looked up at each scrape.
        self._registry = registry

    def _contracts(self) -> ContractRegistry | None:
        if self._registry is not None:
            return self._registry
        from effect_broker.services.runtime import get_runtime

        try:
            return get_runtime().registry
        except Exception:  # a broken contracts file must not break the scrape
            return None

    def collect(self) -> Iterator[Metric]:
        """Yield the controls' gauges (zero for every contract with none)."""
        contracts = self._contracts()
        success = GaugeMetricFamily(
            SCRAPE_SUCCESS, "1 if this scrape read the operator controls, else 0."
        )
        try:
            reading: ControlsReading | None = read_controls(contracts)
        except Exception:  # down, full or slow: report it, go on
            logger.warning(
                "metrics: controls query failed",
                exc_info=True,
                extra={"action": "metrics_scrape"},
            )
            reading = None
        success.add_metric([], 0 if reading is None else 1)
        if reading is not None:
            yield from self._families(reading, contracts)
        yield success

    def _families(
        self, reading: ControlsReading, contracts: ContractRegistry | None
    ) -> Iterator[Metric]:
        pauses = GaugeMetricFamily(
            PAUSES,
            "Active operator pauses of dispatch, by what they name (tool, contract, "
            "tenant, or a combination joined by +).",
            labels=["scope"],
        )
        kinds: dict[str, int] = {}
        for scope in reading.scopes:
            kind = scope_kind(*scope)
            kinds[kind] = kinds.get(kind, 0) + 1
        for kind in ("tool", "contract", "tenant"):
            kinds.setdefault(kind, 0)
        for kind, count in sorted(kinds.items()):
            pauses.add_metric([kind], count)
        yield pauses
        age = GaugeMetricFamily(
            PAUSE_AGE, "Seconds since the oldest active pause began (0 with none)."
        )
        age.add_metric([], reading.oldest_age)
        yield age
        tool_paused = GaugeMetricFamily(
            TOOL_PAUSED,
            "1 while dispatch of the tool is paused for every tenant (a tool pause, "
            "or a contract pause of its active contract), else 0.",
            labels=["tool"],
        )
        for contract in contracts or ():
            if not contract.active:
                continue
            paused = any(
                tenant is None
                and (tool is not None or name is not None)
                and tool in (None, contract.tool)
                and name in (None, contract.name)
                and version in (None, contract.version)
                for tool, name, version, tenant in reading.scopes
            )
            tool_paused.add_metric([contract.tool], 1 if paused else 0)
        yield tool_paused
        yield from _by_contract(
            HELD,
            "Effects an operator's pause holds now: not sent, waiting for a resume.",
            reading.held,
            contracts,
            all_contracts=True,
        )
        yield from _by_contract(
            WAITING_ON_LIMIT,
            "Due, unsent effects of a contract with max_in_flight or rate_limit (not "
            "paused): waiting for a slot or a token, or briefly for a free worker.",
            reading.waiting,
            contracts,
            all_contracts=False,
        )


def _by_contract(
    name: str,
    text: str,
    rows: list[Row],
    contracts: ContractRegistry | None,
    *,
    all_contracts: bool,
) -> Iterator[Metric]:
    family = GaugeMetricFamily(name, text, labels=EFFECT_LABELS)
    seen = set()
    for tool, contract_name, version, safety, count, _age in rows:
        seen.add((tool, contract_name, version, safety))
        family.add_metric([tool, contract_name, version, safety], count)
    for contract in contracts or ():
        labels = (contract.tool, contract.name, contract.version, contract.safety.value)
        if labels in seen or not (all_contracts or contract.limits.limited):
            continue
        family.add_metric(list(labels), 0)
    yield family
