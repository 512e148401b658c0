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
    "receipt_id",
    "trace_id",
    "requested_by",
    "created_at",
    "updated_at",
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
        "receipt_id",
    }
)

SELECT_INTENT = "SELECT " + ", ".join(INTENT_COLUMNS) + " FROM effect_intents"

# ON CONFLICT DO NOTHING waits for a concurrent inserter of the same key to finish, so
# exactly one caller gets a row back; the others read the winner (spec: reservation).
RESERVE_INTENT = """
INSERT INTO effect_intents (
    id, tenant_id, operation_key, tool, request_hash, arguments_ciphertext,
    arguments_key_id, arguments_preview, contract_name, contract_version, safety_class,
    downstream_key, status, version, attempt_count, next_action_at, trace_id,
    requested_by, created_at, updated_at
) VALUES (
    %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, 1, 0, %s, %s, %s, %s, %s
)
ON CONFLICT (tenant_id, operation_key) DO NOTHING
RETURNING """ + ", ".join(INTENT_COLUMNS)

SELECT_INTENT_BY_KEY = SELECT_INTENT + " WHERE tenant_id = %s AND operation_key = %s"
SELECT_INTENT_BY_ID = SELECT_INTENT + " WHERE id = %s"
SELECT_INTENT_BY_ID_SCOPED = SELECT_INTENT + " WHERE id = %s AND tenant_id = %s"
SELECT_VERSION = "SELECT version FROM effect_intents WHERE id = %s"

SELECT_ARGUMENTS = """
SELECT arguments_ciphertext, arguments_key_id, tenant_id, operation_key
FROM effect_intents WHERE id = %s
"""

# The fence: the row changes only if nobody wrote since the writer read ``version``.
# The last column is the digest of the event at the old version (NULL if missing): the
# new event chains to it, and reading it here saves a round trip per transition.
CAS_UPDATE_TEMPLATE = (
    """
UPDATE effect_intents
SET status = %s, version = version + 1, updated_at = %s{extra}
WHERE id = %s AND version = %s
RETURNING """
    + ", ".join(INTENT_COLUMNS)
    + """,
    (SELECT e.digest FROM effect_events e
     WHERE e.effect_id = effect_intents.id AND e.sequence = effect_intents.version - 1)
"""
)

INSERT_EVENT = """
INSERT INTO effect_events (
    effect_id, sequence, event_type, old_status, new_status, version, actor,
    occurred_at, metadata, prev_digest, digest
) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s)
"""

SELECT_EVENTS = """
SELECT sequence, event_type, old_status, new_status, version, actor, occurred_at,
       metadata, prev_digest, digest
FROM effect_events WHERE effect_id = %s ORDER BY sequence
"""

INSERT_ATTEMPT = """
INSERT INTO effect_attempts (
    id, effect_id, ordinal, worker, fencing_version, started_at, request_digest,
    response_digest, transport_meta, error_category, outcome, bytes_may_have_left
) VALUES (%s, %s, %s, %s, %s, %s, %s, '', '{}'::jsonb, '', '', %s)
"""

# An attempt is closed once; the trigger refuses any later change.
CLOSE_ATTEMPT = """
UPDATE effect_attempts
SET ended_at = %s, response_digest = %s, transport_meta = %s::jsonb,
    error_category = %s, outcome = %s, bytes_may_have_left = %s
WHERE id = %s AND ended_at IS NULL
"""

SELECT_OPEN_ATTEMPT = """
SELECT id FROM effect_attempts WHERE effect_id = %s AND ended_at IS NULL
ORDER BY ordinal DESC LIMIT 1
"""

INSERT_RECEIPT = """
INSERT INTO effect_receipts (
    id, effect_id, external_id, result_ciphertext, result_key_id, result_preview,
    evidence_digest, target_timestamp, contract_version, downstream_key_digest, created_at
) VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s)
"""

INSERT_STALE_WRITE = """
INSERT INTO effect_stale_writes (
    effect_id, actor, expected_version, actual_version, attempted, occurred_at
) VALUES (%s, %s, %s, %s, %s, %s)
"""

# Sweeper reads. Both are served by partial/compound indexes on effect_intents.
SELECT_EXPIRED_LEASES = (
    SELECT_INTENT
    + " WHERE status = ANY(%s) AND lease_expires_at < %s"
    + " ORDER BY lease_expires_at LIMIT %s"
)
SELECT_DUE = (
    SELECT_INTENT
    + " WHERE status = %s AND next_action_at <= %s AND safety_class = ANY(%s)"
    + " ORDER BY next_action_at LIMIT %s"
)
