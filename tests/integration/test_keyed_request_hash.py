"""Issue 9, defect 10 "The request hash leaks redacted arguments": the stored hash is an
HMAC under a per-tenant key derived from the master key; it is not in event metadata,
``/history`` or the admin; migration 0007 re-keys rows written the old way and keeps
their event chains verifiable."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from effect_broker import store
from effect_broker.domain.canonical import canonical_json
from effect_broker.domain.errors import PayloadConflictError
from effect_broker.domain.ids import new_row_id
from effect_broker.domain.keys import derive_request_hash_key, request_hash
from effect_broker.domain.payload_crypto import encrypt
from effect_broker.domain.records import EffectRequest
from effect_broker.domain.states import EffectStatus
from effect_broker.models import EffectAttempt, EffectEvent, EffectIntent
from effect_broker.services.runtime import get_runtime
from effect_broker.services.submission import arguments_aad, submit
from effect_broker.services.tenants import create_tenant
from effect_broker.store.ledger import _event_params

CARD = {
    "order": "42",
    "amount_minor": 1999,
    "currency": "EUR",
    "card": "4242424242424242",
}
DOCUMENT = {
    "tool": "charge_card",
    "arguments": CARD,
    "contract_name": "payments.charge",
    "contract_version": "1",
}


def charge(key: str = "order:42:charge:v1", **changes: object) -> EffectRequest:
    return EffectRequest(
        operation_key=key, tool="charge_card", arguments={**CARD, **changes}
    )


def stored_hash(effect_id: str) -> bytes:
    # One column, so the read also works on the ledger as it was at an older migration.
    row = EffectIntent.objects.filter(pk=effect_id).values_list("request_hash").get()
    return bytes(row[0])


@pytest.mark.django_db
def test_the_same_payload_in_two_tenants_has_different_hashes(
    tenant, other_tenant
) -> None:
    mine = submit(tenant, charge()).effect
    theirs = submit(other_tenant, charge()).effect
    assert stored_hash(mine.effect_id) != stored_hash(theirs.effect_id)


@pytest.mark.django_db
def test_the_hash_is_an_hmac_under_a_key_only_the_master_key_gives(tenant) -> None:
    record = submit(tenant, charge()).effect
    stored = stored_hash(record.effect_id)
    document = canonical_json(DOCUMENT)
    # Not the unkeyed digest a dump reader could brute-force ...
    assert stored != hashlib.sha256(document).digest()
    assert stored != request_hash(**DOCUMENT)
    # ... but the HMAC under the tenant's key derived from the broker's master key
    master = settings.EFFECT_BROKER_MASTER_KEY
    key = derive_request_hash_key(master, str(tenant.id))
    assert stored == hmac.new(key, document, "sha256").digest()
    # and any other master key gives another value
    wrong = derive_request_hash_key(bytes(32), str(tenant.id))
    assert stored != hmac.new(wrong, document, "sha256").digest()


@pytest.mark.django_db
def test_the_reserved_event_has_no_request_hash(tenant) -> None:
    record = submit(tenant, charge()).effect
    event = EffectEvent.objects.get(effect_id=record.effect_id)
    assert event.event_type == "reserved"
    assert event.metadata == {"contract": "payments.charge@1"}
    assert stored_hash(record.effect_id).hex() not in json.dumps(event.metadata)


@pytest.mark.django_db
def test_history_does_not_show_the_request_hash(client: Client) -> None:
    tenant, api_key = create_tenant("history-tenant")
    record = submit(tenant, charge()).effect
    store.start_attempt(
        record,
        worker="w",
        now=record.updated_at + timedelta(seconds=1),
        changes={},
    )
    response = client.get(
        f"/v1/effects/{record.effect_id}/history",
        HTTP_AUTHORIZATION=f"Bearer {api_key}",
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert len(response.json()["events"]) == 2
    assert "request_hash" not in body
    assert stored_hash(record.effect_id).hex() not in body


@pytest.mark.django_db
def test_the_admin_does_not_show_the_request_hash(admin_client, tenant) -> None:
    record = submit(tenant, charge()).effect
    moved, attempt_id = store.start_attempt(
        record, worker="w", now=record.updated_at + timedelta(seconds=1), changes={}
    )
    digest = stored_hash(record.effect_id).hex()
    event = EffectEvent.objects.get(effect_id=record.effect_id, sequence=1)
    pages = [
        reverse("admin:effect_broker_effectintent_change", args=[record.effect_id]),
        reverse("admin:effect_broker_effectevent_change", args=[event.pk]),
        reverse("admin:effect_broker_effectattempt_change", args=[attempt_id]),
        reverse("admin:effect_broker_effectintent_changelist"),
        reverse("admin:effect_broker_effectevent_changelist"),
        reverse("admin:effect_broker_effectattempt_changelist"),
    ]
    for page in pages:
        response = admin_client.get(page)
        assert response.status_code == 200, page
        html = response.content.decode()
        assert digest not in html, page
        assert "request_hash" not in html.lower().replace(" ", "_"), page
    assert moved.status is EffectStatus.DISPATCHING


@pytest.mark.django_db
def test_replay_and_conflict_are_unchanged_under_the_keyed_hash(tenant) -> None:
    first = submit(tenant, charge())
    again = submit(tenant, charge())
    assert (again.replayed, again.effect) == (True, first.effect)
    with pytest.raises(PayloadConflictError):
        submit(tenant, charge(card="4242424242424243"))
    assert EffectIntent.objects.get().version == 1


# --- migration 0007 ---------------------------------------------------------------------

APP = "effect_broker"
BEFORE = (APP, "0006_fence_constraint_triggers")
REKEY = (APP, "0007_keyed_request_hash")


# The rows below are written the way the store wrote them before 0007, in SQL of that
# schema: the store's own statements name columns that later migrations add (0008's
# outcome_in_doubt), so they cannot run against the ledger as it was at 0006.
_OLD_INTENT = """
INSERT INTO effect_intents (
    id, tenant_id, operation_key, tool, request_hash, arguments_ciphertext,
    arguments_key_id, arguments_preview, contract_name, contract_version, safety_class,
    downstream_key, status, version, attempt_count, next_action_at, trace_id,
    requested_by, created_at, updated_at
) VALUES (%s, %s, %s, %s, %s, %s, %s, '{}'::jsonb, %s, %s, %s, %s, 'prepared', 1, 0,
          %s, '', '', %s, %s)
"""
_OLD_EVENT = """
INSERT INTO effect_events (
    effect_id, sequence, event_type, old_status, new_status, version, actor,
    occurred_at, metadata, prev_digest, digest
) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s)
"""
_OLD_DISPATCH = """
UPDATE effect_intents
SET status = 'dispatching', version = 2, attempt_count = 1, updated_at = %s
WHERE id = %s AND version = 1
"""
_OLD_ATTEMPT = """
INSERT INTO effect_attempts (
    id, effect_id, ordinal, worker, fencing_version, started_at, request_digest,
    response_digest, transport_meta, error_category, outcome, bytes_may_have_left
) VALUES (%s, %s, 1, 'w', 2, %s, %s, '', '{}'::jsonb, '', '', false)
"""


def reserve_the_old_way(tenant, key: str, arguments: dict[str, Any]) -> tuple[str, bytes]:
    """An intent as the store wrote it before 0007: unkeyed hash in the row and in the
    ``reserved`` event's metadata (and so in the digest chain)."""
    rt = get_runtime()
    effect_id, now, tenant_id = new_row_id(), timezone.now(), str(tenant.id)
    old = request_hash(
        tool="charge_card",
        arguments=arguments,
        contract_name="payments.charge",
        contract_version="1",
    )
    key_id, blob = encrypt(
        rt.keyring, canonical_json(arguments), aad=arguments_aad(tenant_id, key)
    )
    event, _ = _event_params(
        effect_id,
        sequence=1,
        event_type="reserved",
        old_status=None,
        new_status=EffectStatus.PREPARED,
        actor="caller",
        now=now,
        metadata={"contract": "payments.charge@1", "request_hash": old.hex()},
        prev=bytes(32),
    )
    intent = [
        effect_id,
        tenant_id,
        key,
        "charge_card",
        old,
        blob,
        key_id,
        "payments.charge",
        "1",
        "idempotent",
        "dk-" + key,
        now,
        now,
        now,
    ]
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(_OLD_INTENT, intent)
        cur.execute(_OLD_EVENT, event)
    return effect_id, old


def dispatch_the_old_way(effect_id: str, old: bytes) -> str:
    """Attempt 1 opened the way the store did before 0007: the attempt's request digest
    is the unkeyed hash. Returns the attempt's id."""
    now = timezone.now() + timedelta(seconds=1)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT digest FROM effect_events WHERE effect_id = %s AND sequence = 1",
            [effect_id],
        )
        prev = bytes(cur.fetchone()[0])
    event, _ = _event_params(
        effect_id,
        sequence=2,
        event_type="dispatch_started",
        old_status=EffectStatus.PREPARED,
        new_status=EffectStatus.DISPATCHING,
        actor="worker:w",
        now=now,
        metadata={"attempt": 1},
        prev=prev,
    )
    attempt_id = new_row_id()
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(_OLD_DISPATCH, [now, effect_id])
        assert cur.rowcount == 1
        cur.execute(_OLD_EVENT, event)
        cur.execute(_OLD_ATTEMPT, [attempt_id, effect_id, now, old.hex()])
    return attempt_id


@pytest.fixture
def at_0006(transactional_db: None):
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes(APP)
    MigrationExecutor(connection).migrate([BEFORE])
    try:
        yield
    finally:
        # Forward again over an empty ledger (a test may leave a chain 0007 refuses).
        with connection.cursor() as cur:
            cur.execute(
                "TRUNCATE effect_events, effect_attempts, effect_receipts,"
                " effect_stale_writes, effect_forks, effect_intents"
            )
        MigrationExecutor(connection).migrate(latest)


def test_0007_rekeys_old_rows_and_their_chains_still_verify(at_0006) -> None:
    # Given two tenants' intents written the old way, one dispatched (attempt + event)
    tenant, other = create_tenant("old-a")[0], create_tenant("old-b")[0]
    first, old_first = reserve_the_old_way(tenant, "order:1:charge:v1", CARD)
    second, old_second = reserve_the_old_way(other, "order:1:charge:v1", CARD)
    assert old_first == old_second  # the cross-tenant collision of the old scheme
    attempt_id = dispatch_the_old_way(first, old_first)
    assert EffectAttempt.objects.get(pk=attempt_id).request_digest == old_first.hex()

    # When migration 0007 runs
    MigrationExecutor(connection).migrate([REKEY])

    # Then each row holds its tenant's keyed hash, no event or attempt holds the old one
    master = settings.EFFECT_BROKER_MASTER_KEY
    document = canonical_json(DOCUMENT)
    for effect_id, owner in ((first, tenant), (second, other)):
        key = derive_request_hash_key(master, str(owner.id))
        assert stored_hash(effect_id) == hmac.new(key, document, "sha256").digest()
        for event in EffectEvent.objects.filter(effect_id=effect_id):
            assert "request_hash" not in event.metadata
            assert old_first.hex() not in json.dumps(event.metadata)
    assert stored_hash(first) != stored_hash(second)
    attempt = EffectAttempt.objects.get(pk=attempt_id)
    assert attempt.request_digest == stored_hash(first).hex()
    # and the chains verify (the reserved event's digest, and all after it, rewritten)
    assert store.verify_event_chain(first) == 2
    assert store.verify_event_chain(second) == 1
    # and the fence still holds after the migration re-enabled its triggers
    assert _trigger_states() == {"O"}
    # and, once the later migrations have run too, the same call replays and a changed
    # one conflicts, as before
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes(APP))
    again = submit(tenant, charge(key="order:1:charge:v1"))
    assert (again.replayed, again.effect.effect_id) == (True, first)
    assert again.effect.version == 2
    with pytest.raises(PayloadConflictError):
        submit(other, charge(key="order:1:charge:v1", amount_minor=1))


def test_0007_refuses_to_rechain_a_broken_chain(at_0006) -> None:
    from django.db import DatabaseError

    from effect_broker.domain.errors import EventChainBrokenError

    tenant = create_tenant("old-c")[0]
    effect_id, old = reserve_the_old_way(tenant, "order:2:charge:v1", CARD)
    with connection.cursor() as cur:  # a privileged edit the chain must keep showing
        cur.execute("SET session_replication_role = replica")
        try:
            cur.execute(
                "UPDATE effect_events SET actor = 'mallory' WHERE effect_id = %s",
                [effect_id],
            )
        finally:
            cur.execute("SET session_replication_role = origin")
    with pytest.raises((EventChainBrokenError, DatabaseError), match=effect_id):
        MigrationExecutor(connection).migrate([REKEY])
    # nothing was rewritten: the row keeps its old hash, the event its metadata
    assert stored_hash(effect_id) == old
    assert EffectEvent.objects.get(effect_id=effect_id).metadata["request_hash"] == (
        old.hex()
    )
    assert _trigger_states() == {"O"}


def _trigger_states() -> set[str]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT DISTINCT tgenabled FROM pg_trigger"
            " WHERE tgrelid::regclass::text LIKE 'effect\\_%' AND NOT tgisinternal"
        )
        return {row[0] for row in cur.fetchall()}
