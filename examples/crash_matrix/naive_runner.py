"""The naive baseline: a plain local-ledger retry loop, as agent runtimes write it.

    TOOL_REQUESTED -> call the tool -> TOOL_SUCCEEDED; on restart, retry if no success.

It has no stable downstream key (a fresh Idempotency-Key per attempt, the usual
``uuid4()`` at the call site) and no reconciliation. The crash matrix kills it at the
same failpoints as the broker; a kill after the target committed but before
TOOL_SUCCEEDED makes the retry charge twice. That duplicate is what the broker prevents.

Run: ``python -m examples.crash_matrix.naive_runner --database-url URL --target URL
--mode idempotent --operation-key K --body '{...}' [--failpoint after_target_commit]``.
Exit 0 when the ledger holds TOOL_SUCCEEDED.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import uuid

import httpx
import psycopg

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS naive;
CREATE TABLE IF NOT EXISTS naive.tool_events (
    id bigserial PRIMARY KEY,
    operation_key text NOT NULL,
    event text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS naive.local_charges (
    id bigserial PRIMARY KEY,
    operation_key text NOT NULL,
    body jsonb NOT NULL
);
"""


def _failpoint(armed: str, name: str) -> None:
    if armed == name:
        sys.stderr.write(f"naive: failpoint {name} fired\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def ensure_schema(database_url: str) -> None:
    """Create the naive ledger's tables (idempotent)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(4242)")
        try:
            conn.execute(SCHEMA)
        finally:
            conn.execute("SELECT pg_advisory_unlock(4242)")


def run(args: argparse.Namespace) -> int:
    """One pass of the retry loop; returns the process exit code."""
    body = json.loads(args.body)
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        events = {
            row[0]
            for row in conn.execute(
                "SELECT event FROM naive.tool_events WHERE operation_key = %s",
                [args.operation_key],
            )
        }
        if "TOOL_SUCCEEDED" in events:
            return 0
        _failpoint(args.failpoint, "before_reservation_commit")
        conn.execute(
            "INSERT INTO naive.tool_events (operation_key, event) "
            "VALUES (%s, 'TOOL_REQUESTED')",
            [args.operation_key],
        )
        _failpoint(args.failpoint, "after_reservation_commit")
        _failpoint(args.failpoint, "before_request_write")
        if args.mode == "transactional":
            # The "tool" writes a local row in its own transaction, apart from the log.
            conn.execute(
                "INSERT INTO naive.local_charges (operation_key, body) VALUES (%s, %s)",
                [args.operation_key, json.dumps(body)],
            )
        else:
            headers = {"Idempotency-Key": str(uuid.uuid4())}  # new key per attempt
            with httpx.Client(trust_env=False, timeout=10.0) as client:
                client.post(
                    f"{args.target}/{args.mode}/charges", json=body, headers=headers
                )
        _failpoint(args.failpoint, "after_target_commit")
        _failpoint(args.failpoint, "before_receipt_commit")
        conn.execute(
            "INSERT INTO naive.tool_events (operation_key, event) "
            "VALUES (%s, 'TOOL_SUCCEEDED')",
            [args.operation_key],
        )
        _failpoint(args.failpoint, "after_receipt_commit")
    return 0


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
    parser.add_argument("--operation-key", required=True)
    parser.add_argument("--body", required=True)
    parser.add_argument("--failpoint", default="")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
