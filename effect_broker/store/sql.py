"""Every SQL statement that writes or reads the ledger, kept in one place.

Values are always bound parameters; the only interpolated pieces are column names taken
from the fixed tuples below (see ``ledger._set_clause``).
"""

from __future__ import annotations

INTENT_COLUMNS = (
    "id",
    "tenant_id",
    "operation_key",
    "tool",
    "request_hash",
    "downstream_key",
    "contract_name",
    "contract_version",
    "safety_class",
    "status",
    "version",
    "attempt_count",
    "arguments_preview",
    "next_action_at",
    "lease_owner",
    "lease_expires_at",
    "first_dispatch_at",
    "retention_deadline",
    "settlement_deadline",
    "outcome_in_doubt",
    "receipt_id",
    "trace_id",
    "requested_by",
    "created_at",
    "updated_at",
    "trace_context",
)

#: Columns a transition may change besides status/version/updated_at.
MUTABLE_INTENT_COLUMNS = frozenset(
    {
        "attempt_count",
        "next_action_at",
        "lease_owner",
        "lease_expires_at",
        "first_dispatch_at",
        "retention_deadline",
        "settlement_deadline",
        "outcome_in_doubt",
        "receipt_id",
    }
)

#: The digest of the event at the row's current version, read with the row: the next
#: event chains to it. Events are append-only and the version bump and its event commit
#: together, so while the fence (``version``) holds, this digest holds too, and a fenced
#: write needs no round trip to fetch it.
HEAD_DIGEST = (
    "(SELECT e.digest FROM effect_events e"
    " WHERE e.effect_id = effect_intents.id AND e.sequence = effect_intents.version)"
)

#: Every read of an intent row: INTENT_COLUMNS, then the head digest.
SELECT_INTENT = (
    "SELECT " + ", ".join(INTENT_COLUMNS) + ", " + HEAD_DIGEST + " FROM effect_intents"
)

_INSERT_EVENT_COLUMNS = """effect_events (
    effect_id, sequence, event_type, old_status, new_status, version, actor,
    occurred_at, metadata, prev_digest, digest
)"""

#: The event of a write, inserted by the same statement and only if the write happened
#: (it selects FROM the data-modifying CTE named ``{source}``). Its values are bound,
#: not copied from the row, so what is stored is exactly what was hashed.
_EVENT_OF = (
    "INSERT INTO "
    + _INSERT_EVENT_COLUMNS
    + """
    SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s FROM {source}
    RETURNING digest"""
)

# One statement (so one round trip, and in autocommit one commit): the intent, its
# first event and - when the scheduler provides one - the dispatch job commit together
# or not at all; the event and the job select FROM ``intent``, so a replay writes
# neither. The same statement answers a key that exists (issue 13): when the insert
# returned nothing, the second branch reads the existing row by key through the same
# unique index the conflict was found on. A single submit reads the key first
# (``SELECT_INTENT_BY_KEY``, issue 25 item 3), so a replay never gets here; this branch
# answers a key inserted by a concurrent submit after that read. The leading boolean
# says which branch answered (true: created). A row this statement's snapshot cannot
# see - a concurrent inserter of the same key, whom ON CONFLICT waited for and whose
# commit came after the snapshot - makes both branches empty; only then does the
# caller read the winner in a new statement (``SELECT_INTENT_BY_KEY``).
# The first due time (``next_action_at``) is the database's clock, shifted only by a
# test clock's offset (zero in production), as every other deadline is: written from
# the submitting host's clock, an API host 10 minutes ahead made a correct worker
# re-defer every new effect by 10 minutes (issue 19, item 2). ``created_at`` and
# ``updated_at`` stay the submitter's stamp, the same instant as the ``reserved``
# event's ``occurred_at``, which is hashed into the event chain before it is sent.
RESERVE_INTENT = (
    """
WITH intent AS (
    INSERT INTO effect_intents (
        id, tenant_id, operation_key, tool, request_hash, arguments_ciphertext,
        arguments_key_id, arguments_preview, contract_name, contract_version,
        safety_class, downstream_key, status, version, attempt_count, next_action_at,
        trace_id, requested_by, created_at, updated_at, trace_context
    ) VALUES (
        %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, 1, 0,
        clock_timestamp() + %s::interval, %s, %s, %s, %s, %s
    )
    ON CONFLICT (tenant_id, operation_key) DO NOTHING
    RETURNING """
    + ", ".join(INTENT_COLUMNS)
    + """
), event AS (
    """
    + _EVENT_OF.format(source="intent")
    + """
){job}
SELECT true, intent.*, event.digest FROM intent, event{job_source}
UNION ALL
SELECT false, """
    + ", ".join(INTENT_COLUMNS)
    + ", "
    + HEAD_DIGEST
    + """
FROM effect_intents
WHERE tenant_id = %s AND operation_key = %s AND NOT EXISTS (SELECT FROM intent)
"""
)

#: The dispatch job, deferred through procrastinate's own versioned SQL function (the
#: one its ``defer()`` calls), so it commits in the reservation's statement.
RESERVE_JOB = """, job AS (
    SELECT procrastinate_defer_jobs_v1(ARRAY[
        ROW(%s, %s, %s, %s, %s, %s::jsonb, %s)::procrastinate_job_to_defer_v1
    ]) AS ids FROM intent
)"""

SELECT_INTENT_BY_KEY = SELECT_INTENT + " WHERE tenant_id = %s AND operation_key = %s"
SELECT_INTENT_BY_ID = SELECT_INTENT + " WHERE id = %s"
SELECT_INTENT_BY_ID_SCOPED = SELECT_INTENT + " WHERE id = %s AND tenant_id = %s"
SELECT_VERSION = "SELECT version FROM effect_intents WHERE id = %s"

#: Pause ``p``'s scope covers the ``effect_intents`` row of the enclosing query
#: (issue 24, item 7; domain/pauses.py): every scope field that is set must match.
PAUSE_SCOPE = """
    (p.tool IS NULL OR p.tool = effect_intents.tool)
    AND (p.contract_name IS NULL OR p.contract_name = effect_intents.contract_name)
    AND (p.contract_version IS NULL
         OR p.contract_version = effect_intents.contract_version)
    AND (p.tenant_id IS NULL OR p.tenant_id = effect_intents.tenant_id)"""

#: An ACTIVE pause covering the row. Served by the partial unique index on active
#: pauses (a handful of rows, none at all most of the time).
PAUSE_COVERS = "dispatch_pauses p WHERE p.resumed_at IS NULL AND " + PAUSE_SCOPE

# A dispatch job's one read: the row, its head digest, the sealed arguments, the
# database's clock (whether the effect is due is decided on that clock, not the
# host's) and the oldest active pause that holds it (issue 24: checked in the same
# round trip, so an unpaused dispatch costs nothing more).
SELECT_INTENT_FOR_DISPATCH = (
    "SELECT "
    + ", ".join(INTENT_COLUMNS)
    + ", "
    + HEAD_DIGEST
    + ", arguments_ciphertext, arguments_key_id, clock_timestamp() + %s::interval"
    + ", (SELECT p.id FROM "
    + PAUSE_COVERS
    + " ORDER BY p.paused_at LIMIT 1)"
    + " FROM effect_intents WHERE id = %s"
)

SELECT_DATABASE_NOW = "SELECT clock_timestamp() + %s::interval"

# An operator's approval or denial (issue 24): lock the row while it is still the
# version the operator saw, and say whether its approval deadline is still ahead on
# the database's clock. Held to the decision's commit, the lock keeps the sweeper's
# expiry (SKIP LOCKED) and a second operator off the row; no row: someone else
# wrote first. NO KEY UPDATE: the lock a fenced UPDATE takes anyway.
LOCK_AWAITING_APPROVAL = """
SELECT next_action_at > clock_timestamp() + %s::interval FROM effect_intents
WHERE id = %s AND version = %s AND status = 'awaiting_approval'
FOR NO KEY UPDATE
"""

SELECT_ARGUMENTS = """
SELECT arguments_ciphertext, arguments_key_id, tenant_id, operation_key
FROM effect_intents WHERE id = %s
"""

# The fence: the row changes only if nobody wrote since the writer read ``version``.
# The event, and any riders (attempt, receipt: writes that must commit with the
# transition), are in the same statement and select FROM ``cas``, so they happen only
# if the fence held, and commit with it or not at all.
CAS_UPDATE_TEMPLATE = (
    """
WITH cas AS (
    UPDATE effect_intents
    SET status = %s, version = version + 1, updated_at = %s{extra}
    WHERE id = %s AND version = %s
    RETURNING """
    + ", ".join(INTENT_COLUMNS)
    + """
), event AS (
    """
    + _EVENT_OF.format(source="cas")
    + """
){riders}
SELECT cas.*, event.digest FROM cas, event
"""
)

SELECT_EVENT_DIGEST = (
    "SELECT digest FROM effect_events WHERE effect_id = %s AND sequence = %s"
)

SELECT_EVENTS = """
SELECT sequence, event_type, old_status, new_status, version, actor, occurred_at,
       metadata, prev_digest, digest
FROM effect_events WHERE effect_id = %s ORDER BY sequence
"""

# Riders of a transition (see CAS_UPDATE_TEMPLATE): each runs only if the CAS matched.
RIDER_OPEN_ATTEMPT = """
    INSERT INTO effect_attempts (
        id, effect_id, ordinal, worker, fencing_version, started_at, request_digest,
        response_digest, transport_meta, error_category, outcome, bytes_may_have_left
    )
    SELECT %s, %s, %s, %s, %s, %s, %s, '', '{}'::jsonb, '', '', %s FROM cas
"""

# An attempt is closed once; the trigger refuses any later change.
RIDER_CLOSE_ATTEMPT = """
    UPDATE effect_attempts
    SET ended_at = %s, response_digest = %s, transport_meta = %s::jsonb,
        error_category = %s, outcome = %s, bytes_may_have_left = %s
    FROM cas
    WHERE effect_attempts.id = %s AND effect_attempts.ended_at IS NULL
"""

SELECT_OPEN_ATTEMPT = """
SELECT id FROM effect_attempts WHERE effect_id = %s AND ended_at IS NULL
ORDER BY ordinal DESC LIMIT 1
"""

RIDER_RECEIPT = """
    INSERT INTO effect_receipts (
        id, effect_id, external_id, result_ciphertext, result_key_id, result_preview,
        evidence_digest, target_timestamp, contract_version, downstream_key_digest,
        created_at
    )
    SELECT %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s FROM cas
"""

# The dispatch job that ends with this outcome, finished in the outcome's statement
# (issue 25): what procrastinate's worker would do right after in its own
# transaction, ``procrastinate_finish_job_v1(job_id, 'succeeded', delete_job)``
# (procrastinate 3.10), written here as its two branches. Unlike that function it
# does not raise when the job is no longer queued or running (a sweeper failed it
# meanwhile, for a queued twin): the outcome must commit whatever the queue says, and
# such a job keeps the state the sweeper gave it (procrastinate's own finish, which
# the worker then skips, would have failed on it). Like that function it finishes a
# job the sweeper put back to ``todo``. ``tests/integration/test_job_endings.py``
# holds both branches to the function's result.
RIDER_DELETE_SUCCEEDED_JOB = """
    DELETE FROM procrastinate_jobs USING cas
    WHERE procrastinate_jobs.id = %s AND procrastinate_jobs.status IN ('todo', 'doing')
"""
RIDER_MARK_JOB_SUCCEEDED = """
    UPDATE procrastinate_jobs
    SET status = 'succeeded', abort_requested = false,
        attempts = CASE procrastinate_jobs.status
            WHEN 'doing' THEN procrastinate_jobs.attempts + 1
            ELSE procrastinate_jobs.attempts
        END
    FROM cas
    WHERE procrastinate_jobs.id = %s AND procrastinate_jobs.status IN ('todo', 'doing')
"""

# The fork link commits with the old effect's settlement (``resolved_forked``).
RIDER_FORK_LINK = """
    INSERT INTO effect_forks (old_effect_id, new_effect_id, operator, created_at)
    SELECT %s, %s, %s, %s FROM cas
"""

INSERT_STALE_WRITE = """
INSERT INTO effect_stale_writes (
    effect_id, actor, expected_version, actual_version, attempted, occurred_at
) VALUES (%s, %s, %s, %s, %s, %s)
"""

# Sweeper reads. Both are served by partial/compound indexes on effect_intents, and
# both compare on the database's clock (shifted by %s: a test clock's offset, zero in
# production): a sweeper on a host whose clock runs ahead expires no live lease.
# Both lock what they return and skip rows another session holds (issue 19 item 7: a
# sweep waited on a frozen worker's row with no timeout): a held row is being written
# by someone, and the next sweep looks again. NO KEY UPDATE, the lock a fenced UPDATE
# takes, so a concurrent event insert's foreign-key lock does not make a row skipped.
_SWEEP_LOCK = " FOR NO KEY UPDATE OF effect_intents SKIP LOCKED"
SELECT_EXPIRED_LEASES = (
    SELECT_INTENT
    + " WHERE status = ANY(%s) AND lease_expires_at < clock_timestamp() + %s::interval"
    + " ORDER BY lease_expires_at LIMIT %s"
    + _SWEEP_LOCK
)
# Due work a pause holds is left alone (domain/pauses.py): its job found it paused
# and ended; ``services.pauses.resume`` defers it again, and from then on this finds
# it too. Without this, every sweep would re-defer every paused effect.
SELECT_DUE = (
    SELECT_INTENT
    + " WHERE status = %s AND next_action_at <= clock_timestamp() + %s::interval"
    + " AND safety_class = ANY(%s)"
    + " AND NOT EXISTS (SELECT FROM "
    + PAUSE_COVERS
    + " AND (effect_intents.status <> 'outcome_unknown'"
    + " OR effect_intents.safety_class = 'idempotent'))"
    + " ORDER BY next_action_at LIMIT %s"
    + _SWEEP_LOCK
)

# A batch reservation (issue 13): N intents, their ``reserved`` events and - when the
# scheduler provides them - their dispatch jobs, in ONE statement and so one commit.
# The items arrive as ONE bound JSON array (bytes as hex), read back into typed rows
# by ``jsonb_to_record``: one parameter to quote, where an array per column cost the
# client more to quote than the statement took to run. ``ord`` keeps the caller's
# order for the jobs (the answer is put back in it by the caller); the intents are
# inserted in key order (below). ``next_action_at`` is the database's clock, as in
# ``RESERVE_INTENT``. ``existing`` reads the keys that were already taken, in the
# same statement: its snapshot predates this statement's inserts, so it sees exactly
# the rows committed before it. A key a concurrent inserter committed after that
# snapshot is in neither half; ``batch_reserve.reserve_many`` reads those few again,
# as ``reserve`` does. Keys must be distinct within one call (the service folds
# duplicates first).
RESERVE_BATCH = (
    """
WITH input AS (
    SELECT r.*, t.ord
    FROM jsonb_array_elements(%(items)s::jsonb) WITH ORDINALITY AS t(item, ord),
    LATERAL jsonb_to_record(t.item) AS r(
        id uuid, operation_key text, tool text, request_hash text,
        arguments_ciphertext text, arguments_key_id text, arguments_preview jsonb,
        contract_name text, contract_version text, safety_class text,
        downstream_key text, trace_id text, requested_by text, trace_context text,
        digest text, metadata jsonb, actor text, status text, due_in_us bigint,
        job_queue text, job_task text, job_priority int, job_lock text,
        job_queueing_lock text, job_args jsonb, job_scheduled_at timestamptz
    )
), intent AS (
    INSERT INTO effect_intents (
        id, tenant_id, operation_key, tool, request_hash, arguments_ciphertext,
        arguments_key_id, arguments_preview, contract_name, contract_version,
        safety_class, downstream_key, status, version, attempt_count, next_action_at,
        trace_id, requested_by, created_at, updated_at, trace_context
    )
    SELECT id, %(tenant)s::uuid, operation_key, tool, decode(request_hash, 'hex'),
        decode(arguments_ciphertext, 'hex'), arguments_key_id, arguments_preview,
        contract_name, contract_version, safety_class, downstream_key, status, 1, 0,
        clock_timestamp() + %(offset)s::interval + due_in_us * interval '1 microsecond',
        trace_id, requested_by,
        %(now)s::timestamptz, %(now)s::timestamptz, trace_context
    -- In key order, not the caller's: each insert takes its key's unique-index entry
    -- and holds it to commit, so two batches sharing keys in opposite orders each
    -- waited for the other's: a deadlock, one of them a 500 (issue 19, item 3). With
    -- one order for every batch the later one waits, then replays.
    FROM input ORDER BY operation_key
    ON CONFLICT (tenant_id, operation_key) DO NOTHING
    RETURNING """
    + ", ".join(INTENT_COLUMNS)
    + """
), event AS (
    INSERT INTO """
    + _INSERT_EVENT_COLUMNS
    + """
    SELECT input.id, 1, 'reserved', NULL, input.status, 1, input.actor,
        %(now)s::timestamptz, input.metadata, %(genesis)s, decode(input.digest, 'hex')
    FROM input JOIN intent ON intent.id = input.id
    RETURNING effect_id, digest
), existing AS (
    -- One unique-index probe per item. LIMIT 1 keeps the subquery from being pulled
    -- up into a join: as a join, the planner (which guesses 100 input rows) chose a
    -- hash join over ALL of the tenant's effects, a sequential scan that grows with
    -- the ledger (20 ms at 3k effects for a batch of one).
    SELECT taken.* FROM input CROSS JOIN LATERAL (
        SELECT """
    + ", ".join(f"effect_intents.{c}" for c in INTENT_COLUMNS)
    + ", "
    + HEAD_DIGEST
    + """ AS digest
        FROM effect_intents
        WHERE effect_intents.tenant_id = %(tenant)s::uuid
          AND effect_intents.operation_key = input.operation_key
        LIMIT 1
    ) AS taken
){job}
SELECT intent.*, event.digest, true AS created
FROM intent JOIN event ON event.effect_id = intent.id{job_source}
UNION ALL
SELECT existing.*, false FROM existing
"""
)

#: The dispatch jobs of a batch: one ``procrastinate_defer_jobs_v1`` call over the
#: created intents only (a replayed key queues nothing), in the batch's statement.
RESERVE_BATCH_JOBS = """, job AS (
    SELECT procrastinate_defer_jobs_v1(ARRAY(
        SELECT ROW(
            input.job_queue, input.job_task, input.job_priority, input.job_lock,
            input.job_queueing_lock, input.job_args, input.job_scheduled_at
        )::procrastinate_job_to_defer_v1
        FROM input JOIN intent ON intent.id = input.id
        -- An intent that waits for approval has no job until an operator approves.
        WHERE input.job_task IS NOT NULL
        ORDER BY input.ord
    )) AS ids
)"""

SELECT_INTENTS_BY_KEYS = (
    SELECT_INTENT + " WHERE tenant_id = %s AND operation_key = ANY(%s::text[])"
)
