"""Row ids that keep B-tree inserts local.

A random (v4) UUID sends every new effect, event and attempt to a random leaf page of
each index keyed by it, so as the ledger grows each insert touches pages that are no
longer cached and, after a checkpoint, writes a full page image to the WAL: submit and
claim slow down with ledger size (docs/benchmarks.md, "Scale"). A time-ordered v7 UUID
(RFC 9562) appends at the right edge instead. Its first 48 bits are the creation time
in milliseconds, which ``created_at`` already tells a reader; 74 bits stay random.
"""

from __future__ import annotations

import os
import time
import uuid

_RAND_B_BITS = 62
_RAND_A_BITS = 12


def uuid7() -> uuid.UUID:
    """A new RFC 9562 version-7 UUID: unix time in ms, then random bits."""
    millis = time.time_ns() // 1_000_000 & ((1 << 48) - 1)
    rand = int.from_bytes(os.urandom(10), "big")
    rand_a = rand >> (80 - _RAND_A_BITS)
    rand_b = rand & ((1 << _RAND_B_BITS) - 1)
    value = (
        millis << 80
        | 0x7 << 76  # version
        | rand_a << 64
        | 0b10 << 62  # RFC 9562 variant
        | rand_b
    )
    return uuid.UUID(int=value)


def new_row_id() -> str:
    """A time-ordered id for a new ledger row, as text."""
    return str(uuid7())
