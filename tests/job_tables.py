"""Start a test that runs real worker processes with no old procrastinate jobs."""

from __future__ import annotations

from django.db import connection


def forget_old_jobs() -> None:
    """Empty procrastinate's tables: Django's flush between tests skips them (they are
    not Django models), so a worker would otherwise pick up an earlier test's jobs."""
    with connection.cursor() as cur:
        cur.execute(
            "TRUNCATE procrastinate_jobs, procrastinate_periodic_defers, "
            "procrastinate_workers CASCADE"
        )
