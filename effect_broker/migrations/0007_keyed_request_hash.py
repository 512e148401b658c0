"""Re-key every stored request hash (issue 9, defect 10; docs/fencing.md).

Before this migration ``request_hash`` was an unkeyed SHA-256 of the clear arguments,
stored in the intent row, copied into each ``reserved`` event's metadata (shown by the
admin and ``/history``) and into each attempt's ``request_digest``. This migration, in
one transaction:

1. decrypts each intent's arguments with the master key (AAD as in
   ``services.submission.arguments_aad``) and stores the keyed hash
   (``services.submission.request_hash_for``); attempts that carried the old hash
   carry the new one;
2. removes ``request_hash`` from every event's metadata and recomputes the digest
   chain of each effect it touched (``domain.event_chain``), after checking that the
   chain verified BEFORE the rewrite: a broken chain is evidence, and re-chaining it
   would launder it, so the migration stops and names the effects instead.

An intent whose arguments cannot be decrypted (a synthetic or corrupt row) gets an HMAC
of its old hash under the tenant key: the stored value no longer reveals anything, and
a replay of that key stays a conflict, as it already was (fail-safe, never a dispatch).

PRIVILEGED MAINTENANCE: the binding columns are immutable (0002), events append-only
(0002) and attempt rows close once (0002), so this migration disables those triggers
and the commit-time fence (0006) with ``ALTER TABLE ... DISABLE TRIGGER``. That needs
the table owner, takes ACCESS EXCLUSIVE locks (writes wait for the migration), and is
undone by ``ENABLE TRIGGER`` before the same transaction commits, so no other session
ever sees the triggers off. Rows are rewritten one at a time (a decrypt and an UPDATE
per intent, an UPDATE per event of each effect whose reserved event carried the hash),
with ledger writes waiting on the locks meanwhile: on a large ledger, plan a window.

Reverse is a no-op: hashes stay keyed (code from before this migration would then treat
a replay as a conflict, which writes and dispatches nothing).
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import migrations

_TRIGGERS = (
    ("effect_intents", "effect_intents_fence"),
    ("effect_intents", "effect_intents_event_at_version"),
    ("effect_events", "effect_events_append_only"),
    ("effect_attempts", "effect_attempts_close_once"),
)
_BATCH = 1000
_UNREADABLE_LABEL = b"effect-broker/unreadable-arguments/v1\0"


def _set_triggers(cur: Any, verb: str) -> None:
    for table, trigger in _TRIGGERS:
        cur.execute(f"ALTER TABLE {table} {verb} TRIGGER {trigger}")


def _json(raw: Any) -> Any:
    return json.loads(raw) if isinstance(raw, str | bytes) else raw


def rekey_ledger(cur: Any, master_key: bytes) -> tuple[int, int, int]:
    """Re-key intents and strip request hashes from events; return (re-keyed,
    unreadable, re-chained effects). Runs with the triggers already disabled."""
    import hashlib
    import hmac

    from effect_broker.domain.canonical import parse_json_strict
    from effect_broker.domain.errors import DecryptionError, InvalidJsonError
    from effect_broker.domain.keys import derive_request_hash_key
    from effect_broker.domain.payload_crypto import Keyring, decrypt, derive_payload_key
    from effect_broker.services.submission import arguments_aad, request_hash_for

    cur.execute("SELECT DISTINCT arguments_key_id FROM effect_intents")
    key_ids = [row[0] for row in cur.fetchall()]
    keyring = (
        Keyring(
            active_key_id=key_ids[0],
            keys={kid: derive_payload_key(master_key, kid) for kid in key_ids},
        )
        if key_ids
        else None
    )
    rekeyed = unreadable = 0
    last = None
    while keyring is not None:
        cur.execute(
            "SELECT id, tenant_id, operation_key, tool, request_hash,"
            " arguments_ciphertext, arguments_key_id, contract_name, contract_version"
            " FROM effect_intents WHERE (%s::uuid IS NULL OR id > %s::uuid)"
            " ORDER BY id LIMIT %s",
            [last, last, _BATCH],
        )
        rows = cur.fetchall()
        if not rows:
            break
        for row in rows:
            effect_id, tenant_id, op_key, tool, old, blob, key_id, name, version = row
            tenant_id, old = str(tenant_id), bytes(old)
            try:
                plain = decrypt(
                    keyring, key_id, blob, aad=arguments_aad(tenant_id, op_key)
                )
                arguments = parse_json_strict(plain)
                if not isinstance(arguments, dict):
                    raise InvalidJsonError("arguments are not an object")
            except (DecryptionError, InvalidJsonError):
                unreadable += 1
                new = hmac.new(
                    derive_request_hash_key(master_key, tenant_id),
                    _UNREADABLE_LABEL + old,
                    hashlib.sha256,
                ).digest()
            else:
                new = request_hash_for(
                    master_key,
                    tenant_id,
                    tool=tool,
                    arguments=arguments,
                    contract_name=name,
                    contract_version=version,
                )
            if new != old:
                rekeyed += 1
                cur.execute(
                    "UPDATE effect_intents SET request_hash = %s WHERE id = %s",
                    [new, effect_id],
                )
                cur.execute(
                    "UPDATE effect_attempts SET request_digest = %s"
                    " WHERE effect_id = %s AND request_digest = %s",
                    [new.hex(), effect_id, old.hex()],
                )
        last = str(rows[-1][0])
    return rekeyed, unreadable, _strip_event_hashes(cur)


def _strip_event_hashes(cur: Any) -> int:
    from effect_broker.domain.canonical import canonical_json
    from effect_broker.domain.errors import EventChainBrokenError
    from effect_broker.domain.event_chain import (
        GENESIS_DIGEST,
        EventFacts,
        event_digest,
        verify_chain,
    )

    cur.execute(
        "SELECT DISTINCT e.effect_id, i.version FROM effect_events e"
        " JOIN effect_intents i ON i.id = e.effect_id"
        " WHERE e.metadata ? 'request_hash'"
    )
    effects = cur.fetchall()
    broken: list[str] = []
    for effect_id, version in effects:
        cur.execute(
            "SELECT sequence, event_type, old_status, new_status, version, actor,"
            " occurred_at, metadata, prev_digest, digest FROM effect_events"
            " WHERE effect_id = %s ORDER BY sequence",
            [effect_id],
        )
        rows = [
            (
                EventFacts(
                    effect_id=str(effect_id),
                    sequence=seq,
                    event_type=kind,
                    old_status=old,
                    new_status=new,
                    version=int(ver),
                    actor=actor,
                    occurred_at=at,
                    metadata=_json(meta),
                ),
                bytes(prev),
                bytes(digest),
            )
            for seq, kind, old, new, ver, actor, at, meta, prev, digest in cur.fetchall()
        ]
        try:
            verify_chain(rows, expected_last_sequence=int(version))
        except EventChainBrokenError:
            broken.append(str(effect_id))
            continue
        prev = GENESIS_DIGEST
        for facts, _, _ in rows:
            metadata = {k: v for k, v in facts.metadata.items() if k != "request_hash"}
            rewritten = EventFacts(
                effect_id=facts.effect_id,
                sequence=facts.sequence,
                event_type=facts.event_type,
                old_status=facts.old_status,
                new_status=facts.new_status,
                version=facts.version,
                actor=facts.actor,
                occurred_at=facts.occurred_at,
                metadata=metadata,
            )
            digest = event_digest(prev, rewritten)
            cur.execute(
                "UPDATE effect_events SET metadata = %s::jsonb, prev_digest = %s,"
                " digest = %s WHERE effect_id = %s AND sequence = %s",
                [
                    canonical_json(metadata).decode("utf-8"),
                    prev,
                    digest,
                    effect_id,
                    facts.sequence,
                ],
            )
            prev = digest
    if broken:
        raise EventChainBrokenError(
            "0007_keyed_request_hash: refusing to re-chain effects whose event chain "
            "does not verify (re-chaining would hide the break); inspect them: "
            + ", ".join(sorted(broken)),
            effects=sorted(broken),
        )
    return len(effects)


def forward(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cur:
        cur.execute("SELECT EXISTS (SELECT 1 FROM effect_intents)")
        if not cur.fetchone()[0]:
            return  # a fresh database: nothing to re-key, no master key needed
        master_key = settings.EFFECT_BROKER_MASTER_KEY
        if master_key is None:
            from effect_broker.domain.errors import ConfigurationError

            raise ConfigurationError(
                "0007_keyed_request_hash needs the master key to re-key stored "
                "request hashes (EFFECT_BROKER_MASTER_KEY)",
                setting="EFFECT_BROKER_MASTER_KEY",
            )
        _set_triggers(cur, "DISABLE")
        rekey_ledger(cur, master_key)
        _set_triggers(cur, "ENABLE")


class Migration(migrations.Migration):
    dependencies = [("effect_broker", "0006_fence_constraint_triggers")]

    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
