"""Master-key rotation: write a new current key, and move old ciphertexts onto it.

``rotate_key_file`` appends a new random key to the keyring file (domain/master_keys.py)
atomically, mode 600. Processes read the keyring at start, so they encrypt new
payloads with it once restarted; until then they keep encrypting with the old one, which
is harmless because every key still decrypts what it wrote.

``reencrypt`` rewrites every stored argument and result ciphertext whose key id is not
the current one: decrypt with its key, encrypt with the current key, same row-bound
AAD. PRIVILEGED MAINTENANCE, like migrations 0007 and 0010: an intent's ciphertext is
part of its immutable binding (0002) and receipts are append-only, so each batch
disables the one trigger that guards its table inside its own transaction
(``ALTER TABLE ... DISABLE TRIGGER``, the table owner only) and enables it again before
committing; no other session ever sees it off. The ALTER takes an ACCESS EXCLUSIVE
lock, so ledger writes wait for each batch (hundreds of rows, milliseconds); batches
touch one table each, so a batch never holds one table while waiting for the other.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.db import connection, transaction

from effect_broker.domain.master_keys import MasterKeys, parse_keyring
from effect_broker.domain.payload_crypto import decrypt, encrypt
from effect_broker.services.payloads import result_aad
from effect_broker.services.runtime import Runtime, get_runtime
from effect_broker.services.submission import arguments_aad


def rotate_key_file(path: Path) -> MasterKeys:
    """Append a fresh current key to the keyring at ``path``; return the result."""
    keys = parse_keyring(path.read_text(encoding="ascii"), source=str(path)).rotated()
    # Write beside it and rename: a crash leaves the old file or the new one, never
    # half of one (losing a key would make its ciphertexts unreadable).
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".keyring-", text=True)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(keys.to_text())
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return keys


@dataclass(frozen=True)
class KeyUsage:
    key_id: str
    arguments: int
    results: int


def usage() -> list[KeyUsage]:
    """How many stored ciphertexts each key id encrypted."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT key_id, sum(a)::bigint, sum(r)::bigint FROM ("
            " SELECT arguments_key_id AS key_id, 1 AS a, 0 AS r FROM effect_intents"
            " UNION ALL"
            " SELECT result_key_id, 0, 1 FROM effect_receipts"
            ") AS k GROUP BY key_id ORDER BY key_id"
        )
        return [KeyUsage(k, int(a), int(r)) for k, a, r in cur.fetchall()]


@dataclass
class Reencrypted:
    arguments: int = 0
    results: int = 0


def reencrypt(
    *,
    batch: int = 500,
    runtime: Runtime | None = None,
    progress: Callable[[Reencrypted], None] | None = None,
) -> Reencrypted:
    """Move every ciphertext not under the current key onto it; return the counts."""
    rt = runtime or get_runtime()
    current = rt.keyring.active_key_id
    done = Reencrypted()
    while moved := _batch(rt, _ARGUMENTS, current, batch):
        done.arguments += moved
        if progress:
            progress(done)
    while moved := _batch(rt, _RESULTS, current, batch):
        done.results += moved
        if progress:
            progress(done)
    return done


@dataclass(frozen=True)
class _Sealed:
    """One kind of stored ciphertext: its table, the trigger that guards it, the query
    that finds rows not under the current key (with what their AAD needs), and the
    AAD itself."""

    table: str
    trigger: str
    blob: str
    key_id: str
    select: str
    aad: Callable[[str, str], bytes]


_ARGUMENTS = _Sealed(
    table="effect_intents",
    trigger="effect_intents_fence",
    blob="arguments_ciphertext",
    key_id="arguments_key_id",
    select=(
        "SELECT id, tenant_id, operation_key, arguments_ciphertext, arguments_key_id"
        " FROM effect_intents WHERE arguments_key_id <> %s ORDER BY id LIMIT %s"
    ),
    aad=arguments_aad,
)
_RESULTS = _Sealed(
    table="effect_receipts",
    trigger="effect_receipts_append_only",
    blob="result_ciphertext",
    key_id="result_key_id",
    select=(
        "SELECT r.id, i.tenant_id, i.operation_key, r.result_ciphertext,"
        " r.result_key_id FROM effect_receipts r"
        " JOIN effect_intents i ON i.id = r.effect_id"
        " WHERE r.result_key_id <> %s ORDER BY r.id LIMIT %s"
    ),
    aad=result_aad,
)


def _batch(rt: Runtime, sealed: _Sealed, current: str, batch: int) -> int:
    """Re-encrypt up to ``batch`` rows of one table in one transaction."""
    with transaction.atomic(), connection.cursor() as cur:
        # ALTER TABLE refuses a table with commit-time checks pending (0006): run
        # them now, before disabling and again before enabling the guard.
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cur.execute(f"ALTER TABLE {sealed.table} DISABLE TRIGGER {sealed.trigger}")
        cur.execute(sealed.select, [current, batch])
        rows = cur.fetchall()
        for row_id, tenant_id, operation_key, blob, key_id in rows:
            aad = sealed.aad(str(tenant_id), operation_key)
            plain = decrypt(rt.keyring, key_id, blob, aad=aad)
            new_id, new_blob = encrypt(rt.keyring, plain, aad=aad)
            cur.execute(
                f"UPDATE {sealed.table} SET {sealed.blob} = %s, {sealed.key_id} = %s"
                f" WHERE id = %s AND {sealed.key_id} = %s",
                [new_blob, new_id, row_id, key_id],
            )
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cur.execute(f"ALTER TABLE {sealed.table} ENABLE TRIGGER {sealed.trigger}")
    return len(rows)
