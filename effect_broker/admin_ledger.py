"""The ledger's read-only admin pages: attempts, receipts, events, stale writes, forks
and operator tokens are evidence - viewable, never added, changed or deleted here
(STYLE rule 2). The operator console itself is ``effect_broker.admin``."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from effect_broker.models import (
    EffectAttempt,
    EffectEvent,
    EffectFork,
    EffectReceipt,
    OperatorToken,
    StaleWrite,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Ledger rows are evidence: viewable, never added, changed or deleted here."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(EffectAttempt)
class EffectAttemptAdmin(ReadOnlyAdmin):
    list_display = (
        "effect",
        "ordinal",
        "worker",
        "outcome",
        "error_category",
        "bytes_may_have_left",
        "started_at",
        "ended_at",
    )
    # An attempt's request_digest is the effect's request hash (issue 9, defect 10).
    exclude = ("request_digest",)


@admin.register(EffectReceipt)
class EffectReceiptAdmin(ReadOnlyAdmin):
    list_display = ("effect", "external_id", "created_at")
    exclude = ("result_ciphertext",)


@admin.register(EffectEvent)
class EffectEventAdmin(ReadOnlyAdmin):
    list_display = (
        "effect",
        "sequence",
        "event_type",
        "old_status",
        "new_status",
        "actor",
    )
    exclude = ("prev_digest", "digest")


@admin.register(StaleWrite)
class StaleWriteAdmin(ReadOnlyAdmin):
    list_display = (
        "effect",
        "actor",
        "expected_version",
        "actual_version",
        "occurred_at",
    )


@admin.register(EffectFork)
class EffectForkAdmin(ReadOnlyAdmin):
    list_display = ("old_effect", "new_effect", "operator", "created_at")


@admin.register(OperatorToken)
class OperatorTokenAdmin(ReadOnlyAdmin):
    """Tokens are created (shown once) and revoked with ``effect-broker operators``."""

    list_display = ("name", "user", "scope", "created_at", "revoked_at")
    exclude = ("token_hash",)
