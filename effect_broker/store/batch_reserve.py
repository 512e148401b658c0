"""Batch reservation (issue 13): N intents, their events and their dispatch jobs in
one statement and one commit, with a (row, created) answer per intent.

``ledger.reserve`` is the single-intent path; this is its sibling for many keys at once.
The statement is ``sql.RESERVE_BATCH``: one round trip whether the keys are new, taken
or mixed, plus one read only for keys a concurrent inserter committed during it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection

from effect_broker.domain.event_chain import GENESIS_DIGEST
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus
from effect_broker.store import sql
from effect_broker.store.ledger import NewIntent, QueuedJob, _event_params, _json
from effect_broker.store.rows import record_from_row


def _intent_arrays(
    intents: Sequence[NewIntent], *, now: datetime, actors: Sequence[str]
) -> dict[str, Any]:
    """One bound array per column of ``sql.RESERVE_BATCH``'s ``input``."""
    columns: dict[str, list[Any]] = {}
    for intent, actor in zip(intents, actors, strict=True):
        # The same first event ``reserve`` writes, chained from genesis.
        metadata = {"contract": f"{intent.contract_name}@{intent.contract_version}"}
        _, digest = _event_params(
            intent.effect_id,
            sequence=1,
            event_type="reserved",
            old_status=None,
            new_status=EffectStatus.PREPARED,
            actor=actor,
            now=now,
            metadata=metadata,
            prev=GENESIS_DIGEST,
        )
        for name, value in (
            ("ids", intent.effect_id),
            ("operation_keys", intent.operation_key),
            ("tools", intent.tool),
            ("request_hashes", intent.request_hash),
            ("ciphertexts", intent.arguments_ciphertext),
            ("key_ids", intent.arguments_key_id),
            ("previews", _json(intent.arguments_preview)),
            ("contract_names", intent.contract_name),
            ("contract_versions", intent.contract_version),
            ("safety_classes", intent.safety_class),
            ("downstream_keys", intent.downstream_key),
            ("trace_ids", intent.trace_id),
            ("requested_bys", intent.requested_by),
            ("trace_contexts", intent.trace_context),
            ("prev_digests", GENESIS_DIGEST),
            ("digests", digest),
            ("metadatas", _json(metadata)),
            ("actors", actor),
        ):
            columns.setdefault(name, []).append(value)
    return columns


def _job_arrays(
    intents: Sequence[NewIntent], jobs: Sequence[QueuedJob]
) -> dict[str, Any]:
    return {
        "job_ids": [i.effect_id for i in intents],
        "job_queues": [j.queue_name for j in jobs],
        "job_tasks": [j.task_name for j in jobs],
        "job_priorities": [j.priority for j in jobs],
        "job_locks": [j.lock for j in jobs],
        "job_queueing_locks": [j.queueing_lock for j in jobs],
        "job_args": [json.dumps(dict(j.args)) for j in jobs],
        "job_scheduled": [j.scheduled_at for j in jobs],
    }


def reserve_many(
    intents: Sequence[NewIntent],
    *,
    now: datetime,
    actors: Sequence[str],
    jobs: Sequence[QueuedJob] | None = None,
) -> list[tuple[EffectRecord, bool]]:
    """Insert each intent whose (tenant, operation_key) is free; return, in the order
    given, (row, created) per intent: the new row, or the one that already held the key.

    All intents belong to one tenant and carry distinct keys; ``actors[i]`` is the
    actor of ``intents[i]``'s ``reserved`` event. ``jobs[i]`` is the
    dispatch job of ``intents[i]``, inserted only if that intent is. Intents, events and
    jobs are ONE statement: one round trip and, in autocommit, one commit.
    """
    if not intents:
        return []
    tenants = {i.tenant_id for i in intents}
    keys = [i.operation_key for i in intents]
    if len(tenants) != 1 or len(set(keys)) != len(keys):
        raise ValueError("a batch reservation needs one tenant and distinct keys")
    if len(actors) != len(intents) or (jobs is not None and len(jobs) != len(intents)):
        raise ValueError("a batch reservation needs one actor and job per intent")
    tenant_id = next(iter(tenants))
    params: dict[str, Any] = {
        **_intent_arrays(intents, now=now, actors=actors),
        "tenant": tenant_id,
        "status": EffectStatus.PREPARED.value,
        "now": now,
    }
    if jobs is not None:
        params |= _job_arrays(intents, jobs)
        statement = sql.RESERVE_BATCH.format(
            job=sql.RESERVE_BATCH_JOBS, job_source=", job"
        )
    else:
        statement = sql.RESERVE_BATCH.format(job="", job_source="")
    found: dict[str, tuple[EffectRecord, bool]] = {}
    with connection.cursor() as cur:
        cur.execute(statement, params)
        for row in cur.fetchall():
            record = record_from_row(row[:-1])
            found[record.operation_key] = (record, bool(row[-1]))
        # Neither inserted nor there before: a concurrent inserter of the same key
        # committed while this statement waited on it (ON CONFLICT); read the winners.
        missing = [k for k in keys if k not in found]
        if missing:
            cur.execute(sql.SELECT_INTENTS_BY_KEYS, [tenant_id, missing])
            for row in cur.fetchall():
                record = record_from_row(row)
                found[record.operation_key] = (record, False)
    if len(found) != len(keys):  # pragma: no cover - a conflict implies the row exists
        raise RuntimeError("batch reservation conflicted but a row was not found")
    return [found[k] for k in keys]
