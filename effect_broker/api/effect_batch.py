"""``POST /v1/effects/batch``: many submits in one request, one statement, one commit.

Thin glue over ``services.batch_submission.submit_many``: parse, charge the tenant's
rate limit per item, call the service, map each item's result. Its router is mounted
before the effects router, so ``/v1/effects/batch`` is not read as an effect id.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Field, Router, Schema
from pydantic import ConfigDict

from effect_broker.api.effects import SubmitIn, SubmitKeyAuth, _declared_length, _tenant
from effect_broker.api.idempotency_key import HEADER
from effect_broker.api.problems import domain_problem
from effect_broker.api.rate_limit import submit_limiter
from effect_broker.api.schemas import EffectOut, ProblemOut, effect_out, with_problems
from effect_broker.domain.errors import InvalidRequestError
from effect_broker.domain.rate_limit import submit_cost
from effect_broker.domain.records import EffectRequest
from effect_broker.services.batch_submission import (
    CREATED,
    REPLAYED,
    BatchItemResult,
    submit_many,
)

router = Router(tags=["effects"])


class BatchSubmitIn(Schema):
    """POST /v1/effects/batch body: the items, each a ``POST /v1/effects`` body."""

    model_config = ConfigDict(extra="forbid")

    items: list[SubmitIn] = Field(
        min_length=1,
        description="At most EFFECT_BROKER_MAX_BATCH_ITEMS (default 100) items, else "
        "400 invalid_request with `limit`. Any invalid item refuses the whole batch "
        "with that item's own problem and its index in `item`; nothing is written.",
    )


class ItemProblemOut(ProblemOut):
    """A conflicting item's problem, as ``POST /v1/effects`` would answer it."""

    item: int = Field(description="The item's index in the batch.")
    effect_id: str | None = Field(
        default=None, description="The effect the item's key already names."
    )
    pinned_contract: str | None = None


class BatchItemOut(Schema):
    """One item's result: ``created`` or ``replayed`` with its effect, or
    ``conflict`` with the problem a single submit of it would have answered (409
    payload_conflict, or 422 unknown_contract for a pinned contract now gone)."""

    index: int
    outcome: str = Field(description="created | replayed | conflict")
    effect: EffectOut | None = None
    problem: ItemProblemOut | None = None


class BatchOut(Schema):
    """A result per item, in the order sent."""

    items: list[BatchItemOut]


def _charge_items(request: HttpRequest, tenant_id: str, items: int) -> None:
    """Charge the items past the first: ``SubmitKeyAuth`` charged the first with the
    body. A batch that cannot fit the tenant's burst is refused rather than charged
    as the burst (``TokenBucket`` caps a cost), which would undercount it."""
    limiter = submit_limiter()
    if limiter is None or items <= 1:
        return
    total = submit_cost(_declared_length(request)) + items - 1
    if total > limiter.burst:
        fits = max(1, int(limiter.burst - total + items))
        raise InvalidRequestError(
            f"this batch costs {total:g} submit tokens and this tenant's burst is "
            f"{limiter.burst:g}; send at most {fits} items per batch",
            field="items",
            limit=fits,
        )
    limiter.charge(tenant_id, items - 1)


def _item_out(result: BatchItemResult) -> dict[str, Any]:
    if result.effect is not None:
        return {
            "index": result.index,
            "outcome": result.outcome,
            "effect": effect_out(
                result.effect,
                created=result.outcome == CREATED,
                replayed=result.outcome == REPLAYED,
            ),
        }
    assert result.error is not None  # a conflict carries its error
    return {
        "index": result.index,
        "outcome": result.outcome,
        "problem": domain_problem(result.error),
    }


@router.post(
    "/v1/effects/batch",
    response=with_problems({200: BatchOut}, 403, 415, 429),
    summary="Reserve many effects in one commit; a result per item (created, replayed "
    "or conflict); an Idempotency-Key header is refused (400): each item has its key",
    auth=SubmitKeyAuth(),
)
def submit_batch(request: HttpRequest, body: BatchSubmitIn) -> dict[str, Any]:
    if HEADER in request.headers:
        # One header cannot key many operations, and keying only the first item would
        # be a guess; each item carries its own operation_key (issue 21).
        raise InvalidRequestError(
            f"{HEADER} names one operation; a batch takes each item's operation_key "
            "in its body. Send the batch without the header, or submit one effect per "
            "request with it",
            field=HEADER,
        )
    tenant = _tenant(request)
    _charge_items(request, str(tenant.pk), len(body.items))
    results = submit_many(
        tenant,
        [
            EffectRequest(
                operation_key=item.operation_key,
                tool=item.tool,
                arguments=item.arguments,
                requested_by=item.requested_by,
                trace_id=item.trace_id,
            )
            for item in body.items
        ],
    )
    return {"items": [_item_out(r) for r in results]}
