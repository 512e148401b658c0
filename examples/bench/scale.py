"""Scale: grow the ledger with ``generate_series`` (no Python loop), then show the plans
of the hot queries on it.

Seeded rows are synthetic but shaped like a live ledger: ten tenants (the bench's own
among them, holding a tenth), 91% succeeded, 4% failed_final, 2% outcome_unknown and
1% each prepared, retryable and dispatching (half of those with an expired lease),
created over the last 30 days with time-ordered (v7) ids as the store writes them,
each with its ``reserved`` event (version 1; the digests are not a valid chain).
Inserts go through the ledger's triggers like any other insert; nothing is disabled.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from django.db import connection, transaction

from effect_broker import store
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.store.reads import due_effects, expired_leases
from examples.bench.broker_cases import BrokerCases

CHUNK = 100_000

# One statement per chunk: intents and their first event together (a CTE).
SEED_CHUNK = """
WITH s AS (
    SELECT g,
           (%(tenants)s::uuid[])[1 + g %% cardinality(%(tenants)s::uuid[])] AS tenant_id,
           CASE
               WHEN g %% 100 < 2 THEN 'outcome_unknown'
               WHEN g %% 100 = 2 THEN 'prepared'
               WHEN g %% 100 = 3 THEN 'retryable'
               WHEN g %% 100 = 4 THEN 'dispatching'
               WHEN g %% 100 < 9 THEN 'failed_final'
               ELSE 'succeeded'
           END AS status,
           now() - (g %% 2592000) * interval '1 second' AS created_at,
           md5(g::text) AS r
    FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
), ids AS (
    -- Time-ordered v7 UUIDs from created_at, as the store writes them (domain/ids.py).
    SELECT s.*, (lpad(to_hex(floor(extract(epoch FROM s.created_at) * 1000)::bigint),
                      12, '0') || '7' || substr(s.r, 1, 3) || '8'
                 || substr(s.r, 4, 15))::uuid AS id
    FROM s
), ins AS (
    INSERT INTO effect_intents (
        id, tenant_id, operation_key, tool, request_hash, arguments_ciphertext,
        arguments_key_id, arguments_preview, contract_name, contract_version,
        safety_class, downstream_key, status, version, attempt_count, next_action_at,
        lease_owner, lease_expires_at, first_dispatch_at, requested_by, created_at,
        updated_at
    )
    SELECT s.id, s.tenant_id, 'seed:' || s.g, 'bench_charge',
           sha256(int8send(s.g)), %(cipher)s, 'k1',
           '{"order": "seed", "amount_minor": 1999, "currency": "EUR"}'::jsonb,
           'bench.charge', '1', 'idempotent', md5(s.g::text) || md5((-s.g)::text),
           s.status, 1,
           CASE WHEN s.status = 'prepared' THEN 0 ELSE 1 END,
           CASE WHEN s.status IN ('prepared', 'outcome_unknown') THEN s.created_at
                WHEN s.status = 'retryable' THEN now() + interval '1 hour' END,
           CASE WHEN s.status = 'dispatching' THEN 'seed-worker' END,
           CASE WHEN s.status = 'dispatching' THEN
               now() + CASE WHEN (s.g / 100) %% 2 = 0 THEN interval '1 hour'
                            ELSE interval '-1 hour' END END,
           CASE WHEN s.status <> 'prepared' THEN s.created_at END,
           'seed', s.created_at, s.created_at
    FROM ids AS s
    RETURNING id, created_at
)
INSERT INTO effect_events (
    effect_id, sequence, event_type, old_status, new_status, version, actor,
    occurred_at, metadata, prev_digest, digest
)
SELECT id, 1, 'reserved', NULL, 'prepared', 1, 'seed', created_at, '{}'::jsonb,
       %(genesis)s, sha256(uuid_send(id))
FROM ins
"""


def parse_scale(text: str) -> int:
    """``10k`` → 10000, ``1m`` → 1000000, ``250000`` → 250000."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*", text)
    if match is None:
        raise ValueError(f"not a ledger size: {text!r} (use e.g. 10k, 1m or 250000)")
    number = float(match[1]) * {"": 1, "k": 1_000, "m": 1_000_000}[match[2].lower()]
    if number < 1 or number > 20_000_000:
        raise ValueError(f"ledger size must be between 1 and 20m, got {text!r}")
    return int(number)


def label(size: int) -> str:
    """1000000 → '1M', 10000 → '10k'."""
    if size >= 1_000_000 and size % 1_000_000 == 0:
        return f"{size // 1_000_000}M"
    if size >= 1_000 and size % 1_000 == 0:
        return f"{size // 1_000}k"
    return str(size)


def intent_count(database_url: str) -> int:
    """Rows in effect_intents now (exact count)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM effect_intents").fetchone()
    return int(row[0]) if row else 0


def seed_to(
    database_url: str,
    size: int,
    bench_tenant_id: str,
    *,
    progress: Callable[[str], None],
) -> tuple[int, list[str]]:
    """Grow the ledger to ``size`` effects; return (rows added, notes)."""
    notes: list[str] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        # Seeding millions of rows (and the VACUUM after it) may outlast the
        # sessions' statement_timeout (config.database.SESSION_TIMEOUTS).
        conn.execute("SET statement_timeout = 0")
        current = int(conn.execute("SELECT count(*) FROM effect_intents").fetchone()[0])  # type: ignore[index]
        missing = max(0, size - current)
        if missing == 0:
            return 0, notes
        tenants = [bench_tenant_id]
        for _ in range(9):
            tenant_id = str(uuid.uuid4())
            conn.execute(
                "INSERT INTO tenants (id, name, api_key_hash, hmac_key_id, disabled, "
                "created_at, updated_at) VALUES (%s, %s, %s, 'h1', false, now(), now())",
                [tenant_id, f"seed-{tenant_id[:8]}", uuid.uuid4().hex * 2],
            )
            tenants.append(tenant_id)
        start = int(conn.execute("SELECT count(*) FROM effect_intents").fetchone()[0])  # type: ignore[index]
        first = start + 1_000_000_000  # seed keys never collide with earlier seeds
        done = 0
        while done < missing:
            chunk = min(CHUNK, missing - done)
            conn.execute(
                SEED_CHUNK,
                {
                    "tenants": tenants,
                    "first": first + done,
                    "last": first + done + chunk - 1,
                    "cipher": b"\x00" * 12 + bytes(range(48)),
                    "genesis": b"\x00" * 32,
                },
            )
            done += chunk
            if missing > CHUNK:
                progress(f"      seeded {current + done:,} / {size:,}")
        # Fresh statistics and visibility map (as autovacuum would leave them), and a
        # checkpoint, so the measurement does not pay for the seed's dirty pages.
        conn.execute("VACUUM (ANALYZE) effect_intents, effect_events")
        try:
            conn.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            notes.append("CHECKPOINT not allowed for this role; dirty pages may remain")
    # The checkpoint leaves up to a gigabyte in the kernel's write-back queue; on a
    # local server its flushing would otherwise compete with the WAL fsyncs measured
    # next (a remote server's write-back is out of our hands).
    os.sync()
    return missing, notes


@dataclass
class Plan:
    """One captured statement and its EXPLAIN (ANALYZE, BUFFERS) output."""

    name: str
    sql: str
    plan: str

    @property
    def seq_scan_on_effects(self) -> bool:
        """True when the plan reads effect_intents sequentially."""
        return bool(re.search(r"Seq Scan on effect_intents\b", self.plan))

    @property
    def access(self) -> str:
        """The scans the plan uses, compactly (index names, or 'seq scan on T')."""
        found: list[str] = []
        for match in re.finditer(
            r"(Index Only Scan|Index Scan|Bitmap Index Scan|Seq Scan)"
            r"(?: Backward)?(?: using (\S+))? on (\S+)",
            self.plan,
        ):
            kind, index, table = match.groups()
            text = f"{index or table}" if kind != "Seq Scan" else f"seq scan {table}"
            if kind == "Index Only Scan":
                text += " (index only)"
            if text not in found:
                found.append(text)
        if re.search(r"Conflict Arbiter Indexes: (\S+)", self.plan):
            arbiter = re.search(r"Conflict Arbiter Indexes: (\S+)", self.plan)
            assert arbiter is not None
            found.append(f"{arbiter[1]} (conflict arbiter)")
        return ", ".join(found) or "(no scan)"

    @property
    def execution_ms(self) -> float | None:
        """The plan's reported execution time."""
        match = re.search(r"Execution Time: ([\d.]+) ms", self.plan)
        return float(match[1]) if match else None

    def to_json(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "name": self.name,
            "sql": self.sql,
            "access": self.access,
            "seq_scan_on_effect_intents": self.seq_scan_on_effects,
            "execution_ms": self.execution_ms,
            "plan": self.plan,
        }


_LEDGER_TABLES = ("effect_intents", "effect_events", "effect_attempts")


@contextmanager
def _explaining(name: str, plans: list[Plan]) -> Iterator[None]:
    """EXPLAIN (ANALYZE, BUFFERS) every ledger statement the block runs, in a
    savepoint rolled back before the statement itself runs, so the code path is
    exactly what production executes."""

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        if (
            not many
            and head in {"SELECT", "INSERT", "UPDATE", "WITH"}
            and any(table in sql for table in _LEDGER_TABLES)
        ):
            raw = context["connection"].connection
            with raw.cursor() as cur:
                cur.execute("SAVEPOINT bench_explain")
                cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
                text = "\n".join(str(row[0]) for row in cur.fetchall())
                cur.execute("ROLLBACK TO SAVEPOINT bench_explain")
                cur.execute("RELEASE SAVEPOINT bench_explain")
            plans.append(Plan(name, " ".join(sql.split()), text))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield


def capture_plans(cases: BrokerCases, existing: EffectRecord) -> list[Plan]:
    """Plans of reservation (new key, replay), claim, list-unknown and the sweeper's
    scans, all run inside one transaction that is rolled back."""
    plans: list[Plan] = []
    with transaction.atomic():
        with _explaining("reservation (new key)", plans):
            fresh = cases.prepare("plan", 0)
        with _explaining("reservation (replay: insert conflicts, select by key)", plans):
            cases.submit_replay_of(existing)
        with _explaining("claim (load by id, fenced CAS to dispatching)", plans):
            cases.claim(fresh)
        with _explaining("list-unknown (tenant, status=outcome_unknown)", plans):
            store.list_effects(cases.tenant_id, status=EffectStatus.OUTCOME_UNKNOWN)
        with _explaining("sweeper: expired leases", plans):
            expired_leases([EffectStatus.DISPATCHING, EffectStatus.RECONCILING])
        with _explaining("sweeper: due prepared", plans):
            due_effects(
                EffectStatus.PREPARED,
                grace=timedelta(0),
                safety=[s.value for s in SafetyClass],
            )
        with _explaining("sweeper: due outcome_unknown", plans):
            due_effects(
                EffectStatus.OUTCOME_UNKNOWN,
                grace=timedelta(0),
                safety=[s.value for s in SafetyClass if s is not SafetyClass.UNSAFE],
            )
        transaction.set_rollback(True)
    return plans
