"""procrastinate's job tables stay bounded (issue 13), the ledger untouched.

``effect_broker.tasks.remove_finished_jobs`` runs procrastinate's own delete query:
succeeded jobs go after ``succeeded_hours``, every other finished job after
``finished_hours``; queued and running jobs and every ledger row stay.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

from effect_broker.domain.records import EffectRequest
from effect_broker.models import EffectEvent, EffectIntent
from effect_broker.services.submission import submit
from effect_broker.tasks import app, remove_finished_jobs
from tests.job_tables import forget_old_jobs

ROOT = Path(__file__).resolve().parents[2]
RETENTION = {"succeeded_hours": 24, "finished_hours": 168}


def _job(status: str, hours_ago: float, lock: str | None = None) -> int:
    """A job that went todo -> doing -> ``status`` (procrastinate's triggers write
    its events), every event moved ``hours_ago`` into the past."""
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, lock, args) "
            "VALUES ('dispatch', 'effect_broker.dispatch_effect', %s, '{}') "
            "RETURNING id",
            [lock],
        )
        job_id = int(cur.fetchone()[0])
        return _finish(job_id, status, hours_ago)


def _finish(job_id: int, status: str, hours_ago: float) -> int:
    with connection.cursor() as cur:
        if status != "todo":
            cur.execute(
                "UPDATE procrastinate_jobs SET status = 'doing' WHERE id = %s", [job_id]
            )
        if status not in ("todo", "doing"):
            cur.execute(
                "UPDATE procrastinate_jobs SET status = %s WHERE id = %s",
                [status, job_id],
            )
        cur.execute(
            "UPDATE procrastinate_events SET at = now() - make_interval(hours => %s) "
            "WHERE job_id = %s",
            [hours_ago, job_id],
        )
    return job_id


def _rows(table: str, job_ids: list[int]) -> set[int]:
    column = "id" if table == "procrastinate_jobs" else "job_id"
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT DISTINCT {column} FROM {table} WHERE {column} = ANY(%s)", [job_ids]
        )
        return {int(r[0]) for r in cur.fetchall()}


@pytest.mark.django_db
@override_settings(EFFECT_BROKER_JOB_RETENTION=RETENTION)
def test_finished_jobs_past_retention_go_with_their_events_and_nothing_else(
    tenant,
) -> None:
    forget_old_jobs()
    # Given an effect whose dispatch job succeeded two days ago ...
    effect_id = submit(
        tenant,
        EffectRequest(
            operation_key="order:retention",
            tool="charge_card",
            arguments={"order": "7", "amount_minor": 100, "currency": "EUR"},
        ),
    ).effect.effect_id
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id FROM procrastinate_jobs WHERE args->>'effect_id' = %s",
            [effect_id],
        )
        effect_job = _finish(int(cur.fetchone()[0]), "succeeded", 48)
    ledger_before = list(
        EffectEvent.objects.filter(effect_id=effect_id).values_list("id", "event_type")
    )
    # ... and jobs on either side of each retention
    old_succeeded = _job("succeeded", 25)
    new_succeeded = _job("succeeded", 23)
    failed_within = _job("failed", 100)
    aborted_within = _job("aborted", 100)
    failed_past = _job("failed", 169)
    aborted_past = _job("aborted", 169)
    queued_old = _job("todo", 500, lock="effect:queued")
    running_old = _job("doing", 500, lock="effect:running")
    everything = [
        effect_job,
        old_succeeded,
        new_succeeded,
        failed_within,
        aborted_within,
        failed_past,
        aborted_past,
        queued_old,
        running_old,
    ]
    assert _rows("procrastinate_events", everything) == set(everything)

    # When the cleanup runs
    remove_finished_jobs()

    # Then exactly the finished jobs past their retention are gone, events too
    kept = {new_succeeded, failed_within, aborted_within, queued_old, running_old}
    assert _rows("procrastinate_jobs", everything) == kept
    assert _rows("procrastinate_events", everything) == kept
    # and the effect's ledger is untouched: its intent and every event remain
    assert EffectIntent.objects.filter(pk=effect_id).exists()
    assert (
        list(
            EffectEvent.objects.filter(effect_id=effect_id).values_list(
                "id", "event_type"
            )
        )
        == ledger_before
    )
    assert ledger_before  # (the reservation wrote at least its "reserved" event)


def test_the_cleanup_is_a_periodic_job_on_the_maintenance_queue() -> None:
    periodic = app.periodic_registry.periodic_tasks[
        ("effect_broker.remove_finished_jobs", "remove_finished_jobs")
    ]
    assert periodic.task.queue == "maintenance"
    assert periodic.cron == "23 * * * *"  # hourly


def _worker_setting(env: dict[str, str]) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.PROCRASTINATE_WORKER_DEFAULTS['delete_jobs'], "
            "settings.EFFECT_BROKER_JOB_RETENTION)",
        ],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_retention_zero_has_the_worker_delete_a_job_as_it_succeeds() -> None:
    assert _worker_setting(
        {
            "EFFECT_BROKER_JOB_RETENTION_HOURS": "0",
            "EFFECT_BROKER_FAILED_JOB_RETENTION_HOURS": "",
        }
    ) == ("successful {'succeeded_hours': 0, 'finished_hours': 168}")


def test_a_retention_that_is_not_whole_hours_is_refused() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "EFFECT_BROKER_JOB_RETENTION_HOURS": "-1",
        },
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode != 0
    assert "EFFECT_BROKER_JOB_RETENTION_HOURS must be a whole number of hours" in (
        out.stderr
    )
