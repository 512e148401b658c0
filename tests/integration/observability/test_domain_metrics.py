"""Spec "Required observability": each outcome is counted once, where it happens, under
its contract's labels and never a tenant's; the ledger gauges say what waits now.

Driven through the engine bench (real Postgres ledger, simulated targets, a manual
clock), reading the process's own registry as a scrape would.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from django.db import connection, transaction
from django.test import Client
from prometheus_client import REGISTRY

from effect_broker.adapters.simulated_adapter import Fault
from effect_broker.domain.errors import PayloadConflictError
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.observability.collectors import WAITING_QUERY, LedgerCollector
from effect_broker.services.dispatch import dispatch
from effect_broker.services.reconcile import reconcile
from effect_broker.services.submission import submit
from effect_broker.services.sweeper import sweep
from tests.integration.engine.harness import Bench, engine_bench

pytestmark = pytest.mark.django_db(transaction=True)

IDEMPOTENT = SafetyClass.IDEMPOTENT
UNSAFE = SafetyClass.UNSAFE
RECONCILABLE = SafetyClass.RECONCILABLE


@pytest.fixture
def bench() -> Iterator[Bench]:
    with engine_bench() as bench:
        yield bench


def labels(record: EffectRecord, **extra: str) -> dict[str, str]:
    return {
        "tool": record.tool,
        "contract": record.contract_name,
        "contract_version": record.contract_version,
        "safety_class": record.safety.value,
        **extra,
    }


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Delta:
    """Counter values before and after a step (counters are process-wide)."""

    def __init__(self, *series: tuple[str, dict[str, str]]) -> None:
        self.series = series
        self.before = [value(name, **lbl) for name, lbl in series]

    def __call__(self) -> list[float]:
        return [
            value(name, **lbl) - before
            for (name, lbl), before in zip(self.series, self.before, strict=True)
        ]


def test_submits_count_created_replayed_and_conflicted_under_the_contract(bench):
    # Given one new submit
    first = bench.submit(IDEMPOTENT, key=f"op:{uuid.uuid4()}")
    base = labels(first)
    delta = Delta(
        ("effect_broker_effects_submitted_total", base),
        ("effect_broker_effects_deduplicated_total", base),
        ("effect_broker_effects_conflicted_total", {**base, "reason": "payload_drift"}),
        ("effect_broker_submit_duration_seconds_count", base),
    )
    # When the same call is replayed and the key is reused with other arguments
    replay = submit(
        bench.tenant,
        EffectRequest(
            operation_key=first.operation_key,
            tool=first.tool,
            arguments={"amount_minor": 100, "ref": first.operation_key},
        ),
    )
    assert replay.replayed
    with pytest.raises(PayloadConflictError):
        submit(
            bench.tenant,
            EffectRequest(
                operation_key=first.operation_key,
                tool=first.tool,
                arguments={"amount_minor": 999, "ref": first.operation_key},
            ),
        )
    bench.submit(IDEMPOTENT)
    # Then: one more created, one replay, one conflict; a conflict is no submit
    assert delta() == [1.0, 1.0, 1.0, 2.0]


def test_no_series_carries_a_tenant_an_operation_key_or_an_effect_id(bench):
    record = bench.submit(UNSAFE)
    bench.targets[UNSAFE].inject(Fault.LOSE_RESPONSE)
    dispatch(record.effect_id, worker="w1")
    body = Client().get("/metrics").content.decode()
    for secret in (
        str(bench.tenant.id),
        bench.tenant.name,
        record.operation_key,
        record.effect_id,
    ):
        assert secret not in body
    label_names = {
        name
        for family in REGISTRY.collect()
        if family.name.startswith("effect_broker_")
        for sample in family.samples
        for name in sample.labels
    }
    assert label_names <= {
        "tool",
        "contract",
        "contract_version",
        "safety_class",
        "reason",
        "via",
        "cause",
        "outcome",
        "stage",
        "decision",  # approved | denied | expired (issue 24)
        "le",
    }


def test_success_unknown_and_refusal_are_each_counted_once(bench):
    ok = bench.submit(IDEMPOTENT)
    lost = bench.submit(UNSAFE)
    refused = bench.submit(RECONCILABLE)
    delta = Delta(
        ("effect_broker_effects_succeeded_total", labels(ok, via="dispatch")),
        ("effect_broker_dispatch_attempts_total", labels(ok, outcome="succeeded")),
        ("effect_broker_submit_to_receipt_seconds_count", labels(ok)),
        ("effect_broker_effects_unknown_total", labels(lost, cause="outcome_unknown")),
        ("effect_broker_dispatch_attempts_total", labels(lost, outcome="unknown")),
        ("effect_broker_effects_failed_total", labels(refused)),
        ("effect_broker_dispatch_attempts_total", labels(refused, outcome="refused")),
    )
    assert dispatch(ok.effect_id, worker="w1").status is EffectStatus.SUCCEEDED
    bench.targets[UNSAFE].inject(Fault.LOSE_RESPONSE)
    assert dispatch(lost.effect_id, worker="w1").status is EffectStatus.OUTCOME_UNKNOWN
    bench.targets[RECONCILABLE].inject(Fault.TERMINAL)
    assert dispatch(refused.effect_id, worker="w1").status is EffectStatus.FAILED_FINAL
    # A redelivered job does nothing, and counts nothing
    dispatch(lost.effect_id, worker="w2")
    assert delta() == [1.0] * 7


def test_a_same_key_resend_observes_the_key_retention_left(bench):
    record = bench.submit(IDEMPOTENT)
    bench.targets[IDEMPOTENT].inject(Fault.LOSE_RESPONSE)
    dispatch(record.effect_id, worker="w1")
    retention = "effect_broker_retry_key_retention_remaining_seconds"
    delta = Delta(
        (f"{retention}_count", labels(record)),
        (f"{retention}_bucket", labels(record, le="0.0")),
        (f"{retention}_bucket", labels(record, le="3600.0")),
        ("effect_broker_reconciliations_total", labels(record, outcome="succeeded")),
        ("effect_broker_effects_succeeded_total", labels(record, via="dispatch")),
        (f"{retention}_sum", labels(record)),
    )
    bench.advance(600)
    assert reconcile(record.effect_id, worker="w2").status is EffectStatus.SUCCEEDED
    # 1 h retention, 10 min in: about 50 min left - above 0, at most 3600
    *counts, remaining = delta()
    assert counts == [1.0, 0.0, 1.0, 1.0, 1.0]
    assert 3000 - 60 < remaining <= 3000


def test_a_retry_due_after_key_expiry_is_blocked_and_counted(bench):
    record = bench.submit(IDEMPOTENT)
    bench.targets[IDEMPOTENT].inject(Fault.LOSE_RESPONSE)
    dispatch(record.effect_id, worker="w1")
    delta = Delta(
        ("effect_broker_retries_blocked_by_key_expiry_total", labels(record)),
        ("effect_broker_effects_manual_review_total", labels(record)),
        ("effect_broker_reconciliations_total", labels(record, outcome="manual_review")),
        ("effect_broker_retry_key_retention_remaining_seconds_count", labels(record)),
    )
    bench.advance(3600 - 30)  # inside the 60 s margin before the 1 h retention
    assert reconcile(record.effect_id, worker="w2").status is EffectStatus.MANUAL_REVIEW
    assert delta() == [1.0, 1.0, 1.0, 0.0]


def test_lease_expiry_and_a_fenced_late_write_are_counted(bench):
    from tests.integration.engine.harness import WorkerKilled

    record = bench.submit(IDEMPOTENT)
    delta = Delta(
        ("effect_broker_lease_expirations_total", labels(record, stage="dispatching")),
        ("effect_broker_effects_unknown_total", labels(record, cause="lease_expired")),
        ("effect_broker_stale_writes_total", {}),
    )
    bench.switch.when = "after_commit"
    with pytest.raises(WorkerKilled):
        dispatch(record.effect_id, worker="zombie")
    from effect_broker.store import load_effect_for_worker

    zombie_view = load_effect_for_worker(record.effect_id)
    bench.advance(31)
    sweep()
    # The zombie's late heartbeat is refused by the fence and recorded
    from effect_broker.domain.errors import StaleWriteError
    from effect_broker.services.dispatch import note_stale_write
    from effect_broker.services.runtime import get_runtime
    from effect_broker.store import touch

    with pytest.raises(StaleWriteError) as refused:
        touch(
            zombie_view,
            event_type="lease_extended",
            actor="zombie",
            now=bench.clock.now(),
        )
    note_stale_write(get_runtime(), refused.value, actor="zombie")
    assert delta() == [1.0, 1.0, 1.0]


def test_the_ledger_gauges_count_waiting_effects_per_contract(bench):
    # Given two unsafe unknowns and one idempotent effect in manual review
    first = bench.unknown_outcome(UNSAFE)
    bench.advance(30)
    bench.unknown_outcome(UNSAFE)
    review = bench.unknown_outcome(IDEMPOTENT)
    bench.advance(3600 - 30)
    reconcile(review.effect_id, worker="w2")
    # When the API is scraped
    families = {f.name: f for f in LedgerCollector(bench.registry).collect()}

    def sample(name: str, record: EffectRecord) -> float:
        (found,) = [s.value for s in families[name].samples if s.labels == labels(record)]
        return found

    # Then the counts and ages are per contract, with zeros for contracts with none
    assert sample("effect_broker_unknown_effects", first) == 2
    assert sample("effect_broker_manual_review_effects", review) == 1
    assert sample("effect_broker_unknown_effects", review) == 0
    # Ages are read on the database's clock, which the bench's clock does not move:
    # the first was reserved at the real start, the second 30 bench-seconds later
    # (in the database's future), so only the older one gives an age >= 0.
    age = sample("effect_broker_unknown_effect_oldest_age_seconds", first)
    assert 0 <= age < 30
    assert families["effect_broker_ledger_scrape_success"].samples[0].value == 1
    thresholds = {
        s.labels["tool"]: s.value
        for s in families["effect_broker_contract_unknown_age_threshold_seconds"].samples
    }
    assert (
        thresholds["unsafe_charge"] == 900.0
    )  # EFFECT_BROKER_UNKNOWN_ALERT_AFTER default


def test_the_ledger_query_reads_only_waiting_rows_through_its_index(db):
    # Bounded: the partial index serves the scrape's query (the planner prefers a seq
    # scan on a tiny table, so it is told not to; an unusable index would still lose)
    # In a transaction: SET LOCAL outside one does nothing (this module's tests run
    # in autocommit), and the planner's choice was then left to the table's stats.
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("EXPLAIN " + WAITING_QUERY)
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "effect_intents_awaiting_idx" in plan
