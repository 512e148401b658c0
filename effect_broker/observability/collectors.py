"""Gauges read from the ledger at scrape time: effects waiting on an unknown outcome,
an operator, or an operator's approval.

A counter in a worker says how often outcomes became unknown; only the ledger says how
many are unknown now and for how long (a worker that recorded one may be long gone).
So each scrape of the API's ``/metrics`` runs ONE bounded query:

* it reads only rows in ``outcome_unknown``, ``manual_review`` or
  ``awaiting_approval``, through the partial index ``effect_intents_awaiting_idx``
  (migrations 0012, 0017), so its cost follows the waiting effects, not the ledger's
  size;
* it groups by the pinned contract (tool, name, version, safety class): as many
  groups as there are contract versions with waiting effects, never one per tenant;
* it runs under a 2 s ``statement_timeout``: a slow database costs a scrape its
  ledger gauges (``effect_broker_ledger_scrape_success 0``), never a hung scrape.

Alongside, each contract's alert threshold for unknown age (``unknown_alert_after``,
or ``EFFECT_BROKER_UNKNOWN_ALERT_AFTER_SECONDS``) is exported from the contracts file,
so the shipped alert compares the two without a hand-kept list.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from django.conf import settings
from django.db import connection, transaction
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from effect_broker.domain.contracts import ContractRegistry, EffectContract
from effect_broker.domain.states import EffectStatus
from effect_broker.observability.metrics import EFFECT_LABELS

logger = logging.getLogger(__name__)

#: The longest a scrape's ledger query may run (SET LOCAL, this transaction only).
STATEMENT_TIMEOUT_MS = 2000

WAITING_STATUSES = (
    EffectStatus.OUTCOME_UNKNOWN,
    EffectStatus.MANUAL_REVIEW,
    EffectStatus.AWAITING_APPROVAL,
)

# Age counts from the reservation (created_at): an effect's status moves between
# outcome_unknown and reconciling on every probe, so the last change would hide an
# effect that has waited for days behind a fresh "inconclusive". An effect awaiting
# approval waits from its reservation too (or, rarely, from a redeploy that sent it
# back: then it is older than its wait, which errs towards the alert).
WAITING_QUERY = """
SELECT status, tool, contract_name, contract_version, safety_class, count(*),
       EXTRACT(EPOCH FROM (clock_timestamp() - min(created_at)))::float8
FROM effect_intents
WHERE status IN ('outcome_unknown', 'manual_review', 'awaiting_approval')
GROUP BY status, tool, contract_name, contract_version, safety_class
"""

_NAMES = {
    EffectStatus.OUTCOME_UNKNOWN.value: (
        "effect_broker_unknown_effects",
        "effect_broker_unknown_effect_oldest_age_seconds",
        "outcome_unknown",
    ),
    EffectStatus.MANUAL_REVIEW.value: (
        "effect_broker_manual_review_effects",
        "effect_broker_manual_review_oldest_age_seconds",
        "manual_review",
    ),
    EffectStatus.AWAITING_APPROVAL.value: (
        "effect_broker_awaiting_approval_effects",
        "effect_broker_awaiting_approval_oldest_age_seconds",
        "awaiting_approval",
    ),
}
SCRAPE_SUCCESS = "effect_broker_ledger_scrape_success"
THRESHOLD = "effect_broker_contract_unknown_age_threshold_seconds"
#: Each approval-asking contract's ``approval_ttl``: the shipped alert compares the
#: oldest waiting approval with it (issue 24).
APPROVAL_TTL = "effect_broker_contract_approval_ttl_seconds"

#: Every metric family this collector can export.
METRIC_NAMES = (
    *(name for pair in _NAMES.values() for name in pair[:2]),
    SCRAPE_SUCCESS,
    THRESHOLD,
    APPROVAL_TTL,
)

Row = tuple[str, str, str, str, str, int, float]


def read_waiting() -> list[Row]:
    """The waiting effects per status and pinned contract (one bounded query)."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}")
        cur.execute(WAITING_QUERY)
        return [tuple(row) for row in cur.fetchall()]


def unknown_age_threshold(seconds: float | None) -> float:
    """A contract's threshold, or the deployment's default when it names none."""
    if seconds is not None:
        return seconds
    return float(settings.EFFECT_BROKER_UNKNOWN_ALERT_AFTER_SECONDS)


class LedgerCollector(Collector):
    """Unknown, manual-review and awaiting-approval counts and oldest ages, by pinned
    contract."""

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
            logger.warning(
                "metrics: contracts unavailable", extra={"action": "metrics_scrape"}
            )
            return None

    def collect(self) -> Iterator[Metric]:
        """Yield the ledger gauges (zero for every known contract with none)."""
        contracts = self._contracts()
        families = {
            status: (
                GaugeMetricFamily(
                    count, f"Effects in {label} now.", labels=EFFECT_LABELS
                ),
                GaugeMetricFamily(
                    age,
                    f"Seconds since the oldest effect now in {label} was reserved.",
                    labels=EFFECT_LABELS,
                ),
            )
            for status, (count, age, label) in _NAMES.items()
        }
        success = GaugeMetricFamily(
            SCRAPE_SUCCESS, "1 if this scrape read the ledger gauges, else 0."
        )
        try:
            rows = read_waiting()
        except Exception:  # down, full (pool timeout) or slow: report it, go on
            logger.warning(
                "metrics: ledger query failed",
                exc_info=True,
                extra={"action": "metrics_scrape"},
            )
            rows = None
        seen: set[tuple[str, ...]] = set()
        for status, tool, name, version, safety, count, age in rows or []:
            labels = [tool, name, version, safety]
            seen.add((status, *labels))
            families[status][0].add_metric(labels, count)
            families[status][1].add_metric(labels, age)
        if rows is not None:
            for contract in _each(contracts):
                labels = [
                    contract.tool,
                    contract.name,
                    contract.version,
                    contract.safety.value,
                ]
                for status in _NAMES:
                    if (status, *labels) not in seen:
                        families[status][0].add_metric(labels, 0)
        success.add_metric([], 1 if rows is not None else 0)
        threshold = GaugeMetricFamily(
            THRESHOLD,
            "A contract's alert threshold for the age of an unknown outcome "
            "(unknown_alert_after, or EFFECT_BROKER_UNKNOWN_ALERT_AFTER_SECONDS).",
            labels=EFFECT_LABELS,
        )
        for contract in _each(contracts):
            limit = contract.unknown_alert_after
            threshold.add_metric(
                [contract.tool, contract.name, contract.version, contract.safety.value],
                unknown_age_threshold(None if limit is None else limit.total_seconds()),
            )
        ttl = GaugeMetricFamily(
            APPROVAL_TTL,
            "How long an effect of a contract that asks for approval waits for one "
            "(approval_ttl) before it expires unsent.",
            labels=EFFECT_LABELS,
        )
        for contract in _each(contracts):
            if contract.approval is not None:
                ttl.add_metric(
                    [
                        contract.tool,
                        contract.name,
                        contract.version,
                        contract.safety.value,
                    ],
                    contract.approval.ttl.total_seconds(),
                )
        for count_family, age_family in families.values():
            yield count_family
            yield age_family
        yield threshold
        yield ttl
        yield success


def _each(contracts: ContractRegistry | None) -> Iterable[EffectContract]:
    return contracts if contracts is not None else ()
