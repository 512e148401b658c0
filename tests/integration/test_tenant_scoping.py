"""Spec "Multi-tenant queries always include tenant scope": the same operation key in
two tenants is two independent effects, and no read crosses tenants (README: the row
"The same key in another tenant..." cites this file for both halves)."""

from __future__ import annotations

import pytest

from effect_broker import store
from effect_broker.domain.errors import EffectNotFoundError
from effect_broker.domain.records import EffectRequest
from effect_broker.models import EffectIntent
from effect_broker.services.submission import submit
from effect_broker.store.reads import get_effect_by_key


def reserve(tenant, key: str, **arguments: object):
    return submit(
        tenant,
        EffectRequest(
            operation_key=key, tool="charge_card", arguments={"order": key, **arguments}
        ),
    ).effect


@pytest.mark.django_db
@pytest.mark.parametrize(
    "their_arguments", [{}, {"note": "other"}], ids=["same", "other"]
)
def test_the_same_key_in_another_tenant_is_an_independent_effect(
    tenant, other_tenant, their_arguments: dict[str, object]
) -> None:
    # Given tenant A's effect under a key
    mine = reserve(tenant, "order:7:charge:v1")
    # When tenant B submits the same key, with the same or other arguments
    result = submit(
        other_tenant,
        EffectRequest(
            operation_key="order:7:charge:v1",
            tool="charge_card",
            arguments={"order": "order:7:charge:v1", **their_arguments},
        ),
    )
    # Then it is created, not a replay of A's effect nor a conflict with it
    assert (result.created, result.replayed) == (True, False)
    theirs = result.effect
    assert theirs.effect_id != mine.effect_id
    # and the target sees another idempotency key: B cannot dedupe against A's charge
    assert theirs.downstream_key != mine.downstream_key
    # and A's effect is untouched, each found by key only in its own tenant
    assert store.get_effect(str(tenant.id), mine.effect_id) == mine
    assert get_effect_by_key(str(tenant.id), "order:7:charge:v1") == mine
    assert get_effect_by_key(str(other_tenant.id), "order:7:charge:v1") == theirs
    assert EffectIntent.objects.filter(operation_key="order:7:charge:v1").count() == 2


@pytest.mark.django_db
def test_get_effect_of_another_tenant_is_not_found(tenant, other_tenant) -> None:
    theirs = reserve(other_tenant, "order:9:charge:v1")
    with pytest.raises(EffectNotFoundError):
        store.get_effect(str(tenant.id), theirs.effect_id)
    assert store.get_effect(str(other_tenant.id), theirs.effect_id) == theirs


@pytest.mark.django_db
def test_lists_only_contain_the_callers_effects(tenant, other_tenant) -> None:
    mine = {reserve(tenant, f"order:{i}:charge:v1").effect_id for i in range(3)}
    reserve(other_tenant, "order:0:charge:v1")
    listed = store.list_effects(str(tenant.id))
    assert {r.effect_id for r in listed} == mine
    assert store.list_effects(str(tenant.id), operation_prefix="order:1") == [
        r for r in listed if r.operation_key == "order:1:charge:v1"
    ]


@pytest.mark.django_db
def test_an_operation_prefix_is_literal_not_a_pattern(tenant) -> None:
    reserve(tenant, "order:1:charge:v1")
    assert store.list_effects(str(tenant.id), operation_prefix="order:%") == []
    assert store.list_effects(str(tenant.id), operation_prefix="order_") == []
