"""API key authentication reads the tenant in one prepared-once statement (issue 13)
and keeps its promises: the tenant it returns is the stored one, field for field; an
unknown, malformed, rotated or disabled key is refused from the very next call."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from effect_broker.domain.errors import AuthenticationError, TenantDisabledError
from effect_broker.models import Tenant
from effect_broker.services.tenants import (
    authenticate,
    create_tenant,
    rotate_api_key,
    set_disabled,
)

pytestmark = pytest.mark.django_db


def test_authenticate_returns_the_stored_tenant_in_one_statement() -> None:
    tenant, api_key = create_tenant("auth-acme")
    create_tenant("auth-other")
    with CaptureQueriesContext(connection) as queries:
        found = authenticate(api_key)
    assert len(queries.captured_queries) == 1
    stored = Tenant.objects.get(pk=tenant.pk)
    for field in Tenant._meta.concrete_fields:
        assert getattr(found, field.attname) == getattr(stored, field.attname)
    # A loaded row, not a new one: saving it would update, never insert.
    assert found._state.adding is False
    assert found._state.db == connection.alias


@pytest.mark.parametrize("api_key", ["", "eb_", "eb_unknown", "not-a-broker-key"])
def test_unknown_or_malformed_keys_are_refused(api_key: str) -> None:
    create_tenant("auth-acme")
    with pytest.raises(AuthenticationError):
        authenticate(api_key)


def test_a_rotated_key_is_refused_from_the_next_call() -> None:
    _, old_key = create_tenant("auth-rotating")
    assert authenticate(old_key).name == "auth-rotating"
    _, new_key = rotate_api_key("auth-rotating")
    with pytest.raises(AuthenticationError):
        authenticate(old_key)
    assert authenticate(new_key).name == "auth-rotating"


def test_a_disabled_tenant_is_refused_from_the_next_call_and_back_when_enabled() -> None:
    _, api_key = create_tenant("auth-disabling")
    assert authenticate(api_key).disabled is False
    set_disabled("auth-disabling", disabled=True)
    with pytest.raises(TenantDisabledError):
        authenticate(api_key)
    set_disabled("auth-disabling", disabled=False)
    assert authenticate(api_key).disabled is False
