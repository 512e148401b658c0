"""Which transitions NOTIFY (migration 0014): a dispatched effect's claim does not, its
outcome does, and so does an operator's resolution of an unknown outcome. Every NOTIFY
costs a committed transaction on every listening backend of the database (PostgreSQL
wakes them all), so each one a waiter cannot use is waste."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from config.database import url_from_settings
from effect_broker.domain.contracts import load_contracts
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.services import resolution, runtime
from effect_broker.services.dispatch import dispatch
from effect_broker.store.changes import CHANNEL
from examples.bench.broker_cases import BrokerCases, bench_tenant
from examples.bench.environment import SIMULATED_CONTRACT
from tests.integration.engine.harness import Bench

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[psycopg.Connection[Any]]:
    contracts = tmp_path / "contracts.toml"
    contracts.write_text(SIMULATED_CONTRACT, encoding="utf-8")
    connection.ensure_connection()
    url = url_from_settings(connection.settings_dict)
    runtime.reset()
    try:
        with (
            runtime.override(registry=load_contracts(contracts)),
            psycopg.connect(url, autocommit=True) as conn,
        ):
            conn.execute(f"LISTEN {CHANNEL}")
            yield conn
    finally:
        runtime.reset()


def _received(conn: psycopg.Connection[Any]) -> list[str]:
    conn.execute("SELECT 1")  # delivers what is pending
    return [n.payload for n in conn.notifies(timeout=0.3, stop_after=10)]


def test_only_the_settling_change_of_a_dispatch_notifies(
    listener: psycopg.Connection[Any],
) -> None:
    cases = BrokerCases(bench_tenant("notify"))
    effect = cases.submit_new_series("notify", 1)
    assert _received(listener) == []  # prepared: no waiter stops there
    done = dispatch(effect.effect_id, worker="notify-test")
    assert done.status is EffectStatus.SUCCEEDED
    # dispatching (the claim) is silent; succeeded wakes the waiters, once
    assert _received(listener) == [effect.effect_id]


@pytest.mark.parametrize(
    ("verdict", "evidence", "final"),
    [
        ("succeeded", {"source": "dashboard", "reference": "ch_1"}, "succeeded"),
        ("failed", None, "failed_final"),
    ],
)
def test_an_operators_resolution_of_an_unknown_outcome_notifies(
    bench: Bench, operator: Any, verdict: str, evidence: Any, final: str
) -> None:
    # A wait for "settled" (issue 23) sits through outcome_unknown and ends only at
    # the operator's resolution: that change must wake it, not its deadline. (The
    # resolution passes through manual_review in the same transaction; both notify,
    # and PostgreSQL delivers the one notification at commit.)
    unknown = bench.unknown_outcome(SafetyClass.UNSAFE)
    url = url_from_settings(connection.settings_dict)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        resolved = resolution.resolve(
            bench.tenant,
            unknown.effect_id,
            verdict,
            operator=operator,
            reason="checked the target",
            evidence=evidence,
        )
        assert resolved.status.value == final
        assert _received(conn) == [unknown.effect_id]
