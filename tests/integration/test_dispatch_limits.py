"""Per-contract dispatch limits in PostgreSQL (issue 24, item 7), driven through the
engine bench: an effect over ``max_in_flight`` or ``rate_limit`` waits (its job runs
again shortly; nothing is written, nothing fails), a SIGKILLed worker's slot is free
again when its lease ends, a same-key resend over the limit goes back to waiting as
an unknown outcome, and concurrent claims on separate connections never admit more
than the limit. Three real worker processes: tests/acceptance/test_dispatch_controls.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import pytest
from django.db import connection

from effect_broker.adapters.simulated_adapter import Fault
from effect_broker.domain.contracts import parse_contracts
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.observability import metrics
from effect_broker.services import admission, runtime
from effect_broker.services.dispatch import dispatch
from effect_broker.services.reconcile import reconcile
from effect_broker.services.submission import submit
from effect_broker.store import database_now, load_effect_for_worker, load_events
from tests.integration.engine.harness import CONTRACTS, Bench, engine_bench

S = EffectStatus

LIMITED = """
[[contract]]
name = "t.one-at-a-time"
version = "1"
tool = "one_at_a_time"
safety = "idempotent"
key_retention = "1h"
max_in_flight = 1

[[contract]]
name = "t.two-at-a-time"
version = "1"
tool = "two_at_a_time"
safety = "idempotent"
key_retention = "1h"
max_in_flight = 2

[[contract]]
name = "t.two-per-second"
version = "1"
tool = "two_per_second"
safety = "idempotent"
key_retention = "1h"
rate_limit = 2
"""


@contextmanager
def limited_contracts(bench: Bench) -> Iterator[Bench]:
    """The bench, with the limited contracts deployed beside its own."""
    registry = parse_contracts(CONTRACTS + LIMITED, source="limits-bench")
    with runtime.override(registry=registry):
        bench.registry = registry
        yield bench


@pytest.fixture
def limited(bench: Bench) -> Iterator[Bench]:
    with limited_contracts(bench) as limited:
        yield limited


def charge(bench: Bench, tool: str, n: int) -> EffectRecord:
    return submit(
        bench.tenant,
        EffectRequest(operation_key=f"{tool}:{n}", tool=tool, arguments={"n": n}),
    ).effect


def at_of(bench: Bench, record: EffectRecord) -> datetime:
    """When (the database's clock) the effect's next dispatch was asked for."""
    (at,) = [
        at
        for kind, effect_id, at in bench.scheduler.requests
        if kind == "dispatch" and effect_id == record.effect_id and at is not None
    ]
    return at


def test_over_max_in_flight_an_effect_waits_and_is_never_failed(limited: Bench) -> None:
    # Given one attempt of the contract in flight (claimed, its lease running)
    contract = limited.registry.for_tool("one_at_a_time")
    first = charge(limited, "one_at_a_time", 1)
    claimed = admission.claim(runtime.get_runtime(), first, contract, worker="w1")
    assert not isinstance(claimed, admission.Waiting)
    second = charge(limited, "one_at_a_time", 2)
    limited.scheduler.requests.clear()
    before = metrics.DEFERRED.labels(*metrics.record_labels(second), "max_in_flight")
    counted = before._value.get()
    # When the second one's job runs
    waited = dispatch(second.effect_id, worker="w2")
    # Then it was not claimed, nothing was written, and its job runs again shortly
    assert waited.status is S.PREPARED
    assert load_effect_for_worker(second.effect_id).version == second.version
    soon = at_of(limited, second) - database_now(limited.clock.database_offset())
    assert timedelta(0) < soon <= timedelta(milliseconds=100)
    assert before._value.get() == counted + 1
    assert limited.adapters[SafetyClass.IDEMPOTENT].sends == []


def test_a_dead_workers_slot_is_free_when_its_lease_ends(limited: Bench) -> None:
    # Given a worker claimed an attempt and was SIGKILLed (nobody closes it)
    contract = limited.registry.for_tool("one_at_a_time")
    dead = charge(limited, "one_at_a_time", 1)
    admission.claim(runtime.get_runtime(), dead, contract, worker="killed")
    waiting = charge(limited, "one_at_a_time", 2)
    assert dispatch(waiting.effect_id, worker="w2").status is S.PREPARED
    # When its lease runs out (no sweep has run: the row still says dispatching)
    limited.advance(31)
    assert load_effect_for_worker(dead.effect_id).status is S.DISPATCHING
    # Then the slot is free: the waiting effect is sent
    assert dispatch(waiting.effect_id, worker="w2").status is S.SUCCEEDED


def test_over_rate_limit_waiters_are_spaced_one_token_apart(limited: Bench) -> None:
    # Given three effects due at once under a limit of 2 per second
    records = [charge(limited, "two_per_second", n) for n in range(3)]
    limited.scheduler.requests.clear()
    # When their jobs run at the same moment
    done = [dispatch(r.effect_id, worker="w1") for r in records]
    # Then the first is sent, the others wait half a second apart (not together)
    assert [d.status for d in done] == [S.SUCCEEDED, S.PREPARED, S.PREPARED]
    # ... the admission on the record: when, on the database's clock ...
    (started,) = [
        e
        for e in load_events(records[0].effect_id)
        if e.facts.event_type == "dispatch_started"
    ]
    admitted_at = datetime.fromisoformat(str(started.facts.metadata["admitted_at"]))
    assert started.facts.metadata["in_flight"] == 0
    # ... and the next two due one token (half a second) apart, from that moment
    wakes = [at_of(limited, records[1]), at_of(limited, records[2])]
    assert [round((w - admitted_at).total_seconds(), 3) for w in wakes] == [0.5, 1.0]
    # When half a second has passed, then the second is sent, the third still waits
    limited.advance(0.5)
    assert dispatch(records[1].effect_id, worker="w1").status is S.SUCCEEDED
    assert dispatch(records[2].effect_id, worker="w1").status is S.PREPARED


def test_a_same_key_resend_over_the_limit_waits_as_an_unknown_outcome(
    limited: Bench,
) -> None:
    # Given an effect whose answer was lost, and its contract's one slot taken
    contract = limited.registry.for_tool("one_at_a_time")
    lost = charge(limited, "one_at_a_time", 1)
    limited.targets[SafetyClass.IDEMPOTENT].inject(Fault.LOSE_RESPONSE)
    assert dispatch(lost.effect_id, worker="w1").status is S.OUTCOME_UNKNOWN
    busy = charge(limited, "one_at_a_time", 2)
    admission.claim(runtime.get_runtime(), busy, contract, worker="w2")
    limited.scheduler.requests.clear()
    # When its reconciliation (a same-key resend) runs
    after = reconcile(lost.effect_id, worker="w3")
    # Then no attempt started: it is an unknown outcome again, due shortly, and its
    # reconcile job asked for then
    assert after.status is S.OUTCOME_UNKNOWN
    assert after.attempt_count == 1
    assert after.lease_owner is None
    last = load_events(lost.effect_id)[-1].facts
    assert (last.event_type, last.metadata["waiting_on"]) == (
        "resend_deferred",
        "max_in_flight",
    )
    ((kind, _, at),) = limited.scheduler.requests
    assert kind == "reconcile"
    assert at == after.next_action_at


def test_concurrent_claims_on_separate_connections_never_exceed_the_limit(
    transactional_db: None,
) -> None:
    # Given eight due effects of a contract allowing two attempts at once
    with engine_bench() as bench, limited_contracts(bench) as limited:
        contract = limited.registry.for_tool("two_at_a_time")
        records = [charge(limited, "two_at_a_time", n) for n in range(8)]
        rt = runtime.get_runtime()
        start = threading.Barrier(len(records))
        outcomes: list[object] = []

        def claim(record: EffectRecord) -> None:
            try:
                start.wait()
                outcomes.append(admission.claim(rt, record, contract, worker="w"))
            finally:
                connection.close()

        # When eight workers claim them at the same moment, each on its connection
        threads = [threading.Thread(target=claim, args=(r,)) for r in records]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        # Then exactly two were admitted, and the others wait (none failed)
        admitted = [o for o in outcomes if not isinstance(o, admission.Waiting)]
        assert len(outcomes) == 8
        assert len(admitted) == 2
        statuses = sorted(load_effect_for_worker(r.effect_id).status for r in records)
        assert statuses.count(S.DISPATCHING) == 2
        assert statuses.count(S.PREPARED) == 6
