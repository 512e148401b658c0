"""The crash matrix's counts against the real target service (issue 9, "Test target"):
keyed charges are counted by the downstream key, whatever their body; every row can be
listed; a row no cell counted - here one injected by hand - is reported, not missed."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from examples.crash_matrix.attribution import ChargeClaims
from examples.crash_matrix.target_client import TargetProcess, body_digest

pytestmark = pytest.mark.django_db

BODY = {"order": "42", "amount_minor": 1999, "cell": "broker/x/y/1"}


@pytest.fixture
def http(target: TargetProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=target.url, trust_env=False, timeout=5.0) as client:
        yield client


def post(http: httpx.Client, mode: str, body: dict, key: str | None = None) -> str:
    header = {"idempotent": "Idempotency-Key", "reconcilable": "X-Correlation-Key"}
    headers = {header[mode]: key} if key else {}
    response = http.post(f"/{mode}/charges", json=body, headers=headers)
    response.raise_for_status()
    return str(response.json()["id"])


def test_keyed_charges_are_counted_by_key_whatever_their_body(
    target: TargetProcess, http: httpx.Client
) -> None:
    # Given two reconcilable charges under one correlation key with different bodies
    post(http, "reconcilable", BODY, "dk-1")
    post(http, "reconcilable", {**BODY, "amount_minor": 1}, "dk-1")
    post(http, "idempotent", BODY, "dk-1")
    # Then counting by key sees both, counting by body sees only the matching one
    assert target.count_by_key("reconcilable", "dk-1") == 2
    assert target.count_by_key("idempotent", "dk-1") == 1
    assert target.count_by_key("reconcilable", "dk-2") == 0
    assert target.count_by_body(BODY) == 2  # one per mode
    with pytest.raises(KeyError):
        target.count_by_key("unsafe", "dk-1")


def test_charges_lists_every_row_with_its_key_and_body_hash(
    target: TargetProcess, http: httpx.Client
) -> None:
    first = post(http, "idempotent", BODY, "dk-1")
    second = post(http, "unsafe", BODY)
    rows = target.charges()
    assert [(c.id, c.mode, c.key) for c in rows] == [
        (first, "idempotent", "dk-1"),
        (second, "unsafe", None),
    ]
    assert {c.body_hash for c in rows} == {body_digest(BODY)}


def test_a_charge_no_cell_counted_is_reported(
    target: TargetProcess, http: httpx.Client
) -> None:
    # Given the charges two cells counted
    claims = ChargeClaims()
    post(http, "idempotent", BODY, "dk-1")
    claims.claim_key("idempotent", "dk-1", "broker idempotent cell")
    post(http, "unsafe", BODY)
    claims.claim_body("unsafe", BODY, "broker unsafe cell")
    assert claims.unattributed(target.charges()) == []
    # When a charge appears that no cell made: the cell's body under another key
    stray = post(http, "idempotent", BODY, "dk-unknown")
    # Then it is the one charge reported
    assert [c.id for c in claims.unattributed(target.charges())] == [stray]
