"""The second baseline: an unmodified agent-ledger local ledger under the same kills.

agent-ledger (PyPI ``agent-ledger``, the named peer in the spec) wraps a tool handler
in ``EffectLedger.run()``: a row keyed by ``sha256(workflow_id | tool | args)`` is
upserted as ``processing``, the handler runs, the row moves to ``succeeded``; a second
``run()`` of the same call replays the recorded result. It is driven here the way its
README says to use it, at its best:

* the PostgreSQL store (``PostgresStore`` on a psycopg pool, ``SCHEMA_SQL`` in a schema
  of its own);
* the handler passes ``effect.idem_key`` down as the request's key ("If [the downstream
  API supports idempotency keys], passing down effect.idem_key would ensure
  exactly-once execution"): as ``Idempotency-Key`` to the idempotent target and as
  ``X-Correlation-Key`` to the reconcilable one (which records it but does not
  deduplicate by it); the unsafe target takes no key;
* crash recovery is its documented stale takeover (``StaleOptions(after_ms=...)``): a
  ``processing`` row untouched that long is claimed again and the handler re-runs. With
  the default (takeover off) a killed call stays ``processing`` forever and every
  retry ends in ``EffectTimeoutError``: no second charge, and no completed call either;
* transactional mode runs the whole ``run()`` inside one database transaction
  (``tx=``), with the "tool" writing its local row on the same connection.

The crash matrix SIGKILLs it at the same six failpoints as the broker and the naive
loop, then runs it again (the agent retrying), and counts its charges in the target's
table by its own body. Its local ledger cannot tell "the request never left" from "the
target committed and the answer was lost", which is the point of the comparison.

Run: ``python -m examples.crash_matrix.ledger_runner --database-url URL --target URL
--mode idempotent --workflow-id W --body '{...}' [--failpoint after_target_commit]``.
Exit 0 when ``run()`` returned (the ledger holds ``succeeded``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import signal
import sys
from importlib import metadata
from typing import TYPE_CHECKING, Any

import httpx
import psycopg

if TYPE_CHECKING:
    from examples.crash_matrix.rig import Rig

#: Its own schema: agent-ledger's table is called "effects", unqualified.
SCHEMA = "agent_ledger"
#: A ``processing`` row untouched this long is taken over (its floor is 1 s). Long
#: enough that a live call is never taken over in the matrix, short enough to keep
#: cells quick: the retry after a kill waits this long before acting.
STALE_AFTER_MS = 2000
#: How long ``run()`` waits for another caller's ``processing`` row.
WAIT_SECONDS = 20.0
_LOCAL = f"""
CREATE TABLE IF NOT EXISTS {SCHEMA}.local_charges (
    id bigserial PRIMARY KEY,
    workflow_id text NOT NULL,
    body jsonb NOT NULL
)"""


def ledger_missing() -> str | None:
    """Why the agent-ledger baseline cannot run here, or None when it can."""
    for module in ("agent_ledger", "psycopg_pool"):
        if importlib.util.find_spec(module) is None:
            return (
                f"agent-ledger is not installed ({module} cannot be imported; "
                "pip install -e '.[dev]')"
            )
    return None


def ledger_version() -> str:
    """The installed agent-ledger version (only when ``ledger_missing()`` is None)."""
    return metadata.version("agent-ledger")


def ensure_ledger_schema(database_url: str) -> None:
    """Create agent-ledger's table (its own ``SCHEMA_SQL``) and the local charges."""
    from agent_ledger.stores.postgres import SCHEMA_SQL

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(4243)")
        try:
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
            conn.execute(f"SET search_path TO {SCHEMA}")
            conn.execute(SCHEMA_SQL)
            conn.execute(_LOCAL)
        finally:
            conn.execute("SELECT pg_advisory_unlock(4243)")


def ledger_body(naive_body: dict[str, Any]) -> dict[str, Any]:
    """The ledger's body for a cell: the naive body, relabelled (unique per cell)."""
    return {**naive_body, "cell": "ledger/" + naive_body["cell"].split("/", 1)[1]}


def local_effects(database_url: str, workflow_id: str) -> int:
    """Charges the ledger's transactional "tool" wrote for ``workflow_id``."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM {SCHEMA}.local_charges WHERE workflow_id = %s",
            [workflow_id],
        ).fetchone()
    return int(row[0]) if row else 0


def run_ledger(rig: Rig, scenario: str, body: dict[str, Any], failpoint: str) -> int:
    """Run the ledger until it records success (a crash means run it again); count.

    The first run is killed at ``failpoint``; the next ones are the agent's retries.
    """
    workflow_id = body["cell"]
    rig.run_baseline(
        "examples.crash_matrix.ledger_runner",
        ["--mode", scenario, "--workflow-id", workflow_id, "--body", json.dumps(body)],
        failpoint,
        timeout=90,
    )
    if scenario == "transactional":
        return local_effects(rig.database_url, workflow_id)
    return rig.count_baseline(scenario, body)


def _failpoint(armed: str, name: str) -> None:
    if armed == name:
        sys.stderr.write(f"agent-ledger: failpoint {name} fired\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


async def _run(args: argparse.Namespace) -> None:
    from agent_ledger import (
        ConcurrencyOptions,
        Effect,
        EffectLedger,
        EffectLedgerOptions,
        RunOptions,
        StaleOptions,
        ToolCall,
    )
    from agent_ledger.stores.postgres import PostgresStore
    from psycopg_pool import AsyncConnectionPool

    body = json.loads(args.body)
    pool = AsyncConnectionPool(
        args.database_url,
        min_size=1,
        max_size=2,
        open=False,
        kwargs={"options": f"-c search_path={SCHEMA}"},
    )
    await pool.open(wait=True)
    # Its store sets dict rows per cursor; the pool's row type is only typing.
    ledger = EffectLedger(EffectLedgerOptions(store=PostgresStore(pool=pool)))  # type: ignore[arg-type]
    options = RunOptions(
        concurrency=ConcurrencyOptions(effect_timeout_s=WAIT_SECONDS),
        stale=StaleOptions(after_ms=STALE_AFTER_MS),
    )
    call = ToolCall(workflow_id=args.workflow_id, tool=f"charge_{args.mode}", args=body)
    try:
        # Nothing of the call is written before run()'s first statement, its upsert.
        _failpoint(args.failpoint, "before_reservation_commit")
        if args.mode == "transactional":
            async with pool.connection() as conn, conn.transaction():

                async def write_local(effect: Effect) -> dict[str, Any]:
                    _failpoint(args.failpoint, "after_reservation_commit")
                    _failpoint(args.failpoint, "before_request_write")
                    await conn.execute(
                        "INSERT INTO local_charges (workflow_id, body) VALUES (%s, %s)",
                        [args.workflow_id, json.dumps(body)],
                    )
                    _failpoint(args.failpoint, "after_target_commit")
                    _failpoint(args.failpoint, "before_receipt_commit")
                    return {"status": "succeeded"}

                # Its store sets dict rows per cursor; the row type is only typing.
                await ledger.run(call, write_local, tx=conn, run_options=options)  # type: ignore[arg-type]
        else:

            async def charge(effect: Effect) -> dict[str, Any]:
                # The upsert has committed (the pool commits each statement's block).
                _failpoint(args.failpoint, "after_reservation_commit")
                headers = {
                    "idempotent": {"Idempotency-Key": effect.idem_key},
                    "reconcilable": {"X-Correlation-Key": effect.idem_key},
                }.get(args.mode, {})
                _failpoint(args.failpoint, "before_request_write")
                async with httpx.AsyncClient(trust_env=False, timeout=10.0) as client:
                    response = await client.post(
                        f"{args.target}/{args.mode}/charges", json=body, headers=headers
                    )
                response.raise_for_status()
                _failpoint(args.failpoint, "after_target_commit")
                # run() records success right after the handler returns.
                _failpoint(args.failpoint, "before_receipt_commit")
                result: dict[str, Any] = response.json()
                return result

            await ledger.run(call, charge, run_options=options)
        _failpoint(args.failpoint, "after_receipt_commit")
    finally:
        await pool.close()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument(
        "--mode",
        required=True,
        choices=["idempotent", "reconcilable", "unsafe", "transactional"],
    )
    parser.add_argument("--workflow-id", required=True)
    parser.add_argument("--body", required=True)
    parser.add_argument("--failpoint", default="")
    asyncio.run(_run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
