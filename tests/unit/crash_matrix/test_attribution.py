"""Which cell owns each target charge: the rule behind "unattributed charges fail the
run" (issue 9, "Test target")."""

from __future__ import annotations

import pytest

from examples.crash_matrix.attribution import ChargeClaims
from examples.crash_matrix.target_client import Charge, body_digest

BODY = {"order": "42", "amount_minor": 1999, "cell": "broker/idempotent/x/1"}
NAIVE = {"order": "42", "amount_minor": 1999, "cell": "naive/idempotent/x/1"}


def charge(mode: str, key: str | None, body: dict, charge_id: str = "ch_1") -> Charge:
    return Charge(
        charge_id,
        mode,
        key if mode == "idempotent" else None,
        key if mode == "reconcilable" else None,
        body_digest(body),
    )


@pytest.mark.parametrize("mode", ["idempotent", "reconcilable"])
def test_a_keyed_charge_belongs_to_the_cell_that_counted_its_key(mode: str) -> None:
    claims = ChargeClaims()
    claims.claim_key(mode, "dk-1", "broker cell")
    # Whatever its body: the key is what the broker sent.
    assert claims.owner(charge(mode, "dk-1", {"other": "body"})) == "broker cell"


@pytest.mark.parametrize("mode", ["idempotent", "reconcilable"])
def test_a_keyed_charge_under_another_key_is_not_attributed_by_its_body(
    mode: str,
) -> None:
    # Given a broker cell that counted its key, and a charge with the cell's body
    # under some other key
    claims = ChargeClaims()
    claims.claim_key(mode, "dk-1", "broker cell")
    stray = charge(mode, "dk-2", BODY)
    # Then no cell owns it
    assert claims.unattributed([stray]) == [stray]


def test_a_key_counts_only_in_its_own_mode() -> None:
    claims = ChargeClaims()
    claims.claim_key("idempotent", "dk-1", "broker cell")
    stray = charge("reconcilable", "dk-1", BODY)
    assert claims.unattributed([stray]) == [stray]


def test_unkeyed_and_baseline_charges_belong_to_the_cell_that_counted_their_body() -> (
    None
):
    claims = ChargeClaims()
    claims.claim_body("unsafe", BODY, "broker unsafe")
    claims.claim_body("idempotent", NAIVE, "naive")
    assert claims.owner(charge("unsafe", None, BODY)) == "broker unsafe"
    # The naive loop sends a fresh key per attempt: its body is what maps back.
    assert claims.owner(charge("idempotent", "uuid-a", NAIVE, "ch_2")) == "naive"
    assert claims.owner(charge("idempotent", "uuid-b", NAIVE, "ch_3")) == "naive"
    # Same body, another mode: not the same cell's charge.
    assert claims.owner(charge("reconcilable", None, NAIVE)) is None


def test_unattributed_lists_exactly_the_charges_no_cell_counted() -> None:
    claims = ChargeClaims()
    claims.claim_key("idempotent", "dk-1", "broker cell")
    claims.claim_body("unsafe", BODY, "broker unsafe")
    counted = [charge("idempotent", "dk-1", BODY, "ch_1"), charge("unsafe", None, BODY)]
    strays = [
        charge("unsafe", None, {"amount_minor": 1}, "ch_9"),
        charge("idempotent", "dk-unknown", BODY, "ch_8"),
    ]
    assert claims.unattributed(counted + strays) == strays
    assert claims.unattributed(counted) == []


def test_unsafe_charges_cannot_be_claimed_by_key() -> None:
    with pytest.raises(ValueError, match="by body"):
        ChargeClaims().claim_key("unsafe", "dk-1", "broker unsafe")
