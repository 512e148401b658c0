"""Spec "Multi-tenant queries always include tenant scope": no cross-tenant reads."""

from __future__ import annotations

import pytest

from effect_broker import store
from effect_broker.domain.errors import EffectNotFoundError
from effect_broker.domain.records import EffectRequest
from effect_broker.services.submission import submit


def reserve(tenant, key: str):
    return submit(
        tenant,
        EffectRequest(operation_key=key, tool="charge_card", arguments={"order": key}),
    ).effect


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
