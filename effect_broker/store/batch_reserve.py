"""Batch reservation (issue 13): N intents, their events and their dispatch jobs in
one statement and one commit, with a (row, created) answer per intent.

``ledger.reserve`` is the single-intent path; this is its sibling for many keys at once.
The statement is ``sql.RESERVE_BATCH``: one round trip whether the keys are new, taken
or mixed, plus one read only for keys a concurrent inserter committed during it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from effect_broker.domain.event_chain import GENESIS_DIGEST
from effect_broker.domain.records import EffectRecord
from effect_broker.store import prepared, sql
from effect_broker.store.conflicts import retryable_conflicts
from effect_broker.store.ledger import (
    NewIntent,
    QueuedJob,
    reserved_event_params,
    reserved_metadata,
)
from effect_broker.store.rows import record_from_row


def _item(intent: NewIntent, *, now: datetime, actor: str) -> dict[str, Any]:
    """One element of ``sql.RESERVE_BATCH``'s JSON input: the intent and the digest
    of its first event, the same ``reserved`` event ``reserve`` writes."""
    _, digest = reserved_event_params(intent, now=now, actor=actor)
    return {
        "id": intent.effect_id,
        "operation_key": intent.operation_key,
        "tool": intent.tool,
        "request_hash": intent.request_hash.hex(),
        "arguments_ciphertext": intent.arguments_ciphertext.hex(),
        "arguments_key_id": intent.arguments_key_id,
        "arguments_preview": dict(intent.arguments_preview),
        "contract_name": intent.contract_name,
        "contract_version": intent.contract_version,
        "safety_class": intent.safety_class,
        "downstream_key": intent.downstream_key,
        "trace_id": intent.trace_id,
        "requested_by": intent.requested_by,
        "trace_context": intent.trace_context,
        "digest": digest.hex(),
        # jsonb keeps no key order or spacing, so the stored metadata reads back
        # equal to what was hashed whichever JSON text carries it.
        "metadata": reserved_metadata(intent),
        "actor": actor,
        "status": intent.status.value,
        # The first due time's distance from the database's clock (an approval's
        # deadline), in microseconds: exact, where seconds as a float may not be.
        "due_in_us": intent.due_in // timedelta(microseconds=1),
    }


def _job_fields(job: QueuedJob) -> dict[str, Any]:
    return {
        "job_queue": job.queue_name,
        "job_task": job.task_name,
        "job_priority": job.priority,
        "job_lock": job.lock,
        "job_queueing_lock": job.queueing_lock,
        "job_args": dict(job.args),
        "job_scheduled_at": None
        if job.scheduled_at is None
        else job.scheduled_at.isoformat(),
    }


def reserve_many(
    intents: Sequence[NewIntent],
    *,
    now: datetime,
    actors: Sequence[str],
    jobs: Sequence[QueuedJob | None] | None = None,
    database_offset: timedelta = timedelta(0),
) -> list[tuple[EffectRecord, bool]]:
    """Insert each intent whose (tenant, operation_key) is free; return, in the order
    given, (row, created) per intent: the new row, or the one that already held the key.

    All intents belong to one tenant and carry distinct keys; ``actors[i]`` is the
    actor of ``intents[i]``'s ``reserved`` event. ``jobs[i]`` is the dispatch job of
    ``intents[i]``, inserted only if that intent is (None: no job, e.g. for an
    intent that waits for an operator's approval). Intents, events and jobs are ONE
    statement: one round trip and, in autocommit, one commit. As in ``reserve``,
    ``now`` stamps rows and events, and the first due time is the database's clock
    plus ``database_offset``. The rows are inserted in key order, so batches that
    share keys wait for each other instead of deadlocking.
    """
    if not intents:
        return []
    tenants = {i.tenant_id for i in intents}
    keys = [i.operation_key for i in intents]
    if len(tenants) != 1 or len(set(keys)) != len(keys):
        raise ValueError("a batch reservation needs one tenant and distinct keys")
    if len(actors) != len(intents) or (jobs is not None and len(jobs) != len(intents)):
        raise ValueError("a batch reservation needs one actor and job per intent")
    items = [
        _item(intent, now=now, actor=actor)
        for intent, actor in zip(intents, actors, strict=True)
    ]
    if jobs is not None:
        for item, job in zip(items, jobs, strict=True):
            if job is not None:  # None: an intent that waits for approval
                item.update(_job_fields(job))
        statement = sql.RESERVE_BATCH.format(
            job=sql.RESERVE_BATCH_JOBS, job_source=", job"
        )
    else:
        statement = sql.RESERVE_BATCH.format(job="", job_source="")
    tenant_id = next(iter(tenants))
    params: dict[str, Any] = {
        "items": json.dumps(items, ensure_ascii=False, separators=(",", ":")),
        "tenant": tenant_id,
        "now": now,
        "offset": database_offset,
        "genesis": GENESIS_DIGEST,
    }
    found: dict[str, tuple[EffectRecord, bool]] = {}
    # Prepared on the server (store/prepared.py): the batch's text is the same for
    # every size (its items are one JSON parameter), so one plan serves them all. A
    # deadlock or serialization failure wrote nothing of the batch: a 503 to retry.
    with retryable_conflicts(), prepared.cursor() as cur:
        cur.execute(statement, params)
        rows = cur.fetchall()
    for row in rows:
        record = record_from_row(row[:-1])
        found[record.operation_key] = (record, bool(row[-1]))
    # Neither inserted nor there before: a concurrent inserter of the same key
    # committed while this statement waited on it (ON CONFLICT); read the winners.
    missing = [k for k in keys if k not in found]
    if missing:
        with connection.cursor() as cur:
            cur.execute(sql.SELECT_INTENTS_BY_KEYS, [tenant_id, missing])
            for row in cur.fetchall():
                record = record_from_row(row)
                found[record.operation_key] = (record, False)
    if len(found) != len(keys):  # pragma: no cover - a conflict implies the row exists
        raise RuntimeError("batch reservation conflicted but a row was not found")
    return [found[k] for k in keys]
