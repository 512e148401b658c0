"""The crash matrix's edge cells (issue 9), run against real worker processes.

Reads the rows of the full ``effect-broker demo crash-matrix`` run (tests/crash/
conftest.py: its own embedded server or a DATABASE_URL scratch database, the target
service, three real workers), which runs every edge cell (``edge_cells``). This module
checks
each verdict and the facts behind it: charges counted by downstream key in the
target's own table, the target's request counter, statuses, the refusal code and the
fork link. Each cell's own rules must all hold (``verdict == "pass"``); the facts are
asserted again here, so that a loosened rule in a cell cannot hide.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from examples.crash_matrix.plan import EDGE_CASES

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

Cells = dict[tuple[str, str], Any]


@pytest.fixture(scope="module")
def cells(matrix) -> Cells:
    _, _, data = matrix
    assert data, "the crash matrix wrote no results"
    return {
        (r["scenario"], r["case"]): r
        for r in data["cells"]
        if (r["scenario"], r["case"]) in EDGE_CASES
    }


def test_every_edge_cell_passes(cells: Cells) -> None:
    assert sorted(cells) == sorted(EDGE_CASES)
    failed = {
        key: (r["note"], r["facts"]) for key, r in cells.items() if r["verdict"] != "pass"
    }
    assert failed == {}


@pytest.mark.parametrize("scenario", ["idempotent", "reconcilable"])
def test_a_frozen_worker_is_handed_on_and_does_not_send_when_thawed(
    cells: Cells, scenario: str
) -> None:
    from examples.crash_matrix.edge_support import FROZEN

    cell = cells[(scenario, FROZEN)]
    assert (cell["target_effects"], cell["receipts"], cell["status"]) == (
        1,
        1,
        "succeeded",
    )
    assert cell["facts"]["charges"] == 1  # by downstream key, in the target's table
    assert cell["facts"]["requests"] == 1  # the takeover's; none from the thawed worker
    assert "lease_expired" in cell["facts"]["events"]
    frozen_worker = cell["facts"]["attempts"][0]["worker"]
    thawed = [w for w in cell["facts"]["stale_writes"] if w["actor"] == frozen_worker]
    assert [w["attempted"] for w in thawed] == [
        "dispatch_rejected:dispatching->retryable"
    ]
    assert cell["facts"]["thawed_log_says_send_refused"] is True


def test_a_frozen_unsafe_worker_leaves_outcome_unknown_and_sends_nothing(
    cells: Cells,
) -> None:
    from examples.crash_matrix.edge_support import FROZEN

    cell = cells[("unsafe", FROZEN)]
    assert (cell["status"], cell["receipts"]) == ("outcome_unknown", 0)
    assert cell["facts"]["charges"] == 0
    assert cell["facts"]["requests"] == 0
    assert [a["outcome"] for a in cell["facts"]["attempts"]] == ["unknown"]
    assert cell["facts"]["stale_writes"][-1]["attempted"].startswith("dispatch_rejected:")


def test_a_frozen_transactional_claim_blocks_the_takeover_and_commits_once(
    cells: Cells,
) -> None:
    from examples.crash_matrix.edge_support import FROZEN

    cell = cells[("transactional", FROZEN)]
    assert (cell["target_effects"], cell["receipts"], cell["status"]) == (
        1,
        1,
        "succeeded",
    )
    assert cell["facts"]["takeover_waited_on_row_lock"] is True
    assert cell["facts"]["stale_writes"]  # the takeover's claim, refused by the fence


@pytest.mark.parametrize("scenario", ["idempotent", "reconcilable"])
def test_a_worker_frozen_between_headers_and_body_sends_not_one_byte_when_thawed(
    cells: Cells, scenario: str
) -> None:
    # Issue 19, item 4: before the fix the headers had left at the freeze and the body
    # followed on thawing (reconcilable: 2 charges; requests_while_frozen was 2)
    from examples.crash_matrix.plan import FROZEN_MID_WRITE

    cell = cells[(scenario, FROZEN_MID_WRITE)]
    assert (cell["target_effects"], cell["receipts"], cell["status"]) == (
        1,
        1,
        "succeeded",
    )
    facts = cell["facts"]
    assert facts["failpoint"] == "between_headers_and_body"
    assert facts["charges"] == 1
    assert facts["requests_while_frozen"] == 1  # the takeover's; no frozen headers
    assert facts["requests"] == 1  # and nothing from the thawed worker afterwards
    assert "lease_expired" in facts["events"]
    assert [w["attempted"] for w in facts["stale_writes"]] == [
        "dispatch_rejected:dispatching->retryable"
    ]
    assert facts["thawed_log_says_send_refused"] is True


@pytest.mark.parametrize("scenario", ["idempotent", "reconcilable"])
def test_a_late_request_past_the_send_gate_is_refused_by_the_targets_fence(
    cells: Cells, scenario: str
) -> None:
    from examples.crash_matrix.plan import FROZEN_AFTER_GATE

    cell = cells[(scenario, FROZEN_AFTER_GATE)]
    assert (cell["target_effects"], cell["receipts"], cell["status"]) == (
        1,
        1,
        "succeeded",
    )
    facts = cell["facts"]
    assert facts["failpoint"] == "after_send_gate"
    assert facts["charges"] == 1
    # The late request did reach the target - the gate had passed it - after the
    # takeover, and the target refused its older fencing token
    assert (facts["requests_while_frozen"], facts["requests"]) == (1, 2)
    assert facts["stale_fencing_refusals"] == 1
    assert "lease_expired" in facts["events"]
    assert len(facts["stale_writes"]) == 1  # the thawed worker's write, fenced


def test_a_slow_commit_with_a_lost_answer_is_found_not_resent(cells: Cells) -> None:
    from examples.crash_matrix.edge_support import SLOW_COMMIT

    cell = cells[("reconcilable", SLOW_COMMIT)]
    assert (cell["target_effects"], cell["receipts"], cell["status"]) == (
        1,
        1,
        "succeeded",
    )
    assert cell["facts"]["requests"] == 1
    events = cell["facts"]["events"]
    assert "outcome_unknown" in events
    assert "reconciled_committed" in events
    assert "reconciled_not_committed" not in events
    assert "time limit" in cell["facts"]["unknown_reason"]


def test_key_in_use_after_an_unknown_attempt_is_retried_later(cells: Cells) -> None:
    from examples.crash_matrix.edge_support import IN_PROGRESS

    cell = cells[("idempotent", IN_PROGRESS)]
    assert (cell["target_effects"], cell["receipts"], cell["status"]) == (
        1,
        1,
        "succeeded",
    )
    assert cell["facts"]["requests"] == 3
    assert "in progress" in cell["facts"]["reason"]
    assert not {"dispatch_refused", "retries_exhausted"} & set(cell["facts"]["events"])


def test_a_terminal_answer_after_an_unknown_attempt_is_never_final(
    cells: Cells,
) -> None:
    from examples.crash_matrix.edge_support import TERMINAL

    cell = cells[("idempotent", TERMINAL)]
    assert cell["target_effects"] == 1
    assert cell["status"] in {"succeeded", "outcome_unknown", "manual_review"}
    assert "refused_in_doubt" in cell["facts"]["events"]
    assert "dispatch_refused" not in cell["facts"]["events"]
    assert "cannot prove that nothing was charged" in cell["facts"]["reason"]


def test_retry_exhaustion_after_an_unknown_attempt_goes_to_manual_review(
    cells: Cells,
) -> None:
    from examples.crash_matrix.edge_support import EXHAUSTED

    cell = cells[("idempotent", EXHAUSTED)]
    assert (cell["target_effects"], cell["receipts"], cell["status"]) == (
        1,
        0,
        "manual_review",
    )
    assert cell["facts"]["requests"] == 3
    assert "retries_exhausted_in_doubt" in cell["facts"]["events"]
    assert "retries_exhausted" not in cell["facts"]["events"]
    assert cell["facts"]["reason"]


def test_an_operator_cannot_requeue_an_unsafe_effect_but_can_fork_it(
    cells: Cells,
) -> None:
    from examples.crash_matrix.edge_support import OPERATOR

    cell = cells[("unsafe", OPERATOR)]
    facts = cell["facts"]
    assert facts["refusal"] == "unsafe_never_requeued"
    assert facts["status_after_refusal"] == "outcome_unknown"
    assert facts["charges_when_looked"] == facts["charges_after_refusal"] == 0
    assert (cell["status"], cell["receipts"]) == ("failed_final", 0)  # the old effect
    assert facts["old_events"][-1] == "resolved_forked"
    assert facts["fork_linked"] is True
    assert facts["fork_status"] == "succeeded"
    # Exactly one charge in the target's table, and it is the fork's receipt.
    assert facts["fork_charges"] == [facts["fork_receipt_external_id"]]
    assert facts["requests"] == 1


@pytest.mark.parametrize(
    ("scenario", "case"),
    [
        ("idempotent", "one worker's clock +20s"),
        ("reconcilable", "one worker's clock -20s"),
    ],
)
def test_a_worker_with_a_skewed_clock_expires_no_live_lease(
    cells: Cells, scenario: str, case: str
) -> None:
    cell = cells[(scenario, case)]
    facts = cell["facts"]
    # One charge per effect, one request each (a batch of 4, resubmitted at most twice
    # when the pool's workers took a whole batch before the skewed worker could)
    assert facts["charges"] == [1] * len(facts["charges"])
    assert len(facts["charges"]) in (4, 8, 12)
    assert facts["requests"] == len(facts["charges"])
    assert facts["leases_live_when_swept"] >= 1
    assert facts["sweep"]["leases_expired"] == 0
    assert facts["dispatched_by_skewed_worker"] >= 1
    for events in facts["events"]:
        assert not {"lease_expired", "outcome_unknown"} & set(events), events
