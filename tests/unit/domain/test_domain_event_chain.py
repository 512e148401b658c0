"""The event digest chain (spec "Data model", effect_events)."""

from __future__ import annotations

import dataclasses
import hashlib
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from effect_broker.domain.canonical import canonical_json
from effect_broker.domain.errors import EventChainBrokenError, InvalidJsonError
from effect_broker.domain.event_chain import (
    GENESIS_DIGEST,
    EventFacts,
    event_digest,
    format_timestamp,
    verify_chain,
)

EFFECT = "4b0f6f0e-0000-4000-8000-000000000001"
T0 = datetime(2026, 12, 3, 7, 0, tzinfo=UTC)
PATH = ["prepared", "dispatching", "outcome_unknown", "reconciling", "succeeded"]

Row = tuple[EventFacts, bytes, bytes]


def _facts(sequence: int) -> EventFacts:
    return EventFacts(
        effect_id=EFFECT,
        sequence=sequence,
        event_type="created" if sequence == 1 else "transition",
        old_status=None if sequence == 1 else PATH[sequence - 2],
        new_status=PATH[sequence - 1],
        version=sequence,
        actor="worker-1",
        occurred_at=T0 + timedelta(seconds=sequence),
        metadata={"attempt": sequence},
    )


def _chain(length: int = 5) -> list[Row]:
    rows: list[Row] = []
    prev = GENESIS_DIGEST
    for sequence in range(1, length + 1):
        facts = _facts(sequence)
        digest = event_digest(prev, facts)
        rows.append((facts, prev, digest))
        prev = digest
    return rows


def _broken(rows: list[Row], **kwargs: int) -> EventChainBrokenError:
    with pytest.raises(EventChainBrokenError) as caught:
        verify_chain(rows, **kwargs)
    return caught.value


def test_given_facts_then_the_hashed_document_is_exactly_this() -> None:
    facts = _facts(2)
    expected = (
        b'{"actor":"worker-1","effect_id":"4b0f6f0e-0000-4000-8000-000000000001",'
        b'"event_type":"transition","metadata":{"attempt":2},"new_status":"dispatching",'
        b'"occurred_at":"2026-12-03T07:00:02.000000Z","old_status":"prepared",'
        b'"sequence":2,"version":2}'
    )
    assert canonical_json(facts.as_document()) == expected
    prev = bytes(range(32))
    assert event_digest(prev, facts) == hashlib.sha256(prev + expected).digest()


def test_given_first_event_then_it_chains_from_the_genesis_digest() -> None:
    assert bytes(32) == GENESIS_DIGEST
    facts, prev, _ = _chain(1)[0]
    assert prev == GENESIS_DIGEST
    assert event_digest(GENESIS_DIGEST, facts) == _chain(1)[0][2]


def test_given_valid_chain_then_it_verifies() -> None:
    verify_chain(_chain())
    verify_chain(_chain(), expected_last_sequence=5)
    verify_chain([])


def test_given_digests_as_memoryview_then_chain_verifies() -> None:
    rows = [
        (facts, memoryview(prev), memoryview(digest)) for facts, prev, digest in _chain()
    ]
    verify_chain(rows)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("effect_id", "4b0f6f0e-0000-4000-8000-000000000002"),
        ("event_type", "operator_resolution"),
        ("old_status", "retryable"),
        ("new_status", "succeeded"),
        ("version", 99),
        ("actor", "operator:mallory"),
        ("occurred_at", T0 + timedelta(seconds=3, microseconds=1)),
        ("metadata", {"attempt": 4}),
    ],
)
def test_given_any_field_edited_then_that_event_fails_verification(
    field: str, value: Any
) -> None:
    rows = _chain()
    facts, prev, digest = rows[2]
    rows[2] = (dataclasses.replace(facts, **{field: value}), prev, digest)
    error = _broken(rows)
    assert str(error) == "event 3: digest mismatch (edited?)"
    assert error.details == {"sequence": 3, "reason": "digest mismatch (edited?)"}


@given(position=st.integers(min_value=0, max_value=4), actor=st.text(min_size=1))
def test_given_edit_anywhere_then_the_first_bad_sequence_is_named(
    position: int, actor: str
) -> None:
    rows = _chain()
    facts, prev, digest = rows[position]
    if actor == facts.actor:
        actor += "!"
    rows[position] = (dataclasses.replace(facts, actor=actor), prev, digest)
    assert _broken(rows).details["sequence"] == position + 1


def test_given_middle_event_deleted_then_missing_event_is_named() -> None:
    rows = _chain()
    del rows[1]
    error = _broken(rows)
    assert str(error) == "missing event 2 (deleted?)"
    assert error.details["sequence"] == 2


def test_given_two_events_swapped_then_reordering_is_detected() -> None:
    rows = _chain()
    rows[1], rows[2] = rows[2], rows[1]
    error = _broken(rows)
    assert str(error) == "event 2: found event 3 here (duplicated or reordered?)"
    assert error.details["sequence"] == 2


def test_given_event_duplicated_then_it_is_detected() -> None:
    rows = _chain(3)
    rows.insert(2, rows[1])
    error = _broken(rows)
    assert str(error) == "event 3: found event 2 here (duplicated or reordered?)"


def test_given_sequence_numbers_rewritten_after_delete_then_chain_link_fails() -> None:
    # Deleting event 2 and renumbering 3 -> 2 keeps 1..n contiguous, but event 3's
    # stored prev_digest still points at the deleted event.
    rows = _chain()
    renumbered_facts = dataclasses.replace(rows[2][0], sequence=2)
    rows = [rows[0], (renumbered_facts, rows[2][1], rows[2][2]), *rows[3:]]
    error = _broken(rows)
    assert str(error) == (
        "event 2: prev_digest does not match the previous event (chain broken)"
    )


def test_given_stored_prev_digest_edited_then_chain_break_is_named() -> None:
    rows = _chain()
    facts, _, digest = rows[3]
    rows[3] = (facts, bytes(32), digest)
    assert _broken(rows).details["sequence"] == 4


def test_given_stored_digest_edited_then_that_event_is_named() -> None:
    rows = _chain()
    facts, prev, _ = rows[1]
    rows[1] = (facts, prev, bytes(32))
    assert str(_broken(rows)) == "event 2: digest mismatch (edited?)"


def test_given_newest_events_deleted_then_expected_length_catches_it() -> None:
    error = _broken(_chain(3), expected_last_sequence=5)
    assert str(error) == "missing event 4 (truncated?)"
    assert error.details["sequence"] == 4


def test_given_more_events_than_expected_then_it_is_reported() -> None:
    error = _broken(_chain(3), expected_last_sequence=2)
    assert str(error) == "event 3: unexpected: the chain should end at event 2"


# --- facts ------------------------------------------------------------------------------


def test_given_naive_time_then_facts_refuse_it() -> None:
    with pytest.raises(ValueError, match=r"^occurred_at must be timezone-aware \(UTC\)$"):
        dataclasses.replace(_facts(1), occurred_at=datetime(2026, 12, 3, 7, 0))  # noqa: DTZ001


def test_given_non_utc_offset_then_the_same_instant_gives_the_same_digest() -> None:
    cet = timezone(timedelta(hours=1))
    utc_facts = _facts(1)  # occurred 07:00:01 UTC
    cet_facts = dataclasses.replace(
        utc_facts, occurred_at=datetime(2026, 12, 3, 8, 0, 1, tzinfo=cet)
    )
    assert cet_facts.occurred_at.tzinfo is UTC
    assert cet_facts.occurred_at == utc_facts.occurred_at
    assert event_digest(GENESIS_DIGEST, cet_facts) == event_digest(
        GENESIS_DIGEST, utc_facts
    )


def test_given_timestamp_then_format_is_iso_utc_with_microseconds() -> None:
    assert format_timestamp(T0) == "2026-12-03T07:00:00.000000Z"
    assert format_timestamp(datetime(5, 1, 2, 3, 4, 5, 6, tzinfo=UTC)) == (
        "0005-01-02T03:04:05.000006Z"
    )


def test_given_sequence_zero_then_facts_refuse_it() -> None:
    with pytest.raises(ValueError, match=r"^sequence is 1-based, got 0$"):
        dataclasses.replace(_facts(1), sequence=0)


def test_given_metadata_then_it_is_frozen_and_copied() -> None:
    source = {"attempt": 1}
    facts = dataclasses.replace(_facts(1), metadata=source)
    source["attempt"] = 2
    assert facts.metadata == {"attempt": 1}
    with pytest.raises(TypeError):
        facts.metadata["attempt"] = 3  # type: ignore[index]


def test_given_metadata_without_json_form_then_digest_refuses() -> None:
    facts = dataclasses.replace(_facts(1), metadata={"when": T0})
    with pytest.raises(InvalidJsonError):
        event_digest(GENESIS_DIGEST, facts)


def test_given_prev_digest_of_wrong_length_then_value_error() -> None:
    with pytest.raises(ValueError, match=r"^prev_digest must be 32 bytes, got 3$"):
        event_digest(b"abc", _facts(1))
