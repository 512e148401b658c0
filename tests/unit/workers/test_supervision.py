"""The worker supervisor's pure parts: its backoff and the queues it runs."""

from __future__ import annotations

import pytest
from procrastinate.contrib.django import app

from effect_broker.workers.supervision import (
    BROKER_QUEUES,
    RECONCILER_QUEUES,
    Backoff,
    _SupervisedWorker,
)
from effect_broker.workers.wakeups import WakeKeepingWorker


def test_the_backoff_doubles_from_its_start_up_to_its_cap() -> None:
    backoff = Backoff(initial=0.5, multiplier=2.0, cap=5.0)
    middle = [backoff.delay(n, rand=lambda: 0.5) for n in range(6)]
    assert middle == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_the_backoff_jitters_within_a_fifth_and_never_passes_its_cap() -> None:
    backoff = Backoff(initial=1.0, multiplier=2.0, cap=5.0)
    assert backoff.delay(0, rand=lambda: 0.0) == pytest.approx(0.8)
    assert backoff.delay(0, rand=lambda: 1.0) == pytest.approx(1.2)
    assert backoff.delay(10, rand=lambda: 1.0) == 5.0
    assert backoff.delay(10_000, rand=lambda: 0.0) == 4.0  # no overflow


def test_the_worker_runs_every_queue_the_broker_defers_to() -> None:
    app.perform_import_paths()
    queues = {
        task.queue for name, task in app.tasks.items() if name.startswith("effect_broker")
    }
    assert queues == set(BROKER_QUEUES)


def test_the_reconciler_never_dispatches() -> None:
    assert set(RECONCILER_QUEUES) == {"reconcile", "maintenance"}
    assert "dispatch" not in RECONCILER_QUEUES


def test_the_supervised_worker_does_not_lose_a_wake_up() -> None:
    # tests/integration/test_worker_wakeups.py proves WakeKeepingWorker's fix.
    assert issubclass(_SupervisedWorker, WakeKeepingWorker)
