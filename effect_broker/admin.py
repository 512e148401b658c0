"""Django admin: tenants are editable; ledger rows are read-only evidence.

Operator resolution of unknown effects is an admin action that calls the resolution
service (added with the engine); nothing here writes a ledger row directly.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from effect_broker.models import (
    EffectAttempt,
    EffectEvent,
    EffectIntent,
    EffectReceipt,
    StaleWrite,
    Tenant,
)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("name", "id", "disabled", "created_at")
    readonly_fields = ("id", "api_key_hash", "created_at", "updated_at")
    search_fields = ("name",)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Ledger rows are evidence: viewable, never added, changed or deleted here."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(EffectIntent)
class EffectIntentAdmin(ReadOnlyAdmin):
    list_display = (
        "operation_key",
        "tool",
        "safety_class",
        "status",
        "version",
        "updated_at",
    )
    list_filter = ("status", "safety_class", "tool")
    search_fields = ("operation_key",)
    exclude = ("arguments_ciphertext", "downstream_key")


@admin.register(EffectAttempt)
class EffectAttemptAdmin(ReadOnlyAdmin):
    list_display = ("effect", "ordinal", "worker", "outcome", "started_at", "ended_at")


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
