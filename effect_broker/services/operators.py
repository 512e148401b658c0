"""Operators and operator tokens: the only source of operator identity.

Issue 9, defect 5: an agent could resolve its own effects, because resolution took the
tenant's submit key and an ``operator`` name from the request body. An operator is now
an active Django staff user holding ``effect_broker.resolve_effect``:

- admin: the logged-in user;
- CLI: ``--as USERNAME``, checked here (exists, active, staff, permission);
- HTTP: an operator token (``ebop_...``, its own scope) owned by such a user, with the
  user's standing re-checked on every call, so revoking the permission or deactivating
  the user disarms every token at once.

A tenant API key is never an operator credential, and an operator token is not a
tenant key (the prefixes differ, so neither authenticator accepts the other).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone

from effect_broker.domain.errors import (
    AuthenticationError,
    InvalidRequestError,
    OperatorForbiddenError,
)
from effect_broker.models import OperatorToken

RESOLVE_PERMISSION = "effect_broker.resolve_effect"
"""The permission (``app_label.codename``) that makes a staff user an operator."""

OPERATOR_TOKEN_PREFIX = "ebop_"  # noqa: S105 - a public prefix, not a secret
OPERATOR_SCOPE = "operator"
"""The one scope an operator token has today: the operator API."""


def operator_name(user: Any) -> str:
    """Return the username of ``user`` if it may act as an operator, else raise
    ``OperatorForbiddenError`` (never trusts a name from a request)."""
    if user is None or not getattr(user, "is_authenticated", False):
        raise OperatorForbiddenError("an operator must be an authenticated staff user")
    name = user.get_username()
    if not user.is_active:
        raise OperatorForbiddenError(f"user {name!r} is inactive", user=name)
    if not user.is_staff:
        raise OperatorForbiddenError(f"user {name!r} is not staff", user=name)
    if not user.has_perm(RESOLVE_PERMISSION):
        raise OperatorForbiddenError(
            f"user {name!r} lacks the permission {RESOLVE_PERMISSION}", user=name
        )
    return str(name)


def operator_by_username(username: str) -> Any:
    """The operator named ``username`` (CLI ``--as``): exists, active, staff and
    holding the permission."""
    user = get_user_model().objects.filter(username=(username or "").strip()).first()
    if user is None:
        raise OperatorForbiddenError(f"no user named {username!r}", user=username)
    operator_name(user)
    return user


def hash_operator_token(token: str) -> str:
    """SHA-256 hex of an operator token; only this is stored."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(username: str, *, name: str = "") -> tuple[OperatorToken, str]:
    """Create an operator token for ``username`` and return it (shown once)."""
    user = operator_by_username(username)
    label = (name or f"{user.get_username()} token").strip()
    if not 1 <= len(label) <= 200:
        raise InvalidRequestError("token name must be 1-200 characters")
    token = OPERATOR_TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = OperatorToken.objects.create(
        name=label,
        user=user,
        token_hash=hash_operator_token(token),
        scope=OPERATOR_SCOPE,
    )
    return row, token


def revoke_token(token_id: str) -> OperatorToken:
    """Revoke one operator token by id (idempotent)."""
    row = OperatorToken.objects.filter(id=token_id).first()
    if row is None:
        raise InvalidRequestError(f"no operator token {token_id}")
    if row.revoked_at is None:
        row.revoked_at = timezone.now()
        row.save(update_fields=["revoked_at"])
    return row


def authenticate_token(token: str | None) -> Any:
    """Return the operator (staff user) that owns ``token``, re-checking the user's
    standing and permission now; 401 for a bad token, 403 for a user who may not."""
    if not token or not token.startswith(OPERATOR_TOKEN_PREFIX):
        raise AuthenticationError(
            "missing or malformed operator token (a tenant API key is not one)"
        )
    digest = hash_operator_token(token)
    row = OperatorToken.objects.select_related("user").filter(token_hash=digest).first()
    # compare_digest keeps the final comparison constant-time once a row is found.
    if row is None or not hmac.compare_digest(row.token_hash, digest):
        raise AuthenticationError("unknown operator token")
    if row.revoked_at is not None or row.scope != OPERATOR_SCOPE:
        raise AuthenticationError("operator token revoked or out of scope")
    operator_name(row.user)
    return row.user
