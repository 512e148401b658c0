"""Tenants in the admin: created through ``services.tenants`` with an API key shown
once, names unique with a form error (issue 11: no key, and a raw IntegrityError)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from effect_broker.admin_forms import TenantCreateForm
from effect_broker.domain.errors import EffectBrokerError
from effect_broker.models import Tenant
from effect_broker.services import tenants


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    """Tenants: created with an API key shown once; names unique, with a form error."""

    list_display = ("name", "id", "disabled", "created_at")
    # hmac_key_id names the HMAC key every downstream key of the tenant is derived
    # with: editing it would silently change the keys of effects still in flight.
    readonly_fields = ("id", "hmac_key_id", "api_key_hash", "created_at", "updated_at")
    search_fields = ("name",)

    def add_view(
        self,
        request: HttpRequest,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """Create a tenant through ``services.tenants`` and show its key once."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = TenantCreateForm(request.POST if request.method == "POST" else None)
        if form.is_valid():
            try:
                # A savepoint: a lost race on the unique name must not poison the
                # request's transaction (ATOMIC_REQUESTS or a test's).
                with transaction.atomic():
                    tenant, api_key = tenants.create_tenant(form.cleaned_data["name"])
            except IntegrityError:
                form.add_error(
                    "name",
                    "A tenant with this name was created a moment ago. Tenant names "
                    "are unique.",
                )
            except EffectBrokerError as exc:
                form.add_error("name", str(exc))
            else:
                self.log_addition(request, tenant, [{"added": {}}])
                return self._key_shown_once(request, tenant, api_key)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Add tenant",
            "form": form,
            "adminform_errors": form.errors,
        }
        return TemplateResponse(
            request, "admin/effect_broker/tenant/add_tenant.html", context
        )

    def _key_shown_once(
        self, request: HttpRequest, tenant: Tenant, api_key: str
    ) -> HttpResponse:
        # The key is in this response only: never in a message (the cookie storage
        # would carry it back and forth), a log or the database (only its hash).
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Tenant {tenant.name} created",
            "tenant": tenant,
            "api_key": api_key,
        }
        response = TemplateResponse(
            request, "admin/effect_broker/tenant/key_shown_once.html", context
        )
        response["Cache-Control"] = "no-store"
        return response
