"""Django admin: tenants are editable; ledger rows are read-only evidence.

Operator resolution of unknown effects goes through ``services.resolution`` from admin
actions and two small forms (resolve, fork); nothing here writes a ledger row directly.
Who may resolve or fork: an active staff user holding ``effect_broker.resolve_effect``
(``services.operators``), and the operator recorded in the events is the logged-in
user - the service re-checks it, so a forged action post changes nothing either.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from effect_broker.domain.canonical import parse_json_strict
from effect_broker.domain.errors import (
    EffectBrokerError,
    InvalidJsonError,
    OperatorForbiddenError,
    UnstorableTextError,
)
from effect_broker.domain.evidence import EVIDENCE_SHAPES
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.domain.storable_text import require_storable
from effect_broker.models import (
    EffectAttempt,
    EffectEvent,
    EffectFork,
    EffectIntent,
    EffectReceipt,
    OperatorToken,
    StaleWrite,
    Tenant,
)
from effect_broker.services import forking, operators, resolution
from effect_broker.services.resolution import RESOLVABLE, Resolution

_PAGE = "admin/effect_broker/operator_page.html"


def _shapes_help(*kinds: str) -> str:
    return "; ".join(f"{kind}: {', '.join(EVIDENCE_SHAPES[kind])}" for kind in kinds)


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


class ReasonForm(forms.Form):
    """The reason every resolution records in its event."""

    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=2000)


class ResolveForm(ReasonForm):
    """One effect, one of the operator's three choices, with its evidence."""

    resolution = forms.ChoiceField(
        choices=[
            (Resolution.SUCCEEDED.value, "Proof of success: mark succeeded (receipt)"),
            (Resolution.NOT_COMMITTED.value, "Proof of non-commit: requeue"),
            (Resolution.FAILED.value, "Mark final failure"),
        ],
        widget=forms.RadioSelect,
    )
    evidence = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6}),
        required=False,
        help_text="A JSON object with at least these members - "
        + _shapes_help("succeeded", "not_committed", "failed")
        + " (failed: optional). Stored encrypted in the receipt (success) and by "
        "digest in the event.",
    )
    external_id = forms.CharField(required=False, max_length=500)
    field_order = ["resolution", "reason", "evidence", "external_id"]

    def clean_evidence(self) -> dict[str, Any]:
        """Parse the evidence with the broker's strict JSON rules."""
        return _json_object(self.cleaned_data.get("evidence", ""))


class ForkForm(ReasonForm):
    """Fork one effect into a new effect under a new operation key."""

    new_operation_key = forms.CharField(max_length=1024)
    evidence = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6}),
        help_text="Your attestation that the old effect never committed, as a JSON "
        "object with at least: " + _shapes_help("fork"),
    )
    field_order = ["new_operation_key", "reason", "evidence"]

    def clean_evidence(self) -> dict[str, Any]:
        """Parse the evidence with the broker's strict JSON rules."""
        return _json_object(self.cleaned_data.get("evidence", ""))


def _json_object(raw: str) -> dict[str, Any]:
    raw = raw.strip()
    if not raw:
        return {}
    try:
        value = parse_json_strict(raw)
    except InvalidJsonError as exc:
        raise forms.ValidationError(str(exc)) from exc
    if not isinstance(value, dict):
        raise forms.ValidationError("evidence must be a JSON object")
    try:
        # A JSON escape (\u0000) gets past the form's NUL check on the raw text
        # (issue 12: a NUL in an evidence key was a 500).
        require_storable(value, "evidence")
    except UnstorableTextError as exc:
        raise forms.ValidationError(str(exc)) from exc
    return value


@admin.register(EffectIntent)
class EffectIntentAdmin(ReadOnlyAdmin):
    list_display = (
        "operation_key",
        "tenant",
        "tool",
        "safety_class",
        "status",
        "needs_operator",
        "version",
        "updated_at",
        "resolve_link",
    )
    readonly_fields = ("fork_links",)
    list_filter = ("status", "safety_class", "tool")
    list_select_related = ("tenant",)
    search_fields = ("operation_key",)
    # request_hash: not for display, even keyed (issue 9, defect 10).
    exclude = ("arguments_ciphertext", "downstream_key", "request_hash")
    actions = ("request_reconciliation", "resolve_mark_failed")

    @admin.display(boolean=True, description="needs operator")
    def needs_operator(self, obj: EffectIntent) -> bool:
        """Unsafe outcome_unknown or manual_review: nothing automatic will settle it."""
        return obj.status == EffectStatus.MANUAL_REVIEW or (
            obj.status == EffectStatus.OUTCOME_UNKNOWN
            and obj.safety_class == SafetyClass.UNSAFE
        )

    @admin.display(description="resolve")
    def resolve_link(self, obj: EffectIntent) -> str:
        """Links to the resolution and fork forms for effects an operator may settle."""
        if obj.status not in RESOLVABLE:
            return ""
        resolve = reverse("admin:effect_broker_effectintent_resolve", args=[obj.pk])
        fork = reverse("admin:effect_broker_effectintent_fork", args=[obj.pk])
        return format_html(
            '<a href="{}">resolve…</a> <a href="{}">fork…</a>', resolve, fork
        )

    @admin.display(description="fork links")
    def fork_links(self, obj: EffectIntent) -> str:
        """The effect this one was forked from, and its fork (spec: time travel)."""
        link = EffectFork.objects.filter(new_effect_id=obj.pk).first()
        fork = EffectFork.objects.filter(old_effect_id=obj.pk).first()
        parts = []
        if link is not None:
            parts.append(f"forked from {link.old_effect_id} by {link.operator}")
        if fork is not None:
            parts.append(f"forked to {fork.new_effect_id} by {fork.operator}")
        return "; ".join(parts) or "-"

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        """Resolution is an operator's act: active staff with ``resolve_effect``."""
        try:
            operators.operator_name(request.user)
        except OperatorForbiddenError:
            return False
        return True

    def get_urls(self) -> list[URLPattern]:
        """Add ``<id>/resolve/`` and ``<id>/fork/`` before the stock ``<id>/`` routes."""
        extra = [
            path(
                "<uuid:effect_id>/resolve/",
                self.admin_site.admin_view(self.resolve_view),
                name="effect_broker_effectintent_resolve",
            ),
            path(
                "<uuid:effect_id>/fork/",
                self.admin_site.admin_view(self.fork_view),
                name="effect_broker_effectintent_fork",
            ),
        ]
        return [*extra, *super().get_urls()]

    @admin.action(description="Request reconciliation", permissions=["resolve"])
    def request_reconciliation(
        self, request: HttpRequest, queryset: QuerySet[EffectIntent]
    ) -> None:
        """Defer reconcile jobs; unsafe unknown effects are refused with advice."""
        deferred, idle, refused = 0, 0, []
        for intent in queryset.select_related("tenant"):
            try:
                asked = resolution.request_reconciliation(
                    intent.tenant,
                    str(intent.pk),
                    requested_by=f"admin:{request.user.get_username()}",
                )
            except EffectBrokerError as exc:
                refused.append(f"{intent.operation_key}: {exc}")
                continue
            deferred, idle = deferred + asked.deferred, idle + (not asked.deferred)
        if deferred:
            self.message_user(request, f"Reconciliation requested for {deferred}.")
        if idle:
            self.message_user(
                request,
                f"{idle} not reconciled: only outcome_unknown effects are.",
                messages.WARNING,
            )
        _report_refusals(self, request, refused)

    @admin.action(description="Resolve: mark failed", permissions=["resolve"])
    def resolve_mark_failed(
        self, request: HttpRequest, queryset: QuerySet[EffectIntent]
    ) -> HttpResponse | None:
        """Ask for a reason, then mark each selected effect FAILED_FINAL."""
        effects = list(queryset.select_related("tenant"))
        form = ReasonForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            return self._page(
                request,
                form,
                title="Resolve: mark failed",
                intro="Mark these effects as finally failed. They will never be "
                "dispatched again and get no receipt.",
                effects=effects,
                action="resolve_mark_failed",
                submit="Mark failed",
            )
        done, refused = 0, []
        for intent in effects:
            try:
                resolution.resolve_failed(
                    intent.tenant,
                    str(intent.pk),
                    operator=request.user,
                    reason=form.cleaned_data["reason"],
                )
            except EffectBrokerError as exc:
                refused.append(f"{intent.operation_key}: {exc}")
                continue
            done += 1
        if done:
            self.message_user(request, f"Marked {done} effect(s) failed.")
        _report_refusals(self, request, refused)
        return None

    def _operator_target(self, request: HttpRequest, effect_id: Any) -> EffectIntent:
        """The effect an operator page acts on, once the user may resolve effects."""
        if not self.has_resolve_permission(request):
            raise PermissionDenied
        intent = (
            EffectIntent.objects.select_related("tenant").filter(pk=effect_id).first()
        )
        if intent is None:
            raise Http404("no such effect")
        return intent

    def resolve_view(self, request: HttpRequest, effect_id: Any) -> HttpResponse:
        """Resolve one effect: success or non-commit with evidence, or failure."""
        intent = self._operator_target(request, effect_id)
        form = ResolveForm(request.POST if request.method == "POST" else None)
        if form.is_valid():
            data = form.cleaned_data
            try:
                after = resolution.resolve(
                    intent.tenant,
                    str(intent.pk),
                    data["resolution"],
                    operator=request.user,
                    reason=data["reason"],
                    evidence=data["evidence"],
                    external_id=data["external_id"] or None,
                )
            except EffectBrokerError as exc:
                form.add_error(None, f"[{exc.code}] {exc}")
            else:
                self.message_user(
                    request,
                    f"{intent.operation_key}: {intent.status} -> {after.status.value}",
                )
                return HttpResponseRedirect(
                    reverse("admin:effect_broker_effectintent_change", args=[intent.pk])
                )
        return self._page(
            request,
            form,
            title=f"Resolve {intent.operation_key}",
            intro="There is no 'retry anyway': requeue only with evidence that the "
            "target never applied the request.",
            effects=[intent],
            action="",
            submit="Resolve",
        )

    def fork_view(self, request: HttpRequest, effect_id: Any) -> HttpResponse:
        """Fork one effect: settle it and reserve a new effect under a new key."""
        intent = self._operator_target(request, effect_id)
        form = ForkForm(request.POST if request.method == "POST" else None)
        if form.is_valid():
            data = form.cleaned_data
            try:
                forked = forking.fork(
                    intent.tenant,
                    str(intent.pk),
                    operator=request.user,
                    new_operation_key=data["new_operation_key"],
                    reason=data["reason"],
                    evidence=data["evidence"],
                )
            except EffectBrokerError as exc:
                form.add_error(None, f"[{exc.code}] {exc}")
            else:
                self.message_user(
                    request,
                    f"{intent.operation_key}: forked to {forked.new.operation_key} "
                    f"(effect {forked.new.effect_id}); the old effect is "
                    f"{forked.old.status.value}",
                )
                return HttpResponseRedirect(
                    reverse(
                        "admin:effect_broker_effectintent_change",
                        args=[forked.new.effect_id],
                    )
                )
        return self._page(
            request,
            form,
            title=f"Fork {intent.operation_key}",
            intro="A fork is a NEW business operation under a new operation key: the "
            "old effect is settled failed_final on your attestation that it never "
            "committed, and the new one is dispatched. Only fork with evidence.",
            effects=[intent],
            action="",
            submit="Fork",
        )

    def _page(
        self,
        request: HttpRequest,
        form: forms.Form,
        *,
        title: str,
        intro: str,
        effects: list[EffectIntent],
        action: str,
        submit: str,
    ) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": title,
            "intro": intro,
            "form": form,
            "effects": effects,
            "selected": effects if action else [],
            "checkbox_name": ACTION_CHECKBOX_NAME,
            "action": action,
            "submit": submit,
        }
        return TemplateResponse(request, _PAGE, context)


def _report_refusals(
    model_admin: admin.ModelAdmin, request: HttpRequest, refused: Iterable[str]
) -> None:
    for line in refused:
        model_admin.message_user(request, f"Refused: {line}", messages.ERROR)


@admin.register(EffectAttempt)
class EffectAttemptAdmin(ReadOnlyAdmin):
    list_display = ("effect", "ordinal", "worker", "outcome", "started_at", "ended_at")
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
