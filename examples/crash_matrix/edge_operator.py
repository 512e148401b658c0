"""Edge cell: an operator tries to requeue an unsafe effect; the way on is a fork
(issue 9, defect 5; ``edge_cells``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from effect_broker.domain.errors import IllegalTransitionError
from effect_broker.domain.states import EffectStatus
from effect_broker.models import EffectFork, EffectReceipt
from effect_broker.services.forking import fork
from effect_broker.services.resolution import resolve
from examples.crash_matrix.cells import charge_body
from examples.crash_matrix.edge_support import (
    FORK_KEY,
    OPERATOR,
    Checks,
    EdgeCellResult,
    attempts,
    charge_ids_by_body,
    charges,
    edge_result,
    effect_by_key,
    event_types,
    receipts,
    requests_seen,
    settled,
    wait_for,
)
from examples.crash_matrix.rig import Rig

# --- 5. an operator and an unsafe effect ------------------------------------------


def _operator() -> Any:
    """A staff user holding ``effect_broker.resolve_effect`` (fresh permission cache)."""
    users = get_user_model()
    user, _ = users.objects.get_or_create(
        username="edge-operator", defaults={"is_staff": True}
    )
    user.user_permissions.add(
        Permission.objects.get(
            codename="resolve_effect", content_type__app_label="effect_broker"
        )
    )
    return users.objects.get(pk=user.pk)


def operator_cell(rig: Rig, run: str) -> EdgeCellResult:
    """An unsafe effect in outcome_unknown: requeue refused, fork under a new key."""
    scenario, case = "unsafe", OPERATOR
    started = time.monotonic()
    tenant = rig.new_tenant("unsafe-operator")
    body = charge_body(scenario, "operator", run)
    requests_before = requests_seen(rig)
    # SIGKILL once the attempt is committed and the send is next: for the broker the
    # request may have left (outcome_unknown); in truth it did not, so an operator
    # who looks at the target finds nothing and may attest that.
    rig.arm(tenant, "before_request_write")
    rig.submit(tenant, scenario, body)
    old = wait_for(
        tenant, lambda r: r.status is EffectStatus.OUTCOME_UNKNOWN, what="unknown"
    )
    unknown = old
    operator = _operator()
    looked = charges(rig, scenario, old, body)
    evidence = {
        "source": "crash_target.charges, rows with this cell's body",
        "checked_at": datetime.now(UTC).isoformat(),
        "rows": looked,
    }
    refusal = ""
    try:
        resolve(
            tenant,
            old.effect_id,
            "not_committed",
            operator=operator,
            reason="target shows no charge; requeue under the same key",
            evidence=evidence,
        )
    except IllegalTransitionError as exc:
        refusal = str(exc.details.get("refusal", ""))
    after_refusal = effect_by_key(tenant)
    charges_after_refusal = charges(rig, scenario, after_refusal, body)
    forked = fork(
        tenant,
        old.effect_id,
        operator=operator,
        new_operation_key=FORK_KEY,
        reason="target shows no charge; continue under a new operation key",
        evidence=evidence,
    )
    new = wait_for(tenant, settled, key=FORK_KEY, what="the fork to settle")
    old = effect_by_key(tenant)
    receipt = EffectReceipt.objects.filter(effect_id=new.effect_id).first()
    ids = charge_ids_by_body(rig, body)
    linked = EffectFork.objects.filter(
        old_effect_id=old.effect_id, new_effect_id=new.effect_id
    ).exists()
    sent = requests_seen(rig) - requests_before
    old_attempts = attempts(old)
    checks = Checks()
    checks.expect(
        refusal == "unsafe_never_requeued", f"requeue not refused as unsafe: {refusal!r}"
    )
    checks.expect(
        after_refusal.status is EffectStatus.OUTCOME_UNKNOWN
        and after_refusal.version == unknown.version,
        f"the refused requeue changed the effect: {after_refusal.status.value}",
    )
    checks.expect(charges_after_refusal <= 1, f"{charges_after_refusal} charges")
    checks.expect(linked, "no EffectFork row linking the old effect to the fork")
    checks.expect(
        old.status is EffectStatus.FAILED_FINAL
        and event_types(old)[-1] == "resolved_forked",
        f"old effect not settled by resolved_forked: {old.status.value}",
    )
    checks.expect(len(old_attempts) == 1, f"old effect resent: {old_attempts}")
    checks.expect(
        new.effect_id == forked.new.effect_id
        and new.downstream_key != old.downstream_key,
        "the fork is not a new effect with a new downstream key",
    )
    checks.expect(
        new.status is EffectStatus.SUCCEEDED and receipt is not None,
        f"fork not succeeded with a receipt: {new.status.value}",
    )
    checks.expect(
        receipt is not None and ids == [receipt.external_id],
        f"target charges {ids} are not exactly the fork's receipt",
    )
    checks.expect(sent == 1, f"expected 1 request (the fork's), got {sent}")
    return edge_result(
        scenario,
        case,
        started=started,
        checks=checks,
        passed_note="requeue refused (unsafe_never_requeued); fork charged once",
        effects=len(ids),
        record=old,
        receipts=receipts(old),
        facts={
            "refusal": refusal,
            "charges_when_looked": looked,
            "charges_after_refusal": charges_after_refusal,
            "status_after_refusal": after_refusal.status.value,
            "fork_status": new.status.value,
            "fork_charges": ids,
            "fork_receipt_external_id": receipt.external_id if receipt else None,
            "fork_linked": linked,
            "requests": sent,
            "old_events": event_types(old),
        },
    )
