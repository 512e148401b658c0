"""The database role the API and workers serve with: enough to run, not to rewrite.

docs/fencing.md: the triggers that keep the ledger append-only and fenced bind every
role that is not privileged, and nothing binds a table's owner (it may disable a
trigger, TRUNCATE, or replace a trigger function). So production migrates as the owner
and serves as another role, granted here by the owner after each ``migrate``:

- every table: SELECT, INSERT, UPDATE (the fenced compare-and-swap is an UPDATE that
  the triggers check);
- DELETE only where the broker or its libraries delete rows: procrastinate's job
  tables (job retention), Django's sessions, the admin's own auth tables; never on
  the ledger tables, whose rows are history;
- its sequences (new ids) and procrastinate's functions.

No TRUNCATE, no ownership, no CREATE: ``tests/integration/test_serving_role.py`` runs a
submit and a dispatch as such a role and shows what it is refused.
"""

from __future__ import annotations

from django.db import connection

#: The broker's history: rows are appended or moved through the fence, never deleted.
LEDGER_TABLES: frozenset[str] = frozenset(
    {
        "tenants",
        "effect_intents",
        "effect_attempts",
        "effect_receipts",
        "effect_events",
        "effect_stale_writes",
        "effect_forks",
        "operator_tokens",
    }
)


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def grant_serving_role(role: str, *, schema: str = "public") -> list[str]:
    """Grant ``role`` what serving needs in the current database; return the
    statements run. Run it as the tables' owner after ``migrate`` (idempotent)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY tablename",
            [schema],
        )
        tables = [row[0] for row in cur.fetchall()]
        who, where = _quoted(role), _quoted(schema)
        statements = [f"GRANT USAGE ON SCHEMA {where} TO {who}"]
        for table in tables:
            privileges = "SELECT, INSERT, UPDATE"
            if table not in LEDGER_TABLES:
                privileges += ", DELETE"
            statements.append(
                f"GRANT {privileges} ON TABLE {where}.{_quoted(table)} TO {who}"
            )
        statements += [
            f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {where} TO {who}",
            f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {where} TO {who}",
        ]
        for statement in statements:
            cur.execute(statement)
    return statements
