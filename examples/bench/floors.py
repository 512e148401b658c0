"""The floors: what a durable commit and a bare procrastinate job cost on this machine.

Nothing built on PostgreSQL and procrastinate can be faster than these, so the broker's
figures are read as multiples of them.
"""

from __future__ import annotations

import os
import uuid

import psycopg

from examples.bench.noop_task import noop

_FLOOR_TABLE = """
CREATE TABLE IF NOT EXISTS bench_insert_floor (
    key text PRIMARY KEY,
    payload bytea NOT NULL,
    created_at timestamptz NOT NULL
)"""
_FLOOR_INSERT = """
INSERT INTO bench_insert_floor (key, payload, created_at) VALUES (%s, %s, now())
ON CONFLICT (key) DO NOTHING
"""


class InsertFloor:
    """One single-row ``INSERT … ON CONFLICT DO NOTHING`` per call, each its own commit
    (psycopg, autocommit): the durable-commit floor of this server."""

    def __init__(self, database_url: str) -> None:
        self._conn = psycopg.connect(database_url, autocommit=True)
        self._conn.execute(_FLOOR_TABLE)
        self._run = uuid.uuid4().hex[:8]
        self._payload = os.urandom(32)

    def call(self, i: int) -> None:
        """Insert (and commit) a new key."""
        self._conn.execute(_FLOOR_INSERT, (f"{self._run}:{i}", self._payload))

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


class ProcrastinateDefer:
    """``noop.defer()`` on Django's connection: one job row, one commit (the same
    connector the broker's scheduler defers through)."""

    def __init__(self) -> None:
        self._run = int(uuid.uuid4().int % 1_000_000) * 1_000_000

    def call(self, i: int) -> None:
        """Defer one no-op job."""
        noop.defer(n=self._run + i)
