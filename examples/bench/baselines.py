"""What users write today, doing the broker's work for one tool call.

* a hand-rolled Django idempotency table: ``get_or_create`` on the key, the call, then
  an update with the result (two commits; no event chain, no encrypted payload, no
  queue, no fencing, and a crash between the call and the update leaves "started"
  forever with nobody to reconcile it);
* agent-ledger's PostgreSQL store (the closest Python peer on PyPI): ``begin`` then
  ``commit`` of a success, through its psycopg pool, when the optional ``bench`` extra
  is installed.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from typing import Any, ClassVar

from django.apps.registry import Apps
from django.db import connection, models

from effect_broker.adapters.simulated_adapter import SimulatedTarget
from effect_broker.domain.canonical import canonical_json

# Its own model registry: the table is the bench's, invisible to makemigrations.
_bench_apps = Apps(installed_apps=[])


class IdempotencyRecord(models.Model):
    """The table a team adds when retries start charging customers twice."""

    key = models.CharField(max_length=200, unique=True)
    request_hash = models.CharField(max_length=64)
    status = models.CharField(max_length=16)
    response = models.JSONField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects: ClassVar[models.Manager[IdempotencyRecord]] = models.Manager()

    class Meta:
        apps = _bench_apps
        app_label = "bench_handrolled"
        db_table = "bench_handrolled_idempotency"


class HandRolled:
    """``get_or_create`` → call the (same simulated) target → ``save()`` the result."""

    def __init__(self, arguments: dict[str, Any]) -> None:
        with connection.schema_editor() as editor:
            editor.create_model(IdempotencyRecord)
        self.target = SimulatedTarget("idempotent")
        self._arguments = arguments
        self._run = uuid.uuid4().hex[:8]

    def key(self, i: int) -> str:
        """The idempotency key of call ``i``."""
        return f"{self._run}:{i}"

    def call(self, i: int) -> dict[str, Any] | None:
        """One tool call as users write it; a replay returns the stored response."""
        digest = hashlib.sha256(canonical_json(self._arguments)).hexdigest()
        record, created = IdempotencyRecord.objects.get_or_create(
            key=self.key(i), defaults={"request_hash": digest, "status": "started"}
        )
        if not created:
            if record.request_hash != digest:
                raise ValueError("idempotency key reused with other arguments")
            return record.response
        row = self.target.create(self.key(i), bytes.fromhex(digest))
        record.status = "succeeded"
        record.response = {"charge_id": row.external_id, "status": "succeeded"}
        record.save(update_fields=["status", "response", "updated_at"])
        return record.response


class AgentLedger:
    """agent-ledger 0.2's ``PostgresStore``: ``begin`` + ``commit`` per tool call.

    Raises ``ImportError`` when the package (optional ``bench`` extra) is missing.
    """

    def __init__(self, database_url: str, arguments: dict[str, Any]) -> None:
        from agent_ledger import EffectLedger, EffectLedgerOptions
        from agent_ledger.stores.postgres import SCHEMA_SQL, PostgresStore
        from psycopg_pool import AsyncConnectionPool

        self._arguments = arguments
        self._run = uuid.uuid4().hex[:8]
        self._loop = asyncio.new_event_loop()

        async def setup() -> tuple[Any, Any]:
            # Its own schema: agent-ledger's table is called "effects", unqualified.
            pool = AsyncConnectionPool(
                database_url,
                min_size=1,
                max_size=1,
                open=False,
                kwargs={"options": "-c search_path=agent_ledger"},
            )
            await pool.open(wait=True)
            async with pool.connection() as conn:
                await conn.execute("CREATE SCHEMA IF NOT EXISTS agent_ledger")
                await conn.execute(SCHEMA_SQL)
            # Its store sets dict rows per cursor; the pool's row type is only typing.
            store = PostgresStore(pool=pool)  # type: ignore[arg-type]
            ledger = EffectLedger(EffectLedgerOptions(store=store))
            return pool, ledger

        self._pool, self._ledger = self._loop.run_until_complete(setup())

    def call(self, i: int) -> None:
        """Begin a new tool call, then record its success (two statements, commits)."""
        from agent_ledger import CommitSucceeded, ToolCall

        async def one() -> None:
            begun = await self._ledger.begin(
                ToolCall(
                    workflow_id=f"{self._run}:{i}",
                    tool="charge_card",
                    args=self._arguments,
                )
            )
            await self._ledger.commit(
                begun.effect.id,
                CommitSucceeded(result={"charge_id": f"ch_{i}", "status": "succeeded"}),
            )

        self._loop.run_until_complete(one())

    def close(self) -> None:
        """Close the pool and the event loop."""
        self._loop.run_until_complete(self._pool.close())
        self._loop.close()


def agent_ledger_version() -> str | None:
    """The installed agent-ledger version, or None."""
    from importlib import metadata

    try:
        return metadata.version("agent-ledger")
    except metadata.PackageNotFoundError:
        return None
