"""Tenants and API keys: the only source of tenant identity."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from effect_broker.domain.errors import (
    AuthenticationError,
    InvalidRequestError,
    TenantDisabledError,
)
from effect_broker.models import Tenant

API_KEY_PREFIX = "eb_"


def hash_api_key(api_key: str) -> str:
    """SHA-256 hex of an API key; only this is stored."""
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


def create_tenant(name: str, *, hmac_key_id: str = "h1") -> tuple[Tenant, str]:
    """Create a tenant and return it with its API key (shown once, never stored)."""
    name = name.strip()
    if not name or len(name) > 200:
        raise InvalidRequestError("tenant name must be 1-200 characters")
    api_key = API_KEY_PREFIX + secrets.token_urlsafe(32)
    tenant = Tenant.objects.create(
        name=name, api_key_hash=hash_api_key(api_key), hmac_key_id=hmac_key_id
    )
    return tenant, api_key


def authenticate(api_key: str | None) -> Tenant:
    """Return the enabled tenant that owns ``api_key``."""
    if not api_key or not api_key.startswith(API_KEY_PREFIX):
        raise AuthenticationError("missing or malformed API key")
    digest = hash_api_key(api_key)
    tenant = Tenant.objects.filter(api_key_hash=digest).first()
    # compare_digest keeps the final comparison constant-time once a row is found.
    if tenant is None or not hmac.compare_digest(tenant.api_key_hash, digest):
        raise AuthenticationError("unknown API key")
    if tenant.disabled:
        raise TenantDisabledError(f"tenant {tenant.name!r} is disabled")
    return tenant
