"""Time-ordered row ids (RFC 9562 version 7): valid, unique, sorted by creation time."""

from __future__ import annotations

import time
import uuid

from effect_broker.domain.ids import new_row_id, uuid7


def test_a_row_id_is_an_rfc_9562_version_7_uuid() -> None:
    value = uuid.UUID(new_row_id())
    assert value.version == 7
    assert value.variant == uuid.RFC_4122


def test_its_first_48_bits_are_the_creation_time_in_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    value = uuid7()
    after = time.time_ns() // 1_000_000
    assert before <= value.int >> 80 <= after


def test_ids_made_in_later_milliseconds_sort_after_earlier_ones() -> None:
    first = uuid7()
    time.sleep(0.002)
    second = uuid7()
    assert str(first) < str(second)


def test_ids_are_unique() -> None:
    ids = {new_row_id() for _ in range(10_000)}
    assert len(ids) == 10_000
