"""Guard: models and migrations agree (makemigrations --check is clean), and the
migrations that touch a live ledger do it without write-blocking rebuilds."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext


@pytest.mark.django_db
def test_makemigrations_check_is_clean() -> None:
    # --check exits non-zero (SystemExit) when a model change has no migration.
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def _effect_indexes() -> set[str]:
    with connection.cursor() as cur:
        cur.execute("SELECT indexname FROM pg_indexes WHERE tablename LIKE 'effect\\_%'")
        return {row[0] for row in cur.fetchall()}


@pytest.mark.django_db(transaction=True)
def test_0004_drops_redundant_indexes_without_rebuilding_foreign_keys() -> None:
    # A live ledger must keep taking writes while it migrates: Django's own AlterField
    # would drop and re-create each foreign key, re-validating every row under lock.
    app = "effect_broker"
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes(app)
    MigrationExecutor(connection).migrate([(app, "0003_lease_index")])
    try:
        before = _effect_indexes()
        with CaptureQueriesContext(connection) as ctx:
            MigrationExecutor(connection).migrate([(app, "0004_drop_redundant_indexes")])
        sql = "\n".join(q["sql"] for q in ctx.captured_queries)
        assert "FOREIGN KEY" not in sql
        assert "DROP CONSTRAINT" not in sql
        assert all(
            "CONCURRENTLY" in q["sql"]
            for q in ctx.captured_queries
            if q["sql"].startswith(("CREATE INDEX", "DROP INDEX"))
        )
        dropped = before - _effect_indexes()
        assert dropped == {
            "effect_attempts_effect_id_1d18b6ad",
            "effect_events_effect_id_d87cf13c",
            "effect_intents_tenant_id_db0320a3",
        }
    finally:
        MigrationExecutor(connection).migrate(latest)
