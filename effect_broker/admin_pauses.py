"""Dispatch pauses in the admin (issue 24, item 7): the list, a pause form, a resume
action. Each goes through ``services.pauses`` as the logged-in operator (an active
staff user holding ``effect_broker.resolve_effect``, re-checked by the service), who
is recorded with the pause; rows are never edited or deleted here (an audit record,
refused by a trigger too)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from effect_broker.domain.errors import EffectBrokerError, OperatorForbiddenError
from effect_broker.domain.pauses import MAX_PAUSE_REASON
from effect_broker.models import DispatchPause, Tenant
from effect_broker.services import operators, pauses

_PAGE = "admin/effect_broker/operator_page.html"


class PauseForm(forms.Form):
    """A scope (one or more of tool, contract, tenant) and the reason callers read."""

    tool = forms.CharField(required=False, max_length=200, help_text="a tool name")
    contract = forms.CharField(
        required=False, max_length=400, help_text="NAME (every version) or NAME@VERSION"
    )
    tenant = forms.ModelChoiceField(
        queryset=Tenant.objects.order_by("name"),
        required=False,
        to_field_name="name",
        help_text="only this tenant's effects",
    )
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=MAX_PAUSE_REASON,
        help_text="shown to callers on every effect the pause holds",
    )


class ResumeForm(forms.Form):
    """An optional reason, recorded with the resume."""

    reason = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 2}), max_length=500
    )


@admin.register(DispatchPause)
class DispatchPauseAdmin(admin.ModelAdmin):
    """Pauses: active first; paused and resumed by operators, never edited."""

    list_display = (
        "scope",
        "state",
        "held",
        "reason",
        "paused_by",
        "paused_at",
        "resumed_by",
        "resumed_at",
    )
    list_filter = (("resumed_at", admin.EmptyFieldListFilter),)
    list_select_related = ("tenant",)
    ordering = ("-paused_at",)
    actions = ("resume_pauses",)

    @admin.display(description="scope")
    def scope(self, obj: DispatchPause) -> str:
        """What the pause covers, in words."""
        return pauses.pause_of(obj).describe()

    @admin.display(description="state")
    def state(self, obj: DispatchPause) -> str:
        """Active, or resumed."""
        return "active" if obj.resumed_at is None else "resumed"

    @admin.display(description="effects held")
    def held(self, obj: DispatchPause) -> str:
        """Effects in its scope waiting to be sent (while active)."""
        return str(pauses.held_count(str(obj.pk))) if obj.resumed_at is None else "-"

    def _is_operator(self, request: HttpRequest) -> bool:
        try:
            operators.operator_name(request.user)
        except OperatorForbiddenError:
            return False
        return True

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self._is_operator(request)

    def has_resume_permission(self, request: HttpRequest) -> bool:
        """Resuming is an operator's act, as pausing is."""
        return self._is_operator(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._is_operator(request) or super().has_view_permission(request, obj)

    def add_view(
        self,
        request: HttpRequest,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """Pause dispatch through ``services.pauses`` as the logged-in operator."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = PauseForm(request.POST if request.method == "POST" else None)
        if form.is_valid():
            data = form.cleaned_data
            try:
                paused = pauses.pause(
                    tool=data["tool"] or None,
                    contract=data["contract"] or None,
                    tenant=data["tenant"].name if data["tenant"] else None,
                    reason=data["reason"],
                    operator=request.user,
                )
            except EffectBrokerError as exc:
                form.add_error(None, f"[{exc.code}] {exc}")
            else:
                self.message_user(
                    request,
                    f"Paused {paused.describe()}: "
                    f"{pauses.held_count(paused.pause_id)} effect(s) wait.",
                )
                return HttpResponseRedirect(
                    reverse("admin:effect_broker_dispatchpause_changelist")
                )
        return self._page(
            request,
            form,
            title="Pause dispatch",
            intro="Effects in the scope that have not been sent wait until the pause "
            "is resumed; none is failed, and an attempt already in flight finishes. "
            "Give a tool, a contract, a tenant, or several (each must match).",
            submit="Pause",
        )

    @admin.action(description="Resume selected pauses", permissions=["resume"])
    def resume_pauses(
        self, request: HttpRequest, queryset: QuerySet[DispatchPause]
    ) -> HttpResponse | None:
        """Ask for an optional reason, then resume each selected active pause."""
        rows = list(queryset.filter(resumed_at__isnull=True))
        form = ResumeForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            return self._page(
                request,
                form,
                title="Resume dispatch",
                intro="The effects these pauses held are queued for dispatch again.",
                submit="Resume",
                selected=rows,
                action="resume_pauses",
            )
        for row in rows:
            try:
                done = pauses.resume(
                    str(row.pk), operator=request.user, reason=form.cleaned_data["reason"]
                )
            except EffectBrokerError as exc:
                self.message_user(request, f"Refused: {exc}", messages.ERROR)
                continue
            self.message_user(
                request,
                f"Resumed {done.pause.describe()}: {done.redeferred} effect(s) queued.",
            )
        return None

    def _page(
        self,
        request: HttpRequest,
        form: forms.Form,
        *,
        title: str,
        intro: str,
        submit: str,
        selected: list[DispatchPause] | None = None,
        action: str = "",
    ) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": title,
            "intro": intro,
            "form": form,
            "effects": [],
            "choices": [],
            "selected": selected or [],
            "checkbox_name": ACTION_CHECKBOX_NAME,
            "action": action,
            "submit": submit,
            "media": self.media,
        }
        return TemplateResponse(request, _PAGE, context)
